"""The reward for math answers that is no one task's own: VeRL's scorer by data source.

`verl_default` is VeRL's `default_compute_score`; data sources VeRL does not
know (the reasoning-gym tasks of grpo_math) are scored with VeRL's strict
gsm8k scorer (`#### <answer>`), so a format trick earns nothing. A task with
its own verifier registers it beside the task (countdown.compute_score).
"""

from __future__ import annotations

from typing import Any

from tpu_pipeline.train.tasks.base import REWARDS


@REWARDS.register("verl_default")
def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs) -> float:
    """VeRL's scorer for its known data sources (openai/gsm8k, MATH, ...); strict `#### <answer>` otherwise."""
    # heavy: verl's scorers import its math libraries (seconds); a custom --reward never needs them
    from verl.utils.reward_score import default_compute_score
    from verl.utils.reward_score import gsm8k

    try:
        res = default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    except NotImplementedError:
        res = gsm8k.compute_score(solution_str, str(ground_truth), method="strict")
    if isinstance(res, dict):
        res = res.get("score", 0.0)
    return float(res)
