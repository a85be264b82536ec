"""Tiny Hugging Face task folders TRAINED for seconds, saved as users save them
(`model.save_pretrained(d)` beside `processor.save_pretrained(d)`), each with the raw data a user
would bring (image folders, CSV/JSONL text, .wav files with labels.csv): issue 39.

- vit: ViTForImageClassification telling red, green and blue squares apart on noisy 32 x 32 images;
  raw data: a folder with a subfolder per label name, PNG files.
- bert_seq: BertForSequenceClassification, positive vs negative sentences (WordPiece vocab in
  tokenizer.json); raw data: a CSV with text,label columns.
- distilbert_seq: DistilBertForSequenceClassification on the same task (no token_type_ids input).
- albert_seq: AlbertForSequenceClassification on the same task, a SentencePiece (Unigram) tokenizer.
- bert_tok: BertForTokenClassification tagging person and place names (B-PER, I-PER, B-LOC, O);
  raw data: JSONL rows {"tokens": [...], "tags": [...]}.
- wav2vec2: Wav2Vec2ForSequenceClassification telling low from high tones at 16 kHz; raw data:
  .wav files (16-bit PCM, stdlib wave) with labels.csv (file_name,label).
- ast: ASTForAudioClassification on the same tones, ASTFeatureExtractor's log-mel filter banks (16 mel
  bins, 64 frames) computed outside the model; raw data: the same .wav folder.
- whisper: WhisperForAudioClassification on the same tones, WhisperFeatureExtractor's log-mel
  spectrogram (16 mel bins) with a 1 s window (chunk_length 1: 100 frames, the encoder's
  max_source_positions 50) instead of Whisper's 30 s; raw data: the same .wav folder.
- segformer: SegformerForSemanticSegmentation marking a bright square; raw data: images/ and
  masks/ (PNG class indices, same file names).
"""

from __future__ import annotations

import csv
import json
import wave
from pathlib import Path

import numpy as np
import torch
from PIL import Image

COLOURS = ("red", "green", "blue")
IMAGE = 32


def _fit(model, batches, steps: int, lr: float = 3e-3, seed: int = 0):
    """A few Adam steps on `batches(step) -> dict of model kwargs with labels`."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # the cores are shared: one thread trains these small nets fastest here
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        opt.zero_grad()
        model(**batches(step)).loss.backward()
        opt.step()
    return model.eval()


# ---------------------------------------------------------------- images

def colour_image(rng: np.random.Generator, label: int, size: int = IMAGE) -> np.ndarray:
    """A noisy grey image with a square of colour COLOURS[label] somewhere in it (uint8 HWC)."""
    img = rng.integers(60, 140, (size, size, 3)).astype(np.uint8)
    s = int(rng.integers(size // 3, size // 2))
    y, x = rng.integers(0, size - s, 2)
    img[y:y + s, x:x + s] = 30
    img[y:y + s, x:x + s, label] = 230
    return img


def save_vit(out: Path, *, steps: int = 60, seed: int = 0) -> Path:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(seed)
    cfg = ViTConfig(image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=3, id2label=dict(enumerate(COLOURS)),
                    label2id={c: i for i, c in enumerate(COLOURS)})
    model = ViTForImageClassification(cfg)
    proc = ViTImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, 512)
    pixels = proc([colour_image(rng, int(k)) for k in labels], return_tensors="pt")["pixel_values"]
    y = torch.from_numpy(labels)
    _fit(model, lambda s: {"pixel_values": pixels[s * 32 % 512:][:32], "labels": y[s * 32 % 512:][:32]}, steps)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


def image_folder(out: Path, n: int = 24, *, seed: int = 1, size: int = 40) -> Path:
    """A folder with a subfolder per label name (COLOURS), PNG images of another size than the model's."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        label = i % 3
        (out / COLOURS[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(colour_image(rng, label, size)).save(out / COLOURS[label] / f"img_{i:03d}.png")
    return out


# ---------------------------------------------------------------- text

POSITIVE = ("good", "great", "fine", "happy", "lovely", "nice")
NEGATIVE = ("bad", "awful", "poor", "sad", "ugly", "terrible")
FILLER = ("the", "film", "was", "a", "day", "very", "really", "food", "it", "and", "this")
PEOPLE = ("anna", "bob", "maria", "li")
SURNAMES = ("smith", "jones", "garcia")
PLACES = ("paris", "rome", "lima", "oslo")
TAGS = ("O", "B-PER", "I-PER", "B-LOC")


def _tokenizer(words, cls=None):
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(words)))}
    return (cls or BertTokenizerFast)(vocab=vocab, do_lower_case=True)  # vocab=: vocab_file= is ignored in 5.10


def sentiment_rows(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    rows = []
    for i in range(n):
        label = "positive" if i % 2 == 0 else "negative"
        words = list(rng.choice(FILLER, int(rng.integers(3, 7))))
        at = int(rng.integers(0, len(words) + 1))
        words.insert(at, str(rng.choice(POSITIVE if label == "positive" else NEGATIVE)))
        rows.append((" ".join(words), label))
    return rows


def _bert(cls, tok, num_labels: int, id2label: dict, max_len: int):
    from transformers import BertConfig

    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=max_len, num_labels=num_labels,
                     id2label=id2label, label2id={v: k for k, v in id2label.items()})
    return cls(cfg)


def _fit_sentiment(model, tok, out: Path, steps: int, seed: int) -> Path:
    """Trains a sequence classifier on 256 sentiment rows and saves it beside its tokenizer."""
    rows = sentiment_rows(np.random.default_rng(seed), 256)
    enc = tok([t for t, _ in rows], padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    y = torch.tensor([1 if lab == "positive" else 0 for _, lab in rows])
    _fit(model, lambda s: {**{k: v[s * 32 % 256:][:32] for k, v in enc.items()}, "labels": y[s * 32 % 256:][:32]},
         steps)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_bert_seq(out: Path, *, steps: int = 80, seed: int = 0, max_len: int = 32) -> Path:
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    tok = _tokenizer(POSITIVE + NEGATIVE + FILLER)
    model = _bert(BertForSequenceClassification, tok, 2, {0: "negative", 1: "positive"}, max_len)
    return _fit_sentiment(model, tok, out, steps, seed)


def save_distilbert_seq(out: Path, *, steps: int = 80, seed: int = 0, max_len: int = 32) -> Path:
    """DistilBertForSequenceClassification on the same task: a WordPiece tokenizer, and a model that takes
    no token_type_ids (two inputs where MediaPipe's BERT preprocessing fills three)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizer

    torch.manual_seed(seed)
    tok = _tokenizer(POSITIVE + NEGATIVE + FILLER, DistilBertTokenizer)
    cfg = DistilBertConfig(vocab_size=len(tok), dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                           max_position_embeddings=max_len, num_labels=2, id2label={0: "negative", 1: "positive"},
                           label2id={"negative": 0, "positive": 1})
    model = DistilBertForSequenceClassification(cfg)
    return _fit_sentiment(model, tok, out, steps, seed)


def _unigram_tokenizer(words):
    """An ALBERT (SentencePiece Unigram) tokenizer: a piece per word, letters for the rest."""
    from transformers import AlbertTokenizer

    specials = [("<pad>", 0.0), ("<unk>", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[MASK]", 0.0)]
    pieces = [("\u2581" + w, -2.0 - 0.01 * i) for i, w in enumerate(sorted(set(words)))]
    letters = [("\u2581", -3.0)] + [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return AlbertTokenizer(vocab=specials + pieces + letters)


def save_albert_seq(out: Path, *, steps: int = 80, seed: int = 0, max_len: int = 32) -> Path:
    """AlbertForSequenceClassification on the same task with a SentencePiece (Unigram) tokenizer, saved as
    Transformers 5 saves it: tokenizer.json alone, no .model file."""
    from transformers import AlbertConfig, AlbertForSequenceClassification

    torch.manual_seed(seed)
    tok = _unigram_tokenizer(POSITIVE + NEGATIVE + FILLER)
    cfg = AlbertConfig(vocab_size=len(tok), embedding_size=16, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=max_len, num_labels=2,
                       id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    model = AlbertForSequenceClassification(cfg)
    return _fit_sentiment(model, tok, out, steps, seed)


def sentiment_csv(path: Path, n: int = 24, *, seed: int = 1) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(sentiment_rows(np.random.default_rng(seed), n))
    return path


def entity_rows(rng: np.random.Generator, n: int) -> list[tuple[list[str], list[str]]]:
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(int(rng.integers(3, 7))):
            r = rng.random()
            if r < 0.2:
                tokens += [str(rng.choice(PEOPLE)), str(rng.choice(SURNAMES))]
                tags += ["B-PER", "I-PER"]
            elif r < 0.35:
                tokens.append(str(rng.choice(PEOPLE)))
                tags.append("B-PER")
            elif r < 0.5:
                tokens.append(str(rng.choice(PLACES)))
                tags.append("B-LOC")
            else:
                tokens.append(str(rng.choice(FILLER)))
                tags.append("O")
        rows.append((tokens, tags))
    return rows


def save_bert_tok(out: Path, *, steps: int = 100, seed: int = 0, max_len: int = 32) -> Path:
    from transformers import BertForTokenClassification

    torch.manual_seed(seed)
    tok = _tokenizer(PEOPLE + SURNAMES + PLACES + FILLER)
    model = _bert(BertForTokenClassification, tok, len(TAGS), dict(enumerate(TAGS)), max_len)
    rows = entity_rows(np.random.default_rng(seed), 256)
    enc = tok([t for t, _ in rows], is_split_into_words=True, padding="max_length", max_length=16, truncation=True,
              return_tensors="pt")
    labels = torch.full(enc["input_ids"].shape, -100)
    for i, (_, tags) in enumerate(rows):
        for j, w in enumerate(enc.word_ids(i)):
            if w is not None:
                labels[i, j] = TAGS.index(tags[w])
    _fit(model, lambda s: {**{k: v[s * 32 % 256:][:32] for k, v in enc.items()},
                           "labels": labels[s * 32 % 256:][:32]}, steps)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def entity_jsonl(path: Path, n: int = 24, *, seed: int = 1) -> Path:
    rows = entity_rows(np.random.default_rng(seed), n)
    path.write_text("".join(json.dumps({"tokens": t, "tags": g}) + "\n" for t, g in rows))
    return path


# ---------------------------------------------------------------- audio

RATE = 16000
TONES = ("low", "high")


def tone(rng: np.random.Generator, label: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    f = rng.uniform(200, 400) if label == 0 else rng.uniform(1500, 3000)
    x = 0.5 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) + 0.05 * rng.standard_normal(len(t))
    return x.astype(np.float32)


def save_wav2vec2(out: Path, *, steps: int = 40, seed: int = 0) -> Path:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    torch.manual_seed(seed)
    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, classifier_proj_size=16,
                         num_labels=2, id2label=dict(enumerate(TONES)), label2id={t: i for i, t in enumerate(TONES)},
                         feat_extract_norm="layer", do_stable_layer_norm=True, mask_time_prob=0.0)
    model = Wav2Vec2ForSequenceClassification(cfg)
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=RATE, padding_value=0.0, do_normalize=True,
                                  return_attention_mask=True)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 128)
    x = fe([tone(rng, int(k)) for k in labels], sampling_rate=RATE, return_tensors="pt")["input_values"]
    y = torch.from_numpy(labels)
    _fit(model, lambda s: {"input_values": x[s * 16 % 128:][:16], "labels": y[s * 16 % 128:][:16]}, steps)
    model.save_pretrained(out)
    fe.save_pretrained(out)
    return out


def _fit_tones(model, fe, name: str, out: Path, steps: int, seed: int) -> Path:
    """Trains an audio classifier on 128 tones through its feature extractor and saves it beside the extractor."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 128)
    x = fe([tone(rng, int(k)) for k in labels], sampling_rate=RATE, return_tensors="pt")[name]
    y = torch.from_numpy(labels)
    _fit(model, lambda s: {name: x[s * 16 % 128:][:16], "labels": y[s * 16 % 128:][:16]}, steps)
    model.save_pretrained(out)
    fe.save_pretrained(out)
    return out


def save_ast(out: Path, *, steps: int = 30, seed: int = 0) -> Path:
    """ASTForAudioClassification on ASTFeatureExtractor's input_values [1, 64 frames, 16 mel bins] (0.64 s)."""
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

    torch.manual_seed(seed)
    cfg = ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8,
                    frequency_stride=8, time_stride=8, max_length=64, num_mel_bins=16, num_labels=2,
                    id2label=dict(enumerate(TONES)), label2id={t: i for i, t in enumerate(TONES)})
    fe = ASTFeatureExtractor(sampling_rate=RATE, num_mel_bins=16, max_length=64)
    return _fit_tones(ASTForAudioClassification(cfg), fe, "input_values", out, steps, seed)


def save_whisper(out: Path, *, steps: int = 30, seed: int = 0) -> Path:
    """WhisperForAudioClassification on WhisperFeatureExtractor's input_features [1, 16 mel bins, 100 frames]:
    a 1 s window (chunk_length 1) the encoder's 50 positions take (two frames a position)."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForAudioClassification

    torch.manual_seed(seed)
    cfg = WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64, max_source_positions=50,
                        vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                        num_labels=2, id2label=dict(enumerate(TONES)), label2id={t: i for i, t in enumerate(TONES)})
    fe = WhisperFeatureExtractor(feature_size=16, sampling_rate=RATE, chunk_length=1)
    return _fit_tones(WhisperForAudioClassification(cfg), fe, "input_features", out, steps, seed)


def write_wav(path: Path, x: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())


def wav_folder(out: Path, n: int = 16, *, seed: int = 1) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["file_name,label"]
    for i in range(n):
        write_wav(out / f"clip_{i:03d}.wav", tone(rng, i % 2))
        lines.append(f"clip_{i:03d}.wav,{TONES[i % 2]}")
    (out / "labels.csv").write_text("\n".join(lines) + "\n")
    return out


# ---------------------------------------------------------------- segmentation

REGIONS = ("background", "square")


def square_scene(rng: np.random.Generator, size: int = IMAGE) -> tuple[np.ndarray, np.ndarray]:
    img = rng.integers(40, 120, (size, size, 3)).astype(np.uint8)
    mask = np.zeros((size, size), np.uint8)
    s = int(rng.integers(size // 3, size // 2))
    y, x = rng.integers(0, size - s, 2)
    img[y:y + s, x:x + s] = rng.integers(200, 255, 3)
    mask[y:y + s, x:x + s] = 1
    return img, mask


def save_segformer(out: Path, *, steps: int = 60, seed: int = 0) -> Path:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    # 5.10 marks the Pil class as needing torchvision (its mask path does); its image path runs without
    from transformers.models.segformer.image_processing_pil_segformer import SegformerImageProcessorPil

    torch.manual_seed(seed)
    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=32, num_labels=2, id2label=dict(enumerate(REGIONS)),
                          label2id={r: i for i, r in enumerate(REGIONS)})
    model = SegformerForSemanticSegmentation(cfg)
    proc = SegformerImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, do_reduce_labels=False)
    rng = np.random.default_rng(seed)
    scenes = [square_scene(rng) for _ in range(128)]
    x = proc([s[0] for s in scenes], return_tensors="pt")["pixel_values"]
    y = torch.from_numpy(np.stack([m for _, m in scenes])).long()  # the loss upsamples the logits to the masks
    _fit(model, lambda s: {"pixel_values": x[s * 16 % 128:][:16], "labels": y[s * 16 % 128:][:16]}, steps)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


def mask_folder(out: Path, n: int = 12, *, seed: int = 1) -> Path:
    """images/NAME.png and masks/NAME.png (class index per pixel)."""
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        img, mask = square_scene(rng)
        Image.fromarray(img).save(out / "images" / f"scene_{i:03d}.png")
        Image.fromarray(mask).save(out / "masks" / f"scene_{i:03d}.png")
    return out


# ---------------------------------------------------------------- detection

OBJECTS = ("red", "blue")


def object_scene(rng: np.random.Generator, size: int = IMAGE) -> tuple[np.ndarray, int, tuple[int, int, int, int]]:
    """A grey image with one red or blue square: (image, class, (x0, y0, x1, y1) in pixels)."""
    img = rng.integers(60, 140, (size, size, 3)).astype(np.uint8)
    label = int(rng.integers(0, 2))
    s = int(rng.integers(size // 4, size // 2))
    y, x = (int(v) for v in rng.integers(0, size - s, 2))
    img[y:y + s, x:x + s] = 30
    img[y:y + s, x:x + s, 0 if label == 0 else 2] = 230
    return img, label, (x, y, x + s, y + s)


def save_detr(out: Path, *, steps: int = 60, seed: int = 0) -> Path:
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessorPil, ResNetConfig

    torch.manual_seed(seed)
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage2"],
                            layer_type="basic")
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
                     encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                     encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=4, num_labels=2,
                     id2label=dict(enumerate(OBJECTS)), label2id={o: i for i, o in enumerate(OBJECTS)})
    model = DetrForObjectDetection(cfg)
    proc = DetrImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, do_pad=False)
    rng = np.random.default_rng(seed)
    scenes = [object_scene(rng) for _ in range(128)]
    x = proc([s[0] for s in scenes], return_tensors="pt")["pixel_values"]
    def cxcywh(b):  # DETR's targets: centre and size in 0..1
        return [(b[0] + b[2]) / 2 / IMAGE, (b[1] + b[3]) / 2 / IMAGE, (b[2] - b[0]) / IMAGE, (b[3] - b[1]) / IMAGE]

    targets = [{"class_labels": torch.tensor([c]), "boxes": torch.tensor([cxcywh(b)], dtype=torch.float32)}
               for _, c, b in scenes]
    _fit(model, lambda s: {"pixel_values": x[s * 16 % 128:][:16], "labels": targets[s * 16 % 128:][:16]}, steps,
         lr=1e-3)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


def box_folder(out: Path, n: int = 12, *, seed: int = 1) -> Path:
    """Images and boxes.csv (file_name,label,x0,y0,x1,y1 in pixels)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["file_name,label,x0,y0,x1,y1"]
    for i in range(n):
        img, label, box = object_scene(rng)
        Image.fromarray(img).save(out / f"scene_{i:03d}.png")
        lines.append(f"scene_{i:03d}.png,{OBJECTS[label]},{','.join(map(str, box))}")
    (out / "boxes.csv").write_text("\n".join(lines) + "\n")
    return out
