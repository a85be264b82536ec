"""What a Hugging Face folder says about itself: config.json's architecture, its labels, and
whether it asks for code from the folder (auto_map), read without loading any weights.

Detection is by `architectures` only (never by which tokenizer files lie beside it): a BERT
sequence classifier has config.json and tokenizer.json exactly like a causal LM."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tpu_pipeline.convert.lm.kind import names_causal_lm
from tpu_pipeline.errors import UserError

CONFIG = "config.json"


@dataclasses.dataclass(frozen=True)
class Folder:
    path: Path
    config: dict
    architecture: str        # config.json's architectures[0]: the class save_pretrained wrote
    labels: tuple[str, ...]  # id2label in index order ("LABEL_0", ... when the config names none)

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.labels)}


def read_config(path: Path) -> dict:
    cfg = path / CONFIG
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{cfg}: cannot read it as JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{cfg}: holds a JSON {type(data).__name__}, not an object")
    return data


def architectures(path: Path) -> list[str]:
    """config.json's `architectures` ([] when the file is unreadable or names none)."""
    try:
        archs = read_config(path).get("architectures") or []
    except UserError:
        return []
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def is_causal_lm(path: Path) -> bool:
    """A folder whose config.json names a causal-LM head (the causal-lm kind's, lm/kind.py)."""
    return is_hf_folder(path) and names_causal_lm(path)


def open_folder(path: Path) -> Folder:
    """The folder's config, checked: no remote code, one architecture named."""
    cfg = path / CONFIG
    config = read_config(path)
    if "auto_map" in config:
        names = ", ".join(sorted(config["auto_map"])) if isinstance(config["auto_map"], dict) else "?"
        raise UserError(f"{cfg}: asks for code from the folder (auto_map: {names}); trust_remote_code stays off, "
                        "so only architectures built into Transformers are converted")
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UserError(f"{cfg}: names no `architectures` (the model class save_pretrained writes, e.g. "
                        "ViTForImageClassification), so the task head is unknown")
    return Folder(path=path, config=config, architecture=archs[0], labels=_labels(config, cfg))


def _labels(config: dict, cfg: Path) -> tuple[str, ...]:
    raw = config.get("id2label") or {}
    try:
        by_id = {int(k): str(v) for k, v in raw.items()}
    except (AttributeError, ValueError):
        raise UserError(f"{cfg}: id2label must map class indices to names") from None
    n = int(config.get("num_labels") or len(by_id) or 0)
    if by_id and sorted(by_id) != list(range(len(by_id))):
        raise UserError(f"{cfg}: id2label's keys must be 0..{len(by_id) - 1}")
    return tuple(by_id.get(i, f"LABEL_{i}") for i in range(max(n, len(by_id))))
