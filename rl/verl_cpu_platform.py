"""A VeRL platform for CPU-only hosts: device "cpu", gloo, vLLM's CPU backend.

VeRL 0.9.1 knows CUDA, NPU and ROCm. This module adds what its Ray trainer
needs to run on a machine without an accelerator, from outside VeRL (no
installed file is edited):

- `PlatformCPU`, registered with `verl.plugin.platform.PlatformRegistry` as
  "cpu" when this module is imported. `--engine verl` on a CPU host imports it
  in every VeRL process through VeRL's own `VERL_USE_EXTERNAL_MODULES` and
  selects it with `VERL_PLATFORM=cpu` (see `ENV`). It is never auto-detected:
  `is_platform_available` says yes only when VERL_PLATFORM=cpu asks for it.
- Ray counts only GPU/NPU resources in VeRL's ResourcePoolManager, so the
  platform's Ray resource is "GPU", and the local launch starts Ray with fake GPUs
  (one per trainer process; nothing ever touches CUDA). A job on a running CPU
  cluster (`--ray-address`, whose nodes were started plainly, without GPUs) sets
  CLUSTER_SLOT_ENV instead: the resource is "CPU", each trainer process holds CPU
  (wrapper 5).
- `device_module` is `CPU_DEVICE`: the torch.cuda-like calls VeRL makes
  (empty_cache, mem_get_info, rng state, ...), answered for the CPU. Every
  call is recorded in `CALLED` (the hook list the TPU platform is held to).

Wrappers of VeRL internals, each named in `WRAPPED` and tested
(tests/rl/test_verl_cpu_platform_on_cpu.py) so that a VeRL upgrade that
moves one fails a test, not a user:

1. `verl.utils.distributed.initialize_global_process_group_ray`: VeRL builds
   the backend "cpu:gloo,{device}:{backend}", which for device "cpu" is
   "cpu:gloo,cpu:gloo" and torch refuses ("Duplicate device type cpu"); the
   wrapper passes "gloo".
2. The FSDP engine registry has engines for cuda/npu only: VeRL's own
   `VERL_ENGINE_DEVICE=cuda` (in `ENV`) selects the device-agnostic FSDP
   engine; no wrapper needed, the lookup is tested.
3. vLLM-CPU weight sync: `tpu_pipeline.rl.verl_cpu_vllm.CpuWorkerExtension`
   (a subclass of VeRL's vLLM worker extension, named through
   rollout.engine_kwargs.vllm.worker_extension_cls): each update through vLLM's
   layer-wise reload, VeRL's whole-model re-processing replaced for its duration.
4. The weight-transfer socket (`private_ipc`): VeRL names it
   /tmp/rl-colocate-zmq-<Ray job id>-..., and every local Ray cluster numbers its
   first job 01000000, so two `rl --engine verl` runs on one host bound the same
   path and a rollout could receive the other run's weights. Both ends move it
   into the run's own temporary folder: the receiver in CpuWorkerExtension, the
   sender in `tpu_pipeline.rl.verl_cpu_vllm.CpuServerAdapter`, registered in
   VeRL's rollout registry in place of its vLLM ServerAdapter.
5. CPU slots on a cluster without GPUs (CLUSTER_SLOT_ENV): VeRL's placement groups take the
   platform's resource name, but `ResourcePoolManager._check_resource_available` counts
   GPU/NPU by name (wrapped to count CPUs), and the vLLM server launch reads each trainer
   worker's `get_accelerator_ids()[resource][0]` for CUDA_VISIBLE_DEVICES (Ray lists only
   accelerators there: the wrapper adds "CPU": ["0"], a visible-device string the CPU ignores).
   VeRL makes one STRICT_PACK placement group per node of its pool and counts on each node's
   GPUs running out to spread them; CPUs rarely run out, so the placement groups VeRL creates
   (`verl.single_controller.ray.base.placement_group`) are hinted to the alive nodes in turn
   (Ray's `_soft_target_node_id`): `--nnodes 2` puts a trainer process on each of two nodes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import types
from typing import Any, Optional

import torch

PLATFORM_NAME = "cpu"

# The environment every VeRL process of a CPU run gets (driver, Ray workers,
# vLLM's engine): loads this module through VeRL's external-module hook and
# chooses the platform and the engine registry key.
ENV = {
    "VERL_USE_EXTERNAL_MODULES": "tpu_pipeline.rl.verl_cpu_platform",
    "VERL_PLATFORM": PLATFORM_NAME,
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_TARGET_DEVICE": "cpu",
}

# A job on a running CPU cluster: VeRL's trainer processes hold CPUs, not fake GPUs (wrapper 5).
SLOT_VAR = "TPU_PIPELINE_CPU_SLOT"
CLUSTER_SLOT_ENV = {SLOT_VAR: "CPU"}


def slot_resource() -> str:
    """The Ray resource each VeRL trainer process holds: "CPU" on a CPU cluster, else fake "GPU"s."""
    return "CPU" if os.environ.get(SLOT_VAR, "").strip().upper() == "CPU" else "GPU"


# The VeRL internals this module wraps or relies on, "module:attribute" (tested to exist).
WRAPPED = (
    "verl.utils.distributed:initialize_global_process_group_ray",
    "verl.workers.engine.base:EngineRegistry.get_engine_cls",
    "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension.update_weights_from_ipc",
    "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._iter_all_models_with_config",
    "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._get_zmq_handle",
    "verl.workers.rollout.base:_ROLLOUT_REGISTRY",
    "verl.single_controller.ray.base:ResourcePoolManager._check_resource_available",
    "ray.runtime_context:RuntimeContext.get_accelerator_ids",
    "verl.single_controller.ray.base:placement_group",
    # VeRL's last update step, which the weight sync replaces while an update runs
    "vllm.model_executor.model_loader.utils:process_weights_after_loading",
    "vllm.model_executor.model_loader.reload:initialize_layerwise_reload",
    "vllm.model_executor.model_loader.reload:finalize_layerwise_reload",
)

CALLED: set[str] = set()  # device-module and platform hooks VeRL called in this process


class CpuIndex(str):
    """The "current device" on CPU. VeRL uses it both as a torch device
    (`tensor.to(get_device_id())`, where an int would mean CUDA) and inside
    f"{device_name}:{get_device_id()}": a str "cpu" that formats as 0."""

    def __new__(cls):
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __index__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 0


def _mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of host memory, as torch.cuda.mem_get_info reports a GPU's."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _zero(*_a, **_k) -> int:
    return 0


def _none(*_a, **_k) -> None:
    return None


# name -> implementation of the torch.cuda-like calls VeRL makes on its device module.
_DEVICE_CALLS = {
    "is_available": lambda: True,
    "is_initialized": lambda: True,
    "device_count": lambda: 1,
    "current_device": lambda: CpuIndex(),
    "set_device": _none,
    "synchronize": _none,
    "empty_cache": _none,
    "ipc_collect": _none,
    "reset_peak_memory_stats": _none,
    "mem_get_info": lambda *_a: _mem_get_info(),
    "memory_allocated": _zero,
    "memory_reserved": _zero,
    "max_memory_allocated": _zero,
    "max_memory_reserved": _zero,
    "memory_stats": lambda *_a, **_k: {},
    "get_device_name": lambda *_a: "cpu",
    "get_rng_state": lambda *_a, **_k: torch.get_rng_state(),
    "set_rng_state": lambda state, *_a, **_k: torch.set_rng_state(state),
    "manual_seed": lambda seed: torch.manual_seed(seed),
    "manual_seed_all": lambda seed: torch.manual_seed(seed),
    "Stream": torch.cpu.Stream,
    "Event": torch.cpu.Event,
    "current_stream": torch.cpu.current_stream,
    "stream": torch.cpu.stream,
}


class _CpuDeviceModule(types.ModuleType):
    """torch.cuda's shape for the CPU; records each call's name in CALLED. A name
    it does not know fails with AttributeError naming it (never a silent no-op)."""

    def __getattr__(self, name: str) -> Any:
        impl = _DEVICE_CALLS.get(name)
        if impl is None:
            raise AttributeError(f"tpu_pipeline's CPU device module has no {name!r} (VeRL asked for it)")
        if not callable(impl) or isinstance(impl, type):
            CALLED.add(f"device.{name}")
            return impl

        @functools.wraps(impl)
        def call(*a, **k):
            CALLED.add(f"device.{name}")
            return impl(*a, **k)

        return call


CPU_DEVICE = _CpuDeviceModule("tpu_pipeline_cpu_device")


def _platform_class():
    # heavy: verl's plugin package imports its device utilities; only VeRL processes import this module
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """The host CPU behind VeRL's platform interface."""

        def __getattribute__(self, name: str):
            if not name.startswith("_"):
                CALLED.add(f"platform.{name}")
            return super().__getattribute__(name)

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return CPU_DEVICE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            # chosen explicitly only: a GPU host never auto-detects the CPU platform
            return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

        def current_device(self):
            return CpuIndex()

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return  # the CPU allocator has no expandable segments

        def empty_cache(self) -> None:
            return

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the fake GPUs each worker holds

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return

        def profiler_stop(self) -> None:
            return

        def ray_resource_name(self) -> str:
            # VeRL's ResourcePoolManager counts only GPU/NPU: the local launch declares fake GPUs; a CPU
            # cluster's nodes offer CPUs (wrapper 5)
            return slot_resource()

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            # Ray takes CPUs as num_cpus, never in `resources`
            return {"num_cpus": num_gpus} if slot_resource() == "CPU" else {"num_gpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False  # weights go to vLLM through shared memory

        def rollout_env_vars(self) -> dict[str, str]:
            return {"VLLM_TARGET_DEVICE": "cpu"}

        def cudart(self) -> Any:
            return None

    return PlatformCPU


# VeRL's vLLM rollout (the sender of the weights), replaced by our subclass (wrapper 4)
VLLM_ROLLOUT_KEY = ("vllm", "async")
CPU_ROLLOUT = "tpu_pipeline.rl.verl_cpu_vllm.CpuServerAdapter"


# The longest path a Unix socket takes (sun_path is 108 bytes with its terminating NUL).
SOCKET_PATH_MAX = 107


def private_ipc(handle: str) -> str:
    """Wrapper 4: a socket VeRL puts in /tmp goes to this process's temporary folder (the launch
    gives every process of a run the same private TMPDIR, /tmp/tpray-*/tmp), unless that path is
    too long for a socket, where VeRL's own path stays."""
    prefix = "ipc:///tmp/"
    if not handle.startswith(prefix):
        return handle
    path = os.path.join(tempfile.gettempdir(), handle[len(prefix):])
    return "ipc://" + path if len(path.encode()) <= SOCKET_PATH_MAX else handle


def _gloo_process_group(init):
    """Wrapper 1: VeRL's "cpu:gloo,cpu:gloo" backend string becomes "gloo" on the CPU platform."""

    @functools.wraps(init)
    def wrapped(timeout_second=None, backend=None):
        CALLED.add("wrap.initialize_global_process_group_ray")
        return init(timeout_second=timeout_second, backend=backend or "gloo")

    wrapped.__tpu_pipeline_wrapped__ = True
    return wrapped


def _count_cpu_slots(check):
    """Wrapper 5: VeRL's resource check, counting CPUs when the trainer's slots are CPUs."""

    @functools.wraps(check)
    def wrapped(self):
        if slot_resource() != "CPU":
            return check(self)
        CALLED.add("wrap.check_resource_available")
        import ray  # heavy: only VeRL's processes call this

        free = sum(n.get("CPU", 0) for n in ray._private.state.available_resources_per_node().values())
        need = sum(n for nodes in self.resource_pool_spec.values() for n in nodes)
        if free < need:
            raise ValueError(f"Total available CPUs {free} is less than the {need} VeRL's trainer processes hold")

    wrapped.__tpu_pipeline_wrapped__ = True
    return wrapped


def _cpu_accelerator_ids(get_ids):
    """Wrapper 5: each worker's accelerator ids with a CPU entry, as VeRL's vLLM launch reads them."""

    @functools.wraps(get_ids)
    def wrapped(self):
        ids = get_ids(self)
        if slot_resource() == "CPU":
            ids.setdefault("CPU", ["0"])
        return ids

    wrapped.__tpu_pipeline_wrapped__ = True
    return wrapped


def _spread_over_nodes(make_pg):
    """Wrapper 5: VeRL's per-node placement groups, each hinted to the next alive node with CPUs."""
    turn = [0]

    @functools.wraps(make_pg)
    def wrapped(*args, **kwargs):
        if slot_resource() == "CPU" and kwargs.get("strategy") == "STRICT_PACK" and \
                kwargs.get("_soft_target_node_id") is None:
            import ray  # heavy: only VeRL's processes call this

            nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU"))
            if nodes:
                CALLED.add("wrap.placement_group")
                kwargs["_soft_target_node_id"] = nodes[turn[0] % len(nodes)]
                turn[0] += 1
        return make_pg(*args, **kwargs)

    wrapped.__tpu_pipeline_wrapped__ = True
    return wrapped


_registered = None


def register():
    """Registers the CPU platform with VeRL and installs wrapper 1 (idempotent); returns the class."""
    global _registered
    if _registered is None:
        # heavy: see _platform_class
        import verl.utils.distributed as vdist
        from verl.plugin.platform import PlatformRegistry
        from verl.workers.rollout import base as rollout_base

        _registered = PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
        if not getattr(vdist.initialize_global_process_group_ray, "__tpu_pipeline_wrapped__", False):
            vdist.initialize_global_process_group_ray = _gloo_process_group(vdist.initialize_global_process_group_ray)
        rollout_base._ROLLOUT_REGISTRY[VLLM_ROLLOUT_KEY] = CPU_ROLLOUT
        if slot_resource() == "CPU":
            from ray.runtime_context import RuntimeContext
            from verl.single_controller.ray import base as ray_base
            from verl.single_controller.ray.base import ResourcePoolManager

            if not getattr(ray_base.placement_group, "__tpu_pipeline_wrapped__", False):
                ray_base.placement_group = _spread_over_nodes(ray_base.placement_group)
            if not getattr(ResourcePoolManager._check_resource_available, "__tpu_pipeline_wrapped__", False):
                ResourcePoolManager._check_resource_available = _count_cpu_slots(
                    ResourcePoolManager._check_resource_available)
            if not getattr(RuntimeContext.get_accelerator_ids, "__tpu_pipeline_wrapped__", False):
                RuntimeContext.get_accelerator_ids = _cpu_accelerator_ids(RuntimeContext.get_accelerator_ids)
    return _registered


# VeRL imports this module (VERL_USE_EXTERNAL_MODULES) in each of its processes: register there.
# Elsewhere only when a CPU run asked for it, so importing it never changes another platform's VeRL.
if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
    register()
