"""Which modules the run's configuration and plan reach from `roll-device run`, measured by
following the objects: a one-step main job runs in this process (embedded Ray, the CPU) under a
profiler that records every driver-side call receiving a `RunConfig` or a `RunPlan` as an argument
(the objects' own methods left out: a method reads its own object, it does not carry it on), and
which module made the call. Prints the modules reached, the call edges between modules, and the
modules entered from more than one other module (a "return into a module already visited").

python scripts/config_reach.py [OVERRIDES...]
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

Call = tuple[str, str, str]  # (callee module, function, caller module)


def reach(calls: list[Call]) -> dict:
    """The modules `calls` reach in first-call order, the caller -> callee edges between different
    modules, and each module entered from more than one module (with those callers)."""
    modules = list(dict.fromkeys(callee for callee, _, _ in calls))
    edges = list(dict.fromkeys((caller, callee) for callee, _, caller in calls if caller != callee))
    callers: dict[str, set[str]] = {}
    for caller, callee in edges:
        if caller in modules:
            callers.setdefault(callee, set()).add(caller)
    entered_twice = {module: sorted(found) for module, found in callers.items() if len(found) > 1}
    return {"modules": modules, "edges": edges, "entered_twice": entered_twice}


def record_calls(overrides: list[str]) -> list[Call]:
    """Run a one-step main job with `overrides` and record the calls that receive the config or plan."""
    from roll_device.commands.compose import compose
    from roll_device.commands.gate import read_config
    from roll_device.commands.run import run_checked
    from roll_device.pipeline.config import RunConfig
    from roll_device.pipeline.run_plan import RunPlan

    calls: list[Call] = []

    def profile(frame, event, _arg) -> None:
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith(("roll_device", "strategies")):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(n), RunConfig | RunPlan) for n in names if n != "self"):
            calls.append((module, code.co_name, frame.f_back.f_globals.get("__name__", "")))

    run_dir = Path(tempfile.mkdtemp()) / "run"
    config = read_config(compose(["max_steps=1", f"hydra.run.dir={run_dir}", *overrides], with_hydra=True))
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        run_checked(config, run_dir)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls


def main(overrides: list[str]) -> None:
    found = reach(record_calls(overrides))
    print(f"modules reached: {len(found['modules'])}")
    for module in found["modules"]:
        print(f"  {module}")
    print(
        "edges: " + ", ".join(f"{a.rsplit('.', 1)[-1]} -> {b.rsplit('.', 1)[-1]}" for a, b in found["edges"])
    )
    print(f"entered from more than one module: {found['entered_twice'] or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1:])
