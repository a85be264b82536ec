"""`tpu-pipeline doctor`: what is installed and which device would be used."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform as pyplatform
import time

from tpu_pipeline._tpu_guard import tpu_hardware_present
from tpu_pipeline.cpu_features import read_cpu, vllm_gemm_path
from tpu_pipeline.device import select_device

PACKAGES = ("torch", "jax", "jaxlib", "litert-torch", "ai-edge-litert", "ai-edge-quantizer",
            "verl", "transformers", "tflite-micro", "torch-tpu")
REQUIRED = ("torch", "jax", "jaxlib", "litert-torch", "ai-edge-litert", "verl", "transformers")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def diagnose(device: str = "auto") -> dict:
    t0 = time.perf_counter()
    versions = {"python": pyplatform.python_version(), **{p: _version(p) for p in PACKAGES}}
    problems = [f"{p} is not installed" for p in REQUIRED if versions[p] is None]

    import torch  # deferred: the device report must not slow `tpu-pipeline --help`

    plat = select_device(device)
    jax_backend = None
    try:
        import jax

        jax_backend = jax.default_backend()
    except Exception as e:  # a broken jaxlib should not hide the rest of the report
        problems.append(f"jax failed to start: {e}")

    cpu = read_cpu()
    report = {
        "versions": versions,
        # the rollout of `rl --engine verl` on CPU is float32 (rl/verl_bridge.cpu_overrides)
        "cpu": {**cpu.describe(), "vllm_gemm_path": vllm_gemm_path(
            cpu, dtype="float32", zentorch=importlib.util.find_spec("zentorch") is not None)},
        "device": plat.describe(),
        "tpu": {
            "hardware_present": tpu_hardware_present(),
            "torch_tpu_installed": versions["torch-tpu"] is not None,
        },
        "gpu": {"cuda_available": torch.cuda.is_available(), "count": torch.cuda.device_count()},
        "pallas": {
            "mode": "interpret" if plat.kernels_interpreted else "native",
            "runs_as": plat.kernel_lowering,
            "jax_backend": jax_backend,
        },
        "problems": problems,
    }
    pallas = "Pallas in interpret mode" if plat.kernels_interpreted else f"Pallas native ({plat.kernel_lowering})"
    report["verdict"] = (
        f"problems: {'; '.join(problems)}" if problems
        else f"ok: {plat.kind} ({plat.name}), torch.compile backend {plat.compile_backend}, {pallas}"
    )
    report["seconds"] = round(time.perf_counter() - t0, 3)
    return report
