"""Pieces both trainers share: the model-path check, the token-weighted step accounting, the
refusal of an update that is not finite, host snapshots of exported tensors, and checkpoint errors
that name their cause. (A trainer's offload and reload are strategies/host_turns.py's.)"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from roll_device.errors import ConfigError, RollDeviceError
from strategies.base import LossFn, NonFiniteUpdateError, TrainBatch
from strategies.training.batches import budget_micro_batches, micro_batches
from strategies.training.distributed import all_reduce_max, all_reduce_sum
from strategies.training.losses import token_units
from strategies.training.settings import TrainSettings


class TrainerStateError(RollDeviceError, RuntimeError):
    """A trainer method called in a state that cannot serve it (e.g. while offloaded)."""


def refuse_non_finite(loss: float, grad_norm: float, update: str = "policy update") -> None:
    """A NonFiniteUpdateError unless `loss` and `grad_norm` (equal on every rank: both reduced)
    are finite; called before the optimizer applies the update (`update`: whose, in words)."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    raise NonFiniteUpdateError(
        f"the {update} was not applied: its loss is {loss} and its gradient norm {grad_norm}, "
        "not finite numbers"
    )


@contextmanager
def checkpoint_cause() -> Iterator[None]:
    """torch.distributed.checkpoint's CheckpointException (one error listing every failing rank,
    its first line only the ranks) raised as the first failing rank's own error, so that a report's
    first line names the cause: a full disk, a path that is a file."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as error:
        _rank, (cause, _trace) = min(error.failures.items())
        raise cause from error


def check_model_path(model_path: str) -> Path:
    """The model directory, or a ConfigError when it holds no Hugging Face config."""
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model path '{model_path}' holds no config.json: pass a directory saved with "
            "save_pretrained (or run `roll-device make-tiny-model`)"
        )
    return path


def host_snapshot(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU copy of `tensor` (in `dtype` if given) that later steps do not change (`.cpu()` of a
    CPU tensor, or of a one-rank gather, would be the live parameter itself)."""
    return tensor.detach().to("cpu", dtype=dtype, copy=True)


def export_tensor(tensor: torch.Tensor, dtype: torch.dtype | None, snapshot: bool) -> torch.Tensor:
    """One exported tensor: a host snapshot (`snapshot`), or the tensor where it is, cast on its
    device to `dtype` if given (no copy when it has that dtype already): valid until the next
    train step, for a consumer that copies it at once (a weight sync)."""
    if snapshot:
        return host_snapshot(tensor, dtype)
    tensor = tensor.detach()
    return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)


def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups: weight decay on matrices, none on norms and biases (the
    grouping Megatron's optimizer uses, so both trainers decay the same parameters)."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (plain if param.dim() < 2 or name.endswith(".bias") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def plan_micro_batches(
    batch: TrainBatch, settings: TrainSettings, device: torch.device, dp_group=None
) -> list[TrainBatch]:
    """The micro-batches of `batch`: `micro_batch_size` rows each, or, with a token budget, rows
    whose tokens fit it, as many on every data-parallel rank (the ones with fewer split their
    largest), since a sharded model needs the same number of passes everywhere."""
    budget = settings.max_tokens_per_micro_batch
    if budget is None:
        return micro_batches(batch, settings.micro_batch_size)
    own = len(budget_micro_batches(batch, budget, settings.packing))
    count = all_reduce_max(own, device, dp_group)
    return budget_micro_batches(batch, budget, settings.packing, count)


class StepAccounting:
    """A loss aggregated over micro-batches and data-parallel ranks as over the global batch.

    Every micro-batch loss (a mean over its units: response tokens, or for the seq-mean losses rows;
    the loss's `units`) is scaled by its share of the units of the whole step, times the
    data-parallel size (gradients are averaged over ranks), so the gradient is that of the mean
    over the global batch. Metrics are weighted the same way.
    """

    def __init__(
        self, batch: TrainBatch, loss_fn: LossFn, device: torch.device, dp_group=None, dp_size: int = 1
    ) -> None:
        self.units = getattr(loss_fn, "units", token_units)
        (self.total_tokens,) = all_reduce_sum([self.units(batch.response_mask)], device, dp_group)
        if self.total_tokens == 0:
            raise ConfigError("train_step got no response tokens (response_mask is all zero on every rank)")
        self.device = device
        self.dp_group = dp_group
        self.dp_size = dp_size
        self.sums: dict[str, float] = {}

    def scaled_loss(
        self,
        loss_fn: LossFn,
        logprobs: torch.Tensor,
        micro: TrainBatch,
        extra: dict[str, float] | None = None,
        entropy: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The micro-batch loss to backpropagate; records its metrics, and `extra` ones (means over
        the micro-batch's response tokens, such as the trainer's entropy). A loss that
        `needs_entropy` is given the (B, T) per-token `entropy`, with its gradient."""
        loss, metrics = loss_fn(logprobs, micro) if entropy is None else loss_fn(logprobs, micro, entropy)
        tokens = self.units(micro.response_mask)
        for key, value in {"loss": loss.item(), **metrics, **(extra or {})}.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * tokens
        return loss * self.share(micro)

    def share(self, micro: TrainBatch) -> float:
        """The factor of a mean over `micro`'s units in the step's loss: its share of the units of
        the global batch, times the data-parallel size (gradients are averaged over ranks)."""
        return self.units(micro.response_mask) * self.dp_size / self.total_tokens

    def metrics(self) -> dict[str, float]:
        """Token-weighted means over the step on every rank (a collective)."""
        keys = sorted(self.sums)
        totals = all_reduce_sum([self.sums[k] for k in keys], self.device, self.dp_group)
        out = {k: v / self.total_tokens for k, v in zip(keys, totals)}
        out["response_tokens"] = self.total_tokens
        return out
