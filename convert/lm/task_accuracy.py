"""A causal LM's accuracy on the task it was trained for, per shipped bundle, beside
PyTorch's: the figure an rl policy is judged by, not only token agreement.

The task comes from outside convert (ConvertOptions.lm_task): the CLI hands in the
rl policy's recorded recipe (tpu_pipeline.rl.task_eval.TaskEval; convert never
imports rl). It scores PyTorch once (the policy folder through rl's evaluator) and
each distinct bundle through LiteRT-LM's Engine, greedy, on the same held-out
problems with the recipe's verifier. A target fails when its bundle's accuracy is
more than the profile's `max_task_drop` below PyTorch's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from tpu_pipeline.convert.lm.litertlm_runtime import BUNDLE_FILE, RUNTIME, BundleRunner

EXAMPLES = 3  # differing answers shown in the report


class LMTask(Protocol):
    """What convert needs of a task (rl's TaskEval has it)."""

    name: str

    def describe(self) -> dict: ...

    def policy_accuracy(self, policy: str | Path) -> dict: ...

    def generator_accuracy(self, generate: Callable[[str, int], str]) -> dict: ...


def torch_accuracy(task: LMTask, policy: Path) -> dict:
    """PyTorch's figures on the task (the policy folder, greedy); keeps its responses for the
    problem-by-problem comparison."""
    return task.policy_accuracy(policy)


def bundle_accuracy(task: LMTask, bundle: bytes, work: Path, torch_fig: dict, *, max_num_tokens: int,
                    threads: int | None) -> dict:
    """The bundle's figures on the task through LiteRT-LM beside PyTorch's: accuracy, its interval,
    the drop in points, and on how many problems the two answered differently."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / BUNDLE_FILE
    path.write_bytes(bundle)
    with BundleRunner(path, max_num_tokens=max_num_tokens, threads=threads) as runner:
        got = task.generator_accuracy(runner.generate)
    theirs, ours = torch_fig["responses"], got.pop("responses")
    differ = [i for i, (a, b) in enumerate(zip(theirs, ours)) if a.strip() != b.strip()]
    return {**got, "runtime": RUNTIME, "torch_accuracy": torch_fig["accuracy"],
            "torch_interval": torch_fig["interval"],
            "drop_points": round(100 * (torch_fig["accuracy"] - got["accuracy"]), 2),
            "answers_differ": len(differ),
            "examples": [{"problem": i, "torch": theirs[i], "bundle": ours[i]} for i in differ[:EXAMPLES]]}


def verdict(fig: dict, max_drop: float, task: str) -> list[str]:
    """Reasons the bundle fails on the task (empty: it holds PyTorch's accuracy within max_drop)."""
    if fig["torch_accuracy"] - fig["accuracy"] <= max_drop + 1e-12:
        return []
    lo, hi = fig["interval"]
    tlo, thi = fig["torch_interval"]
    return [f"task {task}: the bundle answers {fig['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}) of {fig['n']} held-out "
            f"problems vs PyTorch {fig['torch_accuracy']:.3f} ({tlo:.3f}-{thi:.3f}): {fig['drop_points']:.1f} points "
            f"lower, bound max_task_drop = {100 * max_drop:.1f} points"]


def public(torch_fig: dict) -> dict:
    """PyTorch's figures without its responses (report.json)."""
    return {k: v for k, v in torch_fig.items() if k != "responses"}
