"""Audio task families: classification of a raw waveform (Wav2Vec2, HuBERT, ...). The feature
extractor's sampling rate decides what the app records; its zero-mean unit-variance
normalisation (do_normalize) is folded into the graph, so the artifact takes the waveform as
recorded. Clips are cut or zero-padded to one length: --max-len samples, else the longest
--eval-data clip, else one second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from tpu_pipeline.convert.app_io import AudioInput
from tpu_pipeline.convert.hf import raw_data
from tpu_pipeline.convert.hf.families import (PREPROCESSOR, Rows, TaskFamily, Wrapped, preprocessor_config,
                                              register_family)
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.errors import UserError

NORM_EPS = 1e-7  # Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm's


class WaveformNorm(nn.Module):
    """(x - mean) / sqrt(var + 1e-7) over the clip, as the feature extractor's do_normalize."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + NORM_EPS)


def feature_extractor(folder):
    import transformers  # heavy; only HF folders need it

    cfg = preprocessor_config(folder, "feature extractor")
    try:
        return transformers.AutoFeatureExtractor.from_pretrained(folder.path, local_files_only=True,
                                                                  trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a malformed config fails in many ways
        raise UserError(f"{cfg}: cannot load the feature extractor ({type(e).__name__}: {first_line(e)})") from None


@register_family("audio-classification")
class AudioClassification(TaskFamily):
    """Audio classifiers on the raw waveform (Wav2Vec2ForSequenceClassification, HuBERT, ...): a folder of
    .wav files with labels.csv."""

    auto_class, mapping = "AutoModelForAudioClassification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"

    def __init__(self, folder, model, max_len):
        super().__init__(folder, model, max_len)
        self.extractor = feature_extractor(folder)
        if getattr(self.extractor, "feature_size", 1) != 1 or not hasattr(self.extractor, "do_normalize"):
            raise UserError(f"{folder.path / PREPROCESSOR}: {type(self.extractor).__name__} computes spectrogram "
                            "features outside the model; this version converts raw-waveform models (Wav2Vec2, HuBERT)")
        self.rate = int(self.extractor.sampling_rate)
        self.given_len = max_len
        self.length = max_len or self.rate

    @property
    def input_names(self) -> list[str]:
        return ["input_values"]

    @property
    def sample_args(self) -> tuple[torch.Tensor, ...]:
        t = np.arange(self.length, dtype=np.float32) / self.rate
        return (torch.from_numpy((0.1 * np.sin(2 * np.pi * 440 * t))[None].astype(np.float32)),)

    def module(self) -> nn.Module:
        return Wrapped(self.model, self.input_names, self.output_names,
                       pre=WaveformNorm() if self.extractor.do_normalize else None)

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.audio(path, flag)
        clips = [raw_data.decode_audio(it.value, self.rate, flag) for it in items]
        if self.given_len is None and flag == "--eval-data":
            self.length = max(len(c) for c in clips)  # read before sample_args: the artifact takes the longest clip
        rows = [[np.pad(c[:self.length], (0, max(0, self.length - len(c))))[None].astype(np.float32)] for c in clips]
        labels = self.label_ids(items, lambda it: f"{flag} {it.where}")
        return Rows(rows, labels, f"{flag} {path.name}/ ({len(items)} clips, {raw_data.AUDIO_DECODER}; "
                                  f"{self.length} samples at {self.rate} Hz)")

    def app_io(self) -> dict:
        return {"audio": AudioInput(name="input_values", rate=self.rate), "labels": self.labels()}

    def describe(self) -> dict:
        return {"feature_extractor": type(self.extractor).__name__, "sampling_rate": self.rate,
                "samples": self.length, "do_normalize": bool(self.extractor.do_normalize),
                "normalization": "in the graph" if self.extractor.do_normalize else "none",
                "decoder": raw_data.AUDIO_DECODER}
