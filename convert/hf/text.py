"""Text task families: sequence classification and token classification (BERT and other
encoders). Text goes through the folder's own tokenizer (tokenizer.json, the `tokenizers`
library; Transformers 5 saves a BERT tokenizer as tokenizer.json alone), padded to a fixed length:
--max-len, else the smaller of the model's positions and DEFAULT_LEN. A sequence classifier whose
tokenizer MediaPipe's BERT preprocessing reproduces (a WordPiece one, app_io/wordpiece.py, or a
Unigram one as a SentencePiece model, app_io/unigram.py) is described as a TextClassifier input:
its vocab or model goes into the artifact's metadata."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.convert.app_io import TextInput, wordpiece
from tpu_pipeline.convert.app_io.spec import tokenizer_file
from tpu_pipeline.convert.hf import raw_data
from tpu_pipeline.convert.hf.families import Rows, TaskFamily, Wrapped, register_family
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import task_score
from tpu_pipeline.errors import UserError

DEFAULT_LEN = 128
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # MediaPipe's BERT order: ids, mask, segment ids
IGNORE = -100  # Transformers' label for positions no tag scores (special tokens, padding, later sub-words)


def tokenizer(folder):
    import transformers  # heavy; only HF folders need it

    if not (folder.path / "tokenizer.json").is_file() and not (folder.path / "vocab.txt").is_file():
        raise UserError(f"{folder.path / 'tokenizer.json'}: missing; a text model's folder needs its tokenizer "
                        "(save it with tokenizer.save_pretrained(folder))")
    try:
        return transformers.AutoTokenizer.from_pretrained(folder.path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a malformed tokenizer fails in many ways
        raise UserError(f"{folder.path}: cannot load its tokenizer ({type(e).__name__}: {first_line(e)})") from None


TOKENIZER_FOR = {"WordPiece": "bert", "Unigram": "sentencepiece"}  # tokenizer.json model type -> app_io's tokenizer


def _model_type(path: Path) -> str:
    """tokenizer.json's model type; a vocab.txt is a WordPiece vocab."""
    if path.suffix != ".json":
        return "WordPiece"
    try:
        return str((json.loads(path.read_text(encoding="utf-8")).get("model") or {}).get("type"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None


class _TextFamily(TaskFamily):
    def __init__(self, folder, model, max_len):
        super().__init__(folder, model, max_len)
        self.tokenizer = tokenizer(folder)
        positions = int(folder.config.get("max_position_embeddings") or DEFAULT_LEN)
        if max_len is not None and max_len > positions:
            raise UserError(f"--max-len {max_len} is over the model's {positions} positions (max_position_embeddings)")
        self.max_len = max_len or min(positions, DEFAULT_LEN)
        self.names = [n for n in INPUTS if n in self.tokenizer.model_input_names]
        self.notes.append(f"text padded or cut to {self.max_len} tokens "
                          f"({'--max-len' if max_len else f'min(max_position_embeddings, {DEFAULT_LEN})'})")

    @property
    def input_names(self) -> list[str]:
        return self.names

    @property
    def int_high(self) -> list[int | None]:
        vocab = int(self.folder.config.get("vocab_size") or len(self.tokenizer))
        types = int(self.folder.config.get("type_vocab_size") or 2)
        return [{"input_ids": vocab, "attention_mask": 2, "token_type_ids": types}[n] for n in self.names]

    @property
    def sample_args(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(a) for a in self._encode(["a"])[0][0])

    def _encode(self, texts, words: bool = False):
        enc = self.tokenizer(texts, padding="max_length", truncation=True, max_length=self.max_len,
                             is_split_into_words=words, return_tensors="np",
                             return_token_type_ids="token_type_ids" in self.names)
        return [[enc[n][i:i + 1].astype(np.int64) for n in self.names] for i in range(len(texts))], enc

    def describe(self) -> dict:
        return {"tokenizer": type(self.tokenizer).__name__, "max_len": self.max_len, "inputs": self.names}


@register_family("sequence-classification")
class SequenceClassification(_TextFamily):
    """Text classifiers (BertForSequenceClassification, ...): token ids, mask, types -> logits; CSV/JSONL text."""

    auto_class, mapping = "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"

    def __init__(self, folder, model, max_len):
        super().__init__(folder, model, max_len)
        self.ignored: tuple[str, ...] = ()
        self.text = self._bert_input()

    def module(self) -> torch.nn.Module:
        return Wrapped(self.model, self.input_names, self.output_names, ignored=self.ignored)

    def _bert_input(self) -> TextInput | None:
        """MediaPipe's BERT-style input (WordPiece or SentencePiece, by tokenizer.json's model type) when its
        preprocessing tokenizes as the folder's tokenizer does, else None with a note saying why the
        artifact gets labels only (no TextClassifier metadata, no client check)."""
        vocab = next((p for p in (self.folder.path / n for n in ("tokenizer.json", "vocab.txt")) if p.is_file()), None)
        kind = _model_type(vocab)
        tokenizer = TOKENIZER_FOR.get(kind)
        why = None
        if tokenizer is None:
            why = (f"its tokenizer is {kind}; MediaPipe's TextClassifier reads WordPiece (BERT) or Unigram "
                   "(SentencePiece) ones")
        elif self.names[:2] != list(INPUTS[:2]):
            why = f"the model takes {', '.join(self.names)}; MediaPipe's BERT preprocessing fills {', '.join(INPUTS)}"
        else:
            text = TextInput(name=INPUTS[0], vocab=vocab, tokenizer=tokenizer, mask=INPUTS[1], segment=INPUTS[2])
            try:
                found = tokenizer_file(text)[2]
            except wordpiece.NotMediaPipeBert as e:  # readable, but MediaPipe would tokenize differently
                why = str(e).split(": ", 1)[1]
        if why:
            self.notes.append(f"no MediaPipe TextClassifier metadata (labels only): {why}")
            return None
        if len(self.names) == 2:  # DistilBERT: MediaPipe fills segment ids (all 0) all the same
            self.names = list(INPUTS)
            takes = "token_type_ids" in inspect.signature(self.model.forward).parameters
            self.ignored = () if takes else ("token_type_ids",)
            self.notes.append("token_type_ids: a third input because MediaPipe's BERT preprocessing fills three (its "
                              "segment ids are all 0); " + ("the model takes it" if takes else
                                                            f"{type(self.model).__name__} has no use for it and the "
                                                            "graph ignores it"))
        self.notes.append(f"MediaPipe TextClassifier input: {tokenizer} tokenizer from {found.source} "
                          f"({len(found.tokens)} tokens), {self.max_len} tokens")
        self.notes.extend(found.notes)
        return text

    def app_io(self) -> dict:
        return {"labels": self.labels(), **({"text": self.text} if self.text else {})}

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.texts(path, flag)
        rows, _ = self._encode([it.value for it in items])
        labels = self.label_ids(items, lambda it: it.where)
        return Rows(rows, labels, f"{flag} {path.name} ({len(items)} texts, {type(self.tokenizer).__name__})",
                    raw=[it.value for it in items])


@register_family("token-classification")
class TokenClassification(_TextFamily):
    """Token taggers (BertForTokenClassification, ...): -> logits per token; JSONL tokens and tags,
    scored by entity F1 (IOB2 chunks, as seqeval's default mode)."""

    auto_class, mapping = "AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.token_rows(path, flag)
        rows, enc = self._encode([it.value for it in items], words=True)
        if all(it.label is None for it in items):
            return Rows(rows, None, f"{flag} {path.name} ({len(items)} rows, no tags)")
        labels = np.full((len(items), self.max_len), IGNORE, np.int64)
        for i, it in enumerate(items):
            if it.label is None:
                raise UserError(f"{it.where}: has no tags while other rows have them")
            seen = set()
            for j, w in enumerate(enc.word_ids(i)):
                if w is not None and w not in seen:  # a word's first sub-token carries its tag
                    seen.add(w)
                    labels[i, j] = raw_data.label_index(it.label[w], self.folder.label2id, it.where)
        return Rows(rows, labels, f"{flag} {path.name} ({len(items)} rows, {type(self.tokenizer).__name__}; tags on "
                                  "each word's first sub-token)")

    def metric(self) -> task_score.Metric:
        return task_score.entity_f1(self.folder.labels, ignore=IGNORE)
