"""Quiet output: the driver's terminal shows roll-device's own lines and the progress bars (the
workers' set-up, `setup_progress`, then the steps); each
worker's stdout and stderr (engine start-up, Triton and NUMA notices, FutureWarnings, weight-loading
bars) go to `<run dir>/logs/<role>_<rank>.log`, and the warnings in them that are not known
start-up noise are summarised once at the end of the run.

`capture_output(path)` runs in a worker: it points the process's file descriptors 1 and 2 at the
file, so output from C extensions and child processes (a vLLM engine core) lands there too, and
Ray's log monitor, which streams the worker's original log files to the driver, has nothing to
stream. `quiet_driver()` drops Ray's start-up notices on the driver (the "started a local
instance" line and the token-authentication notice) and Ray's paragraph about a worker that died
(printed by the driver's error listener, `ray._private.worker.print_to_stdstream`, the one place it
passes through): the run's error says it in one line (`WorkerLostError`, pipeline/roles.py), and
Ray's full report goes to that worker's log (`append_report`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOG_DIR = "logs"
WARNING = re.compile(r"warn|error|exception|traceback", re.IGNORECASE)
KNOWN_NOISE = (  # start-up notices every CPU run prints; nothing to act on
    "Triton is installed, but doesn't include CPU backend",
    "`torch.distributed.reduce_op` is deprecated",
    "NUMA binding",
    "Token authentication is enabled",
)
SHOWN_WARNINGS = 5
REPORT_PREFIX = "[roll-device] "  # our report in a worker's log: said on the terminal already
RAY_WORKER_DIED = "A worker died or was killed"  # how Ray's paragraph about a dead worker begins
RAY_NOTICES = {
    "ray._private.worker": lambda record: record.levelno <= logging.INFO,
    "ray._private.authentication.authentication_token_setup": lambda record: (
        "Token authentication" in record.getMessage()
    ),
}


def capture_output(path: str | Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `path` (appended)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def append_report(path: Path, title: str, text: str) -> None:
    """Append `title` and `text` (e.g. Ray's full report of the worker's death) to the log at
    `path`, each line marked as ours: the end-of-run summary then leaves that log out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        log.writelines(f"{REPORT_PREFIX}{line}\n" for line in [title, *text.splitlines()])


class _DropNotices(logging.Filter):
    def __init__(self, drop) -> None:
        super().__init__()
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drop(record)


@contextmanager
def setup_progress(workers: dict[str, int]) -> Iterator[Callable[[str], None]]:
    """A progress bar of the workers set up so far, of `workers` (role: count), naming the roles
    still starting (loading a real model and capturing its graphs takes minutes); yields the call
    for one worker ready."""
    from tqdm import tqdm

    left = dict(workers)

    def waiting() -> str:
        return "waiting for " + ", ".join(f"{role} ({n})" for role, n in left.items() if n)

    with tqdm(total=sum(left.values()), desc="setting up workers", unit="worker", leave=False) as bar:
        bar.set_postfix_str(waiting())

        def ready(role: str) -> None:
            left[role] -= 1
            bar.set_postfix_str(waiting() if any(left.values()) else "", refresh=False)
            bar.update(1)

        yield ready


def quiet_driver() -> None:
    """Drop Ray's start-up notices and its paragraphs about dead workers in this process (once)."""
    import ray._private.worker as ray_worker

    for name, drop in RAY_NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotices) for f in logger.filters):
            logger.addFilter(_DropNotices(drop))
    if not isinstance(ray_worker.print_to_stdstream, _WithoutWorkerDeaths):
        ray_worker.print_to_stdstream = _WithoutWorkerDeaths(ray_worker.print_to_stdstream)


class _WithoutWorkerDeaths:
    """Ray's printer of the driver's streamed lines, less its paragraphs about dead workers."""

    def __init__(self, prints: Callable) -> None:
        self.prints = prints

    def __call__(self, data: dict, *args, **kwargs) -> None:
        lines = [line for line in data["lines"] if not line.startswith(RAY_WORKER_DIED)]
        if lines:
            self.prints({**data, "lines": lines}, *args, **kwargs)


def warnings_worth_reading(log_dir: Path) -> list[str]:
    """Distinct warning or error lines of the worker logs, known noise left out, as `file: line`. A
    log holding our report (`append_report`) is left out: the run's error told that worker's end
    (an engine's own account of it, a rank that died, would repeat it in other words)."""
    found: dict[str, str] = {}
    for log in sorted(Path(log_dir).glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        if any(line.startswith(REPORT_PREFIX) for line in lines):
            continue
        for line in lines:
            text = line.strip()
            if WARNING.search(text) and not any(noise in text for noise in KNOWN_NOISE):
                found.setdefault(text, f"{log.stem}: {text[:200]}")
    return list(found.values())


def summarise_worker_logs(log_dir: Path) -> str:
    """One line (plus up to SHOWN_WARNINGS lines) about the worker logs in `log_dir`."""
    warnings = warnings_worth_reading(log_dir)
    if not warnings:
        return f"worker logs: {log_dir} (no warnings beyond known start-up notices)"
    shown = "".join(f"\n  {w}" for w in warnings[:SHOWN_WARNINGS])
    more = f"\n  ... and {len(warnings) - SHOWN_WARNINGS} more" if len(warnings) > SHOWN_WARNINGS else ""
    return f"worker logs: {log_dir} ({len(warnings)} warning line(s) worth reading):{shown}{more}"
