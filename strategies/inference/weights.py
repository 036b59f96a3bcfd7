"""HF-named weights on their way into a rollout engine.

- `weight_buckets`: groups an iterable of (name, tensor) into buckets of about `bucket_bytes`,
  closing a bucket only between decoder layers (`...layers.<i>.`) or top-level modules, so that
  the tensors an engine fuses into one parameter (q/k/v, gate/up) always arrive together.
- `check_update`: refuses unknown names and fused groups sent incomplete (an engine that
  loads part of a fused parameter would fill the rest with garbage).

To check that an engine holds given weights, compare its `weights_hash()` with
`roll_device.comm.weights_hash` of the export.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from roll_device.errors import ConfigError

NamedTensors = Iterable[tuple[str, torch.Tensor]]
_LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+)\.")


def group_key(name: str) -> str:
    """The unit a name belongs to: its decoder layer (`model.layers.3`) or its module."""
    match = _LAYER_PREFIX.match(name)
    return match.group(1) if match else name.rpartition(".")[0] or name


def weight_buckets(
    named_tensors: NamedTensors, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of at most `bucket_bytes`, except that one group never spans two buckets (a group
    larger than the limit gets a bucket of its own). Each group must arrive in one run."""
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ConfigError(f"update_bucket_bytes must be a positive integer, got {bucket_bytes!r}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size, current, seen_names, closed = 0, None, set(), set()
    for name, tensor in named_tensors:
        if name in seen_names:
            raise ConfigError(f"weight '{name}' was sent twice in one update: send each tensor once")
        seen_names.add(name)
        nbytes = tensor.numel() * tensor.element_size()
        key = group_key(name)
        if key != current:
            if key in closed:
                raise ConfigError(
                    f"weights of '{key}' arrived in two separate runs (again at '{name}'): send the "
                    "tensors of each decoder layer together, in one run (module order)"
                )
            if current is not None:
                closed.add(current)
            current = key
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def check_update(names: Iterable[str], known: set[str], fused: list[list[str]]) -> None:
    """Refuse names the engine does not have, and fused groups that are not sent whole."""
    names = set(names)
    unknown = sorted(names - known)
    if unknown:
        raise ConfigError(
            f"the rollout engine has no weight named {unknown[:5]}"
            f"{' and more' if len(unknown) > 5 else ''}: send HF names of the same architecture "
            f"(for example {sorted(known)[:3]})"
        )
    for group in fused:
        present = [n for n in group if n in names]
        if present and len(present) != len(group):
            missing = [n for n in group if n not in names]
            raise ConfigError(
                f"{present} are fused with {missing} in the rollout engine: send them in the same update"
            )
