"""Runs a .tflite artifact in a real browser: LiteRT.js in headless Chromium.

The page in `web/` loads the model with @litertjs/core (wasm/XNNPACK, or its
WebGPU backend, which web apps pick for speed) and posts its outputs back to
the small HTTP server here. WebGPU runs on Chromium's SwiftShader (Vulkan on
the CPU) on a host without a GPU: float32 arithmetic, so it checks the WebGPU
kernels and their coverage, not a phone GPU's float16 numerics. The web target's
parity uses this when a Chromium and the npm package are present; callers
decide what to do when `browser_unavailable()` gives a reason.

Environment (user settings, not test hooks): TPU_PIPELINE_CHROMIUM names the
browser binary (default: the first of CHROMIUM_NAMES on PATH);
TPU_PIPELINE_LITERTJS_DIR names a node_modules folder holding @litertjs/core
(default: convert/web/node_modules, which `make install` fills).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from tpu_pipeline.errors import ConversionError

WEB_DIR = Path(__file__).parent / "web"
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
                 output_names: list[str] | None = None, timeout: float = 120.0) -> list[list[np.ndarray]]:
    """Runs each sample in headless Chromium (wasm). Inputs are given, and outputs
    returned, in the order of `input_names`/`output_names` (the signature's
    keys) when given, else in the model's tensor order."""
    return run_litertjs_on("wasm", model, samples, input_names=input_names, output_names=output_names,
                           timeout=timeout)[0]


def run_litertjs_on(accelerator: str, model: bytes | str | Path, samples: list[list[np.ndarray]], *,
                    input_names: list[str] | None = None, output_names: list[str] | None = None,
                    timeout: float = 120.0) -> tuple[list[list[np.ndarray]], dict]:
    """run_litertjs on LiteRT.js's `accelerator` ("wasm" or "webgpu") -> (outputs per sample,
    what ran: {"accelerator", "fully_accelerated", "adapter"}). The accelerator is the one the
    page compiled for, which LiteRT.js may have replaced with wasm (it does so unasked for a
    webgpu model that is not fully accelerated): callers compare it with the one they asked for.
    A WebGPU that cannot start raises ConversionError naming why."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator {accelerator!r}: one of {', '.join(ACCELERATORS)}")
    names = input_names or [None] * len(samples[0])
    job = {"accelerator": accelerator,
           "samples": [[_encode(a, n) for a, n in zip(sample, names)] for sample in samples]}
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
    with tempfile.TemporaryDirectory(prefix="tpp-web-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        shutil.copy(WEB_DIR / "index.html", site / "index.html")
        os.symlink(litertjs_dir(), site / "node_modules")
        (site / "model.tflite").write_bytes(model_bytes)
        (site / "job.json").write_text(json.dumps({"model": "model.tflite", **job}))
        result = _serve_and_wait(site, Path(tmp) / "profile", timeout, job.get("accelerator", "wasm"))
    if not result.get("ok"):
        raise ConversionError(f"LiteRT.js failed in the browser: {result.get('error', 'no result').splitlines()[0]}")
    return result


def _serve_and_wait(site: Path, profile: Path, timeout: float, accelerator: str = "wasm") -> dict:
    done = threading.Event()
    box: dict = {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(site), **kw)

        def do_POST(self):  # the page posts its result here
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            box.update(json.loads(body or b"{}"))
            self.send_response(204)
            self.end_headers()
            done.set()

        def log_message(self, *args):
            pass

    Handler.extensions_map = {**Handler.extensions_map, ".wasm": "application/wasm", ".js": "text/javascript"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    flags = CHROMIUM_FLAGS if accelerator == "wasm" else (
        *(f for f in CHROMIUM_FLAGS if f != "--disable-gpu"), *WEBGPU_FLAGS)
    proc = subprocess.Popen([chromium_path(), *flags, f"--user-data-dir={profile}", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not done.wait(timeout):
            raise ConversionError(f"the browser gave no result within {timeout:.0f} s")
        return box
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        server.shutdown()
        server.server_close()
