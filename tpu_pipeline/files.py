"""Atomic writes, checksums and staged output folders.

Nothing a command writes may look valid when it is not: files are written to
a temporary name and renamed, folders are built beside their final place and
moved in only when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp makes the file 0600; a written file gets what open() would give it (0666 less the
        # umask), so a web server or another user can read model.json beside model.tflite
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it process-wide: a race with threads
    that write files at the same time)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def json_text(obj: Any, indent: int | None = None) -> str:
    """Standard JSON, which apps parse (JavaScript's JSON.parse, Swift's JSONDecoder): a figure that is
    not finite (an SNR of exact outputs, a NaN output) is written as null, never as Infinity or NaN."""
    return json.dumps(_plain(obj), indent=indent, allow_nan=False)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json_text(obj, indent=2) + "\n")


def append_jsonl(path: str | Path, obj: Any) -> None:
    with open(path, "a") as f:
        f.write(json_text(obj) + "\n")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """Yields an empty folder beside `final`; on success it replaces `final`.

    On any exception the staging folder is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    os.chmod(stage, 0o777 & ~_umask())  # mkdtemp's 0700 would become the output folder's mode
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(stage, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _plain(obj: Any) -> Any:
    """`obj` as what json.dumps takes: numpy / torch scalars and arrays as Python numbers and lists,
    paths as strings, a float that is not finite as None; anything else JSON lacks raises TypeError."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if not isinstance(obj, (str, bytes, int)) and hasattr(obj, "tolist"):
        return _plain(obj.tolist())
    return obj
