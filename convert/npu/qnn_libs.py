"""Where Qualcomm's x86 QNN libraries come from, for LiteRT's Qualcomm compiler plugin.

LiteRT's plugin wants libQnnHtp/Ir/Saver/System/Lpai.so from the QAIRT SDK, which its
`ai-edge-litert-sdk-qualcomm` package downloads from Qualcomm at install time. onnxruntime-qnn
(the `[npu]` extra) ships QNN 2.51's x86 libraries in its wheel; the plugin accepts them. They are
never copied into or next to another package's files: a folder this project owns (the user cache)
holds symlinks to them, and LiteRT's own `sdk_libs_path` argument of its apply-plugin component
points the compiler at it (convert/npu/compile.py).

The libraries are Qualcomm's, under the Qualcomm AI Stack licence (object code inside an
application; onnxruntime_qnn/Qualcomm_LICENSE.pdf), not this project's Apache-2.0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

from tpu_pipeline.errors import UserError

INSTALL_HINT = "pip install 'tpu-pipeline[npu]'"
# Read by the plugin; onnxruntime-qnn 2.7.0 has all but libQnnLpai.so (the low-power audio island
# backend), which the plugin links but never calls for HTP: it resolves to one of the others (the
# dynamic loader sees the same file once), so no stub binary has to be built.
NEEDED = ("libQnnHtp.so", "libQnnIr.so", "libQnnSaver.so", "libQnnSystem.so")
STAND_IN = {"libQnnLpai.so": "libQnnSystem.so"}
SDK_ENV = "TPU_PIPELINE_QNN_SDK_LIBS"  # a QAIRT SDK's lib/x86_64-linux-clang, used as it is


@dataclasses.dataclass(frozen=True)
class QnnLibs:
    lib_dir: Path         # what the compiler plugin is pointed at
    source: str           # where the libraries came from, for the report
    qnn_version: str      # QNN SDK version of those libraries
    ort_qnn_version: str  # onnxruntime-qnn, whose EP runs the simulator


def require() -> QnnLibs:
    """The QNN libraries, ready for the compiler; a UserError in one line without the extra."""
    try:
        import onnxruntime  # noqa: F401
        import onnxruntime_qnn
        from onnxruntime_qnn import build_and_package_info as info
    except ImportError:
        raise UserError(f"target android-npu needs Qualcomm's QNN libraries and the HTP simulator: "
                        f"{INSTALL_HINT}") from None
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError(f"target android-npu needs onnx to run the compiled model on the HTP simulator: "
                        f"{INSTALL_HINT}") from None
    src = Path(onnxruntime_qnn.LIB_DIR_FULL_PATH)
    override = os.environ.get(SDK_ENV)
    if override:
        d = Path(override)
        missing = [n for n in NEEDED if not (d / n).is_file()]
        if missing:
            raise UserError(f"{SDK_ENV}={override}: {', '.join(missing)} not found there")
        return QnnLibs(d, f"{SDK_ENV}={override}", info.qnn_version, info.__version__)
    return QnnLibs(_linked(src, info.__version__), f"onnxruntime-qnn {info.__version__} ({src})",
                   info.qnn_version, info.__version__)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-pipeline"


def _linked(src: Path, version: str) -> Path:
    """cache/tpu-pipeline/qnn-<version>/: symlinks to onnxruntime-qnn's libraries, made once and
    replaced (never edited) when the installed package moved."""
    missing = [n for n in NEEDED if not (src / n).is_file()]
    if missing:
        raise UserError(f"onnxruntime-qnn {version} at {src} lacks {', '.join(missing)}; reinstall: {INSTALL_HINT}")
    # one folder per installed copy: two venvs (a clone's CI beside a checkout) never repoint each other's links
    name = f"qnn-{version}-{hashlib.sha256(str(src).encode()).hexdigest()[:10]}"
    d = cache_root() / name
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home (CI sandboxes): the links go to the temporary folder instead
        d = Path(tempfile.gettempdir()) / f"tpu-pipeline-{os.getuid()}" / name
    want = {n: src / n for n in NEEDED} | {n: src / s for n, s in STAND_IN.items()}
    # auditwheel's libc++ beside them: the libraries find it through $ORIGIN, which a symlink moves here
    vendored = src.parent / f"{src.name}.libs"
    want |= {p.name: p for p in sorted(vendored.glob("*.so*"))} if vendored.is_dir() else {}
    if d.is_dir() and all((d / n).is_symlink() and os.readlink(d / n) == str(t) for n, t in want.items()):
        return d
    d.mkdir(parents=True, exist_ok=True)
    for n, t in want.items():
        tmp = d / f".{n}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(t)
        os.replace(tmp, d / n)  # atomic: a conversion running beside this one never sees a missing link
    return d


def versions() -> dict:
    out = {}
    for dist in ("onnxruntime", "onnxruntime-qnn", "onnx"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
