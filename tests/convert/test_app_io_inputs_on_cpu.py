"""The input description (convert/app_io/spec.py): flag strings read into records, and every
input that cannot work refused in one line, exit 2, before anything is written (issue 38 item 6).
No child process: the refusals come before any export or MediaPipe run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import tpu_pipeline.convert as tc
from tpu_pipeline.cli import cli
from tpu_pipeline.convert.app_io import AudioInput, ImageInput, TextInput, describe
from tpu_pipeline.convert.app_io.graph import from_pixels, to_pixels
from tpu_pipeline.convert.app_io.spec import from_manifest, parse_image, read_vocab
from tpu_pipeline.errors import UserError
from tpu_pipeline.testing.app_models import ColourNet, SentimentNet, write_vocab


class Gray(nn.Module):
    """The project's digits shape: one 8 x 8 channel, no RGB axis."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class Wave(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(400, 3)

    def forward(self, x):
        return self.fc(x)


def _refused(tmp_path: Path, module, args, **kw) -> str:
    out = tmp_path / "dist"
    with pytest.raises(UserError) as e:
        tc.convert(module.eval(), args, targets="desktop", out=out, progress=False, **kw)
    assert not out.exists(), "nothing is written for bad input"
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_image_flag_reads_mean_and_std_per_channel():
    img = parse_image("x:mean=123.7,116.3,103.5:std=58.4,57.1,57.4")
    assert img == ImageInput(name="x", mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    assert parse_image("pixels") == ImageInput(name="pixels", mean=(0.0,), std=(255.0,))


def test_layout_is_found_from_the_three_sized_axis():
    common = dict(input_names=["x"], input_dtypes=["float32"], output_shapes=[(1, 4)])
    nchw = describe(image="x", input_shapes=[(1, 3, 16, 16)], **common)
    nhwc = describe(image="x", input_shapes=[(1, 16, 16, 3)], **common)
    assert (nchw.image.layout, nhwc.image.layout) == ("NCHW", "NHWC")
    assert nchw.task == "ImageClassifier"
    with pytest.raises(UserError, match="3 on both axis 1 and 3"):
        describe(image="x", input_shapes=[(1, 3, 16, 3)], **common)


def test_pixels_round_trip_by_the_normalisation_mediapipe_applies():
    img = ImageInput(name="x", mean=(127.5,), std=(127.5,))
    x = torch.linspace(-1, 1, 16 * 16 * 3).reshape(1, 16, 16, 3).numpy()
    pix, clipped = to_pixels(x, img)
    assert clipped == 0.0 and pix.dtype.name == "uint8" and pix.min() == 0 and pix.max() == 255
    assert abs(from_pixels(pix, img) - x).max() <= 0.5 / 127.5 + 1e-6  # half a pixel step
    _, clipped = to_pixels(x, ImageInput(name="x"))  # mean 0, std 255: the negative half is clipped
    assert 0.45 < clipped < 0.55


def test_image_on_an_input_without_an_rgb_axis(tmp_path):
    msg = _refused(tmp_path, Gray(), (torch.randn(1, 1, 8, 8),), image="x")
    assert msg == ("--image x: an RGB input has a 3-sized channel axis; this one is [1, 1, 8, 8] (a grayscale or "
                   "other input is not an image MediaPipe can feed)")


def test_label_count_that_is_not_the_class_count(tmp_path):
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    msg = _refused(tmp_path, ColourNet(), (torch.randn(1, 3, 16, 16),), image="x",
                   labels=str(tmp_path / "labels.txt"))
    assert msg == f"--labels {tmp_path / 'labels.txt'}: 3 labels for 4 classes (the first output's last axis)"


def test_unreadable_vocab(tmp_path):
    msg = _refused(tmp_path, SentimentNet(), (torch.zeros(1, 8, dtype=torch.int32),),
                   text=f"ids:vocab={tmp_path}/none.txt")
    assert msg.startswith(f"--text ids: cannot read vocab {tmp_path}/none.txt (FileNotFoundError")
    bad = tmp_path / "bad.txt"
    bad.write_text("<PAD> 0\nhello\n")
    with pytest.raises(UserError, match=r"line 2 is 'hello', not \"token id\""):
        read_vocab(TextInput(name="x", vocab=bad))
    partial = tmp_path / "partial.txt"
    partial.write_text("<PAD> 0\nhello 1\n")
    with pytest.raises(UserError, match="lacks <START>, <UNKNOWN>"):
        read_vocab(TextInput(name="x", vocab=partial))


def test_rate_of_zero(tmp_path):
    msg = _refused(tmp_path, Wave(), (torch.randn(1, 400),), audio="x:rate=0")
    assert msg == "--audio x: rate must be a positive number of Hz, not 0"
    assert "give the sample rate in Hz, like --audio x:rate=..." in _refused(tmp_path, Wave(), (torch.randn(1, 400),), audio="x")


def test_other_inputs_that_cannot_work(tmp_path):
    args = (torch.randn(1, 3, 16, 16),)
    assert "no input of that name (inputs: x)" in _refused(tmp_path, ColourNet(), args, image="pixels")
    assert "an artifact has one app input" in _refused(tmp_path, ColourNet(), args, image="x", audio="x:rate=8000")
    assert "std must not be 0" in _refused(tmp_path, ColourNet(), args, image="x:std=0")
    assert "KEY one of name, description" in _refused(tmp_path, ColourNet(), args, image="x",
                                                       metadata=["colour=red"])
    assert "a mono waveform input is float [1, samples]" in _refused(tmp_path, ColourNet(), args, audio="x:rate=8000")
    assert "token ids are an integer [1, length] input" in _refused(tmp_path, Wave(), (torch.randn(1, 400),),
                                                                     text=f"x:vocab={write_vocab(tmp_path / 'v.txt')}")


def test_manifest_app_io_reads_files_beside_the_model(tmp_path):
    write_vocab(tmp_path / "vocab.txt")
    (tmp_path / "labels.txt").write_text("no\nyes\n")
    app = from_manifest({"text": "ids:vocab=vocab.txt", "labels": "labels.txt", "metadata": {"author": "me"}},
                        tmp_path, "model.pt")
    assert app.text == TextInput(name="ids", vocab=tmp_path / "vocab.txt")
    assert app.labels.names == ("no", "yes") and app.info == {"author": "me"} and app.task == "TextClassifier"
    with pytest.raises(UserError, match="takes image, audio, text, labels, metadata"):
        from_manifest({"pixels": "x"}, tmp_path, "model.pt")
    assert from_manifest({"audio": "w:rate=16000"}, tmp_path, "m").audio == AudioInput(name="w", rate=16000)


def test_cli_exit_2_and_one_line(tmp_path):
    model = tmp_path / "gray.pt2"
    torch.export.save(torch.export.export(Gray().eval(), (torch.randn(1, 1, 8, 8),)), model)
    out = tmp_path / "dist"
    r = CliRunner().invoke(cli, ["convert", str(model), "--image", "x", "--targets", "desktop", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == (
        "Error: --image x: an RGB input has a 3-sized channel axis; this one is [1, 1, 8, 8] (a grayscale or other "
        "input is not an image MediaPipe can feed)")
    assert not out.exists()


def test_train_manifest_carries_app_io(tmp_path):
    """train's write_model records the description; convert's loader reads it into the same record."""
    from tpu_pipeline.convert.module.loaders import load_model
    from tpu_pipeline.train.manifest import write_model

    net = ColourNet().eval()
    write_model(tmp_path / "model.pt", model_class="tpu_pipeline.testing.app_models:ColourNet", model_kwargs={},
                state_dict=net.state_dict(), example_inputs=[torch.randn(1, 3, 16, 16)], input_names=["x"],
                output_names=["logits"], task="classification", recipe="t", metrics={},
                app_io={"image": "x:mean=127.5:std=127.5", "labels": ["red", "green", "blue", "yellow"]})
    m = load_model(tmp_path / "model.pt")
    assert m.app_io.image == ImageInput(name="x", mean=(127.5,), std=(127.5,))
    assert m.app_io.labels.names == ("red", "green", "blue", "yellow")
