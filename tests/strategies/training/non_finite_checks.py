"""A policy update with a NaN loss, run inside spawned gloo ranks (local_ranks.py)."""

from __future__ import annotations

import importlib

import torch

from strategies.base import NonFiniteUpdateError
from strategies.training.losses import grpo_policy_loss
from tests.strategies.training.data import make_batch
from tests.strategies.training.fsdp_checks import max_diff


def refused_update(rank: int, model_path: str, trainer_name: str) -> dict:
    """Rank 1's rows carry a NaN advantage (a NaN reward upstream), so the reduced loss and
    gradient norm are NaN on every rank: the step must be refused everywhere and change nothing,
    and the next finite step must be a fresh trainer's first (optimizer and schedule untouched)."""
    checks = importlib.import_module(f"tests.strategies.training.{trainer_name}_checks")
    loss = grpo_policy_loss(clip_ratio=0.2)
    good = make_batch(seed=3 + rank)
    bad = make_batch(seed=3 + rank)
    bad.advantages = torch.full_like(bad.advantages, float("nan") if rank == 1 else 1.0)

    trainer = checks.new_trainer(model_path)
    before = dict(trainer.export_weights())
    try:
        trainer.train_step(bad, loss)
        refused = ""
    except NonFiniteUpdateError as exc:
        refused = str(exc)
    unchanged = max_diff(dict(trainer.export_weights()), before)
    after_refusal = trainer.train_step(good, loss)
    trainer.shutdown()

    fresh = checks.new_trainer(model_path)
    first = fresh.train_step(good, loss)
    fresh.shutdown()
    return {"refused": refused, "unchanged": unchanged, "after_refusal": after_refusal, "first": first}
