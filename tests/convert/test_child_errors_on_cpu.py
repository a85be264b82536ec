"""The convert stage's child processes (TFLM's worker, LiteRT's GPU worker) end with one line
saying why, never a Python traceback, and the parent's reason is that line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpu_pipeline.convert.runtimes import litert as runtimes
from tpu_pipeline.convert.runtimes.litert import child_reason, run_micro
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import ConversionError
from tpu_pipeline.testing.model_files import tiny_cnn_tflite

CONVERT = Path(runtimes.__file__).parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, path = tiny_cnn_tflite(tmp_path_factory.mktemp("child") / "model.tflite")
    return path.read_bytes()


def test_child_reason_is_one_line():
    traceback = ('Traceback (most recent call last):\n  File "w.py", line 3, in <module>\n    main()\n'
                 'RuntimeError: Failed to allocate tensor arena\n')
    assert child_reason(traceback, 1) == "RuntimeError: Failed to allocate tensor arena"
    assert child_reason("", -11) == "killed by SIGSEGV"
    assert child_reason("some log\n", 3) == "exit status 3"


def test_tflm_worker_fails_with_one_line(tmp_path, tiny):
    (tmp_path / "model.tflite").write_bytes(tiny)
    proc = subprocess.run([sys.executable, str(CONVERT / "iot" / "_micro_worker.py"), str(tmp_path / "model.tflite"),
                           str(tmp_path / "missing.npz"), str(tmp_path / "out.npz"), "65536", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("FileNotFoundError: "), proc.stderr


def test_run_micro_reason_is_one_line_without_a_traceback(tiny):
    info = inspect_model(tiny)
    x = np.zeros((1, 1, 8, 8), np.float32)
    with pytest.raises(ConversionError) as e:
        run_micro(tiny[:200] + b"\0" * (len(tiny) - 200), info, [[x]], 65536)  # a truncated flatbuffer
    msg = str(e.value)
    assert msg.startswith("TFLM interpreter failed") and "\n" not in msg
    assert "Traceback" not in msg and 'File "' not in msg, msg


def test_gpu_worker_fails_with_one_line_and_a_status(tmp_path, tiny):
    (tmp_path / "model.tflite").write_bytes(tiny)
    paths = [str(tmp_path / n) for n in ("model.tflite", "missing-job.json", "in.npz", "out.npz", "status.json")]
    proc = subprocess.run([sys.executable, str(CONVERT / "runtimes" / "gpu_worker.py")], input=json.dumps(paths) + "\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("FileNotFoundError: "), proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["started"] is False and status["error"].startswith("FileNotFoundError: ")


def test_a_gpu_worker_whose_job_never_came_exits_quietly():
    proc = subprocess.run([sys.executable, str(CONVERT / "runtimes" / "gpu_worker.py")], input="", capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
