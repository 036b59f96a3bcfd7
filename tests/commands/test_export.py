"""`roll-device export`: a checkpoint of either trainer (2 gloo ranks) becomes a Hugging Face
directory that transformers loads, whose logprobs and greedy tokens equal the trainer's."""

from __future__ import annotations

import pytest
import torch

from roll_device.cli import main
from strategies.training.local_ranks import run_ranks
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
