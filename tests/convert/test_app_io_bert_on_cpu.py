"""BERT (WordPiece) input for MediaPipe's TextClassifier (issue 39 item 2), what needs no export
and no child: the vocab taken from a Hugging Face tokenizer.json (index = id, as Transformers'
own tokenizer numbers it), every tokenizer MediaPipe would tokenize differently refused in one
line, the three-input description, the int32 app graph equal to the model, the hf sequence
family's choice between a TextClassifier input and labels only, and a folder whose tokenizer has
no vocab refused with exit 2. tests/convert/test_hf_tasks_on_cpu.py runs the artifact in MediaPipe."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.convert.app_io import TextInput, describe, wordpiece
from tpu_pipeline.convert.app_io.graph import app_graph, to_app
from tpu_pipeline.convert.app_io.spec import parse_text
from tpu_pipeline.convert.hf.folder import open_folder
from tpu_pipeline.convert.hf.text import SequenceClassification
from tpu_pipeline.errors import UserError
from tpu_pipeline.testing import hf_task_folders as hf

WORDS = ["good", "bad", "film", "##s", "un", "##like"]


def _saved_tokenizer(path, lower=True):
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    BertTokenizerFast(vocab=vocab, do_lower_case=lower).save_pretrained(path)
    return path / "tokenizer.json"


def _edited(tmp_path, edit):
    p = _saved_tokenizer(tmp_path / "tok")
    tok = json.loads(p.read_text())
    edit(tok)
    p.write_text(json.dumps(tok))
    return p


def test_vocab_from_tokenizer_json_is_the_tokenizers_own_numbering(tmp_path):
    from transformers import AutoTokenizer

    p = _saved_tokenizer(tmp_path / "tok")
    assert not (tmp_path / "tok" / "vocab.txt").exists()  # Transformers 5 saves tokenizer.json alone
    v = wordpiece.read(p, "t")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert list(v.tokens) == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert v.tokens[:4] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]") and v.tokens[-1] == "##like"
    # an uncased tokenizer strips accents; MediaPipe lower-cases ASCII only: said, not refused
    assert any("non-ASCII" in n and "accents" in n for n in v.notes), v.notes


@pytest.mark.parametrize("edit, words, cls", [
    (lambda t: t["normalizer"].update(lowercase=False), ["cased", "lower-cases"], wordpiece.NotMediaPipeBert),
    (lambda t: t["model"].update(type="BPE"), ["BPE", "WordPiece"], wordpiece.NotMediaPipeBert),
    (lambda t: t["model"].update(continuing_subword_prefix="@@"), ["'@@'", "'##'"], wordpiece.NotMediaPipeBert),
    (lambda t: t["model"]["vocab"].pop("[CLS]"), ["not 0..", "id 2"], UserError),
    (lambda t: t["model"].update(vocab={}), ["no vocab"], UserError),
    (lambda t: t.update(pre_tokenizer={"type": "Metaspace"}), ["Metaspace"], wordpiece.NotMediaPipeBert),
    (lambda t: t.update(post_processor=None), ["[CLS] sentence [SEP]"], wordpiece.NotMediaPipeBert),
])
def test_tokenizers_mediapipe_would_read_differently_are_refused_in_one_line(tmp_path, edit, words, cls):
    p = _edited(tmp_path, edit)
    with pytest.raises(cls) as e:
        wordpiece.read(p, "--text input_ids")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--text input_ids: ")
    for w in words:
        assert w in msg, msg
    if cls is UserError:  # unusable input, not a tokenizer that only differs: never the labels-only fallback
        assert not isinstance(e.value, wordpiece.NotMediaPipeBert)


def test_vocab_txt_one_token_a_line(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\ngood\n##s\n")
    assert wordpiece.read(p, "t").tokens == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "good", "##s")
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nGood\n")
    with pytest.raises(wordpiece.NotMediaPipeBert, match="upper-case tokens .'Good'"):
        wordpiece.read(p, "t")
    p.write_text("[PAD]\n\n[UNK]\n[CLS]\n[SEP]\n")  # MediaPipe skips the empty line: every later id would shift
    with pytest.raises(UserError, match="token id 1 is ''"):
        wordpiece.read(p, "t")


def test_text_flag_takes_the_bert_tokenizer(tmp_path):
    p = _saved_tokenizer(tmp_path / "tok")
    assert parse_text(f"ids:vocab={p}:tokenizer=bert:mask=m:segment=s") == TextInput(
        name="ids", vocab=p, tokenizer="bert", mask="m", segment="s")
    with pytest.raises(UserError, match="tokenizer .bpe. is not one of regex, bert, sentencepiece"):
        parse_text(f"ids:vocab={p}:tokenizer=bpe")


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


class ThreeInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = _tiny_bert()

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def test_three_int32_inputs_cast_inside_give_the_models_scores(tmp_path):
    names = ["input_ids", "attention_mask", "token_type_ids"]
    common = dict(input_names=names, input_shapes=[(1, 8)] * 3, input_dtypes=["int64"] * 3, output_shapes=[(1, 3)])
    p = _saved_tokenizer(tmp_path / "tok")
    app = describe(text=TextInput(name="input_ids", vocab=p, tokenizer="bert"), labels=["a", "b", "c"], **common)
    assert app.text.names == tuple(names) and app.text.cast_to == "int64" and app.task == "TextClassifier"
    model = ThreeInputs()
    ids = np.array([[2, 5, 7, 8, 3, 0, 0, 0]], np.int64)
    row = [ids, (ids > 0).astype(np.int64), np.zeros_like(ids)]
    graph, notes = app_graph(model, names, app, np.zeros((1, 3), np.float32))
    fed = to_app([row], names, app)[0]
    assert [x.dtype for x in fed] == [np.int32] * 3 and any("int32" in n for n in notes)
    with torch.no_grad():
        want = torch.softmax(model(*map(torch.from_numpy, row)), -1)
        got = graph(*map(torch.from_numpy, fed))
    assert torch.equal(got, want)
    # a model taking int32 already is fed as it is
    same = describe(text=TextInput(name="input_ids", vocab=p, tokenizer="bert"),
                    **{**common, "input_dtypes": ["int32"] * 3})
    assert same.text.cast_to is None and to_app([row], names, same)[0][0].dtype == np.int64


@pytest.mark.parametrize("change, words", [
    (dict(input_names=["input_ids", "attention_mask"], input_shapes=[(1, 8)] * 2, input_dtypes=["int64"] * 2),
     ["three inputs", "input_ids, attention_mask"]),
    (dict(input_shapes=[(1, 8), (1, 8), (1, 6)]), ["lengths [6, 8]"]),
    (dict(input_dtypes=["int64", "float32", "int64"]), ["attention_mask", "float32"]),
])
def test_bert_description_refuses_inputs_mediapipe_cannot_fill(tmp_path, change, words):
    common = dict(input_names=["input_ids", "attention_mask", "token_type_ids"], input_shapes=[(1, 8)] * 3,
                  input_dtypes=["int64"] * 3, output_shapes=[(1, 3)])
    with pytest.raises(UserError) as e:
        describe(text=TextInput(name="input_ids", vocab=_saved_tokenizer(tmp_path / "tok"), tokenizer="bert"),
                 **{**common, **change})
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return hf.save_bert_seq(tmp_path_factory.mktemp("hf") / "bert_seq", steps=0)


def _family(path):
    from transformers import BertForSequenceClassification

    return SequenceClassification(open_folder(path), BertForSequenceClassification.from_pretrained(path), None)


def test_sequence_family_describes_a_textclassifier_input_or_says_why_not(bert_folder, tmp_path):
    app = _family(bert_folder).app_io()
    assert app["text"] == TextInput(name="input_ids", vocab=bert_folder / "tokenizer.json", tokenizer="bert",
                                    mask="attention_mask", segment="token_type_ids")
    assert app["labels"].names == ("negative", "positive")
    cased = shutil.copytree(bert_folder, tmp_path / "cased")
    tok = json.loads((cased / "tokenizer.json").read_text())
    tok["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(tok))
    fam = _family(cased)
    assert "text" not in fam.app_io() and fam.app_io()["labels"].names == ("negative", "positive")
    assert any(n.startswith("no MediaPipe TextClassifier metadata (labels only): ") and "cased" in n
               for n in fam.notes), fam.notes


def test_folder_whose_tokenizer_has_no_vocab_is_refused(bert_folder, tmp_path):
    d = shutil.copytree(bert_folder, tmp_path / "novocab")
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"], tok["added_tokens"] = {}, []
    (d / "tokenizer.json").write_text(json.dumps(tok))
    r = CliRunner().invoke(cli, ["convert", str(d), "--targets", "desktop", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and r.output.strip().endswith(errors[0]) and "Traceback" not in r.output, r.output
    assert str(d / "tokenizer.json") in errors[0] and "no vocab" in errors[0]
    assert not (tmp_path / "o").exists()


def test_bert_client_check_needs_the_raw_sentences(tmp_path):
    from tpu_pipeline.convert.app_io.client import skipped_because

    bert = describe(text=TextInput(name="input_ids", vocab=_saved_tokenizer(tmp_path / "tok"), tokenizer="bert"),
                    input_names=["input_ids", "attention_mask", "token_type_ids"], input_shapes=[(1, 8)] * 3,
                    input_dtypes=["int64"] * 3, output_shapes=[(1, 3)])
    assert "--eval-data" in skipped_because(bert, None)
    assert skipped_because(bert, ["a good film"]) is None


def test_a_model_without_segment_ids_takes_the_third_input_mediapipe_fills_and_ignores_it(tmp_path):
    from transformers import DistilBertForSequenceClassification

    folder = hf.save_distilbert_seq(tmp_path / "distil", steps=0)
    model = DistilBertForSequenceClassification.from_pretrained(folder).eval()
    fam = SequenceClassification(open_folder(folder), model, None)
    assert fam.input_names == ["input_ids", "attention_mask", "token_type_ids"] and fam.app_io()["text"] is not None
    assert any("has no use for it and the graph ignores it" in n for n in fam.notes), fam.notes
    ids, mask, types = fam.sample_args
    assert types.shape == ids.shape and not types.any()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(fam.module()(ids, mask, types)[0], want)
        assert torch.equal(fam.module()(ids, mask, torch.ones_like(types))[0], want)


def _unigram_json(tmp_path):
    tok = hf._unigram_tokenizer(WORDS[:3])
    tok.save_pretrained(tmp_path / "sp")
    assert not list((tmp_path / "sp").glob("*.model"))  # Transformers 5 saves tokenizer.json alone
    return tok, tmp_path / "sp" / "tokenizer.json"


def test_sentencepiece_model_from_tokenizer_json_encodes_as_the_tokenizer_does(tmp_path):
    import sentencepiece as spm

    from tpu_pipeline.convert.app_io import unigram

    tok, path = _unigram_json(tmp_path)
    model, vocab = unigram.read(path, "t")
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert [sp.IdToPiece(i) for i in range(sp.GetPieceSize())] == list(vocab.tokens) == \
        tok.convert_ids_to_tokens(list(range(len(tok))))
    # what MediaPipe does: ASCII lower-case, encode, look each piece up, [CLS] ... [SEP]
    for s in ["The GOOD film!", "bad  films, goodish", "zz film"]:
        ids = [sp.PieceToId("[CLS]")] + [sp.PieceToId(p) for p in sp.EncodeAsPieces(s.lower())] + [sp.PieceToId("[SEP]")]
        assert ids == tok(s)["input_ids"], s
    assert any("non-ASCII" in n for n in vocab.notes)


@pytest.mark.parametrize("edit, words, cls", [
    (lambda t: t["normalizer"]["normalizers"].__setitem__(slice(None), [{"type": "NFKD"}]), ["cased"],
     wordpiece.NotMediaPipeBert),
    (lambda t: t["model"].update(byte_fallback=True), ["bytes"], wordpiece.NotMediaPipeBert),
    (lambda t: t["model"].update(vocab=[]), ["no pieces"], UserError),
    (lambda t: t["model"]["vocab"].append(["\u2581good\u2581film", -1.0]), ["spanning words"],
     wordpiece.NotMediaPipeBert),
    (lambda t: t.update(pre_tokenizer={"type": "BertPreTokenizer"}), ["Metaspace"], wordpiece.NotMediaPipeBert),
])
def test_unigram_tokenizers_mediapipe_would_read_differently_are_refused(tmp_path, edit, words, cls):
    from tpu_pipeline.convert.app_io import unigram

    _, path = _unigram_json(tmp_path)
    tok = json.loads(path.read_text())
    edit(tok)
    path.write_text(json.dumps(tok))
    with pytest.raises(cls) as e:
        unigram.read(path, "--text input_ids")
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    if cls is UserError:
        assert not isinstance(e.value, wordpiece.NotMediaPipeBert)


def test_sequence_family_takes_a_sentencepiece_tokenizer_and_refuses_bpe(tmp_path):
    from transformers import AlbertForSequenceClassification

    folder = hf.save_albert_seq(tmp_path / "albert", steps=0)
    fam = SequenceClassification(open_folder(folder), AlbertForSequenceClassification.from_pretrained(folder), None)
    assert fam.app_io()["text"].tokenizer == "sentencepiece" and fam.input_names[-1] == "token_type_ids"
    bpe = shutil.copytree(folder, tmp_path / "bpe")
    tok = json.loads((bpe / "tokenizer.json").read_text())
    tok["model"] = {"type": "BPE", "vocab": {p: i for i, (p, _) in enumerate(tok["model"]["vocab"])}, "merges": []}
    (bpe / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((bpe / "tokenizer_config.json").read_text())  # the generic class loads any tokenizer.json
    (bpe / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}))
    fam = SequenceClassification(open_folder(bpe), AlbertForSequenceClassification.from_pretrained(bpe), None)
    assert "text" not in fam.app_io()
    assert any(n.startswith("no MediaPipe TextClassifier metadata (labels only): its tokenizer is BPE") for n in fam.notes)
