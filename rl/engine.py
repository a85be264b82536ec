"""The local GRPO engine: rollout -> reward -> VeRL advantages -> VeRL policy
loss, on one device (CPU, CUDA or TPU through the device runtime).

    tpu-pipeline rl --recipe grpo_math                # CPU: ~15 min, warm start included

The loop has hooks, not forks: a recipe or a test that needs to act between
steps adds a `hook(step, row)` (tpu_pipeline.training.Hook, the signature
train's loop calls too). Checkpoints, metrics, the learning-rate schedule and
the divergence error are the training core train uses as well
(tpu_pipeline.checkpoint, .metrics, .schedule, .training).

Where it departs from the GRPO paper (DeepSeekMath) and VeRL's defaults, and why:
- the optimizer carries the warm start's AdamW moments (a fresh Adam collapsed
  this tiny model, DESIGN.md);
- groups whose samples all scored the same are dropped before the update
  (their advantage is zero; keeping them only dilutes the token mean);
- no KL term by default (grpo_math sets use_kl_loss=false; the paper uses
  beta=0.04): the KL to the warm start is still measured and logged;
- one PPO epoch over the whole batch by default, so old log-probs equal the
  current ones and the ratio clip only acts with ppo_epochs/minibatches > 1.

DAPO (dapo_math) switches on two options of the same loop, not a copy of it:
`algorithm.filter_groups` (dynamic sampling: `sample_groups` draws more rounds
of prompts until the batch holds prompts_per_step groups whose scores differ)
and `algorithm.overlong_buffer` (the shaped reward of `sample`); see
tpu_pipeline.rl.dapo.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tpu_pipeline.checkpoint import Checkpointer
from tpu_pipeline.cpu_load import others_load_the_cores
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json
from tpu_pipeline.metrics import MetricsWriter
from tpu_pipeline.rl import algo, dapo
from tpu_pipeline.rl.accel import autocast, chunk_weight, micro_batches, sampling_generator
from tpu_pipeline.rl.recipe import RESUME_HINT, RLConfig, fingerprint
from tpu_pipeline.rl.dapo import Sampled
from tpu_pipeline.rl.evaluate import decode, encode_prompts, evaluate
from tpu_pipeline.rl.rewards import GuardedReward
from tpu_pipeline.rl.rollout import Rollout, generate, grouped_token_logprobs, token_logprobs
from tpu_pipeline.schedule import lr_factor
from tpu_pipeline.train.tasks.rows import Problem, stable_seed
from tpu_pipeline.training import Hook, call_hooks, diverged


# Without a KL loss, the KL to the warm start is only logged: every KL_EVERY steps
# (a reference forward pass costs about a third of an update).
KL_EVERY = 5

@dataclass
class Engine:
    cfg: RLConfig
    model: object
    tokenizer: object
    optimizer: object
    source: object
    reward: GuardedReward
    out: Path
    device: object
    hooks: list[Hook] = field(default_factory=list)
    ref_model: object = None
    # LoRA: checkpoints hold only the trainable (adapter) weights; the frozen base is the
    # --policy folder the resumed run loads again (the fingerprint pins its path).
    checkpoint_trainable_only: bool = False
    step: int = 0
    elapsed: float = 0.0
    nan_streak: int = 0
    last_saved: int | None = None  # step of the newest checkpoint on disk
    totals: dict = field(default_factory=lambda: {"reward_errors": 0, "reward_timeouts": 0, "nan_steps": 0,
                                                  "skipped_steps": 0})

    def __post_init__(self):
        self.checkpointer = self.checkpointer_for(self.cfg, self.out)

    @staticmethod
    def checkpointer_for(cfg: RLConfig, out: Path) -> Checkpointer:
        return Checkpointer(out, keep=cfg.trainer.keep_checkpoints, resume_hint=RESUME_HINT)

    def score(self, items) -> list[float]:
        rep = self.reward(items)
        self.totals["reward_errors"] += rep.errors
        self.totals["reward_timeouts"] += rep.timeouts
        self._last_report = rep
        return rep.scores

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then constant (the shared schedule with min_ratio=1: no decay)."""
        o = self.cfg.optim
        return o.lr * lr_factor(step, total=self.cfg.trainer.steps, warmup=o.warmup_steps, min_ratio=1.0)

    def evaluate(self, problems, *, k: int = 0) -> dict:
        d, t = self.cfg.data, self.cfg.trainer
        return evaluate(self.model, self.tokenizer, problems, self.score, max_prompt_length=d.max_prompt_length,
                        max_response_length=d.max_response_length, overlong=d.overlong_prompt, k=k,
                        temperature=t.eval_temperature, seed=stable_seed("eval", t.seed), precision=t.precision)

    def autocast(self):
        return autocast(self.cfg.trainer.precision, self.device)

    # ----------------------------------------------------------------- one step
    def train_step(self) -> dict:
        cfg, alg = self.cfg, self.cfg.algorithm
        t_start = time.time()
        step, seed, n, P = self.step, cfg.trainer.seed, cfg.rollout.n, cfg.trainer.prompts_per_step
        problems: list[Problem] = self.source.train_batch(step, P, seed)
        first = self.sample(problems, stable_seed("rollout", seed, step), uid=f"{step}")
        got, rounds = self.sample_groups(first)
        t_reward = time.time()
        scores, r = first.scores, first.rollout
        rlen = r.response_mask.sum(-1).float()
        # Reward and accuracy are of the first round: the policy on a fresh draw of prompts.
        row = {"step": step + 1, "reward": float(sum(scores) / len(scores)),
               "accuracy": float(sum(1 for s in scores if s >= 1.0) / len(scores)),
               "response_length": float(rlen.mean()), "truncated": float(r.truncated.float().mean()),
               "lr": self.lr_at(step), "reward_errors": sum(x.errors for x in rounds),
               "reward_timeouts": sum(x.timeouts for x in rounds)}
        first_error = next((x.first_error for x in rounds if x.first_error), "")
        if first_error:
            row["reward_error"] = first_error[:200]
        if alg.overlong_buffer.enable:
            row["overlong_reward"] = float(sum(first.rewards) - sum(scores)) / len(scores)
        if alg.filter_groups.enable:
            row["gen_batches"] = len(rounds)
        if not got.problems:
            row.update(groups_kept=0, skipped="no informative group")
            return self._timed(row, t_start, first.extra["rollout_seconds"], t_reward)
        g = got.rollout
        batch = algo.make_batch(prompts=g.prompts.cpu(), prompt_mask=g.prompt_mask.cpu(), responses=g.responses.cpu(),
                                response_mask=g.response_mask.cpu(), scores=got.rewards, uids=got.uids,
                                data_sources=[p.data_source for p in got.problems for _ in range(n)])
        algo.compute_advantages(batch, alg)
        keep = algo.informative_rows(batch) if alg.drop_uniform_groups else None
        sub = batch if keep is None else batch.select_idxs(keep)
        row["groups_kept"] = int(len(sub) // n) if keep is not None else len(got.problems)
        row.update(self._update(sub) if len(sub) else {"skipped": "no informative group"})
        return self._timed(row, t_start, sum(x.extra["rollout_seconds"] for x in rounds), t_reward)

    def _timed(self, row: dict, t_start: float, rollout_s: float, t_reward: float) -> dict:
        t_end = time.time()
        row.update(rollout_seconds=rollout_s, reward_seconds=t_reward - t_start - rollout_s,
                   update_seconds=t_end - t_reward, step_seconds=t_end - t_start)
        return row

    def sample(self, problems: list[Problem], gen_seed: int, uid: str) -> Sampled:
        """n samples per prompt, their verifier scores, and the shaped rewards advantages
        are computed on (the verifier's score plus DAPO's overlong penalty when enabled)."""
        cfg, n = self.cfg, self.cfg.rollout.n
        t0 = time.time()
        ids = encode_prompts(self.tokenizer, problems, cfg.data.max_prompt_length, cfg.data.overlong_prompt)
        gen = sampling_generator(self.device, gen_seed)
        self.model.eval()
        with self.autocast():
            r = generate(self.model, ids, n=n, max_new_tokens=cfg.data.max_response_length,
                         temperature=cfg.rollout.temperature, eos_id=self.tokenizer.eos_token_id,
                         pad_id=self.tokenizer.pad_token_id, generator=gen)
        texts = decode(self.tokenizer, r.responses, r.response_mask)
        items = [(p.data_source, texts[i * n + j], p.ground_truth, p.extra_info)
                 for i, p in enumerate(problems) for j in range(n)]
        t_roll = time.time()
        scores = self.score(items)
        rep = self._last_report
        rewards = list(scores)
        ob = cfg.algorithm.overlong_buffer
        if ob.enable:
            pen = dapo.overlong_penalty(r.response_mask.sum(-1).tolist(), cfg.data.max_response_length, ob.len,
                                        ob.penalty_factor)
            rewards = [s + p for s, p in zip(scores, pen)]
        return Sampled(list(problems), Rollout(r.prompts.cpu(), r.prompt_mask.cpu(), r.responses.cpu(),
                                               r.response_mask.cpu(), r.truncated.cpu()),
                       scores, rewards, [f"{uid}-{i}" for i in range(len(problems)) for _ in range(n)], n,
                       rep.errors, rep.timeouts, rep.first_error, {"rollout_seconds": t_roll - t0})

    def sample_groups(self, first: Sampled) -> tuple[Sampled, list[Sampled]]:
        """The groups this step trains on, and every generation round it took.

        Without algorithm.filter_groups: the first round as it is. With it (DAPO's dynamic
        sampling): only groups whose verifier scores differ, from further rounds of fresh
        prompts until prompts_per_step groups are kept or max_num_gen_batches rounds ran;
        the extra groups beyond prompts_per_step are dropped, as VeRL's DAPO trainer does.
        """
        fg, P, seed = self.cfg.algorithm.filter_groups, self.cfg.trainer.prompts_per_step, self.cfg.trainer.seed
        if not fg.enable:
            return first, [first]
        rounds, kept, total = [first], [], 0
        while True:
            cur = rounds[-1]
            groups = dapo.varied_groups(cur.scores, cur.n)[: P - total]
            kept.append(cur.select(groups))
            total += len(groups)
            if total >= P or len(rounds) >= fg.max_num_gen_batches:
                break
            k = len(rounds)
            more = self.source.train_batch(self.step, P, stable_seed("refill", seed, k))
            rounds.append(self.sample(more, stable_seed("rollout", seed, self.step, k), uid=f"{self.step}.{k}"))
        kept = [x for x in kept if x.problems]
        return (dapo.concat(kept, self.tokenizer.pad_token_id) if kept else first.select([])), rounds

    def _update(self, batch) -> dict:
        cfg, alg = self.cfg, self.cfg.algorithm
        kernels, temp = cfg.trainer.kernels, cfg.rollout.temperature
        mask_all = batch.batch["response_mask"]
        width = int(mask_all.sum(0).nonzero().max()) + 1  # trim all-pad response columns
        R = batch.batch["responses"].shape[1]
        input_ids = batch.batch["input_ids"][:, : batch.batch["input_ids"].shape[1] - R + width].to(self.device)
        attn = batch.batch["attention_mask"][:, : input_ids.shape[1]].to(self.device)
        mask = mask_all[:, :width].to(self.device)
        adv = batch.batch["advantages"][:, :width].to(self.device)
        # One update over the whole batch is on-policy: old log-probs are the current
        # ones (detached), as in VeRL, and the extra forward pass is skipped.
        on_policy = cfg.trainer.ppo_epochs == 1 and cfg.trainer.minibatches == 1
        want_ref = self.ref_model is not None and (alg.use_kl_loss or self.step % KL_EVERY == 0)
        # Whole groups in one update: each shared prompt runs through the model once
        # (grouped_token_logprobs; same values, prompt compute divided by n). The fused
        # log-prob kernel path and shuffled minibatches use the per-row path.
        n, P = cfg.rollout.n, input_ids.shape[1] - width
        prompts, pmask, responses = input_ids[:, :P], attn[:, :P], input_ids[:, P:]
        grouped = (on_policy and len(input_ids) % n == 0 and _plain_logprobs(kernels, self.device)
                   and bool((prompts.view(-1, n, P) == prompts[::n, None, :]).all()))
        B = input_ids.shape[0]
        # trainer.micro_batch_size bounds the rows of one forward/backward (activation
        # memory of a large policy); grouped chunks hold whole groups.
        micro, group = cfg.trainer.micro_batch_size, (n if grouped else 1)

        def logprobs(model, rows, use_groups):
            with self.autocast():
                if use_groups:
                    return grouped_token_logprobs(model, prompts[rows], pmask[rows], responses[rows], mask[rows],
                                                  n, temp)
                return token_logprobs(model, input_ids[rows], attn[rows], width, temp, kernels)

        def no_grad_logprobs(model, use_groups):
            rows = torch.arange(B, device=self.device)
            with torch.no_grad():
                return torch.cat([logprobs(model, c, use_groups).float()
                                  for c in micro_batches(rows, micro, n if use_groups else 1)])

        old = None if on_policy else no_grad_logprobs(self.model, False)
        ref = no_grad_logprobs(self.ref_model, grouped) if want_ref else None
        lr = self.lr_at(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.model.train()
        gen = torch.Generator().manual_seed(stable_seed("minibatch", cfg.trainer.seed, self.step))
        mb = max(1, math.ceil(B / cfg.trainer.minibatches))
        agg = algo.resolve(alg)["loss_agg_mode"]
        if on_policy:  # filled chunk by chunk with the current log-probs (detached)
            old = torch.zeros_like(adv)
        stats: dict[str, list[float]] = {}
        for _ in range(cfg.trainer.ppo_epochs):
            order = torch.randperm(B, generator=gen) if cfg.trainer.minibatches > 1 else torch.arange(B)
            for s in range(0, B, mb):
                idx = order[s:s + mb].to(self.device)
                self.optimizer.zero_grad(set_to_none=True)
                for rows in micro_batches(idx, micro, group):
                    logp = logprobs(self.model, rows, grouped).float()
                    if on_policy:
                        old[rows] = logp.detach()
                    loss, m = algo.policy_loss(old_log_prob=old[rows], log_prob=logp, advantages=adv[rows],
                                               response_mask=mask[rows], alg=alg,
                                               ref_log_prob=ref[rows] if ref is not None else None)
                    if not torch.isfinite(loss):
                        return self._nan("loss")
                    # Chunk losses weighted so their gradients sum to the minibatch's VeRL loss.
                    (loss * chunk_weight(mask[rows], mask[idx], agg)).backward()
                    for k, v in m.items():
                        stats.setdefault(k, []).append(v)
                gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
                if not torch.isfinite(gnorm):
                    self.optimizer.zero_grad(set_to_none=True)
                    return self._nan("gradient")
                self.optimizer.step()
                stats.setdefault("grad_norm", []).append(float(gnorm))
        self.nan_streak = 0
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        if ref is not None:  # KL of the policy that sampled this batch to the frozen warm start
            out["kl"] = algo.kl_to_reference(old, ref, mask, alg.kl_loss_type)
        return out

    def _nan(self, what: str) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        self.nan_streak += 1
        self.totals["nan_steps"] += 1
        k = self.cfg.trainer.max_nan_steps
        if self.nan_streak >= k:
            raise diverged(f"the {what} was NaN/inf in {self.nan_streak} consecutive steps, the last at step "
                           f"{self.step + 1} (trainer.max_nan_steps={k})", checkpoint_dir=self.checkpointer.dir,
                           last_good=self.last_saved, lr_key="optim.lr")
        return {"skipped": f"non-finite {what}", "nan": 1}

    # ---------------------------------------------------------------- the loop
    def train(self, *, steps: int, time_budget_s: float, log: MetricsWriter, heldout: list[Problem]) -> None:
        t = self.cfg.trainer
        while self.step < steps and not (time_budget_s and self.elapsed >= time_budget_s):
            t0 = time.time()
            row = self.train_step()
            self.step += 1
            if "skipped" in row:
                self.totals["skipped_steps"] += 1
            if t.eval_every and self.step % t.eval_every == 0 and self.step < steps:
                row["heldout_accuracy"] = self.evaluate(heldout)["accuracy"]
            self.elapsed += time.time() - t0
            row["elapsed_seconds"] = round(self.elapsed, 3)
            log.log(row)
            if t.save_every and self.step % t.save_every == 0:
                self.save_checkpoint()
            call_hooks(self.hooks, self.step, row)

    def save_checkpoint(self) -> Path:
        path = self.checkpointer.save(self.step, config=fingerprint(self.cfg), state={
            "model": self._model_state(), "optimizer": self.optimizer.state_dict(),
            "trainer": {"elapsed": self.elapsed, "nan_streak": self.nan_streak, "totals": self.totals}})
        self.last_saved = self.step
        return path

    def _model_state(self) -> dict:
        sd = self.model.state_dict()
        if not self.checkpoint_trainable_only:
            return sd
        keep = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in sd.items() if k in keep}

    def restore(self, state: dict) -> None:
        """Continues from a checkpoint `Checkpointer.load` returned (already checked)."""
        missing, _ = self.model.load_state_dict(state["model"], strict=not self.checkpoint_trainable_only)
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if trainable & set(missing):
            raise UserError(f"{self.checkpointer.dir}: the checkpoint lacks trainable weights "
                            f"(e.g. {sorted(trainable & set(missing))[0]}); {RESUME_HINT}")
        self.optimizer.load_state_dict(state["optimizer"])
        t = state["trainer"]
        self.step, self.elapsed = int(state["step"]), float(t["elapsed"])
        self.nan_streak, self.totals = int(t["nan_streak"]), dict(t["totals"])
        self.last_saved = self.step


def _plain_logprobs(kernels: str, device) -> bool:
    """True where token_logprobs would use plain torch (no fused kernel)."""
    return kernels == "torch" or (kernels == "auto" and getattr(device, "type", str(device)) == "cpu")


def set_threads(n: int) -> int:
    """torch CPU threads for the run (the warm start trains in this process too).

    0 = auto: torch's default (one per core) on an idle machine, one thread when
    other work already loads the cores (tpu_pipeline.cpu_load).
    """
    if n <= 0:
        n = 1 if others_load_the_cores() else torch.get_num_threads()
    torch.set_num_threads(n)
    return n


def make_reference(model):
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def write_eval(out: Path, evals: dict) -> None:
    atomic_write_json(out / "eval.json", evals)

