import json

import click

from tpu_pipeline.cli.commands import register


@register("eval")
@click.command()
@click.option("--recipe", default="grpo_math", show_default=True, help="rl recipe whose task and scorer to use.")
@click.option("--policy", required=True, help="Hugging Face policy folder (e.g. runs/grpo_math/policy).")
@click.option("--seed", type=int, default=None,
              help="Generate fresh problems with this seed (default: the recipe's fixed held-out split).")
@click.option("--n", type=int, default=None, help="Number of problems (default: the recipe's heldout_n).")
@click.option("--k", type=int, default=None, help="pass@k samples per problem (default: the recipe's eval_k; 0 = off).")
@click.option("--data", default=None, help="A VeRL parquet file instead of the recipe's tasks.")
@click.option("--device", default=None, help="auto, tpu, cuda or cpu.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(recipe, policy, seed, n, k, data, device, as_json):
    """Evaluate a policy on fresh held-out problems."""
    # CLI start-up time: tpu_pipeline.rl imports torch, the kernels and train
    from tpu_pipeline.rl import evaluate_policy

    res = evaluate_policy(recipe, policy, seed=seed, n=n, k=k, data=data, device=device)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    line = f"{res['split']}: greedy accuracy {res['accuracy']:.3f} on {res['n']} problems"
    if res.get("k"):
        line += f", pass@{res['k']} {res['pass_at_k']:.3f}"
    click.echo(line)
