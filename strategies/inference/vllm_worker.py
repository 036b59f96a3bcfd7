"""Methods mixed into vLLM's worker (`worker_extension_cls`), reached with `LLM.collective_rpc`:
weight loading and read-back in Hugging Face names, on every device kind.

- `roll_device_weight_layout()`: the HF names the engine accepts, the groups it fuses into one
  parameter (q/k/v into qkv_proj, gate/up into gate_up_proj; from the model's
  `packed_modules_mapping`), and aliases it ignores (tied weights).
- `roll_device_load_weights(blob)`: loads one bucket (safetensors bytes) through the model
  runner's `reload_weights`, which works after start on every backend (a plain `load_weights`
  fails on the CPU, whose GEMM kernels repack the weights).
- `roll_device_read_weights()`: the weights the engine computes with, in HF names (fused
  parameters split back). Where the CPU backend packed a linear weight into its kernel and left
  an empty parameter, the weight is read through the layer's own kernel: an identity input
  gives `I @ W.T`, i.e. the weight itself. Tensor parallelism 1 only.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from roll_device.errors import ConfigError
from strategies.inference.weights import pack, unpack

# Loading a bucket reloads only some layers; vLLM warns about every other layer it left alone.
_PARTIAL_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


@contextlib.contextmanager
def _quiet_partial_reload():
    loggers = [logging.getLogger(name) for name in _PARTIAL_RELOAD_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _fused_names(model: torch.nn.Module, param_name: str) -> list[str] | None:
    """The HF names fused into `param_name` (e.g. ...qkv_proj.weight -> q/k/v), or None."""
    mapping = getattr(model, "packed_modules_mapping", None) or {}
    module_path, _, leaf = param_name.rpartition(".")
    parent, _, module_name = module_path.rpartition(".")
    if module_name not in mapping:
        return None
    prefix = f"{parent}." if parent else ""
    return [f"{prefix}{part}.{leaf}" for part in mapping[module_name]]


def weight_layout(model: torch.nn.Module) -> dict[str, list]:
    names, fused = [], []
    for name, _ in model.named_parameters():
        group = _fused_names(model, name)
        if group is None:
            names.append(name)
        else:
            names.extend(group)
            fused.append(group)
    aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {
        n for n, _ in model.named_parameters()
    }
    return {"names": names, "fused": fused, "ignored": sorted(aliases)}


def _linear_weight(module: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    rows, cols = module.output_size_per_partition, module.input_size_per_partition
    if weight.numel() == rows * cols:
        return weight.detach().reshape(rows, cols)
    eye = torch.eye(cols, dtype=weight.dtype, device=weight.device)
    return module.quant_method.apply(module, eye, bias=None).t().contiguous()


def read_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from vllm.model_executor.layers.linear import LinearBase

    out: dict[str, torch.Tensor] = {}
    for module_path, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            name = f"{module_path}.{leaf}" if module_path else leaf
            tensor = param.detach()
            if isinstance(module, LinearBase) and leaf == "weight":
                tensor = _linear_weight(module, param)
            if getattr(module, "num_embeddings_padded", None) == tensor.shape[0]:
                tensor = tensor[: module.num_embeddings]  # rows added to pad the vocabulary
            group = _fused_names(model, name)
            if group is None:
                out[name] = tensor.to("cpu")
                continue
            sizes = list(module.output_sizes)
            if sum(sizes) != tensor.shape[0]:
                raise ConfigError(
                    f"cannot split {name} {tuple(tensor.shape)} into {sizes}: weight read-back needs "
                    "tensor_parallel_size=1"
                )
            for part, piece in zip(group, torch.split(tensor, sizes, dim=0)):
                out[part] = piece.to("cpu")
    return out


class RolloutWorkerExtension:
    """Mixed into the vLLM worker class; `self` is the worker."""

    def roll_device_weight_layout(self) -> dict[str, list]:
        return weight_layout(self.model_runner.get_model())

    def roll_device_load_weights(self, blob: bytes) -> int:
        tensors = unpack(blob)
        with _quiet_partial_reload(), torch.no_grad():
            self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        return len(tensors)

    def roll_device_read_weights(self) -> bytes:
        with torch.no_grad():
            return pack(read_weights(self.model_runner.get_model()).items())
