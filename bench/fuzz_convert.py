"""Fuzz `tpu-pipeline convert`'s loaders and the CLI with damaged inputs (issue 19, item 6).

    .venv/bin/python bench/fuzz_convert.py --inputs 10000            # the CLI (CliRunner), load stage
    .venv/bin/python bench/fuzz_convert.py --inputs 2000 --mode loader  # the loader in process (faster)

Seeds: a torch.export archive (.pt2), a tpu-pipeline model.pt manifest, a state_dict .pt (with
--model-class), a malicious pickle (creates a file when unpickled), and an .npz given as --calib
and as --eval-data. hypothesis draws each input: a seed damaged at the byte level (truncate,
bit flips, overwrites, inserts, deletes, "interesting" values), inside one zip member with its
checksum redone (so the damage reaches the unpickler, the .npy header or torch.export's JSON),
or in one manifest field (any type, dangerous class paths). Each input runs in a fresh sandbox
(cwd and TMPDIR) with everything after the load stage (the float export onwards) replaced by a
stop (exit 3), so an input costs milliseconds: tpu_pipeline.testing.fuzz_inputs.

Prints: inputs, the exit-code histogram, tracebacks (untyped exceptions, or a traceback in the
CLI's output), exit-1 count, files left outside --out, pickles executed without --trust-pickle,
backstop hits (typed only by a catch-all: load_model's "cannot load it", convert's "internal
error"), wall time, and the first few findings. Target: 0 exit 1, 0 tracebacks, 0 outside, 0 pickles.
hypothesis is property-based, not coverage-guided: the zip-member and manifest-field strategies
are what take inputs past the zip layer into each parser.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=10000)
    ap.add_argument("--mode", choices=["cli", "loader"], default="cli")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (inputs are reproducible from it)")
    ap.add_argument("--json", type=Path, default=None, help="also write the counts here")
    a = ap.parse_args()

    from hypothesis import HealthCheck, given, seed, settings

    from tpu_pipeline.testing import fuzz_inputs as F

    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="tpu-pipeline-fuzz-"))
    seeds, man = F.build_seeds(root / "seeds")
    run = F.run_cli if a.mode == "cli" else F.run_loader
    codes: collections.Counter = collections.Counter()
    by_seed: collections.Counter = collections.Counter()
    findings: list[dict] = []
    counts = {"inputs": 0, "tracebacks": 0, "exit_1": 0, "outside_out": 0, "pickle_executed": 0, "backstop": 0}

    @seed(a.seed)
    @settings(max_examples=a.inputs, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=["generate"])
    @given(F.damaged(seeds))
    def one(case):
        s, data, how = case
        o = run(s, data, root, man)
        counts["inputs"] += 1
        codes[o.exit_code] += 1
        by_seed[f"{s.name}/{how.split()[0]}"] += 1
        bad = {"traceback": o.traceback is not None, "exit_1": o.exit_code == 1, "outside_out": bool(o.outside),
               "pickle_executed": o.pickle_ran, "backstop": o.backstop}
        for k, v in bad.items():
            counts[k if k != "traceback" else "tracebacks"] += int(v)
        if any(bad.values()) and len(findings) < 20:
            findings.append({"seed": s.name, "how": how, "exit": o.exit_code, "outside": o.outside[:3],
                             "traceback": (o.traceback or "")[-1500:]})
        if a.json and counts["inputs"] % 50 == 0:  # partial figures on disk: a long run cut short still counts
            a.json.write_text(json.dumps({**counts, "exit_codes": dict(codes), "partial": True,
                                          "wall_s": round(time.perf_counter() - t0, 1), "findings": findings}))

    t0 = time.perf_counter()
    with (F.load_stage_only() if a.mode == "cli" else _nothing()):
        one()
        wall = time.perf_counter() - t0
    out = {**counts, "exit_codes": dict(sorted(codes.items())), "by_seed": dict(sorted(by_seed.items())),
           "wall_s": round(wall, 1), "mode": a.mode, "hypothesis_seed": a.seed,
           "command": " ".join([Path(sys.executable).name, *sys.argv])}
    print(json.dumps(out, indent=2))
    for f in findings[:5]:
        print(f"--- finding: {f['seed']} {f['how']} exit {f['exit']} outside {f['outside']}\n{f['traceback']}")
    if a.json:
        a.json.write_text(json.dumps({**out, "findings": findings}, indent=2))
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 1 if any(counts[k] for k in ("tracebacks", "exit_1", "outside_out", "pickle_executed", "backstop")) else 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
