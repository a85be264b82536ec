"""arith_lm: a tiny Llama trained to answer reasoning-gym arithmetic as `#### N`.

The warm start of rl's grpo_math. Supervised next-token loss on the target
tokens only (`#### N` + EOS), prompts right-padded to one fixed length so a
compiled step sees one shape. Evaluation: greedy exact match (VeRL's gsm8k
scorer, strict) on held-out problems, plus pass@k at temperature 1, which
tells rl whether sampling finds answers greedy decoding misses.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_bytes, staged_dir
from tpu_pipeline.train import arith
from tpu_pipeline.train.arith import IGNORE
from tpu_pipeline.train.manifest import write_model
from tpu_pipeline.train.task import TASKS, Task


@TASKS.register("arith_lm")
class ArithTask(Task):
    def __init__(self, recipe, recipe_name):
        super().__init__(recipe, recipe_name)
        a = recipe.arith
        self.tokenizer = arith.build_tokenizer()
        self.train_problems = arith.make_problems(a.n_train, seed=recipe.seed, tasks=a.tasks,
                                                  difficulty=a.difficulty())
        self.heldout = arith.heldout_problems(a.n_heldout, tasks=a.tasks, exclude=self.train_problems,
                                              difficulty=a.difficulty())
        # One fixed length (the longest example) so a compiled step sees one shape.
        self.ids, self.labels = arith.lm_batch(self.tokenizer, self.train_problems)
        self.seq_len = self.ids.shape[1]
        if self.seq_len > a.max_position_embeddings:
            raise UserError(f"arith: problems need {self.seq_len} tokens but max_position_embeddings is "
                            f"{a.max_position_embeddings}")
        self.num_train = len(self.train_problems)
        self.max_new_tokens = max(len(arith.target_text(p.answer)) for p in self.train_problems + self.heldout) + 2

    def model_kwargs(self) -> dict:
        return arith.llama_kwargs(self.tokenizer, **self.recipe.arith.model_config())

    def build_model(self):
        # heavy: transformers takes seconds to import; runner imports this module for digits runs too
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**self.model_kwargs()))

    def make_batch(self, idx):
        return {"input_ids": self.ids[idx], "labels": self.labels[idx]}

    def count(self, batch):
        return int((batch["labels"] != IGNORE).sum())

    def loss_sum(self, model, batch):
        return arith.lm_loss_sum(model, batch["input_ids"], batch["labels"])

    @torch.no_grad()
    def generate(self, model, prompts: list[str], device, *, sample: bool = False, n: int = 1,
                 batch_size: int = 256) -> list[list[str]]:
        """Completions (decoded, special tokens dropped) for each prompt."""
        tok = self.tokenizer
        out: list[list[str]] = []
        was_training = model.training
        model.eval()
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i: i + batch_size], padding=True, return_tensors="pt").to(device)
            gen = model.generate(
                **enc, max_new_tokens=self.max_new_tokens, do_sample=sample, temperature=1.0 if sample else None,
                top_k=0 if sample else None, top_p=1.0 if sample else None, num_return_sequences=n,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            out += [texts[j: j + n] for j in range(0, len(texts), n)]
        model.train(was_training)
        return out

    def evaluate(self, model, device) -> dict[str, Any]:
        a = self.recipe.arith
        greedy = self.generate(model, [p.prompt for p in self.heldout], device)
        correct = [arith.score(c[0], p.answer) for c, p in zip(greedy, self.heldout)]
        res: dict[str, Any] = {"accuracy": sum(correct) / len(correct), "n": len(correct),
                               "metric": "greedy exact match (verl gsm8k strict)",
                               "examples": [{"prompt": p.prompt, "completion": c[0], "answer": p.answer}
                                            for p, c in list(zip(self.heldout, greedy))[:5]]}
        if a.pass_k and a.n_pass_k:
            probs = self.heldout[: a.n_pass_k]
            torch.manual_seed(self.recipe.seed)  # sampling in eval must not depend on the training RNG
            samples = self.generate(model, [p.prompt for p in probs], device, sample=True, n=a.pass_k,
                                    batch_size=max(1, 256 // a.pass_k))
            hits = [max(arith.score(c, p.answer) for c in cs) for cs, p in zip(samples, probs)]
            mean = [sum(arith.score(c, p.answer) for c in cs) / len(cs) for cs, p in zip(samples, probs)]
            res[f"pass@{a.pass_k}"] = sum(hits) / len(hits)
            res["sample_accuracy"] = sum(mean) / len(mean)
            res["n_pass_k"] = len(probs)
        return res

    def export(self, model, out: Path, *, optimizer, metrics) -> None:
        ex = self.tokenizer(self.heldout[0].prompt, return_tensors="pt")["input_ids"]
        # Calibration rows: training prompts of the example's token length (one static shape).
        same = [p.prompt for p in self.train_problems if len(p.prompt) + 1 == ex.shape[1]][:64]
        calib = self.tokenizer(same, return_tensors="pt")["input_ids"] if same else ex
        write_model(
            out / "model.pt", model_class="tpu_pipeline.train.models.causal_lm:LlamaLM",
            model_kwargs=self.model_kwargs(), state_dict={f"lm.{k}": v for k, v in model.state_dict().items()},
            example_inputs=[ex], input_names=["input_ids"], output_names=["logits"], task="causal-lm",
            recipe=self.recipe_name, metrics=metrics, calibration_inputs=[calib])
        with staged_dir(out / "hf") as d:
            model.generation_config.pad_token_id = self.tokenizer.pad_token_id
            model.generation_config.eos_token_id = self.tokenizer.eos_token_id
            model.generation_config.bos_token_id = self.tokenizer.bos_token_id
            model.save_pretrained(d, safe_serialization=True)
            self.tokenizer.save_pretrained(d)
        # rl carries these AdamW moments into GRPO (DESIGN.md: a fresh Adam collapsed it).
        buf = io.BytesIO()
        torch.save({"param_names": [n for n, _ in model.named_parameters()],
                    "state_dict": optimizer.state_dict()}, buf)
        atomic_write_bytes(out / "optimizer.pt", buf.getvalue())

    def flops_per_sample(self, model) -> float:
        # 6 * (matmul parameters) * tokens, plus attention scores (QK^T and AV).
        c = model.config
        n_matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
        n_matmul += c.vocab_size * c.hidden_size  # tied lm_head still does a matmul
        t = self.seq_len
        attn = 2 * 2 * c.num_hidden_layers * t * t * c.hidden_size / 2  # causal: half the scores
        return 3.0 * (2 * n_matmul * t + attn)
