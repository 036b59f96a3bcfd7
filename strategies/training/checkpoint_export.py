"""The Hugging Face tensors of a trainer checkpoint, read in one process without a process group:
either trainer's torch.distributed.checkpoint folder (what `save_checkpoint` writes) becomes the
full HF state dict of the model it trained.

- FSDP: the model's entries are stored whole under `model.<HF name>`;
- Megatron: each (pipeline stage, tensor-parallel rank)'s shard under `model.pp<S>.tp<T>.<name>`
  (a MoE layer's experts under their global index and expert-tensor-parallel rank, whatever the
  expert-parallel size), merged back with the conversion table of megatron_weights.py.

Optimizer entries are not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from roll_device.errors import ConfigError

MEGATRON_KEY = re.compile(r"^model\.pp(\d+)\.tp(\d+)\.(.+)$")


@dataclass(frozen=True)
class Layout:
    """The parallel layout a Megatron checkpoint was written with (what `describe` checks)."""

    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: int = 1  # the checkpoint holds every expert under its global index
    experts_tensor_parallel: int = 1  # the experts' checks, not the merge (which counts the shards)


def _read_model_entries(directory: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(directory)
    stored = reader.read_metadata().state_dict_metadata
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in stored.items()
        if key.startswith("model.") and hasattr(meta, "size")
    }
    if not state:
        raise ConfigError(
            f"checkpoint '{directory}' holds no model tensors: pass a trainer checkpoint folder"
        )
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def _megatron_state(entries: dict[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    from strategies.training import megatron_model, megatron_weights

    shards: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for key, tensor in entries.items():
        stage, rank, name = MEGATRON_KEY.match(key).groups()
        shards.setdefault((int(stage), int(rank)), {})[name] = tensor
    pp = 1 + max(stage for stage, _ in shards)
    ranks = 1 + max(rank for _, rank in shards)  # tensor- or expert-tensor-parallel ranks
    dense = [n for n in shards[(0, ranks - 1)] if not megatron_weights.LOCAL_EXPERT.search(n)]
    tp = ranks if dense else 1  # ranks beyond the dense layers' hold experts only
    shape = megatron_model.describe(hf_config, Layout(tp, pp)).shape
    out = {}
    for stage in range(pp):
        first = shards[(stage, 0)]
        names = {id(tensor): name for name, tensor in first.items()}
        table = megatron_weights.parameters(shape, stage, pp)

        # a tensor is held by as many ranks as split it (experts: the expert-tensor-parallel ones)
        def gather(local, s=stage, n=names, holders=range(ranks)):
            return [shards[(s, r)][n[id(local)]] for r in holders if n[id(local)] in shards[(s, r)]]

        out.update(
            megatron_weights.export(first, table, shape, gather, megatron_weights.ExpertGathers(gather))
        )
    return out


def hf_state_dict(checkpoint_dir: str, model_path: str) -> dict[str, torch.Tensor]:
    """The HF-named full tensors of the checkpoint in `checkpoint_dir`; `model_path` holds the
    model's config.json (the model the run started from)."""
    from transformers import AutoConfig

    if not Path(checkpoint_dir, ".metadata").is_file():
        raise ConfigError(
            f"'{checkpoint_dir}' is no trainer checkpoint (no .metadata): pass a run directory, a "
            "checkpoints/step_<N> folder or its policy/ folder"
        )
    entries = _read_model_entries(checkpoint_dir)
    if all(MEGATRON_KEY.match(key) for key in entries):
        return _megatron_state(entries, AutoConfig.from_pretrained(model_path))
    return {key.removeprefix("model."): tensor for key, tensor in entries.items()}
