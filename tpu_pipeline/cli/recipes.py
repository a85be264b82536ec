import json

import click

from tpu_pipeline.recipes import list_recipes


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def command(as_json: bool) -> None:
    """List the train and rl recipes."""
    rows = list_recipes()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("No recipes installed.")
    for r in rows:
        click.echo(f"{r['stage']:<6} {r['name']:<14} {r['description']}")
