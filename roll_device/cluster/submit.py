"""Send a command to an existing Ray cluster through the Ray Jobs API and follow it.

The job runs `python -m roll_device.cli <command> <overrides>` on the cluster's head with this
checkout as its working directory (Ray leaves `.git`, `.venv` and what `.gitignore`/`.rayignore`
name behind), streams its log here, and ends with the job's exit status. scripts/submit.sh is the same
submission with the plain `ray job submit` CLI.

That working directory is Ray's temporary copy of the checkout, so a submitted run writes its
outputs under `OUTPUTS_ENV` (default `~/roll-device/outputs` on the head, `JOB_OUTPUTS`), not beside
the copy, and its resume advice names `roll-device submit` with this address (`SUBMITTED_TO_ENV`).
A token-authenticated cluster (Ray's default for clusters it starts) gets this machine's token as
`ray.init` would send it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from roll_device.cluster.launcher import check_reachable
from roll_device.errors import ConfigError

TERMINAL_WAIT_S = 60.0
OUTPUTS_ENV = "ROLL_DEVICE_OUTPUTS"  # where runs put their directories (configs/config.yaml: hydra.run.dir)
JOB_OUTPUTS = "${HOME}/roll-device/outputs"  # a submitted job's default; Ray expands ${HOME} on the head
SUBMITTED_TO_ENV = "ROLL_DEVICE_SUBMITTED_TO"  # a submitted job's address, for its resume advice


def checkout_root() -> Path:
    """The roll-device checkout this code runs from (it holds roll_device/ and configs/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "configs").is_dir():
        raise ConfigError(
            f"{root} is not a roll-device checkout (no configs/ beside roll_device/): submit from a "
            "checkout (pip install -e .), since the job ships it as its working directory"
        )
    return root


def entrypoint(command: str, overrides: list[str]) -> str:
    return " ".join(["python", "-m", "roll_device.cli", command, *(shlex.quote(o) for o in overrides)])


def runtime_env(address: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The runtime env of a job sent to `address`: this checkout as working dir, unbuffered output,
    outputs outside the working dir's copy, plus `extra` (its env vars win)."""
    extra = dict(extra or {})
    env_vars = {
        "PYTHONUNBUFFERED": "1",
        OUTPUTS_ENV: JOB_OUTPUTS,
        SUBMITTED_TO_ENV: address,
        **(extra.pop("env_vars", None) or {}),
    }
    return {"working_dir": str(checkout_root()), **extra, "env_vars": env_vars}


def submit_job(
    address: str, command_line: str, job_runtime_env: dict[str, Any], no_wait: bool = False
) -> int:
    """Submit `command_line`; unless `no_wait`, stream its log and return its exit status."""
    from ray.job_submission import JobStatus

    if not address.startswith(("http://", "https://")):
        check_reachable(
            address, setting="--address"
        )  # a head's GCS address: Ray would retry it for 40 s, then trace back
    client = _client(address)
    job_id = client.submit_job(entrypoint=command_line, runtime_env=job_runtime_env)
    print(f"submitted job {job_id} to {address}: {command_line}", flush=True)
    if no_wait:
        token = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE") == "token" else ""  # Ray's CLI
        print(f"follow it with: {token}ray job logs --follow --address {address} {job_id}")
        return 0
    asyncio.run(_stream_logs(client, job_id))
    deadline = time.monotonic() + TERMINAL_WAIT_S
    while not (info := client.get_job_info(job_id)).status.is_terminal() and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"job {job_id} {info.status.value}{status_detail(info.message)}", flush=True)
    if info.status == JobStatus.SUCCEEDED:
        return 0
    return info.driver_exit_code or 1


def _client(address: str):
    """A Jobs API client of `address`, with this machine's Ray token when there is one."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray.exceptions import AuthenticationError, RpcError
    from ray.job_submission import JobSubmissionClient

    # What ray.init does when it joins a cluster: RAY_AUTH_MODE unset and a token in RAY_AUTH_TOKEN
    # or ~/.ray/auth_token: send it (the Jobs client alone sends none unless RAY_AUTH_MODE=token).
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        return JobSubmissionClient(address)
    except AuthenticationError as exc:
        raise ConfigError(
            f"the Ray cluster at {address} refused the submission: {str(exc).splitlines()[0]}: "
            "give this machine the head's token (`ray get-auth-token` on the head) in RAY_AUTH_TOKEN "
            "or ~/.ray/auth_token"
        ) from exc
    except (ConnectionError, RuntimeError, ValueError, RpcError) as exc:
        raise ConfigError(
            f"no Ray Jobs API at {address} ({exc}): give the dashboard address of a running cluster, "
            "e.g. --address http://<head>:8265"
        ) from exc


def status_detail(message: str | None) -> str:
    """The first line of a job's status message, without Ray's trailing pointer to the log tail
    (", last available logs (truncated to 20,000 chars):"): the log was streamed above."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    first = re.sub(r",?\s*last available logs.*$", "", first).rstrip(" :")
    return f": {first}" if first else ""


async def _stream_logs(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)
