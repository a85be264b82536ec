"""Typed results of one conversion: what a model kind's steps hand to the
pipeline, and what the pipeline records per target. `to_json()` gives the
report.json shape (docs/DESIGN.md "Contracts"); the artifact bytes travel in
fields, never in the JSON."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tpu_pipeline.convert.tflite_info import ModelInfo
from tpu_pipeline.errors import EXIT_CONVERSION, EXIT_OK, EXIT_PARITY, ConversionError, ParityError, PipelineError


@dataclasses.dataclass(kw_only=True)
class Artifact:
    """A .tflite plus the files that ship beside it in the target folder (lm.json, tokenizer)."""

    model: bytes
    extra_files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    precision: str = "float32"  # the variant's precision (float16, dynamic_int8, ...), for its parity bound


@dataclasses.dataclass(kw_only=True)
class Parity:
    """A model kind's parity verdict on one target. `figures` is report.json's `parity`
    object (it holds "passed" and "reasons" too); `runtime` replaces the target's
    runtime note when parity ran on more or less than the profile says."""

    figures: dict[str, Any]
    warnings: list[str] = dataclasses.field(default_factory=list)
    runtime: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.figures["passed"])

    @property
    def reasons(self) -> list[str]:
        return list(self.figures.get("reasons", []))


@dataclasses.dataclass(kw_only=True)
class TargetResult:
    target: str
    quantization: str
    runtime: str
    passed: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    size_bytes: int | None = None
    parity: dict | None = None
    latency_ms: dict | None = None
    timings_s: dict[str, float] = dataclasses.field(default_factory=dict)
    compatibility: dict | None = None
    failure: str | None = None           # conversion | compatibility | parity
    artifact_path: str | None = None     # report.json's "artifact"
    sha256: str | None = None
    app_snippet: str | None = None
    firmware: dict | None = None
    candidates: list[dict] | None = None  # every precision measured for this target (when more than one)
    chosen_because: str | None = None    # why this precision won
    kept_float: dict | None = None       # accuracy-aware rounds: layers kept in float32 and what it cost
    int8_repairs: dict | None = None     # accuracy-aware rounds: clipped int8 ranges, each repair tried and its cost
    buckets: list[dict] | None = None    # shape buckets (convert/shapes.py): each bucket's verdict, parity and latency
    xnnpack: dict | None = None          # ai-edge-litert targets: XNNPACK's partitions and the ops left to other kernels
    npu: dict | None = None              # android-npu: per SoC, partition stats and the HTP simulator's parity (convert/npu/)
    npu_models: dict[str, bytes] = dataclasses.field(default_factory=dict)  # SoC -> its compiled .tflite
    layer_errors: dict | None = None     # per-layer error as a Model Explorer overlay (verdict/layer_errors.py):
                                         # {"overlay", "measured_on"}; "file" and "view" once written
    artifact: Artifact | None = None     # the bytes written to the target folder
    info: ModelInfo | None = None

    @property
    def precision(self) -> str:
        """float32 | float16 | dynamic_int8 | static_int8 (report.json calls it quantization)."""
        return self.quantization

    @property
    def metrics(self) -> dict:
        """The parity figures (cosine, max_abs, rmse, top-1, which criterion decided ...)."""
        return self.parity or {}

    @property
    def latency(self) -> float | None:
        """Median milliseconds per call of the artifact on ai-edge-litert, or None if not measured."""
        return (self.latency_ms or {}).get("artifact")

    @property
    def reasons(self) -> list[str]:
        """Why the target failed (empty when it passed)."""
        return [] if self.passed else list(self.errors)

    @property
    def exit_code(self) -> int:
        """This target's own exit code: 0 passed, 4 wrong numbers (parity), 3 no usable artifact."""
        if self.passed:
            return EXIT_OK
        return EXIT_PARITY if self.failure == "parity" else EXIT_CONVERSION

    def fail(self, failure: str, *errors: str) -> TargetResult:
        self.passed, self.failure = False, failure
        self.errors += list(errors)
        return self

    def to_json(self) -> dict:
        d = {"target": self.target, "quantization": self.quantization, "runtime": self.runtime, "passed": self.passed,
             "errors": self.errors, "warnings": self.warnings, "size_bytes": self.size_bytes, "parity": self.parity,
             "latency_ms": self.latency_ms, "timings_s": self.timings_s}
        optional = {"compatibility": self.compatibility, "failure": self.failure, "artifact": self.artifact_path,
                    "sha256": self.sha256, "app_snippet": self.app_snippet, "firmware": self.firmware,
                    "candidates": self.candidates, "chosen_because": self.chosen_because,
                    "kept_float": self.kept_float, "int8_repairs": self.int8_repairs, "buckets": self.buckets,
                    "xnnpack": self.xnnpack, "npu": self.npu, "layer_errors": _written(self.layer_errors)}
        d.update({k: v for k, v in optional.items() if v is not None})
        return d


def _written(layer_errors: dict | None) -> dict | None:
    """report.json names the overlay's file and how to view it; the overlay itself is that file."""
    if not layer_errors or "file" not in layer_errors:
        return None
    return {k: v for k, v in layer_errors.items() if k != "overlay"}


@dataclasses.dataclass(kw_only=True)
class ConvertResult:
    """What `tpu_pipeline.convert.convert` returns: one TargetResult per target built, the
    output folder, and the report (report.json's content). A failed target does not raise;
    `raise_for_failures()` does, with the CLI's exit code (see `exit_code`)."""

    model: str
    kind: str
    out: Path
    targets: dict[str, TargetResult]
    report: dict[str, Any]

    def __getitem__(self, target: str) -> TargetResult:
        return self.targets[target]

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.targets.values())

    @property
    def exit_code(self) -> int:
        """The worst kind of failure across targets: 4 when any artifact computes wrong numbers
        (parity, including a float32 export that does not match PyTorch), else 3 when any target
        has no usable artifact (conversion failed, or the target refuses it: size, ops, arena),
        else 0. Wrong numbers rank first because they are the failure a user cannot see: an
        iot size refusal must not hide them."""
        return max((t.exit_code for t in self.targets.values()),
                   key=lambda c: {EXIT_OK: 0, EXIT_CONVERSION: 1, EXIT_PARITY: 2}[c], default=EXIT_OK)

    def error(self) -> PipelineError | None:
        """The one-line error for the failed targets (ParityError or ConversionError by
        `exit_code`), or None when every target passed; `.report` and `.result` ride along."""
        failed = {n: t for n, t in self.targets.items() if not t.passed}
        if not failed:
            return None
        parts = []
        for n, t in failed.items():
            first = t.errors[0] if t.errors else "failed"
            layer = next((e for e in t.errors[1:] if e.startswith("first diverging layer")), None)
            parts.append(f"{n}: {first}" + (f" [{layer}]" if layer else ""))
        msg = (f"{len(failed)} of {len(self.targets)} targets failed ({'; '.join(parts)}); "
               f"report: {self.out}/report.json")
        err = ParityError(msg) if self.exit_code == EXIT_PARITY else ConversionError(msg)
        err.report, err.result = self.report, self
        return err

    def raise_for_failures(self) -> ConvertResult:
        err = self.error()
        if err is not None:
            raise err
        return self
