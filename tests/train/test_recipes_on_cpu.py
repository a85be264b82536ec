"""Recipe files, bad input and the CLI's one-line errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import UserError
from tpu_pipeline.recipes import list_recipes
from tpu_pipeline.train import run
from tpu_pipeline.schedule import lr_factor
from tpu_pipeline.train.runner import _kernels, load_recipe


def test_shipped_recipes_load_and_are_listed():
    names = {r["name"] for r in list_recipes() if r["stage"] == "train"}
    assert {"digits_cnn", "arith_lm"} <= names
    name, r = load_recipe("arith_lm")
    assert name == "arith_lm" and r.section == "arith" and type(r.settings).__name__ == "ArithConfig"
    assert (r.settings.min_digits, r.settings.max_digits, r.settings.max_terms) == (1, 1, 3)
    _, d = load_recipe("digits_cnn")
    assert d.task == "digits_cnn" and d.settings.channels == [16, 32]


def test_every_recipe_field_has_a_comment():
    from tpu_pipeline.recipes import recipe_dir

    for path in recipe_dir("train").glob("*.toml"):
        for line in path.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#") and not line.startswith("description"):
                assert "#" in line, f"{path.name}: uncommented field: {line}"


@pytest.mark.parametrize("overrides,msg", [
    ({"loop.steps": 0}, "loop.steps must be >= 1"),
    ({"optim.lr": -1.0}, "optim.lr must be > 0"),
    ({"optim.betas": [0.9]}, "optim.betas must be two numbers"),
    ({"loop.stepz": 3}, "unknown key 'stepz'"),
    ({"digits.dropout": 1.5}, "digits.dropout must be in"),
    ({"arith.hidden_size": 10}, "section [arith] belongs to task 'arith_lm', but task is 'digits_cnn'"),
    ({"digits.chanels": [8]}, "digits: unknown key 'chanels'"),
    ({"task": "resnet"}, "unknown train task 'resnet'; valid: arith_lm, countdown_lm, digits_cnn"),
])
def test_bad_config_values_are_refused(overrides, msg, tmp_path):
    with pytest.raises(UserError) as e:
        run("digits_cnn", tmp_path / "r", overrides=overrides)
    assert msg in str(e.value)
    assert not (tmp_path / "r").exists()  # nothing written


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    f = [lr_factor(s, total=100, warmup=10, min_ratio=0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert lr_factor(100, total=100, warmup=10, min_ratio=0.1) == pytest.approx(0.1)


def test_kernels_choice():
    assert _kernels("torch", "arith_lm") == ("torch", None)
    assert _kernels("pallas", "digits_cnn")[1] is None
    note, apply = _kernels("pallas", "arith_lm")
    assert note == "pallas" and callable(apply)


@pytest.mark.parametrize("args,msg", [
    (["--recipe", "nope"], "unknown train recipe 'nope'; valid: arith_lm, countdown_lm, digits_cnn"),
    (["--recipe", "digits_cnn", "--set", "optim.lr=abc"], "optim: lr: expected a number, got 'abc'"),
    (["--recipe", "digits_cnn", "--nproc", "0"], "--nproc must be >= 1"),
    (["--recipe", "digits_cnn", "--device", "tpu9"], "unknown device 'tpu9'"),
    (["--recipe", "/no/such.toml"], "recipe file not found"),
])
def test_cli_bad_input_is_one_line_exit_2(args, msg, tmp_path):
    res = CliRunner().invoke(cli, ["train", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and msg in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_metrics_writer_progress_bar_and_resume_truncation(tmp_path):
    import json

    from tpu_pipeline.metrics import MetricsWriter

    w = MetricsWriter(tmp_path, total_steps=4, start_step=0, progress=True)
    for s in (1, 2, 3, 4):
        w.log({"step": s, "loss": 1.0 / s, "samples_per_s": 10.0})
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # torn line of a killed run
    w = MetricsWriter(tmp_path, total_steps=4, start_step=2, progress=False)
    w.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    MetricsWriter(tmp_path, total_steps=4, start_step=0, progress=False).close()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_cli_set_takes_toml_literals():
    from tpu_pipeline.cli.train import _toml_value

    assert _toml_value('["chain_sum"]') == ["chain_sum"]
    assert _toml_value("3e-4") == 3e-4 and _toml_value("true") is True
    assert _toml_value("abc") == "abc"
