"""End an embedded Ray instance's helper processes as soon as the driver that started it dies.

`ray.init(address="local")` binds the GCS server and the raylet to the driver (the kernel kills
them with it), but not the agents the raylet starts: a dashboard agent and a runtime-env agent that
notice the raylet's death at once, then spend 60 s trying to report it to the GCS that died with it
(Ray 2.60, `process_watcher.report_raylet_error_logs`). A driver killed outright (SIGKILL, the
out-of-memory killer) so leaves two processes behind for a minute.

The launcher notes the driver's processes before `ray.init` and hands those that `ray.init` added
(`descendants()` after minus before) to `watch`, which starts a small watcher process; the watcher reads its stdin, a pipe whose only writer is the driver, so it sees
end-of-file the moment the driver dies (or when the driver closes it on a clean shutdown), and then
kills whichever of those processes are still alive. Processes are named by pid and start time, so a
pid the system has since given to another process is never touched. The same end-of-file idea is
Ray's own reaper's (used where the kernel cannot bind a child's fate to its parent).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil


class Watcher:
    """The watcher of one driver's processes; `release()` ends it, killing what is left."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def release(self, timeout_s: float = 10.0) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()


def descendants() -> set[tuple[int, float]]:
    """Every process this one has started, direct or not, that still runs: (pid, start time)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            found.add((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return found


def watch(named: set[tuple[int, float]]) -> Watcher:
    """A watcher that kills the `named` processes still running when this process ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "roll_device.cluster.reaper", json.dumps(sorted(named))],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's terminal is not for it
    )
    return Watcher(process)


def kill_survivors(named: list[tuple[int, float]]) -> list[int]:
    """SIGKILL each named process that still runs with the same start time; returns their pids."""
    killed = []
    for pid, started in named:
        try:
            if psutil.Process(pid).create_time() != started:
                continue
            os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
        killed.append(pid)
    return killed


def main() -> None:
    named = [(int(pid), float(started)) for pid, started in json.loads(sys.argv[1])]
    while sys.stdin.buffer.read(65536):
        pass
    kill_survivors(named)


if __name__ == "__main__":
    main()
