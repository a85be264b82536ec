"""Runs a .tflite artifact in a real browser: LiteRT.js in headless Chromium.

The page in `web/` loads the model with @litertjs/core (wasm/XNNPACK, or its
WebGPU backend, which web apps pick for speed) and posts its outputs back to
the small HTTP server here. WebGPU runs on Chromium's SwiftShader (Vulkan on
the CPU) on a host without a GPU: float32 arithmetic, so it checks the WebGPU
kernels and their coverage, not a phone GPU's float16 numerics. The web target's
parity uses this when a Chromium and the npm package are present; callers
decide what to do when `browser_unavailable()` gives a reason.

A conversion opens one `session()`: a single Chromium (WebGPU flags when a profile asks for
WebGPU) started before the export, whose page loads LiteRT.js (and makes its WebGPU device)
while the export runs, then runs every job of the conversion (wasm, WebGPU, LM generations),
several at once; without a session each call starts and stops its own browser.

Environment (user settings, not test hooks): TPU_PIPELINE_CHROMIUM names the
browser binary (default: the first of CHROMIUM_NAMES on PATH);
TPU_PIPELINE_LITERTJS_DIR names a node_modules folder holding @litertjs/core
(default: convert/web/node_modules, which `make install` fills).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ctypes
import http.server
import itertools
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Iterator

import numpy as np

from tpu_pipeline.convert.runtimes import overlap
from tpu_pipeline.errors import ConversionError

WEB_DIR = Path(__file__).parents[1] / "web"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Flags for a root, offline, headless box: no sandbox (root), no GPU, no
# background connections that this machine's closed network would refuse.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")
# WebGPU on a headless host without a GPU: Dawn over Chromium's SwiftShader (Vulkan on the CPU).
# Checked 2026-12-01 with Debian's chromium 156: --disable-gpu dropped and --enable-unsafe-webgpu
# given, requestAdapter() finds SwiftShader; without the flag it gives no adapter. The adapter
# flag pins SwiftShader where a real GPU is also present, so results do not depend on the host.
WEBGPU_FLAGS = ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader")
ACCELERATORS = ("wasm", "webgpu")
DTYPES = {"float32": np.float32, "int32": np.int32, "uint8": np.uint8}

log = logging.getLogger(__name__)


def chromium_path() -> str | None:
    env = os.environ.get("TPU_PIPELINE_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def litertjs_dir() -> Path:
    return Path(os.environ.get("TPU_PIPELINE_LITERTJS_DIR", WEB_DIR / "node_modules"))


def browser_unavailable() -> str | None:
    """Why the browser runtime cannot run here, or None when it can."""
    if chromium_path() is None:
        return "no Chromium found (apt-get install chromium, or set TPU_PIPELINE_CHROMIUM)"
    if not (litertjs_dir() / "@litertjs" / "core" / "dist" / "index.js").exists():
        return f"@litertjs/core not installed in {litertjs_dir()} (run `make install` or `npm ci` in {WEB_DIR})"
    return None


def run_litertjs(model: bytes | str | Path, samples: list[list[np.ndarray]], *, input_names: list[str] | None = None,
                 output_names: list[str] | None = None, timeout: float = 120.0,
                 signature: str | None = None) -> list[list[np.ndarray]]:
    """Runs each sample in headless Chromium (wasm). Inputs are given, and outputs
    returned, in the order of `input_names`/`output_names` (the signature's
    keys) when given, else in the model's tensor order. signature: run that
    signature of a model with several (shape buckets), by name; needs both name lists."""
    return run_litertjs_on("wasm", model, samples, input_names=input_names, output_names=output_names,
                           timeout=timeout, signature=signature)[0]


def run_litertjs_on(accelerator: str, model: bytes | str | Path, samples: list[list[np.ndarray]], *,
                    input_names: list[str] | None = None, output_names: list[str] | None = None,
                    timeout: float = 120.0, signature: str | None = None) -> tuple[list[list[np.ndarray]], dict]:
    """run_litertjs on LiteRT.js's `accelerator` ("wasm" or "webgpu") -> (outputs per sample,
    what ran: {"accelerator", "fully_accelerated", "adapter"}). The accelerator is the one the
    page compiled for, which LiteRT.js may have replaced with wasm (it does so unasked for a
    webgpu model that is not fully accelerated): callers compare it with the one they asked for.
    A WebGPU that cannot start raises ConversionError naming why."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator {accelerator!r}: one of {', '.join(ACCELERATORS)}")
    names = input_names or [None] * len(samples[0])
    if signature is not None and not (input_names and output_names):
        raise ValueError("a signature is run with named inputs and outputs (input_names, output_names)")
    job = {"accelerator": accelerator,
           "samples": [[_encode(a, n) for a, n in zip(sample, names)] for sample in samples],
           **({"signature": signature} if signature is not None else {})}
    result = _run_job(model, job, timeout)
    ran = {"accelerator": result.get("accelerator"), "fully_accelerated": result.get("fullyAccelerated"),
           "adapter": result.get("adapter")}
    rows = [{t["name"]: _decode(t) for t in row} for row in result["samples"]]
    if output_names:
        missing = set(output_names) - set(rows[0])
        if missing:
            raise ConversionError(f"LiteRT.js returned outputs {sorted(rows[0])}, not {sorted(missing)}")
        return [[row[n] for n in output_names] for row in rows], ran
    return [list(row.values()) for row in rows], ran


def generate_litertjs(model: bytes | str | Path, lm_meta: dict, prompts: list[list[int]], max_new_tokens: int,
                      *, timeout: float = 300.0) -> list[list[int]]:
    """Greedy generations of a decode-ready LM (lm.json's `lm_meta`) in headless Chromium."""
    job = {"lm": {k: lm_meta[k] for k in ("cache_shape", "prefill_len", "vocab_size", "eos_token_ids", "max_len")},
           "prompts": prompts, "max_new_tokens": max_new_tokens}
    result = _run_job(model, job, timeout)
    return result["generations"]


def _encode(a: np.ndarray, name: str | None = None) -> dict:
    a = np.ascontiguousarray(a)
    dtype = str(a.dtype)
    if dtype not in DTYPES:
        raise ConversionError(f"LiteRT.js tensors are float32, int32 or uint8; this input is {dtype}")
    return {"name": name, "dtype": dtype, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def _decode(t: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(t["data"]), dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).copy()


def _run_job(model: bytes | str | Path, job: dict, timeout: float) -> dict:
    reason = browser_unavailable()
    if reason:
        raise ConversionError(f"browser runtime unavailable: {reason}")
    model_bytes = Path(model).read_bytes() if isinstance(model, (str, Path)) else model
    active = _active[-1] if _active else None
    if active is not None and (job.get("accelerator") != "webgpu" or active.webgpu):
        with overlap.waiting():  # Chromium works on the job: the next target's turn meanwhile
            result = active.run(model_bytes, job, timeout)
        if not result.get("ok"):
            raise ConversionError("LiteRT.js failed in the browser: "
                                  f"{(result.get('error') or 'no result').splitlines()[0]}")
        return result
    with tempfile.TemporaryDirectory(prefix="tpp-web-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        shutil.copy(WEB_DIR / "index.html", site / "index.html")
        os.symlink(litertjs_dir(), site / "node_modules")
        (site / "model.tflite").write_bytes(model_bytes)
        (site / "job.json").write_text(json.dumps({"model": "model.tflite", **job}))
        with overlap.waiting():
            result = _serve_and_wait(site, Path(tmp) / "profile", timeout, job.get("accelerator", "wasm"))
    if not result.get("ok"):
        raise ConversionError(f"LiteRT.js failed in the browser: {result.get('error', 'no result').splitlines()[0]}")
    return result


def _flags(webgpu: bool) -> tuple[str, ...]:
    return (*(f for f in CHROMIUM_FLAGS if f != "--disable-gpu"), *WEBGPU_FLAGS) if webgpu else CHROMIUM_FLAGS


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the forked child only calls it


def _remove_singleton_dir(profile: Path) -> None:
    """Chromium keeps its singleton socket in a folder of its own in the temporary folder (the
    profile links to it) and leaves it there when stopped: one org.chromium.Chromium.* folder per
    start, removed here with the profile. (A TMPDIR inside the run's folder would do it too, but
    the socket's path can then pass the 107 bytes a Unix socket allows, and Chromium aborts.)"""
    try:
        folder = Path(os.readlink(profile / "SingletonSocket")).parent
    except OSError:
        return
    if folder.name.startswith("org.chromium.Chromium."):
        shutil.rmtree(folder, ignore_errors=True)


def _die_with_parent() -> None:
    """Run in the forked child before exec: Chromium gets SIGKILL when the thread that started it
    dies. A conversion killed with SIGKILL, or its test runner timed out, otherwise leaves a headless
    Chromium (its own session, deaf to Ctrl-C) polling a server that is gone, forever. Both
    browsers are started and waited on by the same thread, so it never fires early."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _stop(proc: subprocess.Popen) -> None:
    """Chromium and its helpers (they exit with their browser process), stopped and reaped."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _kill_group(proc: subprocess.Popen) -> None:
    """A session's Chromium, started in its own process group, and every helper it forked: killed
    at once (its graceful shutdown cost 0.7-1 s at the end of each conversion, and the profile
    folder it would save is deleted anyway), then reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _PageServer(http.server.ThreadingHTTPServer):
    """The page's HTTP server on a free local port, whose request threads handle their own errors.

    The stdlib's default prints a traceback to stderr for any error in a request thread: into a
    `--json` output or the user's terminal, from a thread nobody waits on. Chromium closes
    connections whenever it likes (a cancelled fetch; a session's browser killed while its long
    poll is being answered; a loaded box makes both likelier), so a dropped connection is only
    logged at debug level. Any other error is a bug here: logged at debug level with its traceback
    and handed to `on_error` as one line, which fails the jobs waiting on the page."""

    daemon_threads = True  # a request thread never keeps the process alive

    def __init__(self, handler: type, on_error=None):
        super().__init__(("127.0.0.1", 0), handler)
        self.on_error = on_error

    def handle_error(self, request, client_address) -> None:
        e = sys.exc_info()[1]
        if isinstance(e, ConnectionError):  # BrokenPipeError, ConnectionResetError, ConnectionAbortedError
            log.debug("page server: the browser dropped a connection (%s: %s)", type(e).__name__, e)
            return
        log.debug("page server: a request from %s failed", client_address, exc_info=True)
        if self.on_error is not None:
            self.on_error(_one_line(e))

    def start(self) -> None:
        # a short poll: shutdown() waits for it, at the end of every conversion
        threading.Thread(target=self._serve, daemon=True, name="tpp-browser-server").start()

    def _serve(self) -> None:
        try:
            self.serve_forever(poll_interval=0.05)
        except Exception as e:  # noqa: BLE001 - a thread's exception would print a traceback; the jobs fail instead
            log.debug("page server stopped", exc_info=True)
            if self.on_error is not None:
                self.on_error(_one_line(e))


class _PageHandler(http.server.SimpleHTTPRequestHandler):
    """Serves `site` (set by a subclass); logs each request at debug level, where the stdlib writes
    it to stderr."""

    site = ""
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".js": "text/javascript"}

    def __init__(self, *a, **kw):
        super().__init__(*a, directory=self.site, **kw)

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's parameter name
        log.debug("page server: " + format, *args)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


_active: list[Session] = []  # the open session, if any (a list: session() restores the one before it)
SESSION_POLL_S = 20.0  # the page's long poll for its next job: answered empty after this, and asked again


class Session:
    """One headless Chromium serving many jobs: the page (index.html?session) loads LiteRT.js once,
    then asks the server here for jobs and runs each as it comes, several at once (a WebGPU compile
    waits on the GPU process while a wasm job runs in the page). `run` submits one and waits for its
    result; a browser that exits or never answers fails the job (ConversionError), never hangs it.
    `close` stops the browser and fails any job still waiting."""

    def __init__(self, *, webgpu: bool):
        self.webgpu = webgpu
        self._jobs: queue.Queue = queue.Queue()
        self._waiting: dict[str, concurrent.futures.Future] = {}
        self._models: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._tmp = Path(tempfile.mkdtemp(prefix="tpp-web-session-"))
        site = self._tmp / "site"
        site.mkdir()
        shutil.copy(WEB_DIR / "index.html", site / "index.html")
        os.symlink(litertjs_dir(), site / "node_modules")
        self.server = _PageServer(self._handler(site), on_error=self._server_failed)
        self.server.start()
        url = f"http://127.0.0.1:{self.server.server_address[1]}/index.html?session"
        try:
            self.proc = subprocess.Popen([chromium_path(), *_flags(webgpu), f"--user-data-dir={self._tmp / 'profile'}",
                                          url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        except BaseException:
            self._shutdown_server()
            raise

    def _handler(self, site: Path):
        session = self

        class Handler(_PageHandler):
            def do_GET(self):
                path = urllib.parse.urlparse(self.path).path
                if path == "/next":
                    job = session._next()
                    try:
                        return self._json(job)
                    except ConnectionError:
                        # the page never got the job (Chromium dropped the long poll): its next poll does
                        if "id" in job:
                            session._jobs.put(job)
                        raise
                if path.startswith("/models/"):
                    data = session._models.get(path[len("/models/"):].removesuffix(".tflite"))
                    if data is None:
                        return self.send_error(404)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                return super().do_GET()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urllib.parse.urlparse(self.path)
                if url.path == "/result":
                    job_id = urllib.parse.parse_qs(url.query).get("id", [""])[0]
                    session._finish(job_id, _result(body))
                self.send_response(204)
                self.end_headers()

            def _json(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        Handler.site = str(site)
        return Handler

    def _next(self) -> dict:
        if self._closed.is_set():
            return {"close": True}
        try:
            return self._jobs.get(timeout=SESSION_POLL_S)
        except queue.Empty:
            return {"close": True} if self._closed.is_set() else {}

    def _finish(self, job_id: str, result: dict) -> None:
        with self._lock:
            self._models.pop(job_id, None)
            fut = self._waiting.pop(job_id, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def run(self, model: bytes, job: dict, timeout: float) -> dict:
        """The page's result for one job ({"ok": ..., ...}), or ConversionError when the browser
        exited, the session closed or no result came within `timeout` seconds."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed.is_set():
                raise ConversionError("the browser session is closed")
            job_id = str(next(self._ids))
            self._models[job_id], self._waiting[job_id] = model, fut
        self._jobs.put({**job, "id": job_id, "model": f"models/{job_id}.tflite"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                pass
            status = self.proc.poll()
            if status is not None or self._closed.is_set() or time.monotonic() >= deadline:
                with self._lock:
                    self._models.pop(job_id, None)
                    self._waiting.pop(job_id, None)
                if status is not None:
                    raise ConversionError(f"the browser exited (status {status}) before giving a result")
                if self._closed.is_set():
                    raise ConversionError("the browser session closed before giving a result")
                raise ConversionError(f"the browser gave no result within {timeout:.0f} s")

    def _fail_waiting(self, why: str) -> None:
        with self._lock:
            waiting, self._waiting, self._models = list(self._waiting.values()), {}, {}
        for fut in waiting:
            if not fut.done():
                fut.set_exception(ConversionError(why))

    def _server_failed(self, reason: str) -> None:
        """An error in the page server that is not a dropped connection: the jobs waiting fail with it."""
        self._fail_waiting(f"the browser page's server failed: {reason}")

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._jobs.put({"close": True})  # answers a long poll now rather than after SESSION_POLL_S
        self._fail_waiting("the browser session closed before giving a result")
        try:
            _kill_group(self.proc)
        finally:
            self._shutdown_server()

    def _shutdown_server(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        _remove_singleton_dir(self._tmp / "profile")
        shutil.rmtree(self._tmp, ignore_errors=True)


def close_sessions() -> None:
    """Stops every open session's browser now (a conversion that is stopping): the runs waiting on
    it fail at once instead of at their timeout. session() still closes each on its way out."""
    for s in list(_active):
        s.close()


@contextlib.contextmanager
def session(*, webgpu: bool) -> Iterator[Session | None]:
    """One browser for every LiteRT.js run inside the block (run_litertjs*, generate_litertjs),
    started now so that it loads while the caller works; None (and each run starts its own) when
    the browser runtime is unavailable, whose reason each run then reports. Closed on exit, on an
    error or an interrupt too: no Chromium outlives the block."""
    if browser_unavailable():
        yield None
        return
    s = Session(webgpu=webgpu)
    _active.append(s)
    try:
        yield s
    finally:
        _active.remove(s)
        s.close()


def _result(body: bytes) -> dict:
    """The page's posted result; one that is not JSON is a failed result saying so."""
    try:
        result = json.loads(body or b"{}")
    except ValueError as e:
        return {"ok": False, "error": f"the page posted a result that is not JSON ({e})"}
    return result if isinstance(result, dict) else {"ok": False, "error": f"the page posted {type(result).__name__}"}


def _serve_and_wait(site: Path, profile: Path, timeout: float, accelerator: str = "wasm") -> dict:
    done = threading.Event()
    box: dict = {}

    class Handler(_PageHandler):
        def do_POST(self):  # the page posts its result here
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            box.update(_result(body))
            self.send_response(204)
            self.end_headers()
            done.set()

    def server_failed(reason: str) -> None:
        if not done.is_set():
            box.update(ok=False, error=f"the browser page's server failed: {reason}")
            done.set()

    Handler.site = str(site)
    server = _PageServer(Handler, on_error=server_failed)
    server.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    proc = subprocess.Popen([chromium_path(), *_flags(accelerator != "wasm"), f"--user-data-dir={profile}", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        if not done.wait(timeout):
            raise ConversionError(f"the browser gave no result within {timeout:.0f} s")
        return box
    finally:
        _stop(proc)
        _remove_singleton_dir(profile)
        server.shutdown()
        server.server_close()
