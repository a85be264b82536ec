"""The web target's page server (convert/runtimes/browser.py) handles its own errors: a browser that drops a
connection costs a debug log line, never a traceback on stderr (it once ended a `convert --json`
output: BrokenPipeError from a request thread), and a job whose delivery was dropped is handed out
again; any other error in a request becomes the waiting job's failure with its reason.

No Chromium needed: TPU_PIPELINE_CHROMIUM names a stand-in "browser" that only sleeps (or, for the
one-shot page, posts one result), and the test speaks HTTP to the server as the page would."""

from __future__ import annotations

import http.client
import json
import socket
import stat
import struct
import sys
import threading
import time

import pytest

from tpu_pipeline.convert.runtimes import browser
from tpu_pipeline.errors import ConversionError


@pytest.fixture
def sleeping_browser(tmp_path, monkeypatch):
    """A stand-in browser that never asks for a job: the test is the page."""
    path = tmp_path / "fake-chromium"
    path.write_text("#!/bin/sh\nexec sleep 120\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("TPU_PIPELINE_CHROMIUM", str(path))
    monkeypatch.setattr(browser, "SESSION_POLL_S", 1.0)  # an empty long poll answers within a second
    return path


def _reset(sock: socket.socket) -> None:
    """Closes with a TCP reset, as a killed browser's connection ends: the server's next write fails."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _post(port: int, path: str, body: bytes, headers: dict | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def _run_in_thread(session: browser.Session, model: bytes, timeout: float) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["result"] = session.run(model, {"accelerator": "wasm", "samples": []}, timeout)
        except ConversionError as e:
            box["error"] = str(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_a_dropped_long_poll_prints_nothing_and_the_job_is_handed_out_again(sleeping_browser, capfd):
    s = browser.Session(webgpu=False)
    port = s.server.server_address[1]
    try:
        polling = threading.Event()
        ask = s._next
        s._next = lambda: (polling.set(), ask())[1]  # the request thread is in the long poll: no job yet
        page = socket.create_connection(("127.0.0.1", port), timeout=10)
        page.sendall(b"GET /next HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert polling.wait(10), "the server never took the long poll"
        _reset(page)  # the browser goes before its answer: the job is written to a reset connection
        t, box = _run_in_thread(s, b"tflite bytes", timeout=60)

        job, deadline = {}, time.monotonic() + 20
        while "id" not in job and time.monotonic() < deadline:  # the page's next polls
            status, body = _get(port, "/next")
            assert status == 200
            job = json.loads(body)
        assert "id" in job, "the job written to the dropped connection was lost"
        assert _get(port, "/" + job["model"]) == (200, b"tflite bytes")
        assert _post(port, f"/result?id={job['id']}", json.dumps({"ok": True, "samples": []}).encode()) == 204
        t.join(10)
        assert box == {"result": {"ok": True, "samples": []}}
    finally:
        s.close()
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), err  # no traceback, no request log: nothing at the default log level


def test_a_dropped_connection_is_logged_at_debug_level(sleeping_browser, caplog):
    s = browser.Session(webgpu=False)
    port = s.server.server_address[1]
    try:
        polling = threading.Event()
        ask = s._next
        s._next = lambda: (polling.set(), ask())[1]
        page = socket.create_connection(("127.0.0.1", port), timeout=10)
        page.sendall(b"GET /next HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert polling.wait(10)
        with caplog.at_level("DEBUG", logger=browser.__name__):
            _reset(page)
            deadline = time.monotonic() + 10  # the empty long poll answers within SESSION_POLL_S
            while "dropped a connection" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        s.close()
    dropped = [r for r in caplog.records if "dropped a connection" in r.getMessage()]
    assert dropped and all(r.levelname == "DEBUG" for r in dropped), caplog.text
    assert "ConnectionResetError" in dropped[0].getMessage() or "BrokenPipeError" in dropped[0].getMessage()


def test_an_error_in_a_request_fails_the_waiting_job_with_its_reason(sleeping_browser, capfd):
    s = browser.Session(webgpu=False)
    port = s.server.server_address[1]
    try:
        t, box = _run_in_thread(s, b"m", timeout=60)
        t0 = time.monotonic()
        # a request the handler cannot read (a Content-Length that is not a number): a bug, not a disconnect
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            _post(port, "/result?id=1", b"{}", headers={"Content-Length": "many"})
        t.join(20)
        assert time.monotonic() - t0 < 20  # failed at once, not at its 60 s timeout
        assert box["error"].startswith("the browser page's server failed: ValueError: invalid literal"), box
    finally:
        s.close()
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), err


def test_a_result_that_is_not_json_fails_its_job(sleeping_browser, capfd):
    s = browser.Session(webgpu=False)
    port = s.server.server_address[1]
    try:
        t, box = _run_in_thread(s, b"m", timeout=60)
        status, body = _get(port, "/next")
        job = json.loads(body)
        assert _post(port, f"/result?id={job['id']}", b"<html>not json") == 204
        t.join(10)
        assert box["result"]["ok"] is False and "not JSON" in box["result"]["error"], box
    finally:
        s.close()
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), err


ONE_SHOT_BROWSER = """#!{python}
# A stand-in for Chromium on the one-shot page: it drops one request for index.html, then posts a
# result that is not JSON.
import socket, struct, sys, urllib.request
url = sys.argv[-1]
host, port = url.split("/")[2].split(":")
s = socket.create_connection((host, int(port)))
s.sendall(b"GET /index.html HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
urllib.request.urlopen(urllib.request.Request(url.rsplit("/", 1)[0] + "/result", data=b"{{oops", method="POST"))
"""


def test_the_one_shot_page_reports_a_bad_result_instead_of_a_traceback(tmp_path, monkeypatch, capfd):
    fake = tmp_path / "fake-chromium"
    fake.write_text(ONE_SHOT_BROWSER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("TPU_PIPELINE_CHROMIUM", str(fake))
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html></html>")
    result = browser._serve_and_wait(site, tmp_path / "profile", timeout=60)
    assert result["ok"] is False and "not JSON" in result["error"], result
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), err
