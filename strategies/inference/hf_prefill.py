"""Prefill graphs for the HF strategy: a batch's prompts packed end to end into one row of tokens,
padded to a token-count bucket, and run through `roll_device.graph.PrefillGraphRunner`, which
captures the forward in pieces split at attention.

Packing: prompt r's tokens take the next `len(r)` places of the row with positions 0, 1, ... and
segment id r; a token attends to the earlier tokens of its own segment only (the mask is computed
inside the first captured piece from the segment ids). The bucket's padding tokens sit at the end
in segment -1. Each layer's attention runs eagerly at the runner's boundary: it writes the
prompt's keys and values into row r of the shared KV store, left-padded to the batch's longest
prompt exactly as the eager prefill writes them (so decoding continues unchanged), then attends
with PyTorch's scaled-dot-product attention. Padding tokens write to one scratch slot, the last
position of row 0, which no request reaches (a prompt plus at least one new token fits
`max_model_len`, and the last drawn token is never written). The LM head runs on each prompt's
last token only (`logits_to_keep` with the static index of those tokens).

The model runs with the attention function `PIECEWISE_ATTENTION`, registered with transformers:
sdpa for every other call (decode steps, the eager prefill of batches longer than the largest
bucket), the packed attention above when the forward passes it in.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from roll_device.graph import PrefillGraphRunner
from roll_device.platforms.base import Platform
from strategies.inference.hf_cache import SharedKVStore

PIECEWISE_ATTENTION = "roll_device_piecewise"
PACKED_KEY = "packed_attention"  # the forward's keyword that carries the packed attention


def piecewise_attention(module, query, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """sdpa, or the packed prefill's attention when the forward hands one in (`PACKED_KEY`)."""
    packed = kwargs.pop(PACKED_KEY, None)
    if packed is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return packed(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(PIECEWISE_ATTENTION, piecewise_attention)


class PackedPrefill:
    """The packed prefill of one model and KV store, captured per token-count bucket."""

    def __init__(
        self, model: Any, store: SharedKVStore, platform: Platform, sizes: list[int], pad_id: int
    ) -> None:
        self.model, self.store, self.pad_id = model, store, pad_id
        self.device = platform.device()
        self.runner = PrefillGraphRunner(
            platform, sizes, self._make_inputs, self._forward, compile_backend=platform.compile_backend
        )

    def bucket(self, prompts: list[list[int]]) -> int | None:
        """The token-count bucket that holds `prompts`, or None (prefill them eagerly)."""
        return self.runner.bucket(sum(map(len, prompts)))

    def __call__(self, prompts: list[list[int]], width: int, size: int) -> torch.Tensor:
        """The raw log-probabilities of each prompt's next token (rows, vocab); the prompts' keys
        and values are left in the store, left-padded to `width`."""
        inputs = self._pack(prompts, width, size)
        return self.runner.run(size, inputs, len(prompts))

    def _rows(self, size: int) -> int:
        return min(size, self.store.max_rows)

    def _pack(self, prompts: list[list[int]], width: int, size: int) -> dict[str, torch.Tensor]:
        """Bucket `size`'s inputs on the host: `prompts` packed, the rest padding."""
        tokens = torch.full((size,), self.pad_id, dtype=torch.long)
        positions = torch.zeros(size, dtype=torch.long)
        segments = torch.full((size,), -1, dtype=torch.long)
        kv_rows = torch.zeros(size, dtype=torch.long)
        kv_cols = torch.full((size,), self.store.max_len - 1, dtype=torch.long)  # the scratch slot
        last = torch.zeros(self._rows(size), dtype=torch.long)
        start = 0
        for row, prompt in enumerate(prompts):
            end = start + len(prompt)
            tokens[start:end] = torch.tensor(prompt, dtype=torch.long)
            positions[start:end] = torch.arange(len(prompt))
            segments[start:end] = row
            kv_rows[start:end] = row
            kv_cols[start:end] = torch.arange(width - len(prompt), width)
            last[row] = end - 1
            start = end
        return {
            "tokens": tokens,
            "positions": positions,
            "segments": segments,
            "kv_rows": kv_rows,
            "kv_cols": kv_cols,
            "last": last,
        }

    def _make_inputs(self, size: int) -> dict[str, torch.Tensor]:
        return {name: t.to(self.device) for name, t in self._pack([], 0, size).items()}

    def _forward(self, size: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        segments = inputs["segments"]
        order = torch.arange(size, device=segments.device)
        allowed = (segments[:, None] == segments[None, :]) & (order[None, :] <= order[:, None])
        out = self.model(
            input_ids=inputs["tokens"][None],
            position_ids=inputs["positions"][None],
            attention_mask=allowed[None, None],
            use_cache=False,
            logits_to_keep=inputs["last"],
            **{PACKED_KEY: functools.partial(self._attend, inputs)},
        )
        return out.logits[0].float().log_softmax(dim=-1)

    def _attend(self, inputs, module, query, key, value, attention_mask, scaling=None, **_):
        output = self.runner.boundary(
            self._attention,
            module,
            query,
            key,
            value,
            attention_mask,
            inputs["kv_rows"],
            inputs["kv_cols"],
            scaling,
        )
        return output, None

    def _attention(self, module, query, key, value, mask, kv_rows, kv_cols, scaling) -> torch.Tensor:
        """Keys and values into the store, then attention within each prompt (eager)."""
        layer = module.layer_idx
        self.store.keys[layer][kv_rows, :, kv_cols] = key[0].transpose(0, 1)
        self.store.values[layer][kv_rows, :, kv_cols] = value[0].transpose(0, 1)
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)[0]
