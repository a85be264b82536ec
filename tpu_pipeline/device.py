"""Device runtime: where tensors live, how code compiles, how Pallas runs.

`select_device` picks TPU (through TorchTPU), else CUDA, else CPU, and
returns a `Platform` that every stage reads instead of asking torch itself.
TPUs are counted by `_tpu_guard.probe_tpu` (torch-tpu's public `torch.accelerator`
API, in a child process); this process loads torch-tpu only once a TPU is there.
`compile` is torch.compile with that platform's backend; `inductor_pallas=True` makes
Inductor emit Pallas kernels (its Pallas code generator) for the graph.

torch is imported lazily so that `import tpu_pipeline` stays cheap and the
torch-tpu guard in `_tpu_guard` runs first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import platform as pyplatform
from typing import Any, Callable, Iterator

from tpu_pipeline._tpu_guard import probe_tpu, tpu_hardware_present
from tpu_pipeline.errors import UserError

DEVICE_KINDS = ("auto", "tpu", "cuda", "cpu")

# Our names for torch_tpu's eager modes. "strict" is plain eager everywhere.
EAGER_MODES = {
    "strict": "DEFER_NEVER",       # run each op as it is issued
    "fused": "DEFER_AND_FUSE",     # defer ops and fuse them into larger XLA programs
    "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",  # like CUDA_LAUNCH_BLOCKING: errors point at the op
}


@dataclasses.dataclass(frozen=True)
class Platform:
    kind: str               # "tpu" | "cuda" | "cpu"
    device: Any             # torch.device
    count: int              # devices of this kind visible to this process
    name: str               # human-readable hardware name
    bf16: bool              # native bfloat16 math (autocast worth using)
    compile_backend: str    # torch.compile backend: "tpu" on TPU, "inductor" elsewhere
    kernel_lowering: str    # how our Pallas kernels run here: "mosaic-tpu", "gpu" or "interpret"
    reason: str             # why this device was chosen

    @property
    def kernels_interpreted(self) -> bool:
        return self.kernel_lowering == "interpret"

    def describe(self) -> dict:
        d = dataclasses.asdict(self)
        d["device"] = str(self.device)
        return d


def _torch():
    import torch  # deferred: the torch-tpu guard must run first, and doctor/--help stay fast

    return torch


def torch_tpu_installed() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None


def _load_torch_tpu(torch) -> None:
    """Makes device "tpu" usable in this process: torch-tpu's own loader (its
    `torch.backends` entry point, what torch's auto-load calls), unless it already ran.

    JAX stays on the CPU in this process: it only traces and exports the Pallas kernels
    (torch-tpu's jax_op runs them on the chips torch-tpu holds), and a JAX TPU backend
    would try to open those chips too (torch-tpu warns that two frameworks on one PJRT
    plugin deadlocked). A user's own JAX_PLATFORMS is left alone."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    importlib.import_module("torch_tpu")
    if torch._C._get_privateuse1_backend_name() == "tpu":
        return
    for ep in importlib.metadata.entry_points(group="torch.backends"):
        if ep.name == "torch_tpu":
            ep.load()()


def _cuda_count() -> int:
    torch = _torch()
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def available_devices() -> list[str]:
    """Device kinds usable here. TPU is probed only on TPU hardware."""
    kinds = []
    if tpu_hardware_present() and torch_tpu_installed() and probe_tpu().count:
        kinds.append("tpu")
    if _cuda_count():
        kinds.append("cuda")
    kinds.append("cpu")
    return kinds


def select_device(kind: str = "auto") -> Platform:
    kind = (kind or "auto").lower()
    if kind not in DEVICE_KINDS:
        raise UserError(f"unknown device {kind!r}; valid: {', '.join(DEVICE_KINDS)}")
    if kind == "tpu":
        if not torch_tpu_installed():
            raise UserError(
                "device 'tpu' asked for but torch-tpu is not installed "
                f"(pip install 'tpu-pipeline[tpu]'); available: {', '.join(available_devices())}"
            )
        probe = probe_tpu()
        if probe.error:
            raise UserError(f"device 'tpu' asked for but {probe.error}; available: {', '.join(available_devices())}")
        if not probe.count:
            raise UserError(f"device 'tpu' asked for but no TPU is visible (torch-tpu {probe.version or '?'} sees "
                            f"none); available: {', '.join(available_devices())}")
        return _tpu_platform(probe.count, f"asked for --device tpu: {probe.summary}")
    if kind == "cuda":
        n = _cuda_count()
        if not n:
            raise UserError(f"device 'cuda' asked for but no CUDA GPU is visible; available: {', '.join(available_devices())}")
        return _cuda_platform(n, "asked for --device cuda")
    if kind == "cpu":
        return _cpu_platform("asked for --device cpu")

    # auto: TPU, then CUDA, then CPU. torch_tpu loads only on TPU hardware:
    # loaded elsewhere it can hang on a cloud metadata lookup.
    if torch_tpu_installed():
        if tpu_hardware_present():
            probe = probe_tpu()
            if probe.count:
                return _tpu_platform(probe.count, f"auto: {probe.summary}")
            tpu_note = f"torch-tpu installed but sees no TPU ({probe.error or 'none visible'}); "
        else:
            tpu_note = "torch-tpu installed but no TPU hardware here (not loaded); "
    else:
        tpu_note = "no torch-tpu; "
    n = _cuda_count()
    if n:
        return _cuda_platform(n, f"auto: {tpu_note}{n} CUDA GPU(s) visible")
    return _cpu_platform(f"auto: {tpu_note}no CUDA GPU; using CPU")


def _tpu_platform(count: int, reason: str) -> Platform:
    torch = _torch()
    _load_torch_tpu(torch)
    return Platform("tpu", torch.device("tpu"), count, "TPU (TorchTPU)", True, "tpu", "mosaic-tpu", reason)


def _cuda_platform(count: int, reason: str) -> Platform:
    torch = _torch()
    return Platform(
        "cuda", torch.device("cuda"), count, torch.cuda.get_device_name(0),
        bool(torch.cuda.is_bf16_supported()), "inductor", "gpu", reason,
    )


def _cpu_platform(reason: str) -> Platform:
    torch = _torch()
    # bf16 runs on CPU but is emulated on most of them; fp32 is the fast path.
    return Platform(
        "cpu", torch.device("cpu"), 1, f"{pyplatform.machine()} CPU ({os.cpu_count()} cores)",
        False, "inductor", "interpret", reason,
    )


@contextlib.contextmanager
def eager_mode(mode: str, platform: Platform) -> Iterator[None]:
    """TorchTPU eager mode for the block: strict, fused or debug.

    Off TPU only "strict" (ordinary eager execution) exists.
    """
    if mode not in EAGER_MODES:
        raise UserError(f"unknown eager mode {mode!r}; valid: {', '.join(EAGER_MODES)}")
    if platform.kind != "tpu":
        if mode != "strict":
            raise UserError(f"eager mode {mode!r} exists only on TPU (device here: {platform.kind}); use 'strict'")
        yield
        return
    # torch_tpu keeps the process-wide mode in this module attribute.
    execution_mode = importlib.import_module("torch_tpu._internal.execution_mode")
    wanted = EAGER_MODES[mode]
    if not hasattr(execution_mode.EagerMode, wanted):
        have = ", ".join(m for m in dir(execution_mode.EagerMode) if not m.startswith("_"))
        raise UserError(f"this torch-tpu has no eager mode {wanted}; it has: {have}")
    previous = execution_mode.eager_mode
    execution_mode.eager_mode = getattr(execution_mode.EagerMode, wanted)
    try:
        yield
    finally:
        execution_mode.eager_mode = previous


# Inductor config key that selects the code generator for each device kind.
_PALLAS_CONFIG_KEY = {"cpu": "cpu_backend", "cuda": "cuda_backend", "tpu": "tpu_backend"}


def compile(fn: Callable, *, platform: Platform | None = None, inductor_pallas: bool = False,
            **kwargs) -> Callable:
    """torch.compile with the platform's backend.

    inductor_pallas=True: Inductor's own Pallas code generator writes the graph's
    kernels (on CPU they run in JAX's interpret mode: a correctness path, not a fast one).
    """
    torch = _torch()
    platform = platform or select_device("auto")
    if not inductor_pallas:
        return torch.compile(fn, backend=platform.compile_backend, **kwargs)
    options = dict(kwargs.pop("options", None) or {})
    options[_PALLAS_CONFIG_KEY[platform.kind]] = "pallas"
    return torch.compile(fn, backend="inductor", options=options, **kwargs)
