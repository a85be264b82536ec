"""The CPU doctor reports and the vLLM GEMM path `rl --engine verl` takes on it, for CPUs this
machine is not (an AMX Xeon, an AVX2-only desktop, an AMD EPYC with and without zentorch, an
ARM server), read from their /proc/cpuinfo entries."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.cpu_features import read_cpu, vllm_gemm_path

X86 = "processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: {model}\nflags\t\t: {flags}\n"
SAPPHIRE = X86.format(n=0, vendor="GenuineIntel", model="Intel(R) Xeon(R) Platinum 8488C",
                      flags="fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8")
EPYC = X86.format(n=0, vendor="AuthenticAMD", model="AMD EPYC 9R14", flags="fpu sse2 avx2 avx512f avx512_bf16")
DESKTOP = X86.format(n=0, vendor="GenuineIntel", model="Intel(R) Core(TM) i7-8700", flags="fpu sse2 avx avx2 fma")
ARM = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize("text, isas, path", [
    (SAPPHIRE, (True, True, True), "oneDNN (AVX-512)"),
    (EPYC, (False, True, True), "oneDNN (AVX-512)"),
    (DESKTOP, (False, False, True), "oneDNN (AVX2)"),
    (ARM, (None, None, None), "not determined (no x86 CPU flags in /proc/cpuinfo)"),
])
def test_instruction_sets_and_the_float32_rollout_path(text, isas, path):
    cpu = read_cpu(text + "\n" + text.replace("processor\t: 0", "processor\t: 1"))  # the first entry decides
    assert (cpu.has("amx"), cpu.has("avx512"), cpu.has("avx2")) == isas
    assert vllm_gemm_path(cpu) == path


def test_16_bit_weights_on_amx_take_sgl_kernel_and_zentorch_only_on_amd():
    assert vllm_gemm_path(read_cpu(SAPPHIRE), dtype="bfloat16") == "sgl-kernel packed GEMM (AMX)"
    assert vllm_gemm_path(read_cpu(SAPPHIRE), dtype="float16") == "oneDNN (AVX-512)"  # AMX-FP16 is another flag
    assert vllm_gemm_path(read_cpu(EPYC), dtype="bfloat16") == "oneDNN (AVX-512)"
    assert vllm_gemm_path(read_cpu(EPYC), zentorch=True) == "zentorch"
    assert vllm_gemm_path(read_cpu(SAPPHIRE), zentorch=True) == "oneDNN (AVX-512)"


def test_doctor_says_what_this_cpu_is():
    here = read_cpu()
    r = CliRunner().invoke(cli, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    cpu = json.loads(r.output)["cpu"]
    zentorch = importlib.util.find_spec("zentorch") is not None
    assert cpu == {**here.describe(), "vllm_gemm_path": vllm_gemm_path(here, zentorch=zentorch)}
    text = CliRunner().invoke(cli, ["doctor"]).output
    assert f"vLLM's CPU rollout GEMM: {cpu['vllm_gemm_path']}" in text
    assert f"AVX-512 {'yes' if cpu['avx512'] else 'no'}" in text
