"""Keeps torch-tpu from loading where no TPU exists, and asks it about TPUs from a child.

torch-tpu registers itself as a torch device backend and is auto-loaded by
every `import torch`; on a machine without a TPU it then tries to start
libtpu, and a first `.backward()` was seen to hang for over 10 minutes on a
cloud metadata lookup. `guard()` must run before torch is imported.

`probe_tpu()` asks torch-tpu how many TPU chips it sees, through torch-tpu 0.2.0's
public device API (`torch.accelerator`; torch.tpu's own is_available and device_count raise
there, "internal to TorchTPU"), in a child process: a TPU that fails to start aborts
its process (SIGABRT, "No jellyfish device found"), and that must not be ours.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys

AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"

# libtpu asks the cloud metadata server about the host at start-up; off a cloud TPU VM
# (or without network) that lookup hung for over 10 minutes. Skipped unless the user
# set it: a multi-host slice that reads its topology from the metadata server sets
# TPU_SKIP_MDS_QUERY=0 (README).
SKIP_MDS_VAR = "TPU_SKIP_MDS_QUERY"

# Documented escape hatch (README, docs/DESIGN.md): /dev/vfio/N also exists on
# hosts that pass other PCI devices (GPUs, NICs) through to a VM or container.
IGNORE_TPU_VAR = "TPU_PIPELINE_IGNORE_TPU_HARDWARE"

PROBE_TIMEOUT_VAR = "TPU_PIPELINE_TPU_PROBE_TIMEOUT"  # seconds; default 120
MIN_TORCH_TPU = (0, 2, 0)  # the first with the torch.accelerator device API

_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on the PCI bus (torch-tpu looks for the same)


def tpu_hardware_present() -> bool:
    """Signs of a TPU host that need neither torch nor torch-tpu to read."""
    if os.environ.get(IGNORE_TPU_VAR) == "1":
        return False
    if any(os.environ.get(v) for v in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID")):
        return True
    if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    return any(_read(p) == _GOOGLE_PCI_VENDOR for p in glob.glob("/sys/bus/pci/devices/*/vendor"))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def tpu_requested() -> bool:
    return os.environ.get("TPU_PIPELINE_DEVICE", "").lower() == "tpu"


def guard() -> None:
    os.environ.setdefault(SKIP_MDS_VAR, "1")  # read by libtpu when it starts, whoever imports torch
    if "torch" in sys.modules:
        return  # too late to change; whoever imported torch decided
    if not (tpu_requested() or tpu_hardware_present()):
        os.environ.setdefault(AUTOLOAD_VAR, "0")


def torch_tpu_version() -> str | None:
    try:
        return importlib.metadata.version("torch-tpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """(0, 2, 0) for "0.2.0", "0.2.0rc1" or "0.2.0+local": enough to compare releases."""
    parts = []
    for p in version.split("+")[0].split("."):
        m = re.match(r"\d+", p)
        if m is None:
            break
        parts.append(int(m.group()))
    return tuple(parts)


@dataclasses.dataclass(frozen=True)
class TpuProbe:
    count: int           # TPU chips torch-tpu sees (0: none, or the probe failed)
    version: str | None  # torch-tpu's version, None when it has no distribution record
    error: str | None    # why the count could not be read, for the user; None when it was

    @property
    def summary(self) -> str:
        """One line for a device report."""
        if self.error:
            return self.error
        return f"torch-tpu {self.version or '?'} sees {self.count} TPU chip(s)"


# Runs in the child: torch auto-loads torch-tpu (AUTOLOAD forced on below), which starts
# the TPU runtime only where it finds a Google PCI device.
_PROBE = """
import json, torch
import torch_tpu  # noqa: F401  (a no-op after the auto-load; loads it where the auto-load was skipped)
acc = getattr(torch, "accelerator", None)
if acc is None or not hasattr(acc, "device_count"):
    print(json.dumps({"error": f"torch {torch.__version__} has no torch.accelerator device API"}))
else:
    cur = acc.current_accelerator() if acc.is_available() else None
    kind = getattr(cur, "type", None)
    print(json.dumps({"count": int(acc.device_count()) if kind == "tpu" else 0, "accelerator": kind}))
"""


@functools.lru_cache(maxsize=1)
def probe_tpu() -> TpuProbe:
    """How many TPU chips torch-tpu sees, asked in a child process (cached per process).

    Never raises: a torch-tpu older than 0.2.0, a child that aborts, hangs past the
    timeout or prints no answer gives count 0 and the reason in `error`.
    """
    version = torch_tpu_version()
    if version is not None and _release(version) < MIN_TORCH_TPU:
        need = ".".join(map(str, MIN_TORCH_TPU))
        return TpuProbe(0, version, f"torch-tpu {version} predates the torch.accelerator device API; "
                                    f"tpu-pipeline needs torch-tpu >= {need} (pip install 'tpu-pipeline[tpu]')")
    timeout = float(os.environ.get(PROBE_TIMEOUT_VAR, "120"))
    env = {**os.environ, AUTOLOAD_VAR: "1"}
    env.setdefault(SKIP_MDS_VAR, "1")
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return TpuProbe(0, version, f"torch-tpu did not answer within {timeout:.0f} s "
                                    f"(the TPU runtime hung starting; {PROBE_TIMEOUT_VAR} sets the limit)")
    last = (out.stderr.strip().splitlines() or [""])[-1][:300]
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name
        return TpuProbe(0, version, f"the TPU runtime aborted starting ({name}): {last}")
    try:
        answer = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return TpuProbe(0, version, f"torch-tpu failed to load (exit {out.returncode}): {last}")
    if "error" in answer:
        return TpuProbe(0, version, answer["error"])
    return TpuProbe(int(answer["count"]), version, None)
