"""The android-npu target's own step, after its variant passed parity on XNNPACK: per SoC of the
profile, compile (compile.py), read what the NPU took (partition stats: first in the report and
the progress lines), refuse a model the NPU takes too little of (`min_npu_ops_share`), then run
the compiled model on the HTP simulator over the parity rows (simulator.py) and judge its outputs
as the CPU run's are judged (the kind's judge: same bounds per output kind, the task with labels).

A check that cannot run (no simulator, a partition it refuses) fails the SoC: never a pass.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from tpu_pipeline.convert.npu import qnn_libs
from tpu_pipeline.convert.npu.compile import ROOT_MODULE, Compiled, check_socs, compile_for, dequantized_steps
from tpu_pipeline.convert.npu.simulator import HtpSimulator
from tpu_pipeline.convert.tflite_info import inspect_model
from tpu_pipeline.errors import ConversionError

SIMULATOR = "Qualcomm HTP simulator (x86 libQnnHtp.so via onnxruntime's QNN execution provider, CPU fallback off)"
# got -> (per-output figures, passed, reasons): the model kind's judge (ModuleKind.judge_elsewhere)
Judge = Callable[[list], tuple[dict, bool, list[str]]]
_KEEP = ("kind", "samples", "max_abs", "rmse", "cosine", "cosine_mean", "top1", "flip_rate", "prob_error")


def preflight(name: str, socs: list[str]) -> qnn_libs.QnnLibs:
    """Bad input before anything is read or written: a SoC that cannot compile here, no [npu] extra."""
    check_socs(socs, f"target {name}")
    return qnn_libs.require()


@dataclasses.dataclass(kw_only=True)
class NpuResult:
    passed: bool
    failure: str | None      # compatibility (ops share), conversion (compile, simulator), parity
    reasons: list[str]
    figures: dict            # report.json's "npu"
    models: dict[str, bytes]  # SoC -> compiled .tflite


def cpu_summary(c: Compiled, limit: int = 6) -> str:
    """'ATAN2 x1 (head), SORT x2 (model forward)': the ops left on the CPU, by op and module path."""
    by: dict[tuple[str, str], int] = {}
    for o in c.cpu_ops:
        key = (o["op"], o["module"] or ROOT_MODULE)
        by[key] = by.get(key, 0) + 1
    parts = [f"{op} x{n} ({mod})" for (op, mod), n in list(by.items())[:limit]]
    return ", ".join(parts) + (f", and {len(by) - limit} more" if len(by) > limit else "")


def check(name: str, socs: list[str], min_share: float, max_rows: int, model: bytes, samples: list,
          judge: Judge, cpu_got: list, say: Callable[[str], None], torch_judge: Judge | None = None) -> NpuResult:
    """judge decides each SoC; torch_judge (when it is another: labels were given, and judge compares
    with the CPU run whose task score decided) gives the figures against PyTorch for the report."""
    libs = preflight(name, socs)
    figures = {"qnn_version": libs.qnn_version, "qnn_libs": libs.source, "simulator": SIMULATOR,
               "versions": qnn_libs.versions(), "socs": {}}
    models, reasons, failures = {}, [], []
    rows = samples[:max_rows] if max_rows else samples
    for soc in socs:
        say(f"{name}: {soc}: LiteRT AOT compile (Qualcomm QNN {libs.qnn_version})")
        try:
            c = compile_for(model, soc, libs)
        except ConversionError as e:
            figures["socs"][soc] = {"soc": soc, "passed": False, "reasons": [str(e)]}
            reasons.append(f"{soc}: {e}")
            failures.append("conversion")
            continue
        fig = figures["socs"][soc] = c.stats()
        models[soc] = c.model
        on_cpu = cpu_summary(c)
        say(f"{name}: {soc}: {c.ops_on_npu}/{c.ops_total} ops on the NPU in {len(c.partitions)} partition(s)"
            + (f"; on the CPU: {on_cpu}" if on_cpu else ""))
        if c.npu_share < min_share or not c.partitions:
            why = (f"{soc}: the NPU takes {c.ops_on_npu} of {c.ops_total} ops ({c.npu_share:.0%}), under the profile's "
                   f"min_npu_ops_share {min_share:.0%}" if c.partitions else f"{soc}: the NPU takes none of the ops")
            why += f"; left on the CPU: {on_cpu}" if on_cpu else ""
            fig.update(passed=False, reasons=[why])
            reasons.append(why)
            failures.append("compatibility")
            continue
        say(f"{name}: {soc}: the compiled model on the HTP simulator over {len(rows)} parity rows"
            + (" (NPU partitions stitched with the CPU ops on XNNPACK)" if c.cpu_ops else ""))
        try:
            sim_fig = _simulate(c, model, rows, judge, cpu_got, torch_judge)
        except ConversionError as e:
            fig.update(passed=False, reasons=[str(e)], simulator={"ran": False, "reason": str(e)})
            reasons.append(f"{soc}: {e}")
            failures.append("conversion")
            continue
        fig["simulator"] = sim_fig
        fig["passed"] = sim_fig["passed"]
        fig["reasons"] = [f"on the HTP simulator: {r}" for r in sim_fig["reasons"]]
        if not sim_fig["passed"]:
            reasons += [f"{soc}: {r}" for r in fig["reasons"]]
            failures.append("parity")
    failure = None
    if failures:  # wrong numbers rank first, as in ConvertResult.exit_code
        failure = "parity" if "parity" in failures else failures[0]
    figures["passed"] = not reasons
    return NpuResult(passed=not reasons, failure=failure, reasons=reasons, figures=figures, models=models)


def _simulate(c: Compiled, model: bytes, rows: list, judge: Judge, cpu_got: list, torch_judge: Judge | None) -> dict:
    info = inspect_model(model)  # rows and the judge take the uncompiled model's signature order
    sim = HtpSimulator(c.model, [t.name for t in info.inputs], [t.name for t in info.outputs])
    got, times = [], []
    for row in rows:
        t0 = time.perf_counter()
        got.append(sim.run(row))
        times.append(time.perf_counter() - t0)
    outputs, passed, reasons = judge(got)
    by_cpu = torch_judge is not None and torch_judge is not judge
    vs_torch = torch_judge(got)[0] if by_cpu else outputs
    vs_cpu, steps = {}, dequantized_steps(model)
    for k, t in enumerate(sim.outputs):
        diff = max(float(np.abs(np.asarray(g[k], np.float64) - np.asarray(ref[k], np.float64)).max())
                   for g, ref in zip(got, cpu_got))
        step = t.scale or steps.get(t.name)
        vs_cpu[t.name] = {"max_abs": diff, **({"max_lsb": round(diff / step, 3)} if step else {})}
    return {"ran": True, "rows": len(rows), "passed": passed, "reasons": reasons,
            "judged_against": "the CPU run (labels given: its task score decided)" if by_cpu else "PyTorch",
            "stitched": bool(c.cpu_ops), "segments": len(sim.segments),
            "s_per_row": float(np.median(times)) if times else None, "session_s": sim.session_s,
            "vs_pytorch": {n: {k: m[k] for k in _KEEP if k in m} for n, m in vs_torch.items()},
            "vs_xnnpack": vs_cpu}
