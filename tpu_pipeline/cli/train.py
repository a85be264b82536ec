import json
import tomllib

import click

from tpu_pipeline.cli.commands import register


def _override(ctx, param, values):
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {v!r}")
        out[key] = _toml_value(val)
    return out


def _toml_value(text: str):
    """A TOML literal (lists, numbers, booleans, quoted strings), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


@register("train")
@click.command(short_help="Train a model from a recipe.")
@click.option("--recipe", required=True, help="A train recipe name (see `tpu-pipeline recipes`) or a .toml path.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Run folder [default: runs/train/<recipe>].")
@click.option("--device", default="auto", show_default=True, help="auto, tpu, cuda or cpu.")
@click.option("--steps", type=int, default=None, help="Optimizer steps (overrides loop.steps).")
@click.option("--compile/--no-compile", "compile_", default=None, help="torch.compile the model [default: the recipe's loop.compile].")
@click.option("--inductor-pallas", "inductor_pallas", is_flag=True,
              help="Compile with Inductor's Pallas code generator (implies --compile).")
@click.option("--kernels", type=click.Choice(["auto", "pallas", "torch"]), default="auto", show_default=True,
              help="Attention/RMSNorm kernels for Llama models: pallas = tpu_pipeline.kernels' hand-written "
                   "Pallas kernels.")
@click.option("--resume", is_flag=True, help="Continue from the run folder's last checkpoint.")
@click.option("--seed", type=int, default=None, help="Run seed (overrides the recipe's seed).")
@click.option("--nproc", type=int, default=1, show_default=True, help="Data-parallel processes (torchrun + DDP).")
@click.option("--set", "overrides", multiple=True, callback=_override, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. --set optim.lr=3e-4 or --set 'arith.tasks=[\"chain_sum\"]' (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the held-out figures as JSON.")
def command(recipe, out, device, steps, compile_, inductor_pallas, kernels, resume, seed, nproc,
            overrides, as_json):
    """Train a model from a recipe; writes model.pt, eval.json, metrics.jsonl and checkpoints."""
    # CLI start-up time: the runner imports torch and the kernels
    from tpu_pipeline.train.runner import default_out, load_recipe, run

    result = run(recipe, out, device=device, steps=steps, compile=compile_, inductor_pallas=inductor_pallas,
                 kernels=kernels, resume=resume, seed=seed, nproc=nproc, overrides=overrides)
    if not result:  # a non-main process under torchrun: rank 0 reports
        return
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    where = out or default_out(load_recipe(recipe)[0])
    shown = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    click.echo(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
    click.echo(f"Wrote {where}/model.pt (tpu-pipeline convert {where}/model.pt)")
