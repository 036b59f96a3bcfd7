"""LoRA adapters merged into an engine's own weights (the HF engine's way to serve a LoRA policy).

A sync's tensors named as adapters (PEFT's saved names, strategies/training/lora.py) are kept here;
the others are the base, loaded as usual. After each sync every adapted layer's weight becomes
`base + alpha / rank * lora_B @ lora_A`, written in place (addresses kept: captured graphs stay
valid), from a copy of that layer's base weight taken before its first merge (and refreshed when
a sync sends the base again). `named_weights` gives back what the engine holds as the trainer
exports it: the base under HF names and the adapters under PEFT's, so both ends hash alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from roll_device.errors import ConfigError
from strategies.training.lora import PEFT_PREFIX, is_adapter
from strategies.training.settings import LoraSettings


def adapted_weight(adapter_name: str) -> str:
    """The HF name of the weight an adapter tensor adapts (`...q_proj.lora_A.weight` -> `...q_proj.weight`)."""
    module = adapter_name.removeprefix(PEFT_PREFIX).rpartition(".lora_")[0]
    return f"{module}.weight"


class MergedAdapters:
    """The adapters of one engine and the base weights of the layers they adapt."""

    def __init__(self, lora: LoraSettings) -> None:
        self.alpha = lora.alpha
        self.adapters: dict[str, torch.Tensor] = {}
        self.base: dict[str, torch.Tensor] = {}  # HF weight name -> its base value, for adapted layers

    def split(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The base tensors of `named`, for the engine to load; the adapters (copied: the sync's
        buffers are reused) kept here, and a base weight of an adapted layer kept as its base."""
        for name, tensor in named:
            if is_adapter(name):
                self.adapters[name] = tensor.detach().clone()
                continue
            if name in self.base:
                self.base[name] = tensor.detach().to(self.base[name].device, copy=True)
            yield name, tensor

    def merge(self, weights: dict[str, torch.Tensor]) -> None:
        """Every adapted weight in `weights` (the engine's, by HF name) set to base + scaled B @ A."""
        with torch.no_grad():
            for a_name, lora_a in self.adapters.items():
                if ".lora_A." not in a_name:
                    continue
                lora_b = self.adapters.get(a_name.replace(".lora_A.", ".lora_B."))
                target = adapted_weight(a_name)
                if lora_b is None or target not in weights:
                    raise ConfigError(
                        f"adapter '{a_name}' came without its lora_B or adapts no weight of the engine "
                        f"('{target}'): send the adapters of a model of the engine's architecture"
                    )
                weight = weights[target]
                base = self.base.setdefault(target, weight.detach().clone())
                lora_a, lora_b = (t.to(weight.device, weight.dtype) for t in (lora_a, lora_b))
                # one pass over the weight, no temporaries of its size
                torch.addmm(base, lora_b, lora_a, alpha=self.alpha / lora_a.shape[0], out=weight.data)

    def named_weights(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`weights` (the engine's, by HF name) with each adapted weight's base value, and the adapters."""
        return {**{name: self.base.get(name, t) for name, t in weights.items()}, **self.adapters}


ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's saved adapter, beside its adapter_config.json


def write_peft_folder(directory: str, adapters: dict[str, torch.Tensor], alpha: float) -> None:
    """`adapters` (PEFT's saved names) as a folder PEFT and vLLM load an adapter from: the
    tensors, and PEFT's own config of their rank, `alpha` and the layers they adapt."""
    from pathlib import Path

    from peft import LoraConfig
    from safetensors.torch import save_file

    rank = next(t.shape[0] for n, t in adapters.items() if ".lora_A." in n)
    targets = sorted({adapted_weight(n).rsplit(".", 2)[-2] for n in adapters})
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in adapters.items()}, str(folder / ADAPTER_FILE))
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM").save_pretrained(
        str(folder)
    )
