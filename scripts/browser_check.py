"""Open a report in Debian's headless chromium: no console errors, no missing images, a full-page screenshot.

    python scripts/browser_check.py results/report/index.html --screenshot results/report/screenshot.png

Talks to chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 in, fd 4 out, messages
ending in NUL), so it needs nothing beyond the standard library and `apt-get install -y chromium`.
Exit 0 when the page is clean, 1 when it is not (problems printed), 2 when chromium cannot be run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Counts the images that did not load: no pixels (naturalWidth 0) or never finished.
BROKEN_IMAGES_JS = ("JSON.stringify(Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                    ".map(i => i.alt || i.src.slice(0, 80)))")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """A minimal DevTools-protocol client over chromium's debugging pipe."""

    def __init__(self, binary: str, user_data_dir: str):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def as_fds_3_and_4():
            # Copy both ends out of the way first: either may itself be fd 3 or 4.
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={user_data_dir}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=as_fds_3_and_4,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            e = self._read(deadline)
            self.events.append(e)
            if e.get("method") == method:
                return e

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the debugging pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def check_page(html_path: Path, screenshot: Path, width: int = 1280) -> list[str]:
    """Load the page; return its problems (console errors, exceptions, failed loads, broken images)."""
    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        dt = DevTools(binary, profile)
        try:
            target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                dt.send(f"{domain}.enable", session=session)
            dt.send("Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
            dt.send("Page.navigate", {"url": html_path.resolve().as_uri()}, session=session)
            dt.wait_for("Page.loadEventFired", timeout=60)
            broken = json.loads(dt.send("Runtime.evaluate", {"expression": BROKEN_IMAGES_JS, "returnByValue": True},
                                        session=session)["result"]["value"])
            n_images = dt.send("Runtime.evaluate", {"expression": "document.images.length", "returnByValue": True},
                               session=session)["result"]["value"]
            size = dt.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            shot = dt.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}}, session=session)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        finally:
            dt.close()
    problems = [f"image did not load: {b}" for b in broken]
    if n_images == 0:
        problems.append("the page has no images")
    for e in dt.events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = (str(a.get("value", a.get("description", ""))) for a in p["args"])
            problems.append("console error: " + " ".join(args))
        elif method == "Runtime.exceptionThrown":
            problems.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            problems.append(f"browser error: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        elif method == "Network.loadingFailed":
            problems.append(f"load failed: {p.get('errorText')}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("--screenshot", type=Path, required=True)
    args = ap.parse_args(argv)
    if not args.html.is_file():
        print(f"{args.html}: no such report", file=sys.stderr)
        return 2
    try:
        problems = check_page(args.html, args.screenshot)
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"browser check: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    print(f"{args.html}: {'clean' if not problems else f'{len(problems)} problem(s)'}; screenshot {args.screenshot}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
