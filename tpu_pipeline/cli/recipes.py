import json

import click

from tpu_pipeline.recipes import cost_text, list_recipes
from tpu_pipeline.cli.commands import register


@register("recipes")
@click.command(short_help="List the train and rl recipes.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def command(as_json: bool) -> None:
    """List the train and rl recipes, with their expected cost (wall minutes on 2 CPU cores; GPU where measured)."""
    rows = list_recipes()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("No recipes installed.")
    width = max(len(r["name"]) for r in rows)
    costs = [cost_text(r) for r in rows]
    cw = max(len(c) for c in costs)
    click.echo(f"{'stage':<6} {'recipe':<{width}} {'cost':<{cw}} description")
    for r, c in zip(rows, costs):
        click.echo(f"{r['stage']:<6} {r['name']:<{width}} {c:<{cw}} {r['description']}")
