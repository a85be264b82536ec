"""The MediaPipe Tasks child: which interpreter runs _mediapipe_worker.py (its own venv, built by
`make install`: mediapipe 1.2.2's numpy/protobuf/opencv pins are its own) and one call to it.
A client that crashes or hangs costs a timeout or an exit status, never the conversion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tpu_pipeline.errors import ConversionError

WORKER = Path(__file__).with_name("_mediapipe_worker.py")
TIMEOUT_S = 300
ENV = "TPU_PIPELINE_MEDIAPIPE_PYTHON"


def mediapipe_python() -> Path | None:
    """TPU_PIPELINE_MEDIAPIPE_PYTHON, else .venv-mediapipe beside this interpreter's venv (the
    repository root's, as `make install` builds them), else None."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    beside = Path(sys.prefix).parent / ".venv-mediapipe" / "bin" / "python"
    return beside if beside.is_file() else None


def missing() -> str | None:
    """Why the client check cannot run here (None when it can)."""
    py = mediapipe_python()
    if py is None:
        return (f"MediaPipe Tasks is not installed: `make install` builds .venv-mediapipe (or set {ENV} to a Python "
                "with mediapipe==1.2.2)")
    return None if py.is_file() else f"{ENV}={py}: no such interpreter"


def call(request: dict, what: str) -> dict:
    """Runs one request in the MediaPipe child -> its JSON answer. A child that fails says why in
    one line (ConversionError)."""
    why = missing()
    if why:
        raise ConversionError(f"{what}: {why}")
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-mediapipe-") as d:
        req, ans = Path(d) / "request.json", Path(d) / "answer.json"
        req.write_text(json.dumps(request))
        env = {**os.environ, "GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}
        try:
            p = subprocess.run([str(mediapipe_python()), str(WORKER), str(req), str(ans)], capture_output=True,
                               text=True, timeout=TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            raise ConversionError(f"{what}: MediaPipe did not answer in {TIMEOUT_S} s") from None
        if ans.is_file():
            answer = json.loads(ans.read_text())
            if answer.get("error"):
                raise ConversionError(f"{what}: {answer['error']}")
            return answer
        tail = [ln for ln in (p.stderr or "").splitlines() if ln.strip()]
        raise ConversionError(f"{what}: the MediaPipe child exited {p.returncode} "
                              f"({tail[-1] if tail else 'no output'})")
