"""Submission through the Ray Jobs API to a real Ray head on this machine (own ports, its own temp
dir, torn down after): `roll-device submit` and scripts/submit.sh send a job, stream its log and
return its exit status."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_device.cli import main
from roll_device.cluster import start_cluster
from roll_device.cluster.submit import status_detail
from tests.configs import cluster_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head():
    head_only = [
        "cluster=sim",
        "cluster.include_dashboard=true",
        "cluster.head.num_cpus=2",
        "cluster.nodes=[]",
    ]
    handle = start_cluster(cluster_settings(*head_only))
    yield handle
    handle.shutdown()


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _submit(head, *overrides: str) -> subprocess.Popen:
    """`roll-device submit --command plan` of `overrides` to `head`, started."""
    address = ["--address", head.dashboard_url]
    return start(sys.executable, "-m", "roll_device.cli", "submit", *address, "--command", "plan", *overrides)


def _finished(running: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str, str]]:
    done = {name: proc.communicate(timeout=300) for name, proc in running.items()}
    return {name: (running[name].returncode, out, err) for name, (out, err) in done.items()}


@pytest.fixture(scope="module")
def jobs(head):
    """Two submissions at once (each job takes a while to set up): exit status, stdout, stderr."""
    return _finished(
        {
            "fits": _submit(head, "roles.reward.num_devices=2"),
            "no_npu": _submit(head, "roles.actor_train.device=npu"),
        }
    )


@pytest.fixture(scope="module")
def script_job(head):
    """The same job through scripts/submit.sh (the `ray` CLI): exit status, stdout, stderr."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the `ray` CLI
    env = {"RAY_ADDRESS": head.dashboard_url, "PATH": path}
    return _finished({"script": start("scripts/submit.sh", "plan", "roles.reward.num_devices=3", env=env)})


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_submitted_job_succeeds_and_its_log_streams_back(jobs):
    status, out, err = jobs["fits"]
    assert status == 0, out + err
    assert "submitted job raysubmit_" in out and "SUCCEEDED" in out
    assert ["reward", "cpu", "2", "head", "0,1", "2", "1", "-", "no"] in rows(out.split("device plan:")[1])


def test_failed_job_returns_its_exit_status_and_message(jobs):
    status, out, err = jobs["no_npu"]
    assert status == 2, out + err
    assert "role 'actor_train' wants 1 npu device(s), but no node of this cluster has npu devices" in out
    assert "FAILED" in out


@pytest.mark.slow  # the same job as test_submitted_job_succeeds_and_its_log_streams_back, through the Ray CLI
def test_script_submits_the_same_job_with_the_ray_cli(script_job):
    status, out, err = script_job["script"]
    assert status == 0, out + err
    assert ["reward", "cpu", "3", "head", "0,1,2", "3", "1", "-", "no"] in rows(out)


def test_submit_refuses_before_sending_anything(capsys, monkeypatch):
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    assert main(["submit", "--command", "plan"]) == 2
    assert "submit needs the cluster's dashboard address" in capsys.readouterr().err
    assert main(["submit", "--address", "127.0.0.1:9"]) == 2, "a GCS address where nothing answers"
    assert "--address=127.0.0.1:9: nothing answers at 127.0.0.1:9" in capsys.readouterr().err
    assert main(["submit", "--address", "http://127.0.0.1:9", "cluster=sim"]) == 2
    assert "cluster=sim starts its own cluster on this machine" in capsys.readouterr().err
    assert main(["submit", "--address", "http://127.0.0.1:9", "roles.reward.device=abacus"]) == 2
    assert "roles.reward.device='abacus'" in capsys.readouterr().err
    assert main(["submit", "--address", "http://127.0.0.1:9", "--command", "plan"]) == 2
    assert "no Ray Jobs API at http://127.0.0.1:9" in capsys.readouterr().err


@pytest.mark.parametrize(
    "message, detail",
    [
        (
            "Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\nx\n",
            ": Job entrypoint command failed with exit code 2",
        ),
        ("Job finished successfully.", ": Job finished successfully."),
        (None, ""),
    ],
)
def test_final_status_line_ends_without_a_dangling_log_pointer(message, detail):
    assert status_detail(message) == detail


def test_files_and_modules_on_the_cluster_are_left_to_the_job(capsys, monkeypatch):
    """`plan` and `submit` read the overrides here but check the data file and the reward's module
    where the job runs: a path or a module (shipped through cluster.runtime_env) that this
    machine lacks is not refused here."""
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    cluster_side = ["data.path=/on/the/cluster.jsonl", "reward.function=shipped_module.score"]
    assert main(["submit", "--address", "http://127.0.0.1:9", *cluster_side]) == 2
    err = capsys.readouterr().err
    assert "no Ray Jobs API at http://127.0.0.1:9" in err, "refused only for the absent cluster"
    assert "does not exist" not in err and "shipped_module" not in err
