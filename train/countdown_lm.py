"""countdown_lm: the arith_lm Llama (char tokenizer) trained to solve reasoning-gym
countdown problems ("2 7 4#1=" -> "7-4-2"), supervised on one solution per
problem (the generator's); the warm start of rl's grpo_countdown.

Evaluation: greedy success by reasoning-gym's verifier on held-out problems,
and pass@k at temperature 1 (any of k samples verified), which tells rl
whether sampling finds solutions greedy decoding misses. Writes hf/ and
optimizer.pt as arith_lm does (rl carries the AdamW state into GRPO).
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.train import arith, countdown
from tpu_pipeline.train.arith_lm import ArithTask
from tpu_pipeline.train.task import TASKS, Task


@TASKS.register("countdown_lm")
class CountdownTask(ArithTask):
    # ArithTask's batches, loss, generation, export and FLOP count apply unchanged: only
    # the problems, the answer format and the verifier differ.
    def __init__(self, recipe, recipe_name):
        Task.__init__(self, recipe, recipe_name)  # not ArithTask's: it builds arithmetic problems
        c = recipe.countdown
        self.tokenizer = arith.build_tokenizer()
        self.train_problems = countdown.make_problems(c.n_train, seed=recipe.seed, difficulty=c.difficulty())
        self.heldout = countdown.heldout_problems(c.n_heldout, difficulty=c.difficulty(), exclude=self.train_problems)
        self.ids, self.labels = countdown.lm_batch(self.tokenizer, self.train_problems)
        self.seq_len = self.ids.shape[1]
        if self.seq_len > c.max_position_embeddings:
            raise UserError(f"countdown: problems need {self.seq_len} tokens but max_position_embeddings is "
                            f"{c.max_position_embeddings}")
        self.num_train = len(self.train_problems)
        self.max_new_tokens = max(len(p.solution) for p in self.train_problems + self.heldout) + 4

    def model_kwargs(self) -> dict:
        return arith.llama_kwargs(self.tokenizer, **self.recipe.countdown.model_config())

    def evaluate(self, model, device) -> dict[str, Any]:
        c = self.recipe.countdown

        def ok(text: str, p: countdown.Problem) -> float:
            return float(countdown.score(text, p.numbers, p.target) >= 1.0)

        greedy = self.generate(model, [p.prompt for p in self.heldout], device)
        correct = [ok(g[0], p) for g, p in zip(greedy, self.heldout)]
        res: dict[str, Any] = {"accuracy": sum(correct) / len(correct), "n": len(correct),
                               "metric": "greedy success (reasoning-gym countdown verifier)",
                               "examples": [{"prompt": p.prompt, "completion": g[0], "solution": p.solution}
                                            for p, g in list(zip(self.heldout, greedy))[:5]]}
        if c.pass_k and c.n_pass_k:
            probs = self.heldout[: c.n_pass_k]
            torch.manual_seed(self.recipe.seed)  # sampling in eval must not depend on the training RNG
            samples = self.generate(model, [p.prompt for p in probs], device, sample=True, n=c.pass_k,
                                    batch_size=max(1, 256 // c.pass_k))
            hits = [[ok(s, p) for s in ss] for ss, p in zip(samples, probs)]
            res[f"pass@{c.pass_k}"] = sum(max(h) for h in hits) / len(hits)
            res["sample_accuracy"] = sum(sum(h) / len(h) for h in hits) / len(hits)
            res["n_pass_k"] = len(probs)
        return res
