import json
import sys

import click

from tpu_pipeline.cli.commands import register


def _override(ctx, param, values):
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"{v!r}: expected key=value (e.g. optim.lr=5e-5)")
        k, val = v.split("=", 1)
        try:
            out[k] = json.loads(val)
        except json.JSONDecodeError:
            out[k] = val
    return out


@register("rl")
@click.command()
@click.option("--recipe", default="grpo_math", show_default=True, help="rl recipe name, or a path to a recipe .toml.")
@click.option("--out", "out", default=None, help="Run folder (default runs/<recipe>).")
@click.option("--steps", type=int, default=None, help="Run exactly N RL steps (ignores the recipe's time budget).")
@click.option("--time-budget", "time_budget", type=float, default=None, help="RL wall-time budget in seconds.")
@click.option("--engine", type=click.Choice(["local", "verl"]), default="local", show_default=True,
              help="local: this package's engine; verl: VeRL's Ray trainer (python -m verl.trainer.main_ppo).")
@click.option("--data", default=None, help="A VeRL parquet file to train on instead of the recipe's tasks.")
@click.option("--reward", default=None, help="A registered reward (tpu-pipeline recipes --registries) or module:function (VeRL's compute_score signature).")
@click.option("--policy", default=None, help="Start from this Hugging Face folder instead of the warm start.")
@click.option("--lora-rank", "lora_rank", type=int, default=None,
              help="Train LoRA adapters of this rank only (merged into policy/ at the end); 0 = full weights.")
@click.option("--seed", type=int, default=None, help="Seed of prompts, samples and minibatch order.")
@click.option("--device", default=None, help="auto, tpu, cuda or cpu.")
@click.option("--kernels", type=click.Choice(["auto", "pallas", "torch"]), default=None, help="Log-prob kernels.")
@click.option("--resume", is_flag=True, help="Continue DIR from its latest step checkpoint.")
@click.option("--dry-run", is_flag=True, help="With --engine verl: print the command and composed config only.")
@click.option("--ray-address", default=None, envvar="RAY_ADDRESS",
              help="With --engine verl: submit a job to this running Ray cluster's job API, http://HEAD:8265 "
                   "(its token from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; docs/rl.md).")
@click.option("--nnodes", type=int, default=None, help="With --engine verl: nodes VeRL's trainer spans (verl.nnodes).")
@click.option("--gpus-per-node", "gpus_per_node", type=int, default=None,
              help="With --engine verl: trainer processes per node, one per GPU/TPU (on a CPU cluster: one per CPU "
                   "slot) (verl.n_gpus_per_node).")
@click.option("--set", "overrides", multiple=True, callback=_override, help="Recipe override key=value (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(recipe, out, steps, time_budget, engine, data, reward, policy, lora_rank, seed, device, kernels, resume,
            dry_run, ray_address, nnodes, gpus_per_node, overrides, as_json):
    """Improve a policy with a GRPO recipe (VeRL's algorithms)."""
    # CLI start-up time: tpu_pipeline.rl imports torch, the kernels and train
    from tpu_pipeline.rl import run

    for key, value in (("verl.nnodes", nnodes), ("verl.n_gpus_per_node", gpus_per_node)):
        if value is not None:
            overrides[key] = value
    res = run(recipe, out, engine=engine, steps=steps, time_budget_s=time_budget, seed=seed, data=data,
              reward=reward, kernels=kernels, device=device, policy=policy, resume=resume, overrides=overrides,
              dry_run=dry_run, ray_address=ray_address, lora_rank=lora_rank, progress=sys.stderr.isatty() and not as_json)
    if as_json or engine == "verl":
        click.echo(json.dumps(res, indent=2, default=str))
        return
    b, a = res["before"], res["after"]
    k = b.get("k")
    click.echo(f"held-out greedy accuracy: {b['accuracy']:.3f} -> {a['accuracy']:.3f} "
               f"({res['gain_points']:+.1f} points, n={a['n']})")
    if k:
        click.echo(f"pass@{k}: {b['pass_at_k']:.3f} -> {a['pass_at_k']:.3f}")
    click.echo(f"{res['steps']} steps, {res['rl_seconds']:.0f} s of RL, {res['wall_seconds']:.0f} s wall "
               f"(warm start {res['warm_start'].get('seconds', 0):.0f} s)")
    click.echo(f"policy: {a['policy']}  curve: {res.get('curve', '-')}")
