"""Parameters a model holds under two names. With `tie_word_embeddings` the head is the embedding
itself: `state_dict()` lists it twice (`model.embed_tokens.weight` and `lm_head.weight`, in
transformers, vLLM and the FSDP2 model alike), `named_parameters()` once, under the first name.

Exports, engine hashes and saved weights name each tensor once, under that first name. A receiver
keeps the tie when it loads the embedding (transformers copies into the shared parameter, vLLM's
loaders skip the alias), so sending the alias too would gather and move the largest tensor of a
small model twice per sync, for nothing.
"""

from __future__ import annotations

import torch


def tied_aliases(model: torch.nn.Module) -> frozenset[str]:
    """The names under which `model` holds a parameter it already holds under an earlier name."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return frozenset(every - {name for name, _ in model.named_parameters()})


def state_once(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` without the tied aliases: each tensor under its first name."""
    aliases = tied_aliases(model)
    return {name: tensor for name, tensor in model.state_dict().items() if name not in aliases}
