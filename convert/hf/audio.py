"""Audio task families: audio classifiers, by what the folder's feature extractor hands the model
(read from the extractor's own output on a test clip, not from its class name).

- A raw waveform (Wav2Vec2, HuBERT, ...): the feature extractor's sampling rate decides what the app
  records; its zero-mean unit-variance normalisation (do_normalize) is folded into the graph, so the
  artifact takes the waveform as recorded. Clips are cut or zero-padded to one length: --max-len
  samples, else the longest --eval-data clip, else one second.
- Spectrogram features (ASTForAudioClassification on ASTFeatureExtractor's log-mel filter banks,
  input_values [1, frames, mel bins]; WhisperForAudioClassification on WhisperFeatureExtractor's
  log-mel spectrogram, input_features [1, mel bins, frames]): the features run OUTSIDE the artifact,
  which takes the extractor's output, its frames fixed by the extractor (it pads or cuts every clip).
  --eval-data and --calib clips go through the folder's extractor for PyTorch and the artifact
  alike; the report says what an app computes before it calls the model. No MediaPipe
  AudioClassifier metadata (labels only): MediaPipe's AudioClassifier feeds the model waveforms.
"""

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
PROBE_SECONDS = (0.1, 40.0)  # a short and a long test clip: a spectrogram artifact's frames must not depend on the clip
# What each extractor computes (Transformers 5.10's feature_extraction_*.py), for the report and the app's author.
RECIPES = {
    "ASTFeatureExtractor": "Kaldi-style log-mel filter banks of the waveform as decoded (-1..1): 400-sample Hann "
                           "window, 160-sample hop (25 ms / 10 ms at 16 kHz), 512-point FFT, DC offset removed, "
                           "pre-emphasis 0.97, mel bins from 20 Hz to rate/2; zero-padded or cut to max_length "
                           "frames; then (x - mean) / (2 * std) when do_normalize",
    "WhisperFeatureExtractor": "the clip zero-padded or cut to n_samples; log10 of a Slaney mel power spectrogram "
                               "(n_fft-sample Hann window, hop_length hop, mel bins from 0 to 8000 Hz, the last "
                               "frame dropped), floored at its maximum - 8, then (x + 4) / 4",
}
# The extractor's settings an app needs to reproduce its features, where the extractor has them.
SETTINGS = ("num_mel_bins", "feature_size", "n_fft", "hop_length", "chunk_length", "n_samples", "nb_max_frames",
            "max_length", "do_normalize", "mean", "std", "dither", "padding_value")


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


def _extract(extractor, clips: list[np.ndarray], rate: int, where: str) -> tuple[str, np.ndarray]:
    """The extractor's first model input for `clips` (batch first), float32."""
    try:
        out = extractor(clips, sampling_rate=rate, return_tensors="np")
    except Exception as e:  # noqa: BLE001 - an extractor fails in many ways
        raise UserError(f"{where}: {type(extractor).__name__} fails on it ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    name = next((n for n in extractor.model_input_names if n in out), None)
    if name is None:
        raise UserError(f"{where}: {type(extractor).__name__} returns {', '.join(out)}, none of its "
                        f"model_input_names ({', '.join(extractor.model_input_names)})")
    return name, np.asarray(out[name], np.float32)


def _probe(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.1 * np.sin(2 * np.pi * 440 * t) + 0.01 * np.random.default_rng(0).standard_normal(len(t))
            ).astype(np.float32)


def spectrogram_input(extractor, where: str) -> tuple[str, tuple[int, ...]] | None:
    """(name, shape) of what the extractor hands the model when it computes features (one clip gives a
    [1, a, b] array), None when it hands the model the waveform ([1, samples]). UserError when the
    features' frames vary with the clip's length: a fixed-shape artifact takes one number of frames."""
    rate = int(extractor.sampling_rate)
    name, short = _extract(extractor, [_probe(rate, PROBE_SECONDS[0])], rate, where)
    if short.ndim == 2:
        return None
    if short.ndim != 3:
        raise UserError(f"{where}: {type(extractor).__name__} gives {name} of shape {list(short.shape)}; this "
                        "version converts [1, samples] waveforms and [1, a, b] spectrogram features")
    _, long = _extract(extractor, [_probe(rate, PROBE_SECONDS[1])], rate, where)
    if long.shape != short.shape:
        raise UserError(f"{where}: {type(extractor).__name__}'s {name} is {list(short.shape)} for a "
                        f"{PROBE_SECONDS[0]} s clip and {list(long.shape)} for a {PROBE_SECONDS[1]:.0f} s one; this "
                        "version converts extractors that pad or cut every clip to one number of frames (AST, "
                        "Whisper)")
    return name, tuple(int(d) for d in short.shape)


class _AudioFamily(TaskFamily):
    """An audio classifier's folder: its feature extractor and sampling rate; clips from a .wav folder."""

    auto_class, mapping = "AutoModelForAudioClassification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"

    def __init__(self, folder, model, max_len, extractor=None):
        super().__init__(folder, model, max_len)
        self.extractor = extractor if extractor is not None else feature_extractor(folder)
        self.rate = int(self.extractor.sampling_rate)

    def _clips(self, path: Path, flag: str) -> tuple[list, list[np.ndarray], np.ndarray | None]:
        """The folder's clips, decoded at the extractor's rate (another rate is refused), and their labels."""
        items = raw_data.audio(path, flag)
        clips = [raw_data.decode_audio(it.value, self.rate, flag) for it in items]
        return items, clips, self.label_ids(items, lambda it: f"{flag} {it.where}")


@register_family("audio-classification")
class AudioClassification(_AudioFamily):
    """Audio classifiers (AutoModelForAudioClassification's heads): on the raw waveform (Wav2Vec2ForSequence-
    Classification, HuBERT, ...), or on spectrogram features computed outside the artifact (AST, Whisper:
    SpectrogramClassification); a folder of .wav files with labels.csv."""

    @classmethod
    def open(cls, folder, model, max_len) -> _AudioFamily:
        extractor = feature_extractor(folder)
        features = spectrogram_input(extractor, str(folder.path / PREPROCESSOR))
        if features is not None:
            return SpectrogramClassification(folder, model, max_len, extractor, features)
        return cls(folder, model, max_len, extractor)

    def __init__(self, folder, model, max_len, extractor=None):
        super().__init__(folder, model, max_len, extractor)
        if getattr(self.extractor, "feature_size", 1) != 1 or not hasattr(self.extractor, "do_normalize"):
            raise UserError(f"{folder.path / PREPROCESSOR}: {type(self.extractor).__name__} hands the model the "
                            "waveform without do_normalize; this version folds Wav2Vec2FeatureExtractor's "
                            "normalisation in (Wav2Vec2, HuBERT)")
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
        items, clips, labels = self._clips(path, flag)
        if self.given_len is None and flag == "--eval-data":
            self.length = max(len(c) for c in clips)  # read before sample_args: the artifact takes the longest clip
        rows = [[np.pad(c[:self.length], (0, max(0, self.length - len(c))))[None].astype(np.float32)] for c in clips]
        return Rows(rows, labels, f"{flag} {path.name}/ ({len(items)} clips, {raw_data.AUDIO_DECODER}; "
                                  f"{self.length} samples at {self.rate} Hz)")

    def app_io(self) -> dict:
        return {"audio": AudioInput(name="input_values", rate=self.rate), "labels": self.labels()}

    def describe(self) -> dict:
        return {"feature_extractor": type(self.extractor).__name__, "sampling_rate": self.rate,
                "samples": self.length, "do_normalize": bool(self.extractor.do_normalize),
                "normalization": "in the graph" if self.extractor.do_normalize else "none",
                "decoder": raw_data.AUDIO_DECODER}


class SpectrogramClassification(_AudioFamily):
    """Audio classifiers on spectrogram features (ASTForAudioClassification, WhisperForAudioClassification):
    the artifact takes the feature extractor's output; the app computes it (the report says how)."""

    name = AudioClassification.name  # the same task and registry entry: the extractor's output tells them apart

    def __init__(self, folder, model, max_len, extractor, features: tuple[str, tuple[int, ...]]):
        super().__init__(folder, model, max_len, extractor)
        self.feature_name, self.shape = features
        # one example row (export, the shape check below), extracted once
        self._sample = torch.from_numpy(_extract(self.extractor, [_probe(self.rate, 0.5)], self.rate, "a test tone")[1])
        fe = type(self.extractor).__name__
        if max_len is not None:
            raise UserError(f"--max-len {max_len}: {folder.architecture} takes {fe}'s {self.feature_name} "
                            f"{list(self.shape)}, its frames fixed by the extractor (drop --max-len)")
        try:
            with torch.no_grad():
                self.model(**{self.feature_name: self.sample_args[0]})
        except Exception as e:  # noqa: BLE001 - a model refuses a shape in many ways
            raise UserError(f"{folder.path}: {folder.architecture} does not take {fe}'s {self.feature_name} "
                            f"{list(self.shape)} ({type(e).__name__}: {first_line(e)}); save the extractor the "
                            "model was trained with") from None
        self.notes.append(f"features outside the artifact: an app computes {fe}'s {self.feature_name} "
                          f"{list(self.shape)} ({self.layout()}) from {self.rate} Hz mono audio "
                          f"({self._settings_line()}) and hands the artifact that")
        self.notes.append("no MediaPipe AudioClassifier metadata (labels only): MediaPipe's AudioClassifier feeds "
                          "the model the waveform; this model takes spectrogram features")

    def mel_bins(self) -> int | None:
        n = getattr(self.extractor, "num_mel_bins", None) or getattr(self.extractor, "feature_size", None)
        return int(n) if n and n in self.shape[1:] else None

    def layout(self) -> str:
        mel = self.mel_bins()
        if mel is None or self.shape[1] == self.shape[2]:
            return "[1, " + ", ".join(map(str, self.shape[1:])) + "]"
        return "[1, frames, mel bins]" if self.shape[2] == mel else "[1, mel bins, frames]"

    def frames(self) -> int | None:
        layout = self.layout()
        return self.shape[1] if layout == "[1, frames, mel bins]" else self.shape[2] if "frames" in layout else None

    def settings(self) -> dict:
        """The extractor's own settings an app needs, where it has them (JSON-ready)."""
        out = {}
        for k in SETTINGS:
            v = getattr(self.extractor, k, None)
            if isinstance(v, (bool, int, float, str)) and not (k == "feature_size" and "num_mel_bins" in out):
                out[k] = v.item() if isinstance(v, np.generic) else v
        return out

    def _settings_line(self) -> str:
        s = self.settings()
        parts = [f"{self.mel_bins()} mel bins" if self.mel_bins() else None,
                 f"{self.frames()} frames" if self.frames() else None,
                 *(f"{k} {s[k]}" for k in ("n_fft", "hop_length", "chunk_length") if k in s)]
        if s.get("do_normalize") and "mean" in s and "std" in s:
            parts.append(f"normalised with mean {s['mean']:.6g}, std {s['std']:.6g}")
        return ", ".join(p for p in parts if p)

    @property
    def input_names(self) -> list[str]:
        return [self.feature_name]

    @property
    def sample_args(self) -> tuple[torch.Tensor, ...]:
        return (self._sample,)

    def rows(self, path: Path, flag: str) -> Rows:
        items, clips, labels = self._clips(path, flag)
        _, feats = _extract(self.extractor, clips, self.rate, f"{flag} {path}")
        rows = [[feats[i:i + 1]] for i in range(len(clips))]
        return Rows(rows, labels, f"{flag} {path.name}/ ({len(items)} clips, {raw_data.AUDIO_DECODER}; through "
                                  f"{type(self.extractor).__name__} outside the artifact: {self.feature_name} "
                                  f"{list(self.shape)})")

    def app_io(self) -> dict:
        return {"labels": self.labels()}

    def describe(self) -> dict:
        fe = type(self.extractor).__name__
        backend = {}
        if fe == "ASTFeatureExtractor":  # Transformers picks torchaudio's Kaldi fbank where installed, else numpy
            from transformers.utils import is_speech_available

            backend = {"fbank": "torchaudio (Kaldi fbank)" if is_speech_available() else "numpy"}
        return {"feature_extractor": fe, "sampling_rate": self.rate,
                "features": "outside the artifact: the app computes them and hands the artifact the result",
                "input": {"name": self.feature_name, "shape": list(self.shape), "layout": self.layout(),
                          "mel_bins": self.mel_bins(), "frames": self.frames()},
                "extractor": {**self.settings(), **backend},
                "recipe": RECIPES.get(fe, f"{fe}'s own (Transformers' feature_extraction code)"),
                "app_metadata": "labels only (MediaPipe's AudioClassifier feeds waveforms)",
                "decoder": raw_data.AUDIO_DECODER}
