"""Keeps torch-tpu from loading where no TPU exists.

torch-tpu registers itself as a torch device backend and is auto-loaded by
every `import torch`; on a machine without a TPU it then tries to start
libtpu, and a first `.backward()` was seen to hang for over 10 minutes on a
cloud metadata lookup. This module must run before torch is imported.
"""

from __future__ import annotations

import glob
import os
import sys

AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"


# Documented escape hatch (README, docs/DESIGN.md): /dev/vfio/N also exists on
# hosts that pass other PCI devices (GPUs, NICs) through to a VM or container.
IGNORE_TPU_VAR = "TPU_PIPELINE_IGNORE_TPU_HARDWARE"


def tpu_hardware_present() -> bool:
    """Signs of a TPU host that need neither torch nor torch-tpu to read."""
    if os.environ.get(IGNORE_TPU_VAR) == "1":
        return False
    if any(os.environ.get(v) for v in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID")):
        return True
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def tpu_requested() -> bool:
    return os.environ.get("TPU_PIPELINE_DEVICE", "").lower() == "tpu"


def guard() -> None:
    if "torch" in sys.modules:
        return  # too late to change; whoever imported torch decided
    if not (tpu_requested() or tpu_hardware_present()):
        os.environ.setdefault(AUTOLOAD_VAR, "0")
