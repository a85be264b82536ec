"""A quiet terminal: a normal run shows the tool's own lines, not its libraries' chatter.

Importing litert-torch (every `convert`, and `rl` through torchao) prints lines a user can do
nothing about: torchao's failed loads of its CUDA kernels and "no triton" on a CPU host, torch's
deprecation of `register_constant()` for torchao's enums, absl's "before InitializeLog" notice and
TensorFlow's oneDNN notice from native code, and TFLite's "Created ... XNNPACK delegate". `--debug`
(or TPU_PIPELINE_DEBUG=1) skips all of this and shows everything.

Python loggers are quieted by level. The native lines are written by C++ straight to file
descriptor 2 (TF_CPP_MIN_LOG_LEVEL does not reach them in these builds), so fd 2 becomes a pipe
whose reader drops only the lines matching NATIVE_NOISE and passes everything else through at
once, partial lines included; children inherit the pipe, so their own output (a traceback
included) still reaches the terminal. sys.stderr keeps writing to fd 2, so convert's own
redirect of fd 2 around an export (convert/tool_output.py) still catches what it caught; stderr
is then no TTY (no colours on it), which none of the tool's lines needs.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading

# Python loggers whose WARNING lines are about the library's own build, not the user's model.
LIBRARY_LOGGERS = (
    "torchao",  # "Failed to load .../_C_cutlass_90a.abi3.so", "Detected no triton" (CPU hosts)
    "torch.utils._pytree",  # register_constant() deprecated for torchao's Enum subclasses
)

# Whole lines native code writes to fd 2 at import or on the first interpreter.
NATIVE_NOISE = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} [\d:.]+ +\d+ [\w./-]+:\d+\] .*"  # absl INFO lines (TensorFlow's oneDNN notice)
    rb"|INFO: Created TensorFlow Lite XNNPACK delegate for CPU\."
)


def quiet() -> None:
    """Quiet the libraries for the rest of this process (the CLI's entry point calls it once)."""
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    _filter_fd2()


def _filter_fd2() -> None:
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, terminal), name="stderr-filter", daemon=True)
    pump.start()

    def restore() -> None:
        # the pipe's last writer in this process goes; the reader drains what is left and ends
        # (a child still holding the pipe would keep it open: wait a moment, not forever)
        sys.stderr.flush()
        os.dup2(terminal, 2)
        pump.join(timeout=2)

    atexit.register(restore)


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


_NOISE_HEADS = (b"WARNING: All log messages before absl", b"INFO: Created TensorFlow Lite XNNPACK")


def _may_be_noise(partial: bytes) -> bool:
    # native loggers write a line in one write(); only a noise line cut by the pipe's buffer is held
    if len(partial) >= 4096:
        return False
    if re.match(rb"I\d{4} ", partial):
        return True
    return any(head.startswith(partial[:len(head)]) for head in _NOISE_HEADS)
