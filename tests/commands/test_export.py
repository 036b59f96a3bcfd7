"""`roll-device export`: a checkpoint of either trainer (2 gloo ranks) becomes a Hugging Face
directory that transformers loads, whose logprobs and greedy tokens equal the trainer's."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll_device.cli import main
from strategies.training.local_ranks import run_ranks
from tests.commands.export_checks import committed_run
from tests.isolated import run_isolated
from tests.strategies.training.data import make_batch
from tests.strategies.training.fsdp_checks import plain_logprobs

PROMPT = torch.tensor([[5, 9, 12, 7, 3, 20]])


def greedy(model) -> list[int]:
    return model.generate(PROMPT, max_new_tokens=8, do_sample=False, pad_token_id=0)[0].tolist()


def exported_matches_the_trainer(tmp_path, model_path: str, name: str, layout: dict):
    """Export a checkpoint written after one step; the exported model (returned) must compute
    the trainer's logprobs and greedy tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    checkpoint = tmp_path / "checkpoints" / "step_1" / "policy"
    trained = run_ranks(
        "tests.commands.export_checks:saved_after_a_step", 2, model_path, str(checkpoint), name, layout
    )[0]
    trained = {"logprobs": torch.from_numpy(trained["logprobs"]), "weights": trained["weights"]}
    out = tmp_path / "hf"
    assert main(["export", str(checkpoint), str(out), "--model", model_path]) == 0
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    assert (
        AutoTokenizer.from_pretrained(out).vocab_size == AutoTokenizer.from_pretrained(model_path).vocab_size
    )
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    batch = make_batch(seed=51)
    assert (plain_logprobs(exported, batch) - trained["logprobs"]).abs().max().item() < 1e-5
    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    reference.load_state_dict({name: torch.from_numpy(array) for name, array in trained["weights"].items()})
    assert greedy(exported) == greedy(reference)
    untrained = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    assert (plain_logprobs(untrained, batch) - trained["logprobs"]).abs().max().item() > 1e-3  # it moved
    return out, exported


@pytest.mark.slow  # about 40 s: the default suite's budget goes to tests/strategies/training/test_scale.py
def test_fsdp_checkpoint_exports_to_a_model_transformers_loads(tmp_path, tiny_model_path):
    exported_matches_the_trainer(tmp_path, tiny_model_path, "fsdp", {})


@pytest.mark.slow
def test_megatron_tensor_parallel_checkpoint_exports_to_a_model_transformers_loads(tmp_path, tiny_model_path):
    exported_matches_the_trainer(tmp_path, tiny_model_path, "megatron", {"tensor_parallel": 2})


@pytest.mark.slow
def test_vllm_loads_the_export_with_the_trainers_greedy_tokens(tmp_path, tiny_model_path):
    out, exported = exported_matches_the_trainer(tmp_path, tiny_model_path, "fsdp", {})
    prompt = ",".join(str(t) for t in PROMPT[0].tolist())
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = run_isolated("tests.commands.export_checks:vllm_greedy", str(out), prompt, env=env, timeout=600)
    assert PROMPT[0].tolist() + result["tokens"] == greedy(exported)


def test_a_checkpoint_outside_a_run_without_model_is_refused(tmp_path, capsys):
    folder = tmp_path / "policy"
    folder.mkdir()
    assert main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roll-device export: error: export: the checkpoint is not inside a run directory")
    assert err.count("\n") == 1


def test_a_folder_that_is_no_checkpoint_is_refused(tmp_path, tiny_model_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out"), "--model", tiny_model_path]) == 2
    err = capsys.readouterr().err
    assert "is no trainer checkpoint (no .metadata)" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_path):
    """A run directory with committed checkpoints of steps 1 and 2 (tests copy it to damage it)."""
    return committed_run(tmp_path_factory.mktemp("export") / "run", tiny_model_path, steps=2)


def damaged_copy(run_dir: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of `run_dir` whose latest checkpoint has 64 bytes flipped in a .distcp file, and
    that file's path inside the checkpoint."""
    copy = shutil.copytree(run_dir, tmp_path / "run")
    distcp = next((copy / "checkpoints" / "step_2" / "policy").glob("*.distcp"))
    data = bytearray(distcp.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(
        b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 64]
    )
    distcp.write_bytes(bytes(data))
    return copy, str(distcp.relative_to(copy / "checkpoints" / "step_2"))


def refusal(capsys, *args) -> str:
    """The one line `roll-device export ARGS` prints as it exits with status 2."""
    assert main(["export", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roll-device export: error: ") and err.count("\n") == 1, err
    return err


def test_a_run_directory_exports_its_latest_checkpoint(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).state_dict()
    step_2 = committed_weights(run_dir / "checkpoints" / "step_2")
    assert exported.keys() == step_2.keys()
    assert all(torch.equal(exported[name], step_2[name]) for name in step_2)


def committed_weights(step: Path) -> dict[str, torch.Tensor]:
    from strategies.training.checkpoint_export import hf_state_dict

    return hf_state_dict(str(step / "policy"), "unused")


def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_intact_one(run_dir, tmp_path, capsys):
    damaged, name = damaged_copy(run_dir, tmp_path)
    step_1, step_2 = damaged / "checkpoints" / "step_1", damaged / "checkpoints" / "step_2"
    for source in (damaged, step_2, step_2 / "policy"):
        err = refusal(capsys, source, tmp_path / "out")
        assert f"checkpoint {step_2} is damaged: {name} changed since it was written" in err
        assert f"roll-device export {step_1} " in err  # the newest complete one, and how to export it
    assert main(["export", str(step_1), str(tmp_path / "out")]) == 0  # the advice works


def test_a_missing_source_is_named(tmp_path, capsys):
    nowhere = tmp_path / "no" / "such"
    assert f"{nowhere} does not exist" in refusal(capsys, nowhere, tmp_path / "out")


def test_a_missing_model_is_named(run_dir, tmp_path, capsys):
    nowhere = tmp_path / "nowhere"
    assert f"--model={nowhere} does not exist" in refusal(
        capsys, run_dir, tmp_path / "out", "--model", nowhere
    )


def test_a_non_empty_output_folder_is_refused_unless_overwrite(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier export")
    assert "--overwrite" in refusal(capsys, run_dir, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert main(["export", str(run_dir), str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file()


def test_exported_files_get_the_umasks_permissions(run_dir, tmp_path):
    umask = os.umask(0o027)
    try:
        assert main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
    assert modes["model.safetensors"] == 0o640 and set(modes.values()) == {0o640}, modes


REFUSE_IN_A_FRESH_PROCESS = """
import json, sys
from roll_device.cli import main
print(json.dumps([[main(args), "torch" in sys.modules] for args in json.loads(sys.argv[1])]))
"""


def test_arguments_are_refused_before_torch_loads(run_dir, tmp_path):
    damaged, _ = damaged_copy(run_dir, tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    refused = [
        ["export", str(tmp_path / "nowhere"), str(tmp_path / "out")],
        ["export", str(run_dir), str(tmp_path / "out"), "--model", str(tmp_path / "nowhere")],
        ["export", str(run_dir), str(tmp_path / "full")],
        ["export", str(damaged), str(tmp_path / "out")],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", REFUSE_IN_A_FRESH_PROCESS, json.dumps(refused)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert json.loads(proc.stdout) == [[2, False]] * len(refused), proc.stderr


def test_merge_of_a_checkpoint_without_an_adapter_is_refused(run_dir, tmp_path, capsys):
    assert "holds no LoRA adapter: leave --merge out" in refusal(capsys, run_dir, tmp_path / "out", "--merge")


def test_a_ppo_runs_critic_folder_is_named_as_such(tmp_path, capsys):
    """It was refused as a checkpoint outside a run directory, which it is not."""
    step = tmp_path / "run" / "checkpoints" / "step_2"
    for folder in ("policy", "critic"):
        (step / folder).mkdir(parents=True)
    said = refusal(capsys, step / "critic", tmp_path / "out")
    assert f"{step / 'critic'} is PPO's critic, a value model; export writes the policy: pass {step}" in said
