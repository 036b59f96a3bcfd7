"""Submission through the Ray Jobs API to a real Ray head on this machine (own ports, its own temp
dir, torn down after): `roll-device submit` and scripts/submit.sh send a job, stream its log and
return its exit status."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_device.cli import main
from roll_device.cluster.submit import JOB_OUTPUTS, OUTPUTS_ENV, SUBMITTED_TO_ENV, runtime_env, status_detail
from tests.isolated import isolated_env

ROOT = Path(__file__).resolve().parents[2]


TOKEN = "0123456789abcdef0123456789abcdef"  # the head's Ray token (any hex string of 32)


@pytest.fixture(scope="module")
def head():
    """A head with the Jobs API and token authentication (Ray's default for clusters it starts), in
    a process of its own (tests/ray_head.py): the token mode is set per process and cached."""
    head_only = [
        "cluster=sim",
        "cluster.include_dashboard=true",
        "cluster.head.num_cpus=2",
        "cluster.nodes=[]",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_head", *head_only],
        cwd=ROOT,
        env=isolated_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    process.stdout.readline()  # the GCS address
    dashboard_url = process.stdout.readline().strip()
    assert dashboard_url.startswith("http://"), "the head did not start: its output is above"
    yield dashboard_url
    process.stdin.close()
    process.wait(timeout=120)


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`args` with this machine's environment less its Ray settings, plus `env`."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS")
    }
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, **(env or {})},
    )


def _submit(head, *args: str, token: str = TOKEN) -> subprocess.Popen:
    """`roll-device submit` of `args` to `head`, started with `token` in RAY_AUTH_TOKEN and
    RAY_AUTH_MODE unset (so the submission turns token mode on, as ray.init does)."""
    submit = [sys.executable, "-m", "roll_device.cli", "submit", "--address", head]
    return start(*submit, *args, env={"RAY_AUTH_TOKEN": token})


def _finished(running: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str, str]]:
    done = {name: proc.communicate(timeout=300) for name, proc in running.items()}
    return {name: (running[name].returncode, out, err) for name, (out, err) in done.items()}


@pytest.fixture(scope="module")
def jobs(head):
    """Two submissions at once (each job takes a while to set up): exit status, stdout, stderr."""
    return _finished(
        {
            "fits": _submit(head, "--command", "plan", "roles.reward.num_devices=2"),
            "no_npu": _submit(head, "--command", "plan", "roles.actor_train.device=npu"),
            # refused by the gate on the head once it has named the run's directory
            "resumed": _submit(head, "resume=true"),
        }
    )


@pytest.fixture(scope="module")
def script_job(head):
    """The same job through scripts/submit.sh (the `ray` CLI): exit status, stdout, stderr."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the `ray` CLI
    env = {"RAY_ADDRESS": head, "PATH": path, "RAY_AUTH_TOKEN": TOKEN}
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


def test_a_submitted_run_keeps_its_outputs_on_the_head_outside_rays_copy_of_the_checkout(jobs):
    status, out, err = jobs["resumed"]
    assert status == 2, out + err
    outputs = f"{Path.home()}/roll-device/outputs/"  # the head is this machine, with its HOME
    assert f"resume=True but {outputs}" in out, "the run's folder is named absolute, under ~/roll-device"


def test_a_submission_without_the_heads_token_is_refused_in_one_line(head):
    status, out, err = _finished({"wrong": _submit(head, "--command", "plan", token="f" * 32)})["wrong"]
    assert status == 2, out + err
    assert err == (
        f"roll-device submit: error: the Ray cluster at {head} refused the submission: Authentication "
        "failed: Forbidden: Invalid authentication token: give this machine the head's token "
        "(`ray get-auth-token` on the head) in RAY_AUTH_TOKEN or ~/.ray/auth_token\n"
    )


def test_a_jobs_environment_sends_outputs_out_of_the_copy_and_names_the_address():
    env = runtime_env("http://head:8265", {"env_vars": {"X": "1"}, "pip": ["a"]})
    assert env["env_vars"] == {
        "PYTHONUNBUFFERED": "1",
        OUTPUTS_ENV: JOB_OUTPUTS,
        SUBMITTED_TO_ENV: "http://head:8265",
        "X": "1",
    }
    assert env["pip"] == ["a"] and env["working_dir"] == str(ROOT)
    mine = runtime_env("http://head:8265", {"env_vars": {OUTPUTS_ENV: "/shared/runs"}})
    assert mine["env_vars"][OUTPUTS_ENV] == "/shared/runs", "cluster.runtime_env's own wins"


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
