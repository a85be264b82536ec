"""Model kinds: the parts of `convert` that depend on what the model is.

The pipeline (pipeline.py) owns the per-target steps, the same for every kind:
derive the target's variant from the one float export, run the compatibility
checks (checks.py), run parity on the target's runtime, measure latency,
write the artifact, model.json and the report. A kind supplies the pieces in
between: how to load the model and export it once in float32, how a variant
is made, which parity metric proves the artifact, what model.json says.

Kinds today: `module` (module/kind.py: any nn.Module with fixed-shape tensor
inputs, judged output by output) and `causal-lm` (lm/kind.py: a Hugging Face
causal-LM folder, exported decode-ready, judged by greedy token agreement).
A new kind is one module with a ModelKind subclass decorated with
`@register_kind("name")` (its MODEL_KINDS entry), imported by pipeline.py,
the composition point.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from tpu_pipeline.convert.options import ConvertOptions
from tpu_pipeline.convert.precision.quantize import DEFAULT_RANGES
from tpu_pipeline.convert.result import Artifact, Parity, TargetResult
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tflite_info import ModelInfo
from tpu_pipeline.registry import Registry

Progress = Callable[[str], None]


class ModelKind(abc.ABC):
    """One loaded model of this kind, ready to export. Create it with `load`."""

    name: ClassVar[str]  # its MODEL_KINDS name, set by register_kind; report.json's "kind"
    # Kinds are asked lowest first whether they take a MODEL path (detect); the first that does
    # takes it. An explicit number, not registration order, which would follow import order.
    detect_order: ClassVar[int]
    noun: ClassVar[str]  # in messages: "target iot does not take {noun}"
    # ConvertOptions field -> why it has no meaning for this kind; set to a non-default
    # value it is refused (UserError, exit 2) before anything is loaded or written.
    refused_options: ClassVar[dict[str, str]] = {}
    # Whether app snippets and firmware files (which read model.json's serving
    # signature) are written next to a passed artifact.
    app_files: ClassVar[bool] = True
    # Whether explain_failure() can name where a failed artifact departs from PyTorch.
    localizes: ClassVar[bool] = False
    # Whether a failed quantized variant may be rebuilt with its diverging layers kept in float
    # (explain_failure + variant_keeping_float; the pipeline's accuracy-aware rounds).
    refines: ClassVar[bool] = False

    @staticmethod
    @abc.abstractmethod
    def detect(path: Path) -> bool:
        """True when MODEL at `path` is of this kind (kinds are asked in detection_order())."""

    @classmethod
    def skip_reason(cls, profile: TargetProfile) -> str | None:
        """Why this kind is not built for `profile` (the target is skipped, or refused when
        named explicitly), or None."""
        return None

    @classmethod
    @abc.abstractmethod
    def load(cls, path: Path, options: ConvertOptions, rng: np.random.Generator, say: Progress) -> ModelKind:
        """Reads the model and chooses its parity inputs; raises UserError on bad input."""

    @abc.abstractmethod
    def export_float(self, work: Path, say: Progress) -> Artifact:
        """The one float32 export every variant is derived from; ConversionError if it fails."""

    def prepare(self, profiles: list[TargetProfile], float_model: Artifact, rng: np.random.Generator) -> list[str]:
        """Work shared by the targets before their variants (calibration); returns report warnings."""
        return []

    def precision(self, profile: TargetProfile) -> str:
        return profile.precision

    def candidates(self, profile: TargetProfile) -> list[str]:
        """The precisions measured for `profile`, preferred first; the pipeline ships the one that
        passes parity and the checks, then is fastest. Default: only `precision(profile)`."""
        return [self.precision(profile)]

    @abc.abstractmethod
    def variant(self, float_model: Artifact, precision: str) -> Artifact:
        """The `precision` variant of the float export; ConversionError if it cannot be made."""

    def variant_keeping_float(self, float_model: Artifact, precision: str, scopes: list[str],
                              range_estimator: str = DEFAULT_RANGES) -> Artifact:
        """The `precision` variant with the ops named by `scopes` (their output tensor names) left in
        float32, static int8's activation ranges set by `range_estimator` (quantize.RANGE_ESTIMATORS);
        only kinds with `refines` implement it (the pipeline asks no other kind)."""
        raise NotImplementedError(f"{type(self).__name__} has refines = False: it keeps no layer in float")

    @abc.abstractmethod
    def parity(self, profile: TargetProfile, art: Artifact, info: ModelInfo, options: ConvertOptions, work: Path,
               say: Progress) -> Parity:
        """Runs the artifact on the profile's runtime against PyTorch; `options` carries
        --atol/--rtol/--min-cosine overrides. `work` is a scratch folder for this target."""

    def explain_failure(self, art: Artifact, info: ModelInfo) -> dict | None:
        """After failed parity: where the artifact departs from PyTorch (first diverging layer), or None."""
        return None

    @abc.abstractmethod
    def latency(self, art: Artifact, info: ModelInfo, work: Path) -> dict:
        """report.json's latency_ms object for this artifact on ai-edge-litert."""

    @abc.abstractmethod
    def model_json(self, r: TargetResult) -> dict:
        """The target folder's model.json (what an app needs to load and feed the artifact)."""

    @abc.abstractmethod
    def report_fields(self) -> dict:
        """Kind-specific top-level report.json fields: source_format, task, samples,
        sample_source, notes, and whatever describes this kind's inputs."""


MODEL_KINDS: Registry[type[ModelKind]] = Registry(
    "model kind", "a ModelKind subclass with @register_kind(name) in its own module, imported by convert/pipeline.py")


def register_kind(name: str) -> Callable[[type[ModelKind]], type[ModelKind]]:
    """`@register_kind("causal-lm")` on a ModelKind subclass: its MODEL_KINDS entry (described by
    the class docstring's first paragraph) and its `name`."""

    def add(cls: type[ModelKind]) -> type[ModelKind]:
        cls.name = name
        return MODEL_KINDS.register(name)(cls)

    return add


def detection_order() -> list[type[ModelKind]]:
    """The registered kinds in the order the pipeline asks them: detect_order, then name."""
    return sorted((e.obj for e in MODEL_KINDS.entries()), key=lambda k: (k.detect_order, k.name))
