import json

import click

from tpu_pipeline.cli.commands import register


@register("eval")
@click.command()
@click.option("--recipe", default=None,
              help="rl recipe whose task and scorer to use [default: the one the policy folder records, else grpo_math].")
@click.option("--policy", required=True,
              help="Hugging Face policy folder (e.g. runs/grpo_math/policy), a .litertlm bundle "
                   "(dist/.../android/model.litertlm, run on LiteRT-LM) or a convert output folder (each target's bundle).")
@click.option("--seed", type=int, default=None,
              help="Generate fresh problems with this seed (default: the recipe's fixed held-out split).")
@click.option("--n", type=int, default=None, help="Number of problems (default: the recipe's heldout_n).")
@click.option("--k", type=int, default=None,
              help="pass@k samples per problem (default: the recipe's eval_k for a policy folder, 0 for bundles; 0 = off).")
@click.option("--data", default=None, help="A VeRL parquet file instead of the recipe's tasks.")
@click.option("--device", default=None, help="auto, tpu, cuda or cpu (PyTorch policies).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(recipe, policy, seed, n, k, data, device, as_json):
    """Score a policy or a shipped .litertlm bundle.

    Greedy accuracy on the recipe's held-out problems, by its verifier, with a 95% Wilson
    interval."""
    # start-up: the bundle runtime needs no PyTorch; tpu_pipeline.rl imports torch, the kernels and train
    from tpu_pipeline.convert.lm.litertlm_runtime import BundleRunner, bundles_in
    from tpu_pipeline.errors import ConversionError, UserError

    bundles = bundles_in(policy)
    if bundles is None:
        from tpu_pipeline.rl import evaluate_policy
        from tpu_pipeline.rl.task_eval import read_record

        recorded = read_record(policy)
        recipe = recipe or (recorded.name if recorded else "grpo_math")
        results = [evaluate_policy(recipe, policy, seed=seed, n=n, k=k, data=data, device=device)]
    else:
        from tpu_pipeline.rl import evaluate_generator

        results = []
        for targets, path in bundles:
            try:
                runner = BundleRunner(path)
            except ConversionError as e:  # a damaged or foreign file is bad input here, not a failed conversion
                raise UserError(f"--policy {path}: {e}") from None
            with runner:
                res = evaluate_generator(recipe or "grpo_math", runner.generate, label=str(path), seed=seed, n=n,
                                         k=k, data=data)
            results.append({**res, "targets": targets, "runtime": "LiteRT-LM (litert_lm, CPU)"})
    if as_json:
        click.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        return
    for res in results:
        lo, hi = res["interval"]
        where = f"{res['targets']} bundle on LiteRT-LM" if "targets" in res else "PyTorch"
        line = (f"{res['split']}: greedy accuracy {res['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}) on {res['n']} "
                f"problems, {where}")
        if res.get("k"):
            line += f", pass@{res['k']} {res['pass_at_k']:.3f}"
        click.echo(line)
