"""LoRA through PEFT, the field's library: the trainer's model wrapped by `get_peft_model`, the base
frozen, the adapters the only parameters that train.

Names. Inside the wrapped model a base tensor is `base_model.model.<HF name>` with `.base_layer`
before the leaf of a layer that has adapters; an adapter tensor is PEFT's saved name
(`get_peft_model_state_dict`, `save_pretrained`): `base_model.model.<module>.lora_A.weight`, without
the adapter's own name (`default`). Exports and weight syncs use HF names for the base and PEFT's
saved names for the adapters (`is_adapter` tells them apart), so a receiver can load the adapters
as PEFT or vLLM load a saved adapter.

The reference model of a LoRA run is the base: the actor's own model inside PEFT's
`disable_adapter()`.
"""

from __future__ import annotations

import math

import torch

from roll_device.errors import ConfigError
from strategies.training.settings import ALL_LINEAR, LoraSettings

PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"  # PEFT's name for a model's one adapter; not part of the saved names
ADAPTER_MARKS = (".lora_A.", ".lora_B.")
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's adapter config, saved beside a LoRA checkpoint
ADAPTER_SEED = 0  # adapters start alike on every rank and in every run (lora_B is zero: no effect)


def is_adapter(name: str) -> bool:
    """Whether `name` (a PEFT or saved name) is an adapter tensor's."""
    return any(mark in name for mark in ADAPTER_MARKS)


def saved_name(name: str) -> str:
    """A parameter name of the wrapped model as an export names it: an adapter under PEFT's saved
    name, a base tensor under its HF name."""
    if is_adapter(name):
        return name.replace(f".{ADAPTER_NAME}.", ".")
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The leaf names of the model's linear layers that can take adapters (every one but the
    output layer), sorted: a fused mixture-of-experts block's router and expert tensors are not
    linear layers."""
    head = model.get_output_embeddings()
    return sorted(
        {
            name.rpartition(".")[2]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    )


def check_targets(lora: LoraSettings, model: torch.nn.Module) -> None:
    """A ConfigError naming the target modules `model` has no linear layer for, and those it has."""
    if lora.target_modules == ALL_LINEAR:
        return
    known = linear_layer_names(model)
    unknown = [name for name in lora.target_modules if name not in known]
    if unknown:
        raise ConfigError(
            f"trainer.lora.target_modules={lora.target_modules}: the model has no linear layer named "
            f"{', '.join(unknown)}; its linear layers are {', '.join(known)} (or use {ALL_LINEAR})"
        )


def target_modules(lora: LoraSettings, model: torch.nn.Module) -> list[str]:
    """The leaf names of `model`'s linear layers that take adapters: `lora`'s, or with all-linear
    every linear layer but the output layer. Named here rather than left to PEFT's all-linear, which
    on a fused mixture-of-experts (transformers 5's Qwen3-MoE) also wraps the router and the
    stacked expert tensors as parameter targets: adapters that no engine here merges or serves."""
    if lora.target_modules == ALL_LINEAR:
        return linear_layer_names(model)
    return list(lora.target_modules)


def peft_config(lora: LoraSettings, model: torch.nn.Module):
    """PEFT's LoraConfig of `lora` on `model`."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target_modules(lora, model),
        task_type="CAUSAL_LM",
    )


def with_adapters(model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """`model` wrapped by PEFT: adapters on the target modules, every base parameter frozen. On a
    model with meta parameters the adapters are meta too (`init_adapters` fills them later)."""
    from peft import get_peft_model

    check_targets(lora, model)
    return get_peft_model(model, peft_config(lora, model))


def _initial(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """PEFT's start for an adapter tensor: lora_A as `nn.Linear`'s weights, lora_B zero."""
    full = torch.empty(shape)
    if ".lora_B." in name:
        return full.zero_()
    bound = 1 / math.sqrt(shape[1])  # kaiming_uniform_(a=sqrt(5)), PEFT's default for lora_A
    return full.uniform_(-bound, bound, generator=generator)


def init_adapters(model: torch.nn.Module) -> None:
    """Fill the adapters (allocated but not initialised, possibly sharded on dim 0) with PEFT's
    start, drawn whole from one seeded stream so every rank holds its rows of the same tensors."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    generator = torch.Generator().manual_seed(ADAPTER_SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not is_adapter(name):
                continue
            full = _initial(name, param.shape, generator)
            if isinstance(param, DTensor):
                local = distribute_tensor(full, param.device_mesh, param.placements).to_local()
                param.to_local().copy_(local)
            else:
                param.copy_(full)
