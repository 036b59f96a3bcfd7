"""The `roll-device` console script as a user runs it: Hydra overrides, output directory, exit
status and messages."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from roll_device.pipeline.state import Checkpoints

SCRIPT = Path(sys.executable).with_name("roll-device")


def _cli(*args, home, timeout=600):
    env = {**os.environ, "ROLL_DEVICE_HOME": str(home)}
    return subprocess.run(
        [str(SCRIPT), *args], check=False, capture_output=True, text=True, env=env, timeout=timeout
    )


def test_the_main_job_learns_and_writes_into_the_hydra_run_dir(tmp_path):
    """The README's main job as a user starts it (embedded Ray, the tiny model made on first use),
    shortened to 12 steps."""
    run_dir = tmp_path / "run"
    proc = _cli("run", "max_steps=12", "save_every=6", f"hydra.run.dir={run_dir}", home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "tiny-qwen2" / "config.json").exists(), "the tiny model was made on first use"
    assert "max_steps=12" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(r["weights_version"] == r["step"] for r in records), "the rollout got each step's weights"
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout and trainer agree"
    assert all(r["updates"] == 1 and r["ratio_mean"] == pytest.approx(1.0, abs=1e-5) for r in records), (
        "GRPO's one update a step is on-policy"
    )
    assert all(r["importance_ratio_mean"] == 1.0 for r in records), "no correction of on-policy samples"
    assert all(r["kl"] >= 0 for r in records) and records[-1]["kl"] > 0
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    assert last > first + 0.15, f"mean reward did not rise: first steps {first:.3f}, last {last:.3f}"
    assert (run_dir / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "memory.png").read_bytes()[:4] == b"\x89PNG"
    for role, phase in (("actor_infer", "rollout"), ("actor_train", "update"), ("reward", "reward")):
        assert all(r[f"memory/{role}/{phase}/host_rss_mib"] > 0 for r in records), "memory per role and phase"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_12", "step_6"]
    out = proc.stdout
    assert "device plan:" in out and "actor_train" in out
    assert "step plan: grpo, 8 prompts x 8 samples = 64 sequences; 1 pass x 1 mini-batch" in out
    assert "setting up workers:   0%" in proc.stderr and "4/4" in proc.stderr, "set-up shows progress"
    assert "waiting for actor_infer (1), actor_train (1), reference (1), reward (1)" in proc.stderr
    assert "reference runs in actor_train's workers" in out
    assert out.strip().splitlines()[-1].startswith(f"run directory: {run_dir}")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "data.prompts_per_step=7", "roles.actor_infer.num_devices=2"],
            "does not split across 2 actor_infer",
        ),
        (["run", "roles.actor_infer.device=tpu"], "roles.actor_infer.device='tpu'"),
        (  # the simulated cluster's nodes are declared: a plan that cannot fit is refused before Ray
            ["run", "experiment=mixed_devices", "cluster=sim", "rollout=vllm"]
            + ["rollout.tensor_parallel_size=4", "roles.actor_infer.num_devices=4"],
            "engines of 4 cuda devices, but no node of this cluster has more than 2",
        ),
    ],
)
def test_bad_input_exits_2_with_the_reason(tmp_path, capsys, monkeypatch, args, message):
    """In this process (the console script's own exit status and stderr: the npu-sim case below)."""
    import ray

    from roll_device.cli import main

    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path))
    assert main([*args, f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not ray.is_initialized() and not (tmp_path / "run").exists(), "refused before Ray and the run"


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "tpu",
            "unknown device kind 'tpu': valid kinds are npu, cuda, rocm, cpu (ROLL_DEVICE also takes auto, npu-sim)",
        ),
        ("npu", "ROLL_DEVICE=npu but no usable Ascend NPU: install torch_npu"),
    ],
)
def test_bad_roll_device_is_refused_before_work(tmp_path, capsys, monkeypatch, kind, message):
    from roll_device.cli import main

    monkeypatch.setenv("ROLL_DEVICE", kind)
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path))
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "tiny-qwen2").exists(), "nothing was made"


def test_a_simulation_on_the_local_cluster_is_refused_by_the_console_script(tmp_path):
    """ROLL_DEVICE=npu-sim: a simulation on the local cluster would run every role on the CPU. In a
    process of its own (the simulation renames torch's device for the whole process), through the
    installed console script: exit 2, one line, no traceback, nothing made."""
    env = {**os.environ, "ROLL_DEVICE": "npu-sim", "ROLL_DEVICE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(SCRIPT), "run"], check=False, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        "roll-device run: error: ROLL_DEVICE=npu-sim simulates npu devices in this process only: on "
        "cluster=local every role would run on this machine's CPU; to simulate a run on NPU nodes, use "
        "the sim cluster: roll-device run experiment=mixed_devices cluster=sim"
    ) in proc.stderr
    assert not (tmp_path / "tiny-qwen2").exists(), "nothing was made"


def test_make_tiny_model(tmp_path, capsys):
    from roll_device.cli import main

    assert main(["make-tiny-model", str(tmp_path / "m"), "--layers", "1"]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["Qwen2ForCausalLM"]


def test_make_tiny_model_refuses_a_hidden_size_for_qwen_shapes(tmp_path):
    proc = _cli(
        "make-tiny-model", str(tmp_path / "m"), "--shapes", "qwen2.5-0.5b", "--hidden", "64", home=tmp_path
    )
    assert proc.returncode == 2 and "--hidden applies to the tiny shapes" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_cli_offers_every_qwen_shape_the_models_module_defines():
    from roll_device.commands.models import QWEN_SHAPES
    from roll_device.models import qwen_shaped

    assert QWEN_SHAPES == tuple(qwen_shaped.QWEN_SHAPES)
    config = qwen_shaped.qwen_shaped_config(num_layers=1, shapes="qwen2.5-1.5b")
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads) == (1536, 8960, 12)
    assert config.num_hidden_layers == 1 and config.vocab_size == 151936
    assert qwen_shaped.qwen_shaped_config().num_hidden_layers == 24, "0.5B's own layers by default"


def test_a_stretched_tokenizer_covers_the_vocabulary_without_adding_digits():
    from transformers import PreTrainedTokenizerFast

    from roll_device.models.tiny import CHARACTERS, build_tokenizer

    tokenizer: PreTrainedTokenizerFast = build_tokenizer(vocab_size=1000)
    vocab = tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(1000))
    assert tokenizer.encode("12+3") == build_tokenizer().encode("12+3"), "characters keep their ids"
    placeholders = tokenizer.decode(list(range(len(vocab) - 5, len(vocab))))
    assert placeholders and not any(c.isdigit() for c in placeholders)
    assert tokenizer.decode([vocab[c] for c in CHARACTERS]) == CHARACTERS


@pytest.mark.slow
def test_the_main_job_as_the_readme_runs_it(tmp_path):
    """`roll-device run` with no arguments: the default 30 steps raise the mean reward."""
    proc = subprocess.run(
        [str(SCRIPT), "run"],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "ROLL_DEVICE_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / proc.stdout.strip().splitlines()[-1].split()[2]  # relative to the run's cwd
    rewards = [
        json.loads(line)["reward_mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(rewards) == 30
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3


def test_hydra_flags_pass_through_run(capsys):
    from roll_device.cli import main

    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("roll-device run [overrides] [flags]") and "-m/--multirun" in out
    assert "trainer: fsdp, megatron" in out, "Hydra lists the config groups"
    assert main(["run", "--cfg", "job", "max_steps=7"]) == 0
    assert "max_steps: 7" in capsys.readouterr().out
    assert main(["run", "-c", "job", "--resolve", "trainer=megatron"]) == 0
    assert "tensor_parallel: 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cfg", "job", "foo=1"], "foo is not a key of the configuration"),
        (["-m", "max_steps=1,2", "foo=1,2"], "foo is not a key of the configuration"),
        (["-m", "rollout=hf,nope"], "rollout=nope: no such option; choose one of hf, vllm"),
        (
            ["-m", "max_steps=1,2", "trainer=fsdp,megatron", "trainer.tensor_parallel=2"],
            "trainer.tensor_parallel",
        ),
    ],
)
def test_a_key_or_option_no_job_has_is_one_line_with_a_hydra_flag(tmp_path, capsys, args, message):
    """As without a flag: exit 2 and one line, before Hydra prints or sweeps anything."""
    from roll_device.cli import main

    assert main(["run", *args, f"hydra.sweep.dir={tmp_path}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [captured.err.strip()] and message in captured.err
    assert captured.out == "" and not any(tmp_path.iterdir()), "nothing printed or run"


def test_multirun_refuses_each_bad_job_in_one_line(tmp_path, capsys):
    from roll_device.cli import main

    assert main(["run", "-m", "max_steps=abc,0", f"hydra.sweep.dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "roll-device run: error: max_steps='abc': input should be a valid integer (a run needs at least one step)",
        "roll-device run: error: max_steps=0: input should be greater than or equal to 1 (a run needs at least one step)",
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "nosuchkey=1"],
            "roll-device run: error: nosuchkey is not a key of the configuration",
        ),
        (
            ["run", "max_steps=abc"],
            "roll-device run: error: max_steps='abc': input should be a valid integer",
        ),
        (
            ["plan", "rollout=foo"],
            "roll-device plan: error: rollout=foo: no such option; choose one of hf, vllm",
        ),
        (["plan", "trainer.lr=abc"], "roll-device plan: error: trainer.lr='abc'"),
        (
            ["submit", "foo=1"],
            "roll-device submit: error: foo is not a key of the configuration",
        ),
        (["submit", "resume=maybe"], "roll-device submit: error: resume='maybe'"),
        (["doctor", "max_steps=["], "roll-device doctor: error: bad configuration or override: no viable"),
    ],
)
def test_one_exit_code_for_bad_input_on_every_subcommand(capsys, args, message):
    from roll_device.cli import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "args, setting",
    [
        (["make-tiny-model", "{blocked}"], "make-tiny-model's PATH"),
        (["run", "hydra.run.dir={blocked}", "max_steps=1"], "hydra.run.dir"),
        (["run", "model.tiny_dir={blocked}", "hydra.run.dir={tmp}/run", "max_steps=1"], "model.tiny_dir"),
    ],
)
def test_a_folder_that_cannot_be_made_is_refused_in_one_line_naming_its_setting(
    tmp_path, capsys, args, setting
):
    from roll_device.cli import main

    a_file = tmp_path / "a_file"
    a_file.write_text("a file where a folder would go")
    blocked = a_file / "folder"
    assert main([arg.format(blocked=blocked, tmp=tmp_path) for arg in args]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: cannot make the folder {blocked} for {setting} (NotADirectoryError: Not a directory)" in err
    )
    assert err.count("\n") == 1, err
    assert not (tmp_path / "run" / "config.yaml").exists(), "refused before the run writes its config"


def _started_run(args: list[str], home: Path, ready) -> subprocess.Popen:
    """`roll-device *args` started, returned once `ready()` holds (the run still going)."""
    env = {**os.environ, "ROLL_DEVICE_HOME": str(home)}
    proc = subprocess.Popen(
        [str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    return proc


def _resume_command(err: str) -> list[str]:
    return err.split("continue with: roll-device ")[1].split(" (and the same overrides)")[0].split()


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sent, code, said",
    [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
)
def test_ctrl_c_or_sigterm_checkpoints_and_says_how_to_resume(tmp_path, sent, code, said):
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler, `kill`, `ray job stop`) to the driver after step 1:
    exit 130 or 143 (128 + the signal's number, as a shell reports it), no traceback, and the
    printed command goes on to the last step with every step recorded once (from the finished
    step, checkpointed, unless the signal came during a policy update: then from the last
    checkpoint, here none)."""
    run_dir = tmp_path / "run"
    args = ["run", "max_steps=3", "save_every=0", "algorithm.kl_coef=0", f"hydra.run.dir={run_dir}"]
    metrics = run_dir / "metrics.jsonl"
    proc = _started_run(args, tmp_path, lambda: metrics.exists() and metrics.read_text().strip())
    proc.send_signal(sent)
    stopped = time.monotonic()
    _out, err = proc.communicate(timeout=300)
    print(f"{said}: the run ended {time.monotonic() - stopped:.1f}s later")  # for docs, not asserted
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and f"roll-device run: error: {said}; the run stopped after step" in err
    again = _resume_command(err)
    kept = "resume=true" in again
    assert kept == (run_dir / "checkpoints" / "latest").exists(), "the resume command follows what was kept"
    print(f"{said}: the finished step was {'checkpointed' if kept else 'in a policy update: not kept'}")
    done = _cli(*again, *args[1:-1], home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(run_dir) == [1, 2, 3]


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_run_stops_names_the_last_checkpoint(tmp_path):
    """Two Ctrl-C 0.3 s apart once a step is checkpointed: the second lands while the run shuts
    down, and the message still names the last checkpoint and `resume=true`. The same command
    without it is refused (it would overwrite the checkpoints); the advised one finishes the run."""
    run_dir = tmp_path / "run"
    args = ["run", "max_steps=6", "save_every=1", "algorithm.kl_coef=0", f"hydra.run.dir={run_dir}"]
    proc = _started_run(args, tmp_path, (run_dir / "checkpoints" / "latest").exists)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "before the first step" not in err, err[-3000:]
    path, state = Checkpoints(run_dir).latest()
    assert (
        f"the last checkpoint is step {state.step} in {path}; continue with: roll-device run resume=true"
        in err
    )
    refused = _cli(*args, home=tmp_path)
    assert refused.returncode == 2 and "holds checkpoints" in refused.stderr, refused.stderr[-3000:]
    done = _cli(*_resume_command(err), *args[1:-1], home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(run_dir) == list(range(1, 7))


def _title(process) -> str:
    """A process's title (`ray::TrainWorker.train` for a Ray worker in a call), "" once gone."""
    try:
        return process.cmdline()[0]
    except (psutil.Error, IndexError):
        return ""


def _kill_in(proc: subprocess.Popen, title: str) -> None:
    """SIGKILL the first process under `proc` (the driver, its embedded Ray, the workers) whose
    title is `title`, as soon as one has it."""
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        found = [p for p in psutil.Process(proc.pid).children(recursive=True) if _title(p) == title]
        if found:
            found[0].send_signal(signal.SIGKILL)
            return
        time.sleep(0.01)


@pytest.mark.slow  # by default: test_worker_failures (one line, no Ray paragraph), test_errors (no c10d dumps)
def test_a_killed_trainer_is_one_line_on_the_terminal(tmp_path):
    """`kill -9` of the trainer's process in a weight sync, with overlap (`algorithm.max_staleness=1`:
    the sender waits there for the rollout in flight): one error line naming the role, the rank, the
    cause in our words and the worker's log, which holds Ray's report. Neither Ray's paragraph about
    the dead worker nor C++ stack dumps of the driver's abort of the dead trainer's store reach the
    terminal."""
    run_dir = tmp_path / "run"
    args = ["run", "max_steps=6", "save_every=0", "algorithm.max_staleness=1", f"hydra.run.dir={run_dir}"]
    metrics = run_dir / "metrics.jsonl"
    proc = _started_run(args, tmp_path, lambda: metrics.exists() and metrics.read_text().strip())
    _kill_in(proc, "ray::TrainWorker.send_weights")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    log = run_dir / "logs" / "actor_train_0.log"
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(
        "roll-device run: error: a worker of role 'actor_train' (rank 0) died: the process was killed "
        f"(SIGKILL: `kill -9` or the out-of-memory killer) or crashed; its log: {log}; the run stopped"
    ), err[-3000:]
    for noise in ("frame #", "Exception raised from", "[c10d]", "A worker died", "Worker exit", "Traceback"):
        assert noise not in out + err, (noise, out + err)
    assert "Worker exit type" in log.read_text(), "Ray's report is in the worker's log"


def test_ctrl_c_outside_a_run_ends_without_a_traceback(capsys, monkeypatch):
    import roll_device.commands.plan
    from roll_device.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(roll_device.commands.plan, "load_config", interrupted)
    assert main(["plan"]) == 130
    assert capsys.readouterr().err == "roll-device plan: interrupted (Ctrl-C)\n"
