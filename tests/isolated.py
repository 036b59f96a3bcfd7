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
        raise AssertionError(f"{target} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
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
