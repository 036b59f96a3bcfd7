"""Per-token logprobs from a transformers causal LM, the ways the FSDP trainer can compute them:

- rows padded to one length, or *packed*: the real tokens of every row concatenated into one row
  with per-sample `position_ids` that restart at 0 and no attention mask, from which transformers
  builds the block-diagonal causal mask (sdpa, eager, flex) or varlen boundaries (flash
  attention): no padding is computed;
- from the full [tokens x vocab] logits, or in *chunks* of `chunk` positions from the last hidden
  states and the output layer, each chunk recomputed in the backward pass (activation
  checkpointing) so that the logits held at any time are one chunk's.

With `entropy=METRIC` the policy's per-token entropy comes from the same logits, in the same
pass and the same chunks (no second [tokens x vocab] tensor beyond one slice of ENTROPY_SLICE
positions), without gradient: a metric; with `entropy=GRAD` it keeps its gradient, for an entropy
bonus in the loss (`algorithm.entropy_coef`). Results are (B, T) in the batch's padded layout
(batches.py's alignment), whatever the path: the value at token t is that of the distribution
that predicted it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from strategies.base import TrainBatch
from strategies.training.batches import align_to_tokens, shifted_labels

# transformers attention kernels that take packed rows (boundaries from position_ids, no mask)
PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
NO_LOGITS = torch.zeros(0, dtype=torch.long)  # `logits_to_keep` that keeps none: hidden states only
METRIC, GRAD = "metric", "grad"  # the entropy as a metric (no gradient), or for the loss
Entropy = Literal["metric", "grad"] | None  # None: no entropy
ENTROPY_SLICE = 128  # positions whose probabilities the entropy holds at once (a [slice x vocab] temporary)


def next_token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, N) logprob of `labels` under (B, N, V) logits, in fp32: a log-softmax over the last
    dimension (cross-entropy over the transposed (B, V, N) layout reduces across strided memory and
    loses about ten times the precision at a large vocabulary)."""
    return logits.float().log_softmax(dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_of(logits: torch.Tensor, grad: bool = False) -> torch.Tensor:
    """(B, N) entropy of the (B, N, V) logits' distributions, in fp32, ENTROPY_SLICE positions at
    a time: logsumexp(z) - sum(softmax(z) * z); without gradient unless `grad` (an entropy bonus
    in the loss)."""
    pieces = []
    with contextlib.nullcontext() if grad else torch.no_grad():
        for part in logits.split(ENTROPY_SLICE, dim=1):
            part = part.float()
            log_norm = part.logsumexp(dim=-1)
            pieces.append(log_norm - (part.softmax(dim=-1) * part).sum(dim=-1))
    return torch.cat(pieces, dim=1)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """`F.linear(hidden, weight, bias)` computed as `weight @ hidden.T`, so that the weight's
    gradient comes out of the matmul as a tensor of its own: `F.linear`'s is a view of another,
    which autograd may not add to in place, so its sum with the other chunks' gradients or a tied
    embedding's is a third [vocab x hidden] tensor at once (519 MiB at Qwen2.5-0.5B's shapes)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    logits = (weight @ flat.T).T.reshape(*hidden.shape[:-1], weight.shape[0])
    return logits if bias is None else logits + bias


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, bias, labels: torch.Tensor, entropy: Entropy
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head_logits(hidden, weight, bias)
    return next_token_logprobs(logits, labels), entropy_of(logits, entropy == GRAD) if entropy else None


def chunked_logprobs(
    hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor, chunk: int, entropy: Entropy = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`next_token_logprobs(head(hidden), labels)` (and with `entropy`, `entropy_of` the same
    logits) computed `chunk` positions at a time; in training each chunk's logits are recomputed
    in the backward instead of kept."""
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[1], chunk):
        part = slice(start, start + chunk)
        args = (hidden[:, part], head.weight, head.bias, labels[:, part], entropy)
        if torch.is_grad_enabled():
            logprob, piece = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logprob, piece = _chunk_logprobs(*args)
        logprobs.append(logprob)
        entropies.append(piece)
    return torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1) if entropy else None


def _last_hidden_state_only(decoder: torch.nn.Module, args, output):
    """Forward hook on the decoder: the causal LM returns the decoder's `hidden_states` as its
    own, so this hands it the last one alone. The chunked path needs that one, as an output of
    the model (FSDP2 registers its pre-backward hook on the root's outputs); asking for
    `output_hidden_states` would hold every layer's states (in no-grad passes too) and return
    the embedding's output, a view FSDP2 warns about."""
    output.hidden_states = (output.last_hidden_state,)
    return output


def packed_inputs(micro: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, N) token ids of every row's real tokens in row order, and their (1, N) positions."""
    mask = micro.attention_mask.bool()
    lengths = mask.sum(dim=1).tolist()
    positions = torch.cat([torch.arange(n) for n in lengths])
    return micro.input_ids[mask].unsqueeze(0), positions.unsqueeze(0)


def unpack(next_token: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(1, N) next-token logprobs of a packed row -> (B, T) aligned logprobs of the padded rows:
    token t's value sits at its own position, 0 at each sample's first token and on padding."""
    aligned = torch.zeros_like(next_token)
    aligned[:, 1:] = next_token[:, :-1]
    aligned = aligned * (positions != 0).to(aligned.device, aligned.dtype)
    out = torch.zeros(attention_mask.shape, dtype=aligned.dtype, device=aligned.device)
    out[attention_mask.bool().to(out.device)] = aligned[0]
    return out


def model_logprobs(
    model: torch.nn.Module,
    micro: TrainBatch,
    device: torch.device,
    packing: bool,
    chunk: int | None,
    entropy: Entropy = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) aligned logprobs of `micro` (on `device`) under `model`, packed or padded, chunked
    or whole, and with `entropy` the (B, T) aligned entropies (else None; with gradient for GRAD)."""
    inputs, align = model_inputs(micro, device, packing)
    labels = shifted_labels(inputs["input_ids"])
    if chunk is None:
        logits = model(**inputs, use_cache=False).logits
        next_token = next_token_logprobs(logits, labels)
        entropies = entropy_of(logits, entropy == GRAD) if entropy else None
    else:
        hook = model.get_decoder().register_forward_hook(_last_hidden_state_only)
        try:
            hidden = model(**inputs, use_cache=False, logits_to_keep=NO_LOGITS).hidden_states[-1]
        finally:
            hook.remove()
        next_token, entropies = chunked_logprobs(
            hidden, model.get_output_embeddings(), labels, chunk, entropy
        )
    return align(next_token), align(entropies) if entropy else None


def model_inputs(
    micro: TrainBatch, device: torch.device, packing: bool
) -> tuple[dict[str, torch.Tensor | None], Callable[[torch.Tensor], torch.Tensor]]:
    """The model's inputs for `micro` on `device` (packed into one row, or padded), and the function
    that turns the model's per-position outputs for them ((1, N) packed, or (B, T)) into (B, T)
    values aligned to the tokens: the output at position t - 1 as token t's."""
    if not packing:
        mask = micro.attention_mask.to(device)
        inputs = {"input_ids": micro.input_ids.to(device), "attention_mask": mask}
        return inputs, lambda values: align_to_tokens(values, mask)
    ids, positions = (t.to(device) for t in packed_inputs(micro))
    inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": None}
    return inputs, lambda values: unpack(values, positions, micro.attention_mask)
