"""A model whose head is tied to its embedding (as Qwen2.5-0.5B's is) crosses every end of a weight
sync under the embedding's name alone: the FSDP2 trainer (2 gloo ranks) exports it once, the HF
and vLLM engines load it and keep the head tied (their hashes equal the export's), and
`roll-device export` writes its checkpoint as a model that transformers loads with the head tied.
(The Megatron trainer's side, over two pipeline stages: tests/strategies/training/test_megatron.py.)"""

from __future__ import annotations

import pytest
import torch

from roll_device.cli import main
from roll_device.comm import weights_hash
from strategies.tied_weights import tied_aliases
from strategies.training.local_ranks import run_ranks
from tests.strategies.inference.conftest import start

EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def tied_model_path(session_home) -> str:
    from roll_device.models.tiny import make_tiny_model

    return str(make_tiny_model(session_home / "tiny-qwen2-tied", tied=True))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tied_model_path):
    """The FSDP2 trainer's checkpoint folder and export after one step on 2 ranks."""
    checkpoint = tmp_path_factory.mktemp("tied") / "checkpoints" / "step_1" / "policy"
    rank0 = run_ranks(
        "tests.commands.export_checks:saved_after_a_step", 2, tied_model_path, str(checkpoint), "fsdp", {}
    )[0]
    return checkpoint, {name: torch.from_numpy(array) for name, array in rank0["weights"].items()}


def plain(model_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)


def test_the_alias_is_the_head_of_a_tied_model_only(tied_model_path, tiny_model_path):
    assert tied_aliases(plain(tied_model_path)) == {HEAD}
    assert tied_aliases(plain(tiny_model_path)) == frozenset()


def test_the_trainer_exports_the_tied_head_once_as_the_embedding(trained, tied_model_path):
    _, weights = trained
    assert sorted(weights) == sorted(set(plain(tied_model_path).state_dict()) - {HEAD})
    untrained = plain(tied_model_path).model.embed_tokens.weight
    assert (weights[EMBEDDING] - untrained).abs().max().item() > 1e-3  # the step moved it


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_an_engine_loads_the_embedding_into_its_tied_head(trained, tied_model_path, engine):
    _, weights = trained
    changes = {"max_num_seqs": 4, "kv_cache_bytes": 2**25, "dtype": "float32"} if engine == "vllm" else {}
    strategy = start(engine, tied_model_path, update_bucket_bytes=65536, **changes)
    try:
        before = strategy.weights_hash()
        strategy.update_weights(weights.items())
        assert strategy.weights_hash() == weights_hash(weights.items()) != before
        if engine == "hf":  # the head is the loaded embedding, not a stale copy
            assert torch.equal(strategy.model.lm_head.weight.detach(), weights[EMBEDDING])
    finally:
        strategy.shutdown()


def test_the_export_command_writes_a_tied_model(trained, tied_model_path, tmp_path):
    """An FSDP2 checkpoint stores the head under both names (a Megatron one the embedding alone:
    tests/strategies/training/test_megatron.py, over two pipeline stages)."""
    checkpoint, weights = trained
    assert main(["export", str(checkpoint), str(tmp_path / "hf"), "--model", tied_model_path]) == 0
    exported = plain(str(tmp_path / "hf"))
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    assert torch.equal(exported.model.embed_tokens.weight.detach(), weights[EMBEDDING])
