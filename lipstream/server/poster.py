"""The avatar's idle picture as a JPEG, so the page shows the avatar the moment it opens (before Start)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import cv2
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from lipstream.avatar.bundle import AvatarBundle, SharedBundles
from lipstream.errors import LipstreamError

POSTER_QUALITY = 85


def poster_jpeg(bundle: AvatarBundle) -> bytes:
    """The first frame the idle loop shows, as a JPEG (made once per open bundle)."""
    cached = bundle.derived.get("poster_jpeg")
    if cached is None:
        rgb = np.asarray(bundle.frames[bundle.base_frame_index(0)])
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                               [cv2.IMWRITE_JPEG_QUALITY, POSTER_QUALITY])  # fmt: skip
        if not ok:
            raise LipstreamError(f"the poster of {bundle.name} could not be encoded")
        cached = bundle.derived["poster_jpeg"] = buf.tobytes()
    return cached


def add_poster_route(app: FastAPI, bundles: SharedBundles, authorized: Callable[[Request], bool]) -> None:
    """GET /api/avatars/{name}/poster.jpg: the avatar's idle picture (token-protected like /api)."""

    @app.get("/api/avatars/{name}/poster.jpg")
    async def poster(name: str, request: Request) -> Response:
        """The avatar's idle picture as a JPEG."""
        if not authorized(request):
            return JSONResponse(
                {"error": "unauthorized", "message": "missing or wrong token"}, status_code=401
            )
        try:
            bundle = await asyncio.to_thread(bundles.get, name)
            body = await asyncio.to_thread(poster_jpeg, bundle)
        except LipstreamError as exc:
            return JSONResponse({"error": "not_found", "message": str(exc)}, status_code=404)
        return Response(body, media_type="image/jpeg", headers={"Cache-Control": "no-cache"})
