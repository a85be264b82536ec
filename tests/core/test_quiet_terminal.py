"""A quiet terminal and notebook (tpu_pipeline/library_noise.py): the libraries' chatter only with --debug."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tpu_pipeline.library_noise import _pump

# What `convert` printed before library_noise.py, on any host: absl's notice from litert-torch's native
# import, torch's deprecation for torchao's enums, TFLite's delegate line at the first parity run.
LIBRARY_LINES = ("absl::InitializeLog() is called", "Calling register_constant() on Enum subclasses",
                 "Created TensorFlow Lite XNNPACK delegate")
# Also printed on this CPU host (torchao's CUDA kernels, TensorFlow's oneDNN), never in a quiet run.
HOST_LINES = ("Failed to load", "oneDNN custom operations are on")


def pumped(*writes: bytes) -> bytes:
    """What the fd 2 filter lets through, for these writes into its pipe."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    t = threading.Thread(target=_pump, args=(r_in, w_out))
    t.start()
    for chunk in writes:
        os.write(w_in, chunk)
    os.close(w_in)
    t.join(timeout=10)
    os.close(w_out)
    with os.fdopen(r_out, "rb") as f:
        return f.read()


def test_filter_drops_the_native_lines_and_keeps_the_rest():
    out = pumped(
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        b"I0000 00:00:1796178701.434420   13817 port.cc:153] oneDNN custom operations are on. ...\n",
        b"  export: torch -> float32 .tflite\n",
        b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n",
        b"WARNING: Logging before InitGoogle() is written to STDERR\n",
        b"WARNING: Cache file is stale. Setting stale flag.\n",
        b"WARNING: [npu_registry.cc:34] NPU accelerator could not be loaded and registered: kLiteRtStatusErrorNotFound.\n",
        b"WARNING: [npu_registry.cc:34] NPU accelerator could not be loaded and registered: kLiteRtStatusErrorInternal.\n",
        b"E1202 02:31:47.152000 13817 foo.cc:1] a native error stays\n",
        b"Traceback (most recent call last):\n  File \"x.py\", line 1\n",
    )
    assert out == (b"  export: torch -> float32 .tflite\n"
                   b"WARNING: [npu_registry.cc:34] NPU accelerator could not be loaded and registered: kLiteRtStatusErrorInternal.\n"
                   b"E1202 02:31:47.152000 13817 foo.cc:1] a native error stays\n"
                   b"Traceback (most recent call last):\n  File \"x.py\", line 1\n")


def test_filter_passes_a_partial_line_at_once():
    # a progress bar redrawn with \r, or a prompt, must not wait for a newline that never comes
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    t = threading.Thread(target=_pump, args=(r_in, w_out), daemon=True)
    t.start()
    os.write(w_in, b"step 3/10\r")
    assert os.read(r_out, 100) == b"step 3/10\r"
    os.close(w_in)
    t.join(timeout=10)
    os.close(w_out), os.close(r_out)


def test_filter_drops_a_noise_line_cut_in_two_and_keeps_one_that_only_starts_alike():
    assert pumped(b"INFO: Created TensorFlow", b" Lite XNNPACK delegate for CPU.\n", b"I", b"nterrupted.\n") == b"Interrupted.\n"


# Registered before quiet_process(), so they run after its own exit handlers, as LiteRT's C++ destructors
# write after all of Python's: a noise line dropped, a real last line kept, the command's line in between.
AT_EXIT = """
import atexit, os, sys
atexit.register(os.write, 2, b"last words\\n")
atexit.register(os.write, 2, b"INFO: [accelerator_registry.cc:43] DestroyAccelerator\\n")
from tpu_pipeline.library_noise import quiet_process
quiet_process()
print("the command's line", file=sys.stderr)
"""


@pytest.mark.slow
def test_the_cli_filter_drops_lines_written_as_the_process_ends():
    run = subprocess.run([sys.executable, "-c", AT_EXIT], capture_output=True, timeout=120)
    assert (run.returncode, run.stderr) == (0, b"the command's line\nlast words\n")


@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory):
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    path = tmp_path_factory.mktemp("quiet") / "tiny.pt2"
    torch.export.save(torch.export.export(net, (torch.randn(1, 16),)), path)
    return path


def convert(pt2: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    exe = shutil.which("tpu-pipeline", path=str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if k != "TPU_PIPELINE_DEBUG"}
    return subprocess.run([exe, *flags, "convert", str(pt2), "--targets", "desktop", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_convert_prints_only_its_own_lines_and_debug_shows_the_rest(tiny_pt2, tmp_path):
    quiet_run = convert(tiny_pt2, tmp_path / "quiet")
    assert quiet_run.returncode == 0, quiet_run.stderr
    assert "export: torch -> float32 .tflite" in quiet_run.stderr  # the tool's own progress stays
    for line in LIBRARY_LINES + HOST_LINES + ("FutureWarning",):  # torch's LeafSpec warning loading a .pt2
        assert line not in quiet_run.stderr, quiet_run.stderr
    debug_run = convert(tiny_pt2, tmp_path / "debug", "--debug")
    assert debug_run.returncode == 0, debug_run.stderr
    # the libraries still print these (else the filter above proves nothing); --debug shows them
    for line in LIBRARY_LINES:
        assert line in debug_run.stderr, debug_run.stderr


API_SCRIPT = """
import sys, torch
import tpu_pipeline.convert as tc
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3)).eval()
progress = {"none": None, "off": False}[sys.argv[2]]
r = tc.convert(net, (torch.randn(1, 3, 8, 8),), targets="desktop", out=sys.argv[1], samples=4, latency=False,
               progress=progress)
print("passed", r.passed)
"""


@pytest.mark.slow
def test_the_python_api_prints_only_the_tools_own_lines_in_a_fresh_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TPU_PIPELINE_DEBUG"}
    runs = {p: subprocess.run([sys.executable, "-c", API_SCRIPT, str(tmp_path / p), p], capture_output=True,
                              text=True, env=env, timeout=600) for p in ("none", "off")}
    for run in runs.values():
        assert run.returncode == 0 and run.stdout == "passed True\n", (run.stdout, run.stderr)
    # progress=None: a line a step through the tpu_pipeline logger's own handler ("  " + the step), nothing else
    lines = runs["none"].stderr.splitlines()
    assert "  export: torch -> float32 .tflite (litert-torch, traced once)" in lines, lines
    assert "  write: artifacts, model.json, report.json, report.html" in lines, lines
    assert all(line.startswith("  ") and not line.startswith("   ") for line in lines), lines
    assert runs["off"].stderr == ""  # progress=False: silent
