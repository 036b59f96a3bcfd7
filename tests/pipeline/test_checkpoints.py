"""Resume checks the checkpoint before any worker starts: a damaged or partial latest checkpoint is
named with the file at fault, the newest complete one is offered (and taken with
`resume=latest_valid`), and nothing in the run directory is written before that choice."""

import json

import pytest
import ray

from roll_device.commands.run import run_checked
from roll_device.errors import ConfigError
from roll_device.pipeline.state import Checkpoints, PipelineState
from tests.configs import run_config

# The files a checkpoint of the FSDP trainer holds (DCP shards and metadata, the optimizer state).
POLICY_FILES = {"policy/.metadata": 400, "policy/__0_0.distcp": 4096, "policy/trainer_state.pt": 300}


def _commit(checkpoints: Checkpoints, step: int) -> None:
    staging = checkpoints.staging_dir(step)
    for name, size in POLICY_FILES.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(bytes([step]) * size)
    checkpoints.commit(staging, PipelineState(step=step, data_position=8 * step, sampling_seed=step))


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with complete checkpoints of steps 2 and 4 (latest: 4) and metrics."""
    checkpoints = Checkpoints(tmp_path / "run")
    _commit(checkpoints, 2)
    _commit(checkpoints, 4)
    (tmp_path / "run" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s}) + "\n" for s in range(1, 6))
    )
    return tmp_path / "run"


def _snapshot(folder):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: _truncate(d / "pipeline.json"), "pipeline.json is unreadable (JSONDecodeError"),
        (lambda d: _truncate(d / "policy/.metadata"), "policy/.metadata has 200 bytes, 400 were written"),
        (
            lambda d: _truncate(d / "policy/__0_0.distcp"),
            "policy/__0_0.distcp has 2048 bytes, 4096 were written",
        ),
        (
            lambda d: _truncate(d / "policy/trainer_state.pt"),
            "policy/trainer_state.pt has 150 bytes, 300 were written",
        ),
        (
            lambda d: (d / "policy/trainer_state.pt").write_bytes(b"\0" * 300),
            "trainer_state.pt changed since it was written",
        ),
        (lambda d: (d / "policy/__0_0.distcp").unlink(), "policy/__0_0.distcp is missing"),
        (lambda d: _truncate(d / "manifest.json"), "manifest.json is unreadable"),
        (
            lambda d: (d / "pipeline.json").write_text('{"step": 4}'),
            "pipeline.json is unreadable (ValueError",
        ),
    ],
)
def test_a_damaged_latest_checkpoint_is_named_and_the_previous_one_offered(run_dir, damage, message):
    damage(run_dir / "checkpoints" / "step_4")
    with pytest.raises(ConfigError) as err:
        Checkpoints(run_dir).resume_point(True)
    text = str(err.value)
    assert (
        f"the latest checkpoint {run_dir / 'checkpoints' / 'step_4'} is damaged" in text and message in text
    )
    assert "resume=latest_valid continues from step_2, the newest complete checkpoint" in text
    path, state = Checkpoints(run_dir).resume_point("latest_valid")
    assert path.name == "step_2" and state == PipelineState(step=2, data_position=16, sampling_seed=2)


def test_a_complete_latest_checkpoint_is_taken(run_dir):
    path, state = Checkpoints(run_dir).resume_point(True)
    assert path.name == "step_4" and state.step == 4


def test_latest_naming_a_missing_folder_with_nothing_complete_before_it(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    _commit(checkpoints, 2)
    (checkpoints.root / "step_2" / "pipeline.json").unlink()
    with pytest.raises(ConfigError, match="no earlier complete checkpoint exists: start a new run"):
        checkpoints.resume_point("latest_valid")


def test_run_refuses_a_damaged_checkpoint_before_ray_and_writes_nothing(run_dir, tmp_path):
    _truncate(run_dir / "checkpoints" / "step_4" / "policy" / "__0_0.distcp")
    before = _snapshot(run_dir)
    cfg = run_config("resume=true")
    with pytest.raises(ConfigError, match="policy/__0_0.distcp has 2048 bytes"):
        run_checked(cfg, run_dir)
    assert not ray.is_initialized(), "no cluster was started"
    assert _snapshot(run_dir) == before, "nothing in the run directory was written"
    assert not (tmp_path / "tiny").exists(), "no model was made"


def test_cli_refuses_before_hydra_writes_into_the_run_directory(run_dir, capsys):
    from roll_device.cli import main

    (run_dir / "checkpoints" / "step_4" / "pipeline.json").write_text("{")
    before = _snapshot(run_dir)
    assert main(["run", "resume=true", f"hydra.run.dir={run_dir}"]) == 2
    assert "pipeline.json is unreadable" in capsys.readouterr().err
    assert _snapshot(run_dir) == before and not (run_dir / ".hydra").exists()


def test_a_new_run_refuses_a_folder_with_checkpoints_before_ray_and_writes_nothing(run_dir, tmp_path):
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError) as refused:
        run_checked(run_config(), run_dir)
    assert str(refused.value) == (
        f"hydra.run.dir={run_dir} holds checkpoints (the newest: step_4) that a new run would overwrite: "
        "continue them with resume=true, start in another folder with hydra.run.dir=<dir>, or replace "
        "them with overwrite=true"
    )
    assert not ray.is_initialized(), "no cluster was started"
    assert _snapshot(run_dir) == before, "nothing in the run directory was written"


def test_the_cli_refuses_a_new_run_over_checkpoints_in_one_line(run_dir, capsys):
    from roll_device.cli import main

    assert main(["run", f"hydra.run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"roll-device run: error: hydra.run.dir={run_dir} holds checkpoints")
        and err.count("\n") == 1
    )
    assert not (run_dir / ".hydra").exists()


def test_overwrite_and_resume_together_are_refused():
    with pytest.raises(
        ConfigError, match="resume=True continues the checkpoints that overwrite=true would replace"
    ):
        run_config("resume=true", "overwrite=true")
