"""Typed results of one conversion: what a model kind's steps hand to the
pipeline, and what the pipeline records per target. `to_json()` gives the
report.json shape (docs/DESIGN.md "Contracts"); the artifact bytes travel in
fields, never in the JSON."""

from __future__ import annotations

import dataclasses
from typing import Any

from tpu_pipeline.convert.tflite_info import ModelInfo


@dataclasses.dataclass(kw_only=True)
class Artifact:
    """A .tflite plus the files that ship beside it in the target folder (lm.json, tokenizer)."""

    model: bytes
    extra_files: dict[str, bytes] = dataclasses.field(default_factory=dict)


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
    artifact: Artifact | None = None     # the bytes written to the target folder
    info: ModelInfo | None = None

    def fail(self, failure: str, *errors: str) -> TargetResult:
        self.passed, self.failure = False, failure
        self.errors += list(errors)
        return self

    def to_json(self) -> dict:
        d = {"target": self.target, "quantization": self.quantization, "runtime": self.runtime, "passed": self.passed,
             "errors": self.errors, "warnings": self.warnings, "size_bytes": self.size_bytes, "parity": self.parity,
             "latency_ms": self.latency_ms, "timings_s": self.timings_s}
        optional = {"compatibility": self.compatibility, "failure": self.failure, "artifact": self.artifact_path,
                    "sha256": self.sha256, "app_snippet": self.app_snippet, "firmware": self.firmware}
        d.update({k: v for k, v in optional.items() if v is not None})
        return d
