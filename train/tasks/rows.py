"""Prompts with verifiable answers in VeRL's row schema, and the stable seed.

Every rl source yields rows shaped like VeRL's parquet data (data_source,
prompt, ability, reward_model.ground_truth, extra_info), so the local engine
and `--engine verl` read the same thing, and a file VeRL's preprocessing
scripts wrote (GSM8K, MATH...) reads back into the same rows.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_bytes


@dataclass
class Problem:
    prompt: Any                 # str, or a list of chat messages [{"role", "content"}]
    ground_truth: str
    data_source: str
    ability: str = "math"
    extra_info: dict = field(default_factory=dict)

    def prompt_text(self, tokenizer=None) -> str:
        """The text the policy continues: raw for plain prompts; the chat template where the
        tokenizer has one; else the messages' contents joined (char-level tokenizers)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(self.prompt, add_generation_prompt=True, tokenize=False)
        return "\n".join(m["content"] for m in self.prompt)

    def to_row(self, index: int, split: str) -> dict:
        prompt = self.prompt if isinstance(self.prompt, list) else [{"role": "user", "content": self.prompt}]
        return {
            "data_source": self.data_source,
            "prompt": prompt,
            "ability": self.ability,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"split": split, "index": index, **self.extra_info},
        }


def stable_seed(*parts: Any) -> int:
    """A stable 31-bit seed from parts (Python's hash() is salted per process)."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def read_parquet(path: str | Path) -> list[Problem]:
    """Rows in VeRL's schema -> Problems; a malformed row fails with its row number."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--data {path}: file not found")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise UserError(f"--data {path}: not a readable parquet file ({type(e).__name__}: {e})") from None
    if not rows:
        raise UserError(f"--data {path}: no rows")
    return [_row(path, i, r) for i, r in enumerate(rows)]


def _row(path: Path, i: int, r: dict) -> Problem:
    where = f"{path}: row {i}"
    ds = r.get("data_source")
    if not isinstance(ds, str) or not ds:
        raise UserError(f"{where}: 'data_source' must be a non-empty string, got {ds!r}")
    prompt = r.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise UserError(f"{where}: 'prompt' is empty")
    elif isinstance(prompt, (list, tuple)) and prompt:
        for j, m in enumerate(prompt):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
                raise UserError(f"{where}: prompt[{j}] must be {{'role': str, 'content': str}}, got {m!r}")
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise UserError(f"{where}: 'prompt' must be a list of chat messages or a string, got {prompt!r}")
    rm = r.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if gt is None or (isinstance(gt, str) and not gt):
        raise UserError(f"{where}: 'reward_model.ground_truth' is missing")
    extra = r.get("extra_info") if isinstance(r.get("extra_info"), dict) else {}
    return Problem(prompt, gt if isinstance(gt, str) else str(gt), ds, str(r.get("ability") or "math"), dict(extra))


def write_parquet(problems: Sequence[Problem], path: str | Path, split: str) -> Path:
    """Problems -> a parquet file VeRL's RLHFDataset reads (written atomically)."""
    table = pa.Table.from_pylist([p.to_row(i, split) for i, p in enumerate(problems)])
    buf = io.BytesIO()
    pq.write_table(table, buf)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
