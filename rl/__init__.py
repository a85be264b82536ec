"""tpu_pipeline.rl (installed from the repository folder `rl/`): GRPO recipes
on VeRL's algorithms, a local engine, and a bridge to VeRL's Ray trainer.

    from tpu_pipeline.rl import run, evaluate_policy, load_recipe
    run("grpo_math", "runs/grpo_math")
"""

if __name__ != "tpu_pipeline.rl":
    # A top-level `rl` is another PyPI distribution; this folder is only ever
    # tpu_pipeline.rl (see pyproject's package-dir).
    raise ImportError("import tpu_pipeline.rl, not a top-level 'rl'")

from tpu_pipeline.rl.api import evaluate_generator, evaluate_policy, run  # noqa: E402
from tpu_pipeline.rl.recipe import RLConfig, load_recipe  # noqa: E402

__all__ = ["RLConfig", "evaluate_generator", "evaluate_policy", "load_recipe", "run"]
