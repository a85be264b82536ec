"""What the third-party tools convert drives (litert-torch, ai-edge-quantizer,
the LiteRT analyzer) print and raise, made fit for our own output: their C++
and progress logs go to a file (`quiet_native`), their exceptions become one
line of a message (`first_line`)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def quiet_native(log_path: Path | None = None) -> Iterator[Path]:
    """Sends the converter's progress lines and C++ logs (fd 1/2) to a log file,
    so `--json` output and the progress display stay clean. Without `log_path` the
    file is a temporary one, removed on exit (each export, quantization and check
    made one, and none was ever removed: thousands piled up in /tmp)."""
    fd, name = tempfile.mkstemp(prefix="tpu-pipeline-convert-", suffix=".log") if log_path is None else (
        os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), str(log_path))
    saved = [os.dup(1), os.dup(2)]
    try:
        # heavy: loads litert_torch (~8 s), which every caller is about to use. Its rich console
        # writes to sys.stdout, which a host (click's CliRunner, a notebook) may have replaced.
        import litert_torch.progress as progress

        progress.console.quiet = True
    except Exception:  # noqa: BLE001 - older/newer layouts: the fd redirect still applies
        pass
    try:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(fd, 1), os.dup2(fd, 2)
        yield Path(name)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)
        if log_path is None:
            with contextlib.suppress(OSError):
                os.unlink(name)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), at most 300 characters."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]
