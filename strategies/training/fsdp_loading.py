"""The FSDP2 model built without ever holding it whole: the transformers model is made with its
parameters on the meta device (buffers, such as rotary frequencies, are computed for real and put
on the rank's device), each decoder layer and the root are sharded with `fully_shard`, the shards
are allocated where they live (`to_empty`: the device, or the CPU under optimizer offload), and
each rank copies only its own rows of every tensor out of the checkpoint's memory-mapped
safetensors files (hf_weights.py), converting the dtype as it copies. Peak memory of the process
while loading: its shards (plus, for a device, one copy of READ_BYTES in flight); the rows read are
file pages of the page cache.

Buffers are moved by registering the moved tensor, not by `buffer.data = moved` (what
`fully_shard` would do with a buffer left elsewhere): a device whose tensors are another tensor
type than the CPU's (the simulated NPU's wrapper tensors) refuses that in-place swap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from roll_device.errors import ConfigError
from strategies.training.hf_weights import HfWeights


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside keep their parameters on the meta device (no memory) and their
    buffers where they are computed: `register_parameter` moves each new parameter to meta, so
    the initialisation that follows in a module's constructor runs on meta too."""
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kept = module._parameters[name]
            module._parameters[name] = torch.nn.Parameter(kept.to("meta"), requires_grad=kept.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def check_attention(name: str) -> None:
    """`name` is an attention kernel transformers knows, or a hub kernel (`org/repo`) that
    transformers fetches where the model is built; refused in one line otherwise."""
    from transformers import AttentionInterface

    known = ["eager", *AttentionInterface().valid_keys()]
    if name.removeprefix("paged|") not in known and name not in known and "/" not in name:  # paged|sdpa: sdpa
        raise ConfigError(
            f"trainer.attn_implementation={name} is not an attention kernel transformers knows: choose "
            f"one of {', '.join(known)}, or a hub kernel (org/repo)"
        )


def empty_model(
    model_path: str,
    attn_implementation: str,
    device: torch.device,
    auto_class: str = "AutoModelForCausalLM",
    **config_changes,
) -> torch.nn.Module:
    """The fp32 model of `model_path`'s config (a transformers `auto_class`, with `config_changes`
    set on the config) with meta parameters and its buffers, computed on the CPU, on `device`."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_path)
    for key, value in config_changes.items():
        setattr(config, key, value)
    with parameters_on_meta():
        model = getattr(transformers, auto_class).from_config(
            config, dtype=torch.float32, attn_implementation=attn_implementation
        )
    for module, name, buffer in _buffers(model):
        module._buffers[name] = buffer.to(device)
    return model


def _buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    return [(m, n, b) for m in model.modules() for n, b in m._buffers.items() if b is not None]


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Allocate the (sharded) parameters on `device`, uninitialised, and keep the buffers as they
    are (`to_empty` would give them new, uninitialised memory on `device`)."""
    kept = _buffers(model)
    model.to_empty(device=device)
    for module, name, buffer in kept:
        module._buffers[name] = buffer


# rows copied at a time: the temporary a copy to another device (and dtype) makes there
READ_BYTES = 32 * 2**20


def fill_shards(
    model: torch.nn.Module,
    model_path: str,
    new_head: str | None = None,
    hf_name: Callable[[str], str | None] = lambda name: name,
) -> None:
    """Copy each parameter's local rows (a DTensor sharded on dim 0, or a plain tensor) from the
    checkpoint, READ_BYTES of rows at a time (in the parameter's dtype). `hf_name`: a parameter's
    name in the checkpoint (None: not in it, left as it is: a LoRA adapter). Parameters whose names
    start with `new_head` and that the checkpoint lacks (a head the model path was not saved with,
    such as a critic's value head on a policy's checkpoint) start at zero."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    weights = HfWeights(model_path)
    with torch.no_grad():
        for name, param in model.named_parameters():
            name = hf_name(name)
            if name is None:
                continue
            if isinstance(param, DTensor):
                local = param.to_local()
                shape, offset = compute_local_shape_and_global_offset(
                    param.shape, param.device_mesh, param.placements
                )
                start = offset[0]
            else:
                local, shape, start = param, param.shape, 0
            if local.numel() == 0:
                continue
            if new_head is not None and name.startswith(new_head) and name not in weights:
                local.zero_()
                continue
            step = max(1, READ_BYTES // (local[0].numel() * local.element_size()))
            for first in range(0, shape[0], step):
                rows = weights.rows(name, start + first, start + min(first + step, shape[0]))
                local[first : first + step].copy_(rows)  # converts the dtype as it copies: no temporary
