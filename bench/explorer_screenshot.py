"""The screenshot in docs/convert/verdict.md: a failing target's artifact in Model Explorer with the
per-layer error overlay convert wrote beside it (convert/verdict/layer_errors.py).

    .venv/bin/python bench/explorer_screenshot.py DIR/<target>/failed docs/convert/layer_errors.png

Starts Model Explorer's own server on the artifact and its overlay (the command model.json names),
opens the page in headless Chromium over the DevTools protocol, waits until the graph is drawn
and saves a PNG. A docs asset, not a test: nothing here judges the overlay
(tests/convert/test_api_on_cpu.py checks it against Model Explorer's TFLite adapter)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tpu_pipeline.convert.runtimes.browser import chromium_path


class DevTools:
    """The few DevTools calls a screenshot needs, over the page's websocket (stdlib only)."""

    def __init__(self, ws_url: str):
        host, port, path = re.match(r"ws://([^:/]+):(\d+)(/.*)", ws_url).groups()
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(head.decode(errors="replace"))
        self.n = 0

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self._send(json.dumps({"id": self.n, "method": method, "params": params}).encode())
        while True:
            msg = json.loads(self._recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def _send(self, data: bytes) -> None:
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 1 << 16 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _recv(self) -> bytes:
        out = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            out += self._exact(n)
            if b0 & 0x80:
                return out

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools closed the socket")
            buf += chunk
        return buf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(folder: Path, png: Path, wait_s: float = 120.0) -> None:
    model, overlay = folder / "model.tflite", folder / "layer_errors.json"
    explorer = Path(sys.executable).with_name("model-explorer")
    port, dt_port = _free_port(), _free_port()
    server = subprocess.Popen([str(explorer), str(model), "--node_data_paths", str(overlay), "--no_open_in_browser",
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    profile = tempfile.mkdtemp(prefix="explorer-shot-")
    browser = None
    try:
        url = None
        for line in server.stdout:
            m = re.search(r"(http://localhost:\d+/\?data=\S+)", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            raise RuntimeError("model-explorer did not start")
        browser = subprocess.Popen([chromium_path(), "--headless", "--no-sandbox", "--use-angle=swiftshader",
                                    "--enable-unsafe-swiftshader", f"--user-data-dir={profile}",
                                    "--window-size=1400,900", f"--remote-debugging-port={dt_port}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{dt_port}/json"))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        dt = DevTools(next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"])
        dt.call("Page.navigate", url=url)
        # drawn: the graph's canvas is on the page and no "Processing graph" / "Converting" is left
        probe = ("(() => { const t = document.body.innerText; return !!document.querySelector('canvas') && "
                 "!/Processing graph|Converting/.test(t); })()")
        while not dt.call("Runtime.evaluate", expression=probe, returnByValue=True)["result"].get("value"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the graph was not drawn within {wait_s:.0f} s")
            time.sleep(1.0)
        # every layer opened, so each op shows its own colour (the toolbar's "expand all layers")
        dt.call("Runtime.evaluate", expression=(
            "[...document.querySelectorAll('mat-icon')].find(e => e.textContent.trim() === 'unfold_more_double')"
            ".closest('[class*=icon-container],button,div').click()"))
        time.sleep(3.0)  # the overlay's colours are applied after the first frame
        shot = dt.call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))
        print(f"{png}: {png.stat().st_size} bytes")
    finally:
        for p in (browser, server):
            if p is not None:
                p.terminate()
                p.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)  # Chromium's profile: nothing left in /tmp


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
