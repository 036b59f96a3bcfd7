"""One static KV store shared by every batch-size bucket of the HF strategy.

The store holds, per decoder layer, keys and values of shape (max_rows, kv_heads, max_len,
head_dim) on the device. `cache(rows)` returns a transformers `Cache` whose layers are
`StaticLayer`s bound to views of the first `rows` rows of the store (contiguous, since rows are
the leading dimension), so that buckets and the prefill of a batch write into the same memory and
the store is allocated once, at the size of the largest bucket. A bucket's cache keeps its
addresses for the life of the store, which is what a captured decode graph needs.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from roll_device.errors import ConfigError


class _BoundStaticLayer(StaticLayer):
    """A `StaticLayer` over given key/value tensors instead of tensors of its own."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__(max_cache_len=keys.shape[2])
        self.dtype, self.device = keys.dtype, keys.device
        self.batch_size, self.num_heads = keys.shape[:2]
        self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
        self.keys, self.values = keys, values
        self.cumulative_length = self.cumulative_length.to(keys.device)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a bound static layer is initialized at construction")


class SharedKVStore:
    """Keys and values for `max_rows` sequences of up to `max_len` tokens, for every layer."""

    def __init__(self, model_config, max_rows: int, max_len: int, dtype: torch.dtype, device: torch.device):
        text = model_config.get_text_config(decoder=True)
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        if set(layer_types) != {"full_attention"}:
            raise ConfigError(
                f"the hf strategy supports full-attention models only; this model has layer types "
                f"{sorted(set(layer_types))}: use the vllm strategy"
            )
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        shape = (max_rows, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in layer_types]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in layer_types]
        self.max_rows, self.max_len = max_rows, max_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def cache(self, rows: int) -> Cache:
        """A cache over the first `rows` rows of the store, starting empty (write position 0)."""
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"a cache of {rows} rows does not fit a store of {self.max_rows}")
        layers = [_BoundStaticLayer(k[:rows], v[:rows]) for k, v in zip(self.keys, self.values)]
        return Cache(layers=layers)


def set_length(cache: Cache, length: int) -> None:
    """Move every layer's write position to `length` in place (addresses unchanged)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)
