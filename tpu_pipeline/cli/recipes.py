import importlib
import json

import click

from tpu_pipeline.cli.commands import register
from tpu_pipeline.recipes import cost_text, list_recipes
from tpu_pipeline.registry import listing

# The modules whose import fills every registry: each stage's composition point (the CLI is
# the one layer that may import them all). Targets are files: listed from the shipped profiles.
REGISTRY_MODULES = ("tpu_pipeline.train.tasks", "tpu_pipeline.kernels", "tpu_pipeline.convert.pipeline")


@register("recipes")
@click.command(short_help="List the train and rl recipes.")
@click.option("--registries", is_flag=True,
              help="List everything registered instead: tasks, rl sources, rewards, model kinds, LM recipes and "
                   "families, kernel families, targets, commands; each with where it is defined.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def command(registries: bool, as_json: bool) -> None:
    """List the train and rl recipes, with their expected cost (wall minutes on 2 CPU cores; GPU where measured)."""
    if registries:
        return _registries(as_json)
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


def _registries(as_json: bool) -> None:
    for module in REGISTRY_MODULES:
        importlib.import_module(module)
    # CLI start-up time: convert's targets module imports the converter's config types
    from tpu_pipeline.convert.targets import load_profiles, profile_dir

    targets = [{"name": e.name, "description": e.description, "defined_in": e.defined_in}
               for e in load_profiles().entries()]
    rows = listing() + [{"kind": "target", "how_to_add": f"a commented TOML file in {profile_dir()}",
                         "entries": targets}]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['kind']} ({len(r['entries'])}): add {r['how_to_add']}")
        width = max((len(e["name"]) for e in r["entries"]), default=0)
        for e in r["entries"]:
            click.echo(f"  {e['name']:<{width}}  {e['description']}  [{e['defined_in']}]")
