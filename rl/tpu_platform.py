"""A VeRL platform for TorchTPU: device "tpu", Ray resource "TPU".

Registered with `verl.plugin.platform.PlatformRegistry` under the name "tpu"
by `register()`, which this module calls on import only where `torch_tpu` is
installed (VeRL workers import it through
`actor_rollout_ref.model.external_lib=tpu_pipeline.rl.tpu_platform`, set by
`--engine verl` on a TPU host, with VERL_PLATFORM=tpu).

The names are those of VeRL's own TPU platform (verl-hardware-plugin's PlatformTPU):
device "tpu", collective backend "tpu_dist" (what torch-tpu registers with
torch.distributed once a TPU starts; gloo where it has not; TPU_PIPELINE_TPU_DIST_BACKEND
overrides), Ray resource "TPU". Device queries go through torch-tpu 0.2.0's public
`torch.accelerator` API: its legacy torch.tpu device queries raise.

Not verified on TPU hardware. Checked against the real torch-tpu 0.2.0 and VeRL without
a TPU (tests/core/test_tpu_contract_on_cpu.py, in .venv-tpu), and with a fake torch_tpu.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any, Optional

import torch
import torch.distributed as dist

from tpu_pipeline._tpu_guard import tpu_hardware_present

PLATFORM_NAME = "tpu"
DIST_BACKEND = "tpu_dist"  # torch_tpu/_loader.py: Backend.register_backend("tpu_dist", ...)
RAY_RESOURCE = "TPU"


def _tpu() -> ModuleType:
    importlib.import_module("torch_tpu")  # registers torch.tpu
    tpu = getattr(torch, "tpu", None)
    if tpu is None:
        raise RuntimeError("torch_tpu is installed but torch.tpu is missing")
    return tpu


def _platform_class():
    # heavy: verl's plugin package imports its trainer utilities; only TPU hosts register
    from verl.plugin.platform import PlatformBase

    class PlatformTPU(PlatformBase):
        """TorchTPU behind VeRL's platform interface."""

        @property
        def device_name(self) -> str:
            return "tpu"

        @property
        def vendor_name(self) -> str:
            return "google"

        @property
        def device_module(self) -> ModuleType:
            return _tpu()

        def is_available(self) -> bool:
            try:
                _tpu()
                cur = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
                return getattr(cur, "type", None) == PLATFORM_NAME
            except Exception:  # noqa: BLE001 - a missing runtime means "not available"
                return False

        def is_platform_available(self, use_smi_check=False) -> bool:
            # CPU-only Ray actors on a TPU host see the hardware but no device: say yes
            # there without loading torch_tpu (which could start libtpu).
            if use_smi_check:
                return importlib.util.find_spec("torch_tpu") is not None and tpu_hardware_present()
            return self.is_available()

        def current_device(self) -> int:
            _tpu()
            return int(torch.accelerator.current_device_index())

        def device_count(self) -> int:
            return int(torch.accelerator.device_count()) if self.is_available() else 0

        def set_device(self, device_index: int) -> None:
            _tpu()
            torch.accelerator.set_device_index(device_index)

        def synchronize(self, device_index: Optional[int] = None) -> None:
            _tpu()
            torch.accelerator.synchronize(device_index)

        def manual_seed(self, seed: int) -> None:
            tpu = _tpu()
            (tpu.manual_seed if hasattr(tpu, "manual_seed") else torch.manual_seed)(seed)

        def manual_seed_all(self, seed: int) -> None:
            tpu = _tpu()
            (tpu.manual_seed_all if hasattr(tpu, "manual_seed_all") else self.manual_seed)(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return  # no caching-allocator knobs exposed by TorchTPU

        def empty_cache(self) -> None:
            tpu = _tpu()
            if hasattr(tpu, "empty_cache"):
                tpu.empty_cache()

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return (None, None)

        def communication_backend_name(self) -> str:
            override = os.environ.get("TPU_PIPELINE_TPU_DIST_BACKEND")
            if override:
                return override
            return DIST_BACKEND if DIST_BACKEND in getattr(dist.Backend, "backend_list", []) else "gloo"

        def visible_devices_envvar(self) -> str:
            return "TPU_VISIBLE_CHIPS"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return

        def profiler_stop(self) -> None:
            return

        def ray_resource_name(self) -> str:
            return RAY_RESOURCE

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformTPU


_registered = None


def register():
    """Registers the TPU platform with VeRL (idempotent); returns its class."""
    global _registered
    if _registered is None:
        from verl.plugin.platform import PlatformRegistry  # heavy: see _platform_class

        _registered = PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
    return _registered


if importlib.util.find_spec("torch_tpu") is not None:
    register()
