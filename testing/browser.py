"""Serve the admin app in-process with waitress and drive Debian's headless chromium at it.

Shared by tests/test_page_browser.py and bench/page_load.py. chromium's own `--dump-dom` and
`--screenshot` are enough: the page applies `#q=` from its URL on load, so a search needs no clicks,
and `--virtual-time-budget` lets the page's fetches finish before the DOM is dumped.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading

from prometheus_client import CollectorRegistry
from waitress import create_server

from extender.http.admin import create_admin_app


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def serving(extender):
    """The admin app on 127.0.0.1 (a loopback peer, as the page requires); yields its base URL."""
    server = create_server(create_admin_app(extender, CollectorRegistry()), host="127.0.0.1", port=0, threads=4)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.close()
        thread.join(5)


def run_chromium(url: str, *args: str, timeout: float = 60) -> str:
    """chromium headless on `url` with `args` (e.g. --dump-dom); its stdout."""
    with tempfile.TemporaryDirectory(prefix="tessera-chromium-") as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args, url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout
