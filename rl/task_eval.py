"""An rl recipe's task as the yardstick of any greedy generator: the PyTorch policy,
or a shipped .litertlm bundle on LiteRT-LM (the CLI hands its `generate` in; rl never
imports convert, pyproject's forbidden contract).

The same held-out problems, the same prompt text (Problem.prompt_text), the same
response limit (data.max_response_length) and the recipe's own verifier (its
trainer.reward) score both, so the figures differ only by what the generator does.

The policy record: rl writes RECORD_FILE into every policy/ it saves (both engines),
naming the recipe and its whole typed config (overrides included), so `convert` of
that folder knows which task to score and on which problems. A folder without one (a
policy saved before the record existed, or from elsewhere) converts as before, with
no task accuracy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

from tpu_pipeline import config as _config
from tpu_pipeline import stats
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.recipe import RLConfig, to_dict
from tpu_pipeline.rl.rewards import GuardedReward, load_reward

RECORD_FILE = "tpu_pipeline_rl.json"
RECORD_FORMAT = "tpu-pipeline/rl-policy@1"

# A greedy generator: (prompt text, max new tokens) -> the continuation's text, the stop token not shown.
Generate = Callable[[str, int], str]


def write_record(cfg: RLConfig, folder: Path, *, engine: str) -> None:
    """policy/RECORD_FILE: the recipe this policy was trained by (Hugging Face loaders ignore it)."""
    atomic_write_json(Path(folder) / RECORD_FILE, {"format": RECORD_FORMAT, "recipe": cfg.name, "engine": engine,
                                                   "config": to_dict(cfg)})


def read_record(folder: str | Path) -> RLConfig | None:
    """The recorded recipe's config of a policy folder; None when it has no record. A damaged
    record is a UserError naming the file."""
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {RECORD_FORMAT!r}")
        cfg = _config.load(RLConfig, data["config"])
    except (OSError, ValueError, KeyError, TypeError, UserError) as e:
        raise UserError(f"{path}: not a readable rl policy record ({str(e).splitlines()[0][:200]})") from None
    cfg.name = cfg.name or data.get("recipe", "")
    return cfg


def wilson(k: int, n: int) -> list[float]:
    """95% Wilson score interval of k/n, rounded for eval.json."""
    return [round(x, 4) for x in stats.wilson(k, n)]


def figures(correct: int, n: int) -> dict:
    return {"accuracy": correct / max(n, 1), "correct": correct, "n": n, "interval": wilson(correct, n)}


class TaskEval:
    """A recipe's held-out problems and verifier; scores a policy folder or a generator."""

    def __init__(self, cfg: RLConfig, *, seed: int | None = None):
        self.cfg = cfg
        source = build_source(cfg.data, cfg.trainer.seed)
        if seed is None:
            self.problems, self.split = source.heldout(), "heldout"
        else:
            self.problems, self.split = source.fresh(cfg.data.heldout_n, seed), f"fresh(seed={seed})"
        self.name = cfg.name

    def describe(self) -> dict:
        d = self.cfg.data
        return {"recipe": self.cfg.name, "source": d.file or d.source, "split": self.split, "problems": len(self.problems),
                "verifier": self.cfg.trainer.reward, "max_response_length": d.max_response_length,
                "decoding": "greedy"}

    def score_items(self, items: Sequence[tuple]) -> list[float]:
        """The recipe's verifier on (data_source, text, ground_truth, extra_info) items, under the
        engines' timeout guard (a slow call scores 0)."""
        guard = GuardedReward(load_reward(self.cfg.trainer.reward), self.cfg.trainer.reward_timeout_s)
        try:
            return guard(list(items)).scores
        finally:
            guard.close()

    def score(self, texts: Sequence[str]) -> list[float]:
        return self.score_items([(p.data_source, t, p.ground_truth, p.extra_info) for p, t in zip(self.problems, texts)])

    def prompt_texts(self) -> list[str]:
        """What a generator without the policy's tokenizer is fed: Problem.prompt_text without a chat
        template (for a recipe whose prompts need the template this is refused, not approximated)."""
        if self.cfg.policy.require_chat_template:
            raise UserError(f"recipe {self.cfg.name} formats prompts with the policy's chat template; a .litertlm "
                            "bundle is scored on plain prompt text only (no template is applied)")
        return [p.prompt_text(None) for p in self.problems]

    def generator_accuracy(self, generate: Generate) -> dict:
        """Greedy accuracy of `generate` on the problems, with the texts it produced."""
        t0 = time.perf_counter()
        texts = [generate(t, self.cfg.data.max_response_length) for t in self.prompt_texts()]
        scores = self.score(texts)
        return {**figures(sum(1 for s in scores if s >= 1.0), len(scores)), "responses": texts,
                "seconds": round(time.perf_counter() - t0, 2)}

    def policy_accuracy(self, policy: str | Path, *, device: str | None = None) -> dict:
        """Greedy accuracy of a Hugging Face policy folder through PyTorch: rl's evaluator, as `eval`
        and the engines' eval.json measure it."""
        import tpu_pipeline
        from tpu_pipeline.rl.evaluate import evaluate
        from tpu_pipeline.rl.policy import load_policy

        d, t = self.cfg.data, self.cfg.trainer
        platform = tpu_pipeline.select_device(device or "cpu")
        model, tok = load_policy(policy, platform.device)
        texts: list[str] = []
        res = evaluate(model, tok, self.problems, self.score_items, max_prompt_length=d.max_prompt_length,
                       max_response_length=d.max_response_length, overlong=d.overlong_prompt, k=0,
                       precision=t.precision, texts_out=texts)
        return {**figures(res["correct"], res["n"]), "responses": texts, "seconds": res["seconds"]}


def policy_task(folder: str | Path) -> TaskEval | None:
    """The task a policy folder was trained on (its record), or None when it has none."""
    cfg = read_record(folder)
    return TaskEval(cfg) if cfg is not None else None
