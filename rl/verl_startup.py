"""Where a VeRL launch spends its start-up: the phases read from the trainer's log.

VeRL's driver, Ray and every actor VeRL starts (TaskRunner, the FSDP WorkerDict,
vLLM's server, engine core and worker, the agent-loop and reward workers) print a
line with a wall-clock stamp as they come up; `phases(log)` names the first stamp of
each milestone and the seconds since the previous one. eval.json keeps them
(`startup_phases`), so a slow start says which step was slow. A milestone missing
from the log (another VeRL version, a cluster run) is left out, never guessed.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

# (milestone, the log line that marks it), in launch order; each process's first line is VeRL's platform
# notice ("Platform override from VERL_PLATFORM"), printed when it has imported VeRL.
MILESTONES = (
    ("driver imported VeRL", r"^INFO:.*Platform override from VERL_PLATFORM"),
    ("ray.init called", r"ray init kwargs|authentication_token_setup"),
    ("Ray started", r"Started a local Ray instance"),
    ("TaskRunner imported VeRL", r"\(TaskRunnerV1 pid=\d+\).*Platform override"),
    ("data loaded", r"train and validate dataloader initialized"),
    ("FSDP worker imported VeRL", r"\(WorkerDict pid=\d+\).*Platform override"),
    ("actor and reference built (FSDP)", r"actor and ref model engine initialized"),
    ("vLLM server configured", r"\(vLLMHttpServer pid=\d+\).*Enforce eager"),
    ("vLLM engine ready, trainer ready", r"all initialize finished"),
    ("first rollout request (agent-loop workers up)", r"Passing raw prompts to InputProcessor"),
)

_FULL = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d+)")  # Python logging: 2026-12-01 10:57:42,502
_VLLM = re.compile(r"\b(\d\d)-(\d\d) (\d\d:\d\d:\d\d)\b")          # vLLM: WARNING 12-01 10:59:58
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _stamp(line: str, year: int | None) -> float | None:
    m = _FULL.search(line)
    if m:
        return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + m.group(2))
    m = _VLLM.search(line)
    if m and year is not None:
        return datetime.strptime(f"{year}-{m.group(1)}-{m.group(2)} {m.group(3)}", "%Y-%m-%d %H:%M:%S").timestamp()
    return None


def phases(log_path: Path) -> list[dict]:
    """[{"phase", "at_s" (since the first milestone), "took_s" (since the previous one)}] from the log."""
    try:
        lines = [_ANSI.sub("", ln) for ln in Path(log_path).read_text(errors="replace").splitlines()]
    except OSError:
        return []
    years = (_FULL.search(ln) for ln in lines)
    year = next((int(m.group(1)[:4]) for m in years if m), None)
    out, first, prev = [], None, None
    for name, pattern in MILESTONES:
        rx = re.compile(pattern)
        t = next((s for ln in lines if rx.search(ln) and (s := _stamp(ln, year)) is not None), None)
        if t is None or (prev is not None and t < prev):
            continue
        first = t if first is None else first
        out.append({"phase": name, "at_s": round(t - first, 1), "took_s": round(t - (prev if prev is not None else t), 1)})
        prev = t
    return out
