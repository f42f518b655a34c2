"""One headless Chromium per test module that drives a browser (a pytest plugin listed in conftest.py).

Every driver script in tests/browser used to start Chromium of its own, a few seconds each on 2 cores; now a
module with `browser` tests starts tests/browser/browser_server.mjs once, and the scripts' launchChromium()
connects to it through LIPSTREAM_CHROMIUM_WS (each script still gets its own pages and contexts, closed when
it ends). Scripts that need other flags (a fake microphone, WebGPU) still start their own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

BROWSER_DIR = Path(__file__).resolve().parent / "browser"
CHROMIUM = Path("/usr/lib/chromium/chromium")
ENDPOINT_ENV = "LIPSTREAM_CHROMIUM_WS"


class SharedChromium:
    """tests/browser/browser_server.mjs in a subprocess: a Chromium that driver scripts connect to."""

    def __init__(self, start_timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [shutil.which("node") or "node", "browser_server.mjs"], cwd=BROWSER_DIR,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(start_timeout)
        if not line or not line[0].startswith("{"):
            self.stop()
            raise RuntimeError(f"browser_server.mjs did not start: {line} {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        self.ws_endpoint: str = json.loads(line[0])["wsEndpoint"]

    def stop(self) -> None:
        """Close its stdin (it closes the browser and exits), then reap it."""
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _module_drives_a_browser(request: pytest.FixtureRequest) -> bool:
    """Whether a test of this module that this process runs carries the `browser` mark."""
    module = request.node
    return any(
        item.get_closest_marker("browser") is not None
        for item in request.session.items
        if item.nodeid.startswith(module.nodeid + "::")
    )


@pytest.fixture(scope="module", autouse=True)
def shared_chromium(request: pytest.FixtureRequest) -> Iterator[SharedChromium | None]:
    """The module's shared Chromium (None in a module without browser tests, or where Chromium is missing:
    run_browser_script then names what to install)."""
    ready = (BROWSER_DIR / "node_modules" / "playwright-core").is_dir() and CHROMIUM.exists()
    if not ready or not _module_drives_a_browser(request):
        yield None
        return
    browser = SharedChromium()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENDPOINT_ENV, browser.ws_endpoint)
        try:
            yield browser
        finally:
            browser.stop()
