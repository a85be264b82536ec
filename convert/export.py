"""PyTorch -> one float32 .tflite with litert-torch. Every target variant is
derived from this one artifact (quantize.py): the model is traced once."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from tpu_pipeline.convert.loaders import LoadedModel, first_line
from tpu_pipeline.errors import ConversionError


@contextlib.contextmanager
def quiet_native(log_path: Path | None = None) -> Iterator[Path]:
    """Sends the converter's progress lines and C++ logs (fd 1/2) to a log file,
    so `--json` output and the progress display stay clean."""
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


def export_float(model: LoadedModel, path: Path) -> bytes:
    """Converts `model` at its sample inputs; returns the .tflite bytes (also written to `path`)."""
    try:
        import litert_torch  # heavy: ~8 s to import (the TFLite converter stack); only exports need it

        with quiet_native():
            edge = litert_torch.convert(model.module, model.sample_args)
            edge.export(str(path))
    except Exception as e:  # noqa: BLE001 - the converter raises many types; all mean "cannot convert"
        raise ConversionError(f"litert-torch could not convert the model: {type(e).__name__}: {first_line(e)}") from None
    return path.read_bytes()
