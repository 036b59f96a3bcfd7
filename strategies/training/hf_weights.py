"""The tensors of a Hugging Face checkpoint directory, as views of its safetensors files mapped
into memory (copy-on-write): nothing is read until a tensor's bytes are used, and what is read
stays file pages (the page cache, shared by every rank on the host), not memory of the process.
A rank that copies only its own rows of each tensor into its shards (converting the dtype on the
way) reads only those rows and allocates nothing beside its shards.

A mixture-of-experts model of transformers 5 holds each layer's experts as 3-D parameters
(`mlp.experts.gate_up_proj`: experts x (gate rows, up rows) x hidden; `mlp.experts.down_proj`),
while checkpoints (and what `save_pretrained` writes) name each expert's matrices
(`mlp.experts.<e>.gate_proj.weight`, ...): `rows` of a fused name are stacked from those, expert
by expert (the layout of transformers' `qwen2_moe` conversion, which Qwen3-MoE shares).

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a
JSON header naming each tensor's dtype, shape and byte range within the data that follows."""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

from roll_device.errors import ConfigError

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

# a fused experts' parameter -> the per-expert matrices it concatenates (rows), in order
FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


class HfWeights(Mapping[str, torch.Tensor]):
    """Name -> tensor over the `*.safetensors` files of `model_path` (views of the mapped files)."""

    def __init__(self, model_path: str) -> None:
        files = sorted(Path(model_path).glob("*.safetensors"))
        if not files:
            raise ConfigError(
                f"model path '{model_path}' holds no *.safetensors weights (save the model with "
                "save_pretrained(..., safe_serialization=True))"
            )
        self._where: dict[str, tuple[mmap.mmap, int, dict]] = {}
        for path in files:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            for name, entry in header.items():
                if name != "__metadata__":
                    self._where[name] = (mapped, 8 + length, entry)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"HF checkpoint has no tensor '{name}'")
        mapped, data_start, entry = self._where[name]
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        if end == begin:
            return torch.empty(entry["shape"], dtype=dtype)
        flat = torch.frombuffer(
            mapped, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin
        )
        return flat.view(entry["shape"])

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of tensor `name` (its first dimension), a view: read when used; of a
        fused experts' parameter the checkpoint does not hold, experts [start, stop) stacked."""
        if name not in self._where and name.rpartition(".")[2] in FUSED_EXPERTS:
            return self._experts(name, start, stop)
        return self[name][start:stop]

    def _experts(self, name: str, start: int, stop: int) -> torch.Tensor:
        prefix, _, fused = name.rpartition(".")
        return torch.stack(
            [
                torch.cat([self[f"{prefix}.{expert}.{part}.weight"] for part in FUSED_EXPERTS[fused]])
                for expert in range(start, stop)
            ]
        )

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
