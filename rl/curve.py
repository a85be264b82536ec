"""DIR/curve.png: training reward and held-out greedy accuracy against RL wall time.

The numbers come from DIR/metrics.jsonl, written by the training core's
MetricsWriter (tpu_pipeline.metrics).
"""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.metrics import read_metrics


def plot_curve(out: Path, evals: dict) -> Path:
    """DIR/curve.png: training reward and held-out greedy accuracy against RL wall time."""
    # heavy: matplotlib takes about a second to import and is needed once, at the end of a run
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r["elapsed_seconds"] for r in rows if "reward" in r]
    ax.plot(t, [r["reward"] for r in rows if "reward" in r], lw=0.8, alpha=0.6, label="train reward (mean)")
    held = [(r["elapsed_seconds"], r["heldout_accuracy"]) for r in rows if "heldout_accuracy" in r]
    before = evals.get("before", {}).get("accuracy")
    after = evals.get("after", {}).get("accuracy")
    pts = ([(0.0, before)] if before is not None else []) + held
    if after is not None and rows:
        pts.append((rows[-1]["elapsed_seconds"], after))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="C3", label="held-out greedy accuracy")
    k = evals.get("before", {}).get("k")
    if k and "pass_at_k" in evals.get("before", {}):
        ax.axhline(evals["before"]["pass_at_k"], ls="--", color="gray", lw=0.8, label=f"warm start pass@{k}")
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = out / "curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
