"""The tensors of a Hugging Face checkpoint directory, read lazily from its safetensors files: one
tensor, or one row range of it, at a time, so that a rank never holds the whole model in host
memory while it fills its own shards."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from roll_device.errors import ConfigError


class HfWeights(Mapping[str, torch.Tensor]):
    """Name -> tensor over the `*.safetensors` files of `model_path` (read on access)."""

    def __init__(self, model_path: str) -> None:
        from safetensors import safe_open

        files = sorted(Path(model_path).glob("*.safetensors"))
        if not files:
            raise ConfigError(
                f"model path '{model_path}' holds no *.safetensors weights (save the model with "
                "save_pretrained(..., safe_serialization=True))"
            )
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}  # noqa: SIM118 (safe_open is no dict)

    def _handle(self, name: str):
        if name not in self._where:
            raise KeyError(f"HF checkpoint has no tensor '{name}'")
        return self._where[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of tensor `name` (its first dimension), read without the rest."""
        return self._handle(name).get_slice(name)[start:stop]

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
