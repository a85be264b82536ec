"""What the CPU is: its vendor and model, the instruction sets that decide which kernels run
(AMX, AVX-512, AVX2), and the GEMM path vLLM's CPU backend takes for `rl --engine verl`'s
rollout on it. Read from /proc/cpuinfo (Linux); elsewhere the sets are unknown (None).

The path follows vLLM 0.28's `dispatch_cpu_unquantized_gemm` (vllm/model_executor/layers/
utils.py): zentorch on an AMD CPU with AVX-512 where zentorch is installed; sgl-kernel's packed
GEMM for 16-bit weights on AMX; oneDNN otherwise (on x86), at the widest vector set the CPU has;
torch's own linear when nothing else applies. The weight sync is tested on each
(tests/rl/test_verl_weight_sync_on_cpu.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

# Our name -> the /proc/cpuinfo flag that says the CPU has it.
ISA_FLAGS = {"amx": "amx_tile", "avx512": "avx512f", "avx2": "avx2"}


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    vendor: str | None            # "GenuineIntel", "AuthenticAMD", ...
    model: str | None             # the model name the kernel reports
    flags: frozenset[str] | None  # None: no x86 flags line (another architecture, or no /proc)

    def has(self, isa: str) -> bool | None:
        return None if self.flags is None else ISA_FLAGS[isa] in self.flags

    def describe(self) -> dict:
        return {"vendor": self.vendor, "model": self.model, **{isa: self.has(isa) for isa in ISA_FLAGS}}


def read_cpu(cpuinfo: str | None = None) -> CpuInfo:
    """The first processor's entry of /proc/cpuinfo (or of the text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return CpuInfo(None, None, None)
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags")
    return CpuInfo(fields.get("vendor_id"), fields.get("model name"),
                   frozenset(flags.split()) if flags is not None else None)


def vllm_gemm_path(cpu: CpuInfo, *, dtype: str = "float32", zentorch: bool = False) -> str:
    """The GEMM vLLM's CPU backend uses for the rollout's linear layers of `dtype` weights."""
    if cpu.flags is None:
        return "not determined (no x86 CPU flags in /proc/cpuinfo)"
    if zentorch and cpu.vendor == "AuthenticAMD" and any(f.startswith("avx512") for f in cpu.flags):
        return "zentorch"
    if dtype in ("bfloat16", "float16") and cpu.has("amx") and (dtype == "bfloat16" or "amx_fp16" in cpu.flags):
        return "sgl-kernel packed GEMM (AMX)"
    widest = next((name for isa, name in (("avx512", "AVX-512"), ("avx2", "AVX2")) if cpu.has(isa)), None)
    if widest:
        return f"oneDNN ({widest})"
    return "oneDNN or torch linear (no AVX2/AVX-512 flags: not determined here)"
