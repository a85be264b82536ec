"""The libraries' chatter a user can do nothing about, kept off the terminal and the notebook.

Importing litert-torch (every conversion, and `rl` through torchao) and running LiteRT print lines
that say nothing about the user's model: torchao's failed loads of its CUDA kernels, torch's
deprecation of `register_constant()` for torchao's enums, absl's "before InitializeLog" notice and
TensorFlow's oneDNN notice from native code, TFLite's "Created ... XNNPACK delegate", LiteRT's
accelerator registry and LiteRT-LM's loader lines, Transformers' "Loading weights" and "Writing
model shards" bars, and torch's FutureWarnings raised from inside its own modules (a .pt2's
`LeafSpec`).

- The CLI quiets the whole process once (`quiet_process`, from its entry point); its filter is a
  small child process that reads until the last writer is gone, because LiteRT's C++ destructors
  write ("DestroyAccelerator") after Python's atexit handlers, when a thread could no longer read.
- The Python API quiets each public call while it runs (`quieted`, a context manager and
  decorator): a script or notebook then shows only the tool's own lines, and everything the user
  prints or logs outside those calls is untouched.
- `TPU_PIPELINE_DEBUG=1` (the CLI's `--debug`) skips all of this and shows everything.

Python loggers are quieted by level and warnings by a filter. The native lines are written by C++
straight to file descriptor 2 (TF_CPP_MIN_LOG_LEVEL does not reach them in these builds), so fd 2
becomes a pipe whose reader drops only the lines matching NATIVE_NOISE and passes everything else
through at once, partial lines included; children inherit the pipe, so their own output (a
traceback included) still reaches the terminal. sys.stderr keeps writing to fd 2, so convert's own
redirect of fd 2 around an export (convert/tool_output.py) still catches what it caught.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import warnings

# Python loggers whose WARNING lines are about the library's own build, not the user's model.
LIBRARY_LOGGERS = (
    "torchao",  # "Failed to load .../_C_cutlass_90a.abi3.so", "Detected no triton" (CPU hosts)
    "torch.utils._pytree",  # register_constant() deprecated for torchao's Enum subclasses
)

# Whole lines native code writes to fd 2 at import, on the first interpreter, or loading an LM bundle.
NATIVE_NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\] .*"  # absl INFO lines (TensorFlow's oneDNN notice, LiteRT-LM)
    rb"|W\d{4} [\d:.]+ +\d+ litert_lm_loader\.cc:\d+\] .*"  # LiteRT-LM: optional bundle sections "not found"
    rb"|INFO: Created TensorFlow Lite XNNPACK delegate for CPU\."
    rb"|INFO: \[[\w./-]+:\d+\] .*"  # LiteRT's own INFO lines ("[accelerator_registry.cc:43] DestroyAccelerator")
    rb"|WARNING: Logging before InitGoogle\(\) is written to STDERR"  # LiteRT-LM's engine
    rb"|WARNING: Cache file is stale\. Setting stale flag\."  # XNNPACK's weight cache, rebuilt by itself
    # LiteRT-LM looks for an NPU on every host and says so when there is none; the bundle runs on CPU
    rb"|WARNING: \[npu_registry\.cc:\d+\] NPU accelerator could not be loaded and registered: kLiteRtStatusErrorNotFound\."
)

_NOISE_HEADS = (b"WARNING: All log messages before absl", b"INFO: Created TensorFlow Lite XNNPACK", b"INFO: [",
                b"WARNING: Logging before InitGoogle", b"WARNING: [npu_registry.cc:", b"WARNING: Cache file is stale")

# Transformers (and huggingface_hub) read this when imported, in this process and in children.
_NO_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"


def debug_wanted() -> bool:
    return os.environ.get("TPU_PIPELINE_DEBUG") == "1"


def quiet_process() -> None:
    """Quiet the libraries for the rest of this process (the CLI's entry point calls it once)."""
    global _depth
    with _lock:
        if _depth:
            return
        _depth = 1  # never undone: the process ends with the command
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    _dependency_warnings_off()
    os.environ[_NO_BARS] = "1"
    _transformers_bars(False)
    _filter_fd2_until_exit()


@contextlib.contextmanager
def _quiet_call():
    global _depth, _undo
    if debug_wanted():
        yield
        return
    with _lock:
        first = _depth == 0
        _depth += 1
        if first:
            _undo = _quiet_until_undone()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            undo, last = _undo, _depth == 0
        if last and undo is not None:
            undo()


class quieted(contextlib.ContextDecorator):
    """Quiet the libraries while a Python API call runs: `with quieted():` or `@quieted()` on a
    public function. Nested and concurrent calls share one filter; the last one out restores the
    terminal, the loggers, the warning filters and Transformers' progress bars as they were."""

    def __enter__(self):
        self._cm = _quiet_call()
        return self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


_lock = threading.Lock()
_depth = 0
_undo = None


def _quiet_until_undone():
    levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    caught = warnings.catch_warnings()
    caught.__enter__()
    _dependency_warnings_off()
    had_env = os.environ.get(_NO_BARS)
    os.environ[_NO_BARS] = "1"
    bars = _transformers_bars(False)
    restore_fd2 = _filter_fd2()

    def undo() -> None:
        restore_fd2()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        caught.__exit__(None, None, None)
        if had_env is None:
            os.environ.pop(_NO_BARS, None)
        else:
            os.environ[_NO_BARS] = had_env
        # imported during the call with the variable set: its bars are off unless put back
        _transformers_bars(bars if bars is not None else had_env is None)

    return undo


def _dependency_warnings_off() -> None:
    # later filters are matched first: the tool's own deprecations still show
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=category, module=r"tpu_pipeline(\.|$)")


def _transformers_bars(on: bool) -> bool | None:
    """Turns Transformers' tqdm bars on or off if it is imported; returns whether they were on."""
    if "transformers" not in sys.modules:
        return None
    try:
        from transformers.utils import logging as hf_logging  # already imported: costs nothing
    except Exception:  # noqa: BLE001 - a half-imported or other transformers: leave its bars alone
        return None
    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
    return was


def _filter_fd2():
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, terminal), name="stderr-filter", daemon=True)
    pump.start()
    done = []

    def restore() -> None:
        if done:
            return
        done.append(True)
        # the pipe's last writer in this process goes; the reader drains what is left and ends
        # (a child still holding the pipe would keep it open: wait a moment, not forever)
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(terminal, 2)
        pump.join(timeout=2)
        if not pump.is_alive():
            os.close(terminal)

    return restore


def _filter_fd2_until_exit() -> None:
    read_end, write_end = os.pipe()
    sys.stderr.flush()
    try:
        # its own session: the terminal's Ctrl-C reaches the command, not the filter that shows its last lines
        subprocess.Popen([sys.executable, "-I", "-S", __file__], stdin=read_end, stdout=2, start_new_session=True)
    except OSError:  # no interpreter to start (a frozen or unusual host): the thread filter, undone at exit
        os.close(read_end), os.close(write_end)
        atexit.register(_filter_fd2())
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)


def _pump(read_end: int, terminal: int) -> None:
    pending = b""
    while chunk := os.read(read_end, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        out = b"".join(line + b"\n" for line in lines if not NATIVE_NOISE.fullmatch(line.rstrip(b"\r")))
        # a partial line (a prompt, a progress bar redrawn with \r) goes out now, not at its newline
        if pending and not _may_be_noise(pending):
            out, pending = out + pending, b""
        if out:
            os.write(terminal, out)
    if pending:
        os.write(terminal, pending)
    os.close(read_end)


def _may_be_noise(partial: bytes) -> bool:
    # native loggers write a line in one write(); only a noise line cut by the pipe's buffer is held
    if len(partial) >= 4096:
        return False
    if re.match(rb"[IW]\d{4} ", partial):
        return True
    return any(head.startswith(partial[:len(head)]) for head in _NOISE_HEADS)


if __name__ == "__main__":  # the CLI's filter process (_filter_fd2_until_exit): stdin is the pipe, stdout the terminal
    _pump(0, 1)
