"""GSM8K for real models: the offline problem set `grpo_gsm8k` ships, and the
`gsm_symbolic` word problems an arith rl recipe may mix in.

The shipped file (`rl/datasets/gsm8k_offline.parquet`) holds grade-school word
problems from reasoning-gym's `gsm_symbolic` generators (GSM8K questions with
their numbers re-drawn), written in exactly the schema VeRL's
`examples/data_preprocess/gsm8k.py` writes for openai/gsm8k: the question plus
VeRL's instruction as one user message, `reward_model.ground_truth` the
integer answer, `data_source` "openai/gsm8k", so VeRL's strict gsm8k scorer
(`#### N`) grades it and a user's real GSM8K parquet drops in with `--data`.

Regenerate it (deterministic; a test checks the shipped rows against this):

    python -m tpu_pipeline.train.tasks.gsm8k rl/datasets/gsm8k_offline.parquet

Its rl source is the file itself (rl's ParquetSource, `data.file`) and its
reward VeRL's scorer for "openai/gsm8k" (`verl_default`); it has no train
task: the policy is a model the user brings.
"""

from __future__ import annotations

import argparse
import re

from tpu_pipeline.train.tasks.rows import Problem, write_parquet

DATA_SOURCE = "openai/gsm8k"
# VeRL's examples/data_preprocess/gsm8k.py appends this to every question.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SYMBOLIC = "gsm_symbolic"  # reasoning-gym's generator of GSM8K-style problems
OFFLINE_ROWS = 600
OFFLINE_SEED = 14


def offline_problems(n: int = OFFLINE_ROWS, seed: int = OFFLINE_SEED) -> list[Problem]:
    """`n` GSM-style problems from reasoning-gym's gsm_symbolic, in VeRL's gsm8k row shape."""
    # heavy: reasoning_gym imports every task family it ships (~1 s)
    import reasoning_gym

    # GSM8K's answers are integers: the few generated problems with a fractional answer are
    # skipped, and so are repeated questions (a held-out row must not be a training row).
    # Items depend only on (seed, index), so a longer draw keeps the first rows.
    ds = reasoning_gym.create_dataset(SYMBOLIC, size=2 * n + 10, seed=seed)
    out, seen = [], set()
    for x in ds:
        if len(out) == n:
            break
        answer = str(x["answer"]).strip()
        if not re.fullmatch(r"-?\d+", answer) or x["question"] in seen:
            continue
        seen.add(x["question"])
        cot = str(x["metadata"].get("answer_cot", "")).strip()
        out.append(Problem(
            prompt=[{"role": "user", "content": f"{x['question']} {INSTRUCTION}"}],
            ground_truth=answer, data_source=DATA_SOURCE, ability="math",
            # VeRL keeps the worked solution (ending "#### N") and the bare question beside the prompt.
            # Its own last line is replaced: the generator sometimes ends "#### 66.0", which
            # the strict scorer rejects for "66".
            extra_info={"answer": f"{cot.split('####')[0].rstrip()}\n#### {answer}", "question": x["question"],
                        "generator": "reasoning_gym.gsm_symbolic", "generator_seed": seed}))
    return out


def symbolic_problems(n: int, seed: int) -> list[Problem]:
    """`n` gsm_symbolic problems as chat messages, VeRL's instruction appended, answers as given."""
    # heavy: reasoning_gym imports every task family it ships (~1 s)
    import reasoning_gym

    if n <= 0:
        return []
    ds = reasoning_gym.create_dataset(SYMBOLIC, size=n, seed=seed)
    return [Problem([{"role": "user", "content": f"{x['question']} {INSTRUCTION}"}], str(x["answer"]), SYMBOLIC)
            for x in ds]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write grpo_gsm8k's offline GSM-style parquet file.")
    p.add_argument("out")
    p.add_argument("--n", type=int, default=OFFLINE_ROWS)
    p.add_argument("--seed", type=int, default=OFFLINE_SEED)
    a = p.parse_args(argv)
    write_parquet(offline_problems(a.n, a.seed), a.out, "train")
    print(a.out)


if __name__ == "__main__":
    main()
