"""LM quantization recipes side by side, through `convert` itself (issue 12 item 4).

One `convert` of a Hugging Face causal LM with a profile whose `lm_precisions`
lists every LM recipe (convert/lm/quant_recipes.py): the report's candidates give,
per recipe, bundle size, greedy agreement with transformers through litert_lm
(near-tie rule), held-out perplexity change vs PyTorch float32, decode-ready
parity on ai-edge-litert, ms per token, and why the winner won. Every recipe
is derived from the one float32 export (nothing is exported twice). The
progress messages are timed, so the cost of each extra candidate (quantize +
parity + perplexity + latency) is measured too: what a profile's list adds
to convert's wall time.

Default model: the default grpo_math policy architecture (tpu_pipeline.testing.lm_zoo,
random weights unless --hf names a trained policy folder such as
runs/demo/grpo_math/policy). Writes OUT/lm_recipes.json and OUT/lm_recipes.md.

CPU commands (one export each, a few minutes; --defaults: two converts of every target):
    .venv/bin/python bench/lm_recipes.py --out /tmp/lm_recipes [--hf runs/demo/grpo_math/policy]
    .venv/bin/python bench/lm_recipes.py --out /tmp/lm_recipes --defaults
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from tpu_pipeline.convert import convert
from tpu_pipeline.convert.targets import LM_RECIPES, profile_dir
from tpu_pipeline.testing import lm_zoo

CACHE, PREFILL = 64, 16
TARGET = "android"  # the profile whose list is replaced by every recipe (float16's elementwise logit bounds)



def profiles_with_every_recipe(dst: Path) -> Path:
    shutil.copytree(profile_dir(), dst)
    path = dst / f"{TARGET}.toml"
    text = re.sub(r"^lm_precisions = .*$", "", path.read_text(), flags=re.M)
    path.write_text(text + f"\nlm_precisions = {json.dumps([e.name for e in LM_RECIPES.entries()])}\n")
    return dst


def profiles_before(dst: Path) -> Path:
    """The shipped profiles as they were before LM recipes were measured: one precision per LM
    target (lm_precisions removed; web's LMs float16, as its lm_precision said)."""
    shutil.copytree(profile_dir(), dst)
    for path in dst.glob("*.toml"):
        text = re.sub(r"^(lm_precisions|max_perplexity_change) = .*$", "", path.read_text(), flags=re.M)
        path.write_text(text + ('\nlm_precision = "float16"\n' if path.stem == "web" else ""))
    return dst


def compare_defaults(folder: Path, prompts: Path, work: Path, out: Path) -> None:
    """`--targets all` twice: with one precision per LM target (before) and with the shipped
    profiles' lm_precisions (two recipes per phone/web target): what measuring them adds."""
    rows = {}
    for label, profiles in (("before", profiles_before(work / "p_before")), ("shipped", profile_dir())):
        t0 = time.perf_counter()
        r = convert(folder, targets="all", out=work / f"dist_{label}", prompts=prompts, lm_max_len=CACHE,
                    lm_prefill_len=PREFILL, profile_dir=profiles, progress=lambda m: print(f"[{label}] {m}", flush=True))
        rows[label] = {"wall_s": time.perf_counter() - t0, "export_s": r.report["export_s"],
                       "targets": {n: {"precision": t.precision, "passed": t.passed, "chosen_because": t.chosen_because,
                                       "candidates": t.candidates, "timings_s": t.timings_s}
                                   for n, t in r.targets.items()}}
    (out / "lm_recipes_defaults.json").write_text(json.dumps(rows, indent=1, default=str))
    for label, row in rows.items():
        print(f"{label}: wall {row['wall_s']:.0f} s (export {row['export_s']:.0f} s); " + ", ".join(
            f"{n} {t['precision']}{'' if t['passed'] else ' FAILED'}" for n, t in row["targets"].items()))
    print(f"added by the shipped lm_precisions: {rows['shipped']['wall_s'] - rows['before']['wall_s']:+.0f} s")


def candidate_costs(log: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds from each recipe's `quantize (X, ...)` message to the next recipe's (or to the
    write step): its quantize + checks + parity + perplexity + latency."""
    starts = [(t, m.split("(")[1].split(",")[0]) for t, m in log if m.startswith("quantize (")]
    end = next((t for t, m in log if m.startswith("write:")), log[-1][0])
    return {name: (starts[i + 1][0] if i + 1 < len(starts) else end) - t for i, (t, name) in enumerate(starts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_lm_recipes"))
    ap.add_argument("--hf", type=Path, default=None, help="HF causal-LM folder (default: grpo_math policy shape)")
    ap.add_argument("--defaults", action="store_true",
                    help="instead: convert --targets all with one precision per LM target, then with the shipped "
                         "profiles' lm_precisions, and compare wall times")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log: list[tuple[float, str]] = []

    def say(msg: str) -> None:
        log.append((time.perf_counter(), msg))
        print(f"{log[-1][0] - log[0][0]:7.1f}s {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="lm-recipes-") as tmp:
        work = Path(tmp)
        folder = args.hf or lm_zoo.save_grpo_policy_shape(work / "hf")
        prompts = work / "prompts.txt"
        prompts.write_text("\n".join(lm_zoo.PROMPTS) + "\n")
        if args.defaults:
            return compare_defaults(folder, prompts, work, args.out)
        t0 = time.perf_counter()
        result = convert(folder, targets=f"desktop,{TARGET}", out=work / "dist", progress=say, prompts=prompts,
                         lm_max_len=CACHE, lm_prefill_len=PREFILL, profile_dir=profiles_with_every_recipe(work / "p"))
        wall = time.perf_counter() - t0
    t = result[TARGET]
    costs = candidate_costs(log)
    rows = {"model": str(args.hf or "grpo_math policy shape, random weights"), "target": TARGET, "wall_s": wall,
            "export_s": result.report["export_s"], "chosen": t.precision, "chosen_because": t.chosen_because,
            "candidate_s": costs, "candidates": t.candidates}
    (args.out / "lm_recipes.json").write_text(json.dumps(rows, indent=1, default=str))
    lines = [f"Model: {rows['model']}; target {TARGET} listing every recipe; convert wall {wall:.0f} s "
             f"(export {rows['export_s']:.0f} s); shipped: {t.precision}", "",
             "| recipe | passed | bundle KB | litert_lm agreement (near-ties) | held-out perplexity | change vs PyTorch "
             "| ms/token | candidate s | failure |", "|---|---|---|---|---|---|---|---|---|"]
    for c in t.candidates or []:
        lm = c if "bundle_size_bytes" in c else {}
        ppl, change, ms = lm.get("perplexity"), lm.get("perplexity_change"), c["latency_ms"]
        cells = [c["precision"] + (" (shipped)" if c["chosen"] else ""), str(c["passed"]),
                 f"{lm['bundle_size_bytes'] / 1024:.0f}" if lm else "",
                 f"{lm['generation_agreement']:.0%} ({lm['near_ties']})" if lm else "",
                 "" if ppl is None else f"{ppl:.4f}", "" if change is None else f"{100 * change:+.2f}%",
                 "" if ms is None else f"{ms:.3f}", f"{costs.get(c['precision'], 0):.1f}",
                 (c["errors"] or [""])[0][:160]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"chosen because: {t.chosen_because}"]
    (args.out / "lm_recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
