"""A deterministic hash of named tensors, the same on both ends of a weight sync.

Names are sorted; each tensor contributes its name, shape and the bytes of its contiguous CPU
data, floating tensors cast to float32 first, so a bf16 export and a bf16 engine copy hash alike
whatever device holds them. Tensors are read one at a time: memory stays at one tensor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from roll_device.comm.buckets import tensor_bytes


def tensor_digest(name: str, tensor: torch.Tensor) -> bytes:
    data = tensor.detach().cpu()
    if data.is_floating_point():
        data = data.float()
    h = hashlib.sha256()
    h.update(name.encode())
    h.update(repr(tuple(data.shape)).encode())
    h.update(tensor_bytes(data).numpy())
    return h.digest()


def weights_hash(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Hex SHA-256 over the name-sorted digests of `named_tensors`."""
    digests = sorted((name, tensor_digest(name, tensor)) for name, tensor in named_tensors)
    total = hashlib.sha256()
    for _name, digest in digests:
        total.update(digest)
    return total.hexdigest()
