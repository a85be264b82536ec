"""Where a run's numbers go: DIR/metrics.jsonl (one object per step), TensorBoard
(DIR/tb), a progress bar, and the learning-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

from ..files import append_jsonl

BAR_FIELDS = (("reward", "reward", "{:.3f}"), ("acc", "accuracy", "{:.3f}"), ("kl", "kl", "{:.4f}"),
              ("len", "response_length", "{:.1f}"), ("s/step", "step_seconds", "{:.2f}"))


class MetricsLog:
    def __init__(self, out: Path, *, progress: bool, total: int, tensorboard: bool = True):
        self.path = out / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out / "tb"))
            except ImportError:  # tensorboard is a dependency; tolerate a trimmed install
                self._tb = None
        self._bar = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("rl"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[info]}"), transient=False)
            self._task = self._bar.add_task("rl", total=total, info="")
            self._bar.start()

    def truncate_after(self, step: int) -> None:
        """Drops rows past `step` (a resumed run rewrites them)."""
        if not self.path.is_file():
            return
        rows = [line for line in self.path.read_text().splitlines() if line.strip()]
        keep = [r for r in rows if json.loads(r).get("step", 0) <= step]
        self.path.write_text("".join(r + "\n" for r in keep))

    def log(self, row: dict) -> None:
        append_jsonl(self.path, row)
        step = row.get("step", 0)
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k.replace(".", "/"), v, step)
        if self._bar is not None:
            info = "  ".join(f"{name} {fmt.format(row[key])}" for name, key, fmt in BAR_FIELDS if key in row)
            if "heldout_accuracy" in row:
                info += f"  heldout {row['heldout_accuracy']:.3f}"
            self._bar.update(self._task, completed=step, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._tb is not None:
            self._tb.close()


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_curve(out: Path, evals: dict) -> Path:
    """DIR/curve.png: training reward and held-out greedy accuracy against RL wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
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
