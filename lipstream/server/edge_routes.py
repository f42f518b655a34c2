"""`lipstream serve` hosts an avatar's web export at /edge/NAME/ (data built once into the bundle's cache)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.edge.web_export import (
    _SKIP_PAGE,
    EXPORT_VERSION,
    MANIFEST,
    PAGE_DIR,
    WebExportConfig,
    export_web,
)
from lipstream.errors import LipstreamError
from lipstream.server.auth import extract_token, token_ok

log = logging.getLogger(__name__)

CACHE_NAME = "edge-viseme"  # under <bundle>/cache/: the export's data (the page comes from the package)
TOKEN_COOKIE = "lipstream_edge_token"
TTS_HEADER = "X-Lipstream-TTS"  # on export.json from `lipstream serve`: where text can be spoken


class EdgeExports:
    """Builds an avatar's export data on first request (once, under a lock) and finds its files."""

    def __init__(self, avatars_dir: Path | None) -> None:
        self.avatars_dir = avatars_dir
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._building: set[str] = set()  # avatars whose build runs in the background

    def folder(self, name: str) -> Path:
        """The avatar's export folder, built now if missing (raises LipstreamError for an unknown avatar)."""
        bundle = load_avatar(name, self.avatars_dir)
        target = Path(bundle.path) / "cache" / CACHE_NAME
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if not self._fresh(target, bundle.frame_count):
                export_web(name, target, WebExportConfig(include_page=False), self.avatars_dir, replace=True)
        return target

    def is_built(self, bundle: AvatarBundle) -> bool:
        """The avatar's export data is there and current (cheap: reads its manifest)."""
        return self._fresh(Path(bundle.path) / "cache" / CACHE_NAME, bundle.frame_count)

    def build_in_background(self, name: str) -> None:
        """Start building the avatar's export data on a daemon thread (once at a time per avatar)."""
        with self._guard:
            if name in self._building:
                return
            self._building.add(name)

        def build() -> None:
            try:
                self.folder(name)
            except LipstreamError as exc:
                log.warning("web export data for %s could not be built: %s", name, exc)
            finally:
                with self._guard:
                    self._building.discard(name)

        threading.Thread(target=build, name=f"edge-build-{name}", daemon=True).start()

    @staticmethod
    def _fresh(target: Path, frame_count: int) -> bool:
        try:
            manifest = json.loads((target / MANIFEST).read_text())
            # an export older than this lipstream's (no eye points, no utterance edges, ...) is made again
            current = manifest.get("format_version", 0) >= EXPORT_VERSION
            return manifest["frame_count"] == frame_count and current
        except (OSError, ValueError, KeyError):
            return False


def _inside(root: Path, rel: str) -> Path | None:
    """root/rel when it stays inside root and is a file."""
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        return None
    return path


def add_edge_routes(app: FastAPI, exports: EdgeExports, token: str | None) -> None:
    """GET /edge/NAME/ (the page) and /edge/NAME/<file> (its modules from the package, data from the cache).

    With a server token, the page must be opened with ?token=T; it then rides in a cookie for the files."""

    def allowed(request: Request) -> bool:
        given = extract_token(request.headers, request.query_params) or request.cookies.get(TOKEN_COOKIE)
        return token_ok(token, given)

    @app.get("/edge/{name}")
    async def edge_root(name: str) -> Response:
        """The page lives one level down, so its relative URLs resolve under /edge/NAME/."""
        return RedirectResponse(f"/edge/{name}/")

    @app.get("/edge/{name}/{rel:path}")
    async def edge_file(name: str, rel: str, request: Request) -> Response:
        """One file of the avatar's web export."""
        if not allowed(request):
            return JSONResponse({"error": "unauthorized", "message": "open /edge/NAME/?token=TOKEN"}, 401)
        rel = rel or "index.html"
        page_file = None if any(p in _SKIP_PAGE for p in Path(rel).parts) else _inside(PAGE_DIR, rel)
        if page_file is not None:
            response: Response = FileResponse(page_file, headers={"Cache-Control": "no-store"})
        else:
            try:
                folder = await asyncio.to_thread(exports.folder, name)
            except LipstreamError as exc:
                return JSONResponse({"error": "not_found", "message": str(exc)}, 404)
            data_file = _inside(folder, rel)
            if data_file is None:
                return JSONResponse({"error": "not_found", "message": f"no file {rel} in the export"}, 404)
            response = FileResponse(
                data_file, headers={"Cache-Control": "no-cache"}, stat_result=data_file.stat()
            )
            # no-cache + ETag: a browser revalidates and gets 304 for the data it already holds (the live
            # player's patch mode downloads the base loop once this way)
            if rel == MANIFEST:  # the page is served by lipstream, whose /api/tts can speak text for it
                response.headers[TTS_HEADER] = "/api/tts"
            etag = response.headers.get("etag")
            if etag and etag in (request.headers.get("if-none-match") or ""):
                response = Response(status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache"})
        if token and request.query_params.get("token"):
            given = request.query_params["token"]
            response.set_cookie(TOKEN_COOKIE, given, httponly=True, path=f"/edge/{name}/")
        return response
