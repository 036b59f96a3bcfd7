"""HfWeights reads a safetensors checkpoint as views of the mapped files: every tensor, and every
row range, equals what safetensors itself loads, whatever the dtype and shape."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from strategies.training.hf_weights import HfWeights


def test_views_equal_safetensors_own_load(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "embed.weight": torch.randn(37, 5, generator=g).to(torch.bfloat16),
        "layer.weight": torch.randn(6, 3, generator=g),
        "layer.bias": torch.randn(3, generator=g).half(),
        "ids": torch.arange(7, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "flags": torch.tensor([True, False, True]),
    }
    save_file(dict(list(tensors.items())[:4]), tmp_path / "model-00001-of-00002.safetensors")
    save_file(dict(list(tensors.items())[4:]), tmp_path / "model-00002-of-00002.safetensors")
    expected = {
        **load_file(tmp_path / "model-00001-of-00002.safetensors"),
        **load_file(tmp_path / "model-00002-of-00002.safetensors"),
    }
    weights = HfWeights(str(tmp_path))
    assert sorted(weights) == sorted(tensors)
    for name, tensor in expected.items():
        got = weights[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor), name
    assert torch.equal(weights.rows("embed.weight", 10, 29), tensors["embed.weight"][10:29])
    fp32 = torch.empty(19, 5)
    fp32.copy_(weights.rows("embed.weight", 10, 29))  # what the FSDP loader does: convert as it copies
    assert torch.equal(fp32, tensors["embed.weight"][10:29].float())
