"""The WordPiece vocab MediaPipe's BERT tokenizer reads, and whether it tokenizes as the model's own.

MediaPipe Tasks' TextClassifier on a BERT model (bert_preprocessor_calculator.cc, tokenizers/
bert_tokenizer.h, 1.2.2) reads BertTokenizerOptions' VOCABULARY file: one token per line, the
line's index its id (empty lines are skipped, so no token may be empty). To a sentence it does:
ASCII lower-casing (nothing else: no accent stripping, no other letters), a split on whitespace
and punctuation (kept as tokens) and CJK characters, greedy longest-match word pieces with the
"##" prefix, "[UNK]" for a word that has none; then "[CLS]" first and "[SEP]" last, cut to the
input length, ids 0 after them with mask 0, segment ids all 0.

A Hugging Face tokenizer.json (Transformers 5 saves no vocab.txt) says what the model was trained
with; `read` takes its WordPiece vocab and refuses (`NotMediaPipeBert`) a tokenizer MediaPipe
would tokenize differently on every sentence: not WordPiece, cased, another subword prefix,
other special tokens, another pre-tokenizer or template. What differs only on some sentences
(non-ASCII letters, accents) is said in `Vocab.notes`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tpu_pipeline.errors import UserError

CLS, SEP, UNK = "[CLS]", "[SEP]", "[UNK]"  # the literals MediaPipe's BERT preprocessor looks up
SUBWORD_PREFIX = "##"
MAX_CHARS_PER_WORD = 100  # bert_tokenizer.h kDefaultMaxCharsPerSubToken


class NotMediaPipeBert(UserError):
    """A readable tokenizer whose tokens MediaPipe's BERT preprocessing would not reproduce."""


@dataclasses.dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]   # index = id
    source: str               # where they came from ("tokenizer.json's WordPiece vocab")
    notes: tuple[str, ...]    # where MediaPipe's tokenizer may still differ from the model's, in words


def read(path: Path, what: str) -> Vocab:
    """The vocab at `path`: a tokenizer.json (its WordPiece model) or a vocab.txt (one token a line).
    `what` starts each error line (e.g. "--text input_ids"). UserError: unreadable, no vocab, ids
    that are not 0..N-1; NotMediaPipeBert: a tokenizer MediaPipe's BERT preprocessing differs from."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read vocab {path} ({type(e).__name__}: {e})") from None
    if path.suffix == ".json":
        return _from_tokenizer_json(text, path, what)
    tokens = tuple(text.splitlines())
    while tokens and not tokens[-1]:
        tokens = tokens[:-1]
    _check_tokens(tokens, f"{what}: vocab {path}")
    upper = next((t for t in tokens if t not in (CLS, SEP, UNK) and not t.startswith("[") and t != t.lower()), None)
    if upper is not None:
        raise NotMediaPipeBert(f"{what}: vocab {path} has upper-case tokens ({upper!r}): a cased vocab; MediaPipe's "
                               "BERT tokenizer lower-cases every sentence, so those tokens are never produced")
    return Vocab(tokens, f"{path.name} (one token a line)", ())


def _from_tokenizer_json(text: str, path: Path, what: str) -> Vocab:
    try:
        tok = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what}: {path} is not JSON ({e})") from None
    model = tok.get("model") if isinstance(tok, dict) else None
    if not isinstance(model, dict):
        raise UserError(f"{what}: {path} has no tokenizer model (expected a Hugging Face tokenizer.json)")
    if model.get("type") != "WordPiece":
        raise NotMediaPipeBert(f"{what}: {path} is a {model.get('type')} tokenizer; MediaPipe's BERT preprocessing "
                               "reads a WordPiece vocab")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise UserError(f"{what}: {path} has no vocab in its WordPiece model (model.vocab is empty)")
    by_id = {}
    for token, i in vocab.items():
        if not isinstance(i, int) or i in by_id:
            raise UserError(f"{what}: {path}: token {token!r} has id {i!r}, not a unique whole number")
        by_id[i] = token
    if sorted(by_id) != list(range(len(by_id))):
        gap = next(i for i in range(len(by_id) + 1) if i not in by_id)
        raise UserError(f"{what}: {path}: the vocab's ids are not 0..{len(by_id) - 1} (no token has id {gap}); "
                        "MediaPipe's vocab file gives each token its line number")
    tokens = tuple(by_id[i] for i in range(len(by_id)))
    _check_tokens(tokens, f"{what}: {path}")
    if model.get("continuing_subword_prefix", SUBWORD_PREFIX) != SUBWORD_PREFIX:
        raise NotMediaPipeBert(f"{what}: {path}: word pieces continue with {model['continuing_subword_prefix']!r}; "
                               f"MediaPipe's BERT tokenizer uses {SUBWORD_PREFIX!r}")
    if model.get("unk_token", UNK) != UNK:
        raise NotMediaPipeBert(f"{what}: {path}: the unknown token is {model['unk_token']!r}; MediaPipe's BERT "
                               f"tokenizer writes {UNK}")
    notes = [_lowercase_note(tok.get("normalizer"), path, what)]
    _check_pre_tokenizer(tok.get("pre_tokenizer"), path, what)
    check_template(tok.get("post_processor"), path, what)
    if model.get("max_input_chars_per_word", MAX_CHARS_PER_WORD) != MAX_CHARS_PER_WORD:
        notes.append(f"a word over {MAX_CHARS_PER_WORD} characters becomes [UNK] in MediaPipe (the folder's tokenizer "
                     f"allows {model['max_input_chars_per_word']})")
    return Vocab(tokens, f"{path.name}'s WordPiece vocab", tuple(n for n in notes if n))


def _check_tokens(tokens: tuple[str, ...], where: str) -> None:
    if not tokens:
        raise UserError(f"{where}: no tokens")
    bad = next((i for i, t in enumerate(tokens) if not t or "\n" in t or "\r" in t), None)
    if bad is not None:
        raise UserError(f"{where}: token id {bad} is {tokens[bad]!r}; a vocab file line cannot hold it (MediaPipe "
                        "skips empty lines, which would shift every later id)")
    missing = [t for t in (CLS, SEP, UNK) if t not in tokens]
    if missing:
        raise NotMediaPipeBert(f"{where}: the vocab lacks {', '.join(missing)}, which MediaPipe's BERT preprocessing "
                               "writes around every sentence")


def normalizer_steps(n) -> list[dict]:
    if not isinstance(n, dict):
        return []
    return [x for s in n.get("normalizers", []) for x in normalizer_steps(s)] if n.get("type") == "Sequence" else [n]


def _lowercase_note(normalizer, path: Path, what: str) -> str:
    """Refuses a cased tokenizer; the note on what MediaPipe's ASCII-only lower-casing still changes."""
    steps = normalizer_steps(normalizer)
    bert = next((s for s in steps if s.get("type") == "BertNormalizer"), None)
    lower = bool(bert and bert.get("lowercase")) or any(s.get("type") == "Lowercase" for s in steps)
    if not lower:
        raise NotMediaPipeBert(f"{what}: {path} is cased (its normalizer keeps upper case); MediaPipe's BERT "
                               "tokenizer lower-cases every sentence, so its ids would differ from the model's")
    accents = (bert is not None and bert.get("strip_accents") in (None, True)) or any(
        s.get("type") == "StripAccents" for s in steps)
    return ("MediaPipe lower-cases ASCII letters only" + (" and strips no accents" if accents else "") +
            ": a sentence with non-ASCII letters may tokenize differently from the folder's tokenizer")


def _check_pre_tokenizer(pre, path: Path, what: str) -> None:
    kind = pre.get("type") if isinstance(pre, dict) else None
    if kind != "BertPreTokenizer":
        raise NotMediaPipeBert(f"{what}: {path} splits words with {kind or 'no pre-tokenizer'}; MediaPipe's BERT "
                               "tokenizer splits on whitespace and punctuation as BertPreTokenizer does")


def check_template(post, path: Path, what: str) -> None:
    """The single-sentence template must be [CLS] sentence [SEP], all segment 0, as MediaPipe packs it."""
    kind = post.get("type") if isinstance(post, dict) else None
    if kind == "BertProcessing":
        cls, sep = post.get("cls", [None])[0], post.get("sep", [None])[0]
        if (cls, sep) == (CLS, SEP):
            return
    elif kind == "TemplateProcessing":
        single = post.get("single") or []
        got = [("A" if "Sequence" in p else p.get("SpecialToken", {}).get("id"),
                next(iter(p.values()), {}).get("type_id", 0)) for p in single]
        if got == [(CLS, 0), ("A", 0), (SEP, 0)]:
            return
    raise NotMediaPipeBert(f"{what}: {path} does not pack a sentence as {CLS} sentence {SEP} ({kind or 'no template'}); "
                           "MediaPipe's BERT preprocessing does")
