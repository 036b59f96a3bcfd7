"""Fault drills for whole runs: an `on_step` hook that kills a role's worker with SIGKILL at a
chosen worker call (the runs join the session's cluster: `shared_cluster` in tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import time


def kill_at_next(role: str, method: str, killed_at: list, after_step: int = 3, victim: str | None = None):
    """An on_step hook: after step `after_step`, the next call of `method` on `role` first kills
    worker 0 of role `victim` (default: `role` itself) with SIGKILL, as `kill -9` would (its time
    goes into `killed_at`)."""

    def on_step(record, roles):
        if record["step"] != after_step:
            return
        group = roles.groups[role]
        pid = roles.groups[victim or role].infos[0]["pid"]
        for name in ("async_call_all", "async_scatter"):
            original = getattr(group, name)

            def killing(called, *args, _original=original, **kwargs):
                if called.__name__ == method and not killed_at:
                    os.kill(pid, signal.SIGKILL)
                    killed_at.append(time.monotonic())
                return _original(called, *args, **kwargs)

            setattr(group, name, killing)

    return on_step
