"""The SentencePiece model MediaPipe's BERT preprocessing reads for a Unigram (ALBERT-style) tokenizer.

MediaPipe Tasks 1.2.2's TextClassifier on a three-input model whose metadata names a
SentencePieceTokenizerOptions (bert_preprocessor_calculator.cc, tokenizers/sentencepiece_tokenizer.h)
lower-cases the sentence's ASCII letters, encodes it with the SentencePiece processor loaded from the
packed model file, looks each piece's id up with PieceToId, and puts "[CLS]" first and "[SEP]"
last (looked up the same way), ids 0 after them, mask 0, segment ids 0.

Transformers 5 saves a SentencePiece tokenizer as tokenizer.json alone (a Unigram model: pieces
with their log-probabilities), so `read` writes the SentencePiece ModelProto (sentencepiece's own
protobuf module) from it: the same pieces, scores and ids; the unknown piece as UNKNOWN and the
special tokens as CONTROL; no normalization rule (MediaPipe's ASCII lower-casing stands in for the
tokenizer's Lowercase); a "\u2581" put before the first word and whitespace runs folded, as
Metaspace does. A tokenizer that would tokenize differently on every sentence is refused
(wordpiece.NotMediaPipeBert); what differs on some sentences (NFKD, accents, `` and '' quotes)
is said in the notes."""

from __future__ import annotations

import json
from pathlib import Path

from tpu_pipeline.convert.app_io.wordpiece import CLS, SEP, NotMediaPipeBert, Vocab, check_template, normalizer_steps
from tpu_pipeline.errors import UserError

SPACE = "\u2581"  # SentencePiece's whitespace mark


def read(path: Path, what: str) -> tuple[bytes, Vocab]:
    """(the serialized SentencePiece ModelProto, its pieces as a Vocab) for the Unigram tokenizer.json
    at `path`. UserError: unreadable or no pieces; NotMediaPipeBert: one MediaPipe reads differently."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # a dependency of this project's (pyproject.toml)

    path = Path(path)
    try:
        tok = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{what}: cannot read {path} ({type(e).__name__}: {e})") from None
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict) or model.get("type") != "Unigram":
        raise NotMediaPipeBert(f"{what}: {path} is not a Unigram (SentencePiece) tokenizer")
    pieces = model.get("vocab")
    if not isinstance(pieces, list) or not pieces:
        raise UserError(f"{what}: {path} has no pieces in its Unigram model (model.vocab is empty)")
    if model.get("byte_fallback"):
        raise NotMediaPipeBert(f"{what}: {path} falls back to bytes for unknown characters; this writer makes a "
                               "SentencePiece model without byte pieces")
    unk = model.get("unk_id")
    specials = {a["content"] for a in tok.get("added_tokens") or [] if a.get("special")}
    tokens = [p[0] for p in pieces]
    missing = [t for t in (CLS, SEP) if t not in tokens]
    if unk is None or missing:
        raise NotMediaPipeBert(f"{what}: {path} lacks {', '.join(missing) or 'an unknown piece'}, which MediaPipe's BERT "
                               "preprocessing looks up")
    inner = next((t for t in tokens if SPACE in t[1:] and t not in specials), None)
    if inner is not None:
        raise NotMediaPipeBert(f"{what}: {path} has a piece spanning words ({inner!r}); the folder's tokenizer "
                               "splits words first, SentencePiece would not")
    notes = [_normalizer_note(tok.get("normalizer"), path, what)]
    _check_metaspace(tok.get("pre_tokenizer"), path, what)
    check_template(tok.get("post_processor"), path, what)
    m = pb.ModelProto()
    for i, (piece, score) in enumerate(pieces):
        p = m.pieces.add()
        p.piece, p.score = piece, float(score)
        p.type = (pb.ModelProto.SentencePiece.UNKNOWN if i == unk else
                  pb.ModelProto.SentencePiece.CONTROL if piece in specials else pb.ModelProto.SentencePiece.NORMAL)
    m.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    m.trainer_spec.vocab_size = len(pieces)
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = unk, -1, -1, -1
    n = m.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", True, True, True
    return m.SerializeToString(), Vocab(tuple(tokens), f"{path.name}'s Unigram pieces", tuple(x for x in notes if x))


def _normalizer_note(normalizer, path: Path, what: str) -> str:
    steps = normalizer_steps(normalizer)
    kinds = {s.get("type") for s in steps}
    if "Lowercase" not in kinds:
        raise NotMediaPipeBert(f"{what}: {path} is cased (its normalizer keeps upper case); MediaPipe lower-cases every "
                               "sentence before SentencePiece, so its pieces would differ from the model's")
    if kinds - {"Lowercase", "NFKD", "StripAccents", "Replace", "Strip"}:
        raise NotMediaPipeBert(f"{what}: {path} normalizes with {', '.join(sorted(k for k in kinds if k))}; the "
                               "SentencePiece model written here does not")
    return ("MediaPipe lower-cases ASCII letters only and applies none of the folder's NFKD, accent stripping or "
            "quote replacement: a sentence with non-ASCII letters or `` '' quotes may tokenize differently")


def _check_metaspace(pre, path: Path, what: str) -> None:
    steps = (pre.get("pretokenizers") or []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    meta = [s for s in steps if isinstance(s, dict) and s.get("type") == "Metaspace"]
    others = [s.get("type") for s in steps if isinstance(s, dict) and s.get("type") not in ("Metaspace", "WhitespaceSplit")]
    if len(meta) != 1 or others or meta[0].get("replacement", SPACE) != SPACE or \
            meta[0].get("prepend_scheme", "always") not in ("always", "first"):
        raise NotMediaPipeBert(f"{what}: {path} does not split words as SentencePiece does (a Metaspace with "
                               f"{SPACE!r} before each word)")
