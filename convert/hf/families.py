"""Task families: one loader per family of Hugging Face heads, behind one registry, as
Transformers maps config.json's `architectures` to its AutoModelFor... classes.

A family knows, for the heads it takes (the classes Transformers' own AutoModelFor... mapping lists:
ViTForImageClassification is AutoModelForImageClassification's, Wav2Vec2ForSequenceClassification
AutoModelForAudioClassification's): the folder's processor, the model's fixed-shape inputs (built from
the processor's own output), the outputs the artifact keeps, how raw data (raw_data.py) becomes
rows and labels, the task metric, and what an app hands the model (app_io's description).
A new family is a subclass with `@register_family("name")` in image.py, text.py or audio.py.
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch
from torch import nn

from tpu_pipeline.convert.app_io import Labels
from tpu_pipeline.convert.hf.folder import Folder
from tpu_pipeline.convert.verdict.task_score import Metric
from tpu_pipeline.errors import UserError
from tpu_pipeline.registry import Registry


@dataclasses.dataclass
class Rows:
    rows: list[list[np.ndarray]]  # per row, one batch-1 array per model input
    labels: np.ndarray | None     # (N, ...) aligned with rows; None without labels
    source: str                   # how the report names them
    raw: list | None = None       # per row, the raw item an app hands over (a sentence), where the client check needs it


class TaskFamily(abc.ABC):
    """One loaded folder of this family: its wrapped model, processor and example inputs."""

    name: ClassVar[str]                   # its HF_TASKS name; report.json's "task"
    auto_class: ClassVar[str]             # the AutoModelFor... class whose mapping lists this family's heads
    mapping: ClassVar[str]                # that mapping in transformers.models.auto.modeling_auto
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    output_kinds: ClassVar[dict[str, str]] = {"logits": "logits"}  # convert/verdict/output_kinds.py

    def __init__(self, folder: Folder, model: nn.Module, max_len: int | None):
        self.folder, self.model = folder, model
        self.notes: list[str] = []

    @classmethod
    def open(cls, folder: Folder, model: nn.Module, max_len: int | None) -> TaskFamily:
        """This family loaded for the folder; a family whose folders come in kinds (audio: a waveform or
        spectrogram features, by what the feature extractor gives) returns the class for its kind."""
        return cls(folder, model, max_len)

    @property
    @abc.abstractmethod
    def input_names(self) -> list[str]:
        """The artifact's inputs, in forward() order."""

    @property
    @abc.abstractmethod
    def sample_args(self) -> tuple[torch.Tensor, ...]:
        """One example row from the processor's own output (batch 1, the artifact's fixed shapes)."""

    @property
    def int_high(self) -> list[int | None]:
        return [None] * len(self.input_names)

    def module(self) -> nn.Module:
        """The artifact's graph: the HF model on the inputs, its named outputs as a tuple."""
        return Wrapped(self.model, self.input_names, self.output_names)

    @abc.abstractmethod
    def rows(self, path: Path, flag: str) -> Rows:
        """Raw data at `path` (raw_data.py) through the folder's processor."""

    def metric(self) -> Metric | None:
        """The task metric when the output kind alone does not say it (None: chosen by kind)."""
        return None

    def app_io(self) -> dict:
        """AppIO fields (convert/app_io) an app task of this family reads: image=/audio=/text=, labels=;
        {} where MediaPipe has no task for the family (token tagging, segmentation maps)."""
        return {}

    def labels(self) -> Labels:
        return Labels(names=self.folder.labels, source=f"{self.folder.path / 'config.json'} id2label")

    @abc.abstractmethod
    def describe(self) -> dict:
        """report.json's hf object: the processor, decoders and preprocessing the rows went through."""

    def label_ids(self, items, where: Callable[[object], str]) -> np.ndarray | None:
        """Each item's label (a name through label2id, or an index) -> int64 [N]; None when no item has one."""
        from tpu_pipeline.convert.hf.raw_data import label_index

        given = [it.label is not None and it.label != "" for it in items]
        if not any(given):
            return None
        if not all(given):
            first = items[given.index(False)]
            raise UserError(f"{where(first)}: has no label while other rows have one")
        return np.array([label_index(it.label, self.folder.label2id, where(it)) for it in items], np.int64)


PREPROCESSOR = "preprocessor_config.json"  # where save_pretrained writes an image processor or feature extractor


def preprocessor_config(folder: Folder, what: str) -> Path:
    """The folder's preprocessor_config.json; UserError naming it when the processor was not saved."""
    cfg = folder.path / PREPROCESSOR
    if not cfg.is_file():
        raise UserError(f"{cfg}: missing; this model's folder needs its {what} (save it with "
                        f"{what.replace(' ', '_')}.save_pretrained(folder))")
    return cfg


class Wrapped(nn.Module):
    """A HF model as litert-torch traces it: positional tensor inputs (named as forward() takes
    them) -> a tuple of the named outputs; `pre` runs on the first input first (preprocessing
    folded into the graph, e.g. a waveform's normalisation); `ignored` inputs are taken and not
    passed on (an input an app's client fills that the model has no use for)."""

    def __init__(self, model: nn.Module, input_names: list[str], output_names: tuple[str, ...],
                 pre: nn.Module | None = None, ignored: tuple[str, ...] = ()):
        super().__init__()
        self.model, self.pre, self.ignored = model, pre, tuple(ignored)
        self.input_names, self.output_names = list(input_names), tuple(output_names)

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.pre is not None:
            args = (self.pre(args[0]), *args[1:])
        out = self.model(**{n: a for n, a in zip(self.input_names, args) if n not in self.ignored})
        return tuple(getattr(out, n) for n in self.output_names)


HF_TASKS: Registry[type[TaskFamily]] = Registry(
    "Hugging Face task family",
    "a TaskFamily subclass with @register_family(name) in convert/hf/{image,text,audio}.py")


def register_family(name: str) -> Callable[[type[TaskFamily]], type[TaskFamily]]:
    def add(cls: type[TaskFamily]) -> type[TaskFamily]:
        cls.name = name
        return HF_TASKS.register(name)(cls)

    return add


def family_for(architecture: str) -> type[TaskFamily] | None:
    """The family whose AutoModelFor... mapping lists `architecture` (Transformers' own table)."""
    from transformers.models.auto import modeling_auto  # heavy; only HF folders need it

    for e in HF_TASKS.entries():
        names = getattr(modeling_auto, e.obj.mapping, {}).values()
        if any(architecture == n or (isinstance(n, (tuple, list)) and architecture in n) for n in names):
            return e.obj
    return None


def known_heads() -> list[str]:
    return sorted(e.obj.auto_class for e in HF_TASKS.entries())
