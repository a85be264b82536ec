"""The `hf-task` model kind: a Hugging Face task folder (config.json's `architectures` names a
head of a family in families.py), converted by the folder alone. Its processor turns raw
--eval-data and --calib (raw_data.py) into the rows PyTorch and every artifact run, id2label
names the classes (labels by name through label2id), and the family says the task metric
(accuracy, entity F1, mean IoU, mAP@0.5). From there it is a `module`: exported once, judged by its task
score with labels, else output by output (module/kind.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert.app_io import AppIO
from tpu_pipeline.convert.hf import audio as _audio  # noqa: F401 - registers its families
from tpu_pipeline.convert.hf import image as _image  # noqa: F401
from tpu_pipeline.convert.hf import text as _text  # noqa: F401
from tpu_pipeline.convert.hf.families import TaskFamily, family_for, known_heads
from tpu_pipeline.convert.hf.folder import architectures, is_causal_lm, is_hf_folder, open_folder, read_config
from tpu_pipeline.convert.hf.raw_data import is_raw
from tpu_pipeline.convert.kinds import Progress, register_kind
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.module.loaders import load_object
from tpu_pipeline.convert.options import ConvertOptions
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict.eval_data import EvalData
from tpu_pipeline.errors import PipelineError, UserError

NOT_FOR_HF = ("does not apply to a Hugging Face task folder (its config.json, processor and safetensors define "
              "the model)")
LM_ONLY = "applies to Hugging Face causal-LM folders only"


@register_kind("hf-task")
class HFTaskKind(ModuleKind):
    """A Hugging Face task folder (image, text, token or audio classification, segmentation, detection) found by
    config.json's architectures: raw data through the folder's processor, labels through id2label."""

    detect_order = 10  # after causal-lm (0), before the module catch-all (100)
    noun = "a Hugging Face task model"
    refused_options = {"input_shapes": NOT_FOR_HF, "model_class": NOT_FOR_HF, "model_kwargs": NOT_FOR_HF,
                       "trust_pickle": NOT_FOR_HF, "prompts": LM_ONLY, "lm_prefill_len": LM_ONLY}
    family: TaskFamily | None = None

    @staticmethod
    def detect(path: Path) -> bool:
        """A folder whose config.json names an architecture (or asks for remote code) and no causal-LM head;
        one naming no architecture stays the module kind's (a causal LM's fixed-length forward)."""
        if not is_hf_folder(path) or is_causal_lm(path):
            return False
        try:
            return bool(architectures(path)) or "auto_map" in read_config(path)
        except UserError:
            return False

    @classmethod
    def load(cls, path: Path, o: ConvertOptions, rng: np.random.Generator, say: Progress) -> HFTaskKind:
        say("load: Hugging Face task folder (safetensors; no code from the folder runs)")
        folder = open_folder(path)
        family_cls = family_for(folder.architecture)
        if family_cls is None:
            raise UserError(f"{path / 'config.json'}: architecture {folder.architecture} has no task head this "
                            f"tool knows (it converts the heads of {', '.join(known_heads())} and "
                            "AutoModelForCausalLM)")
        family = family_cls.open(folder, _model(folder), o.lm_max_len)
        # eval rows first: an audio clip length is the longest eval clip's unless --max-len says it
        ev = None
        if o.eval_data is not None and is_raw(Path(o.eval_data)):
            rows = family.rows(Path(o.eval_data), "--eval-data")
            ev = EvalData(rows.rows, rows.labels, rows.source, raw=rows.raw)
        if isinstance(o.calib, (str, Path)) and is_raw(Path(o.calib)):
            o = dataclasses.replace(o, calib=[tuple(r) for r in family.rows(Path(o.calib), "--calib").rows])
        metric = family.metric()
        if metric is not None and o.metric is None and ev is not None and ev.labels is not None:
            o = dataclasses.replace(o, metric=metric)
        m = load_object(family.module(), family.sample_args)
        m = dataclasses.replace(m, source_format=f"Hugging Face {family.name} folder ({folder.architecture})",
                                input_names=list(family.input_names), output_names=list(family.output_names),
                                output_kinds=dict(family.output_kinds), task=family.name,
                                int_high=family.int_high, notes=m.notes + family.notes,
                                app_io=AppIO(**family.app_io(), info={"name": path.resolve().name}) if family.app_io()
                                else None)
        kind = cls.from_loaded(m, o, rng, eval_set=ev)
        kind.family = family
        return kind

    def report_fields(self) -> dict:
        f = self.family
        return {**super().report_fields(), "source_format": self.m.source_format, "task": f.name,
                "hf": {"architecture": f.folder.architecture, "labels": list(f.folder.labels), **f.describe()}}


def _model(folder) -> torch.nn.Module:
    """The class config.json names, from Transformers itself (never from the folder: no auto_map)."""
    import transformers  # heavy; only HF folders need it

    cls = getattr(transformers, folder.architecture, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise UserError(f"{folder.path / 'config.json'}: Transformers {transformers.__version__} has no class "
                        f"{folder.architecture}")
    try:
        return cls.from_pretrained(folder.path, dtype=torch.float32, local_files_only=True).eval()
    except PipelineError:
        raise
    except Exception as e:  # noqa: BLE001 - missing or mismatched weights fail in many ways
        raise UserError(f"{folder.path}: cannot load it as {folder.architecture} ({type(e).__name__}: "
                        f"{first_line(e)})") from None
