"""Greedy generation with a decode-ready LiteRT LM: ai-edge-litert, the
tokenizers library and numpy only, no PyTorch. This is the reference client
for artifacts written by `decode_ready.py` (see `tpu-pipeline generate`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter
from tokenizers import Tokenizer

from tpu_pipeline.convert.lm.litertlm_runtime import BUNDLE_FILE
from tpu_pipeline.errors import UserError

META_FILE = "lm.json"


def resolve_artifact_dir(path: str | Path) -> Path:
    """A target folder, or a convert output folder (then its desktop artifact): one that holds a
    decode-ready LM (lm.json) or a LiteRT-LM bundle (model.litertlm)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such folder")
    for folder in (path, *(path / t for t in ("desktop", "android", "ios", "web"))):
        if (folder / META_FILE).is_file() or (folder / BUNDLE_FILE).is_file():
            return folder
    raise UserError(f"{path} holds no language model ({META_FILE} or {BUNDLE_FILE} missing): convert a "
                    "Hugging Face causal-LM folder with `tpu-pipeline convert` first")


class LiteRTLanguageModel:
    def __init__(self, artifact_dir: str | Path, *, num_threads: int | None = None):
        d = Path(artifact_dir)
        meta_path = d / META_FILE
        if not meta_path.is_file():
            raise UserError(f"{d} holds no decode-ready LM ({META_FILE} missing): convert a Hugging Face "
                            "causal-LM folder with `tpu-pipeline convert` first")
        for name in ("model.tflite", "tokenizer.json"):
            if not (d / name).is_file():
                raise UserError(f"{d}: {name} missing; the artifact folder is incomplete (convert it again)")
        self.meta = json.loads(meta_path.read_text())
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        self._interp = Interpreter(model_path=str(d / "model.tflite"), num_threads=num_threads)
        self._prefill = self._interp.get_signature_runner("prefill")
        self._decode = self._interp.get_signature_runner("decode")
        self.max_len = int(self.meta["max_len"])
        self.prefill_len = int(self.meta["prefill_len"])
        self.eos_ids = set(self.meta.get("eos_token_ids") or [])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _prefill_all(self, prompt_ids: list[int]):
        shape = tuple(self.meta["cache_shape"])
        k = np.zeros(shape, np.float32)
        v = np.zeros(shape, np.float32)
        p, n = self.prefill_len, len(prompt_ids)
        logits = None
        for start in range(0, n, p):  # chunked prefill: positions beyond n are masked, then overwritten
            chunk = prompt_ids[start:start + p]
            tokens = np.zeros((1, p), np.int32)
            tokens[0, :len(chunk)] = chunk
            out = self._prefill(tokens=tokens, input_pos=np.arange(start, start + p, dtype=np.int32),
                                k_cache=k, v_cache=v)
            k, v = out["k_cache"], out["v_cache"]
            logits = out["logits"][0, len(chunk) - 1]
        return logits, k, v

    def last_prefill_logits(self, prompt_ids: list[int]) -> np.ndarray:
        return self._prefill_all(prompt_ids)[0]

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int = 32) -> list[int]:
        """Greedy continuation of `prompt_ids` (stops at EOS, which is kept)."""
        n = len(prompt_ids)
        if n == 0:
            raise UserError("empty prompt")
        if n >= self.max_len:
            raise UserError(f"prompt is {n} tokens; this artifact's cache holds {self.max_len}")
        logits, k, v = self._prefill_all(prompt_ids)
        new: list[int] = []
        pos = n
        while len(new) < max_new_tokens:
            token = int(np.argmax(logits))
            new.append(token)
            if token in self.eos_ids or pos >= self.max_len:
                break
            out = self._decode(tokens=np.array([[token]], np.int32), input_pos=np.array([pos], np.int32),
                               k_cache=k, v_cache=v)
            k, v, logits = out["k_cache"], out["v_cache"], out["logits"][0, 0]
            pos += 1
        return new

    def generate(self, prompt: str, max_new_tokens: int = 32) -> str:
        return self.decode(self.generate_ids(self.encode(prompt), max_new_tokens))
