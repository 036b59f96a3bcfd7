"""Run a check in a fresh Python process and return the JSON it prints on its last line.

For tests that change process-wide state that cannot be undone (the simulated NPU renames
PrivateUse1 once per process) or that need their own environment variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def isolated_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child interpreter: the repository first on PYTHONPATH
    (the tests' modules import), then `env`."""
    search_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": search_path, **(env or {})}


def run_isolated(target: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> dict:
    """Call `module:function(*args)` in a new interpreter; the function returns a JSON-able dict."""
    module, function = target.split(":")
    code = f"import json, sys\nfrom {module} import {function} as f\nprint(json.dumps(f(*sys.argv[1:])))\n"
    return _last_json_line(code, args, env, timeout, target)


# Each check's result, or its traceback: one check that raises leaves the others' results readable.
_MANY = """\
import importlib, json, sys, traceback
results = {}
for target in sys.argv[1:]:
    print(f"running {target}", file=sys.stderr, flush=True)  # names the check if the process dies
    module, function = target.split(":")
    try:
        results[target] = {"result": getattr(importlib.import_module(module), function)()}
    except Exception:
        results[target] = {"traceback": traceback.format_exc()}
print(json.dumps(results))
"""


class IsolatedChecks:
    """Several `module:function` checks run in order in one new interpreter, so that they share
    its start (the simulated NPU's included); `checks[target]` is one's dict, or fails with that
    check's own traceback. For checks that leave no state the next one reads."""

    def __init__(self, targets: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> None:
        self.results = _last_json_line(_MANY, targets, env, timeout, ", ".join(targets))

    def __getitem__(self, target: str) -> dict:
        outcome = self.results[target]
        if "traceback" in outcome:
            raise AssertionError(f"{target} failed:\n{outcome['traceback'][-4000:]}")
        return outcome["result"]


def checks_in_one_process(module: str, names: list[str]):
    """A module-scoped fixture `shared`: `shared(name)` is check `module:name`'s dict, the checks
    `names` run together by `IsolatedChecks`, in that order."""

    @pytest.fixture(scope="module", name="shared")
    def shared():
        checks = IsolatedChecks([f"{module}:{name}" for name in names], timeout=600)
        return lambda name: checks[f"{module}:{name}"]

    return shared


def _last_json_line(code: str, args, env: dict[str, str] | None, timeout: int, what: str) -> dict:
    """Run `code` in a new interpreter and read the JSON of its last line of output."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        cwd=ROOT,
        env=isolated_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def simulated_npu():
    """This process's platform, made the simulated NPU (`ROLL_DEVICE=npu-sim`): for checks that
    `run_isolated` runs, since the simulation renames PrivateUse1 once per process."""
    os.environ["ROLL_DEVICE"] = "npu-sim"
    import roll_device as rd

    return rd.current_platform()


def error_of(call) -> str:
    """`call()`'s exception as "Type: message" (for checks that report errors as JSON), or ""."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (the tests assert on the type name and message)
        return f"{type(exc).__name__}: {exc}"
    return ""
