"""Routing replay of multi-turn trajectories on the tiny Qwen3-MoE (run in the spawned rank of
tests/strategies/routes_checks.py, which has the engine and the trainer: one spawn, not two):
2-turn trajectories through the HF engine's request path, each turn's recorded routes against
the batch the trajectories train as, and the FSDP trainer's logprobs with replay against the
engine's own."""

from __future__ import annotations

import torch

from roll_device.agentic.environment import Task
from roll_device.pipeline.agentic_step import completion
from roll_device.pipeline.batching import build_batch
from tests.pipeline.test_agentic_turns import SAMPLING, Recording, agentic, driver

TASKS = [Task("", None, 1), Task("", None, 2)]


def recorded_rollout(engine, model_path: str) -> tuple[list, list]:
    """2 trajectories of each of `TASKS`, 2 turns each, through `engine` (recording routes): the
    trajectories, and the engine's requests (context, completion) in the order they came back."""
    from transformers import AutoTokenizer

    engines = Recording(engine)
    settings = agentic(environment="tests.agentic.envs.Echo", tools=[], max_turns=2, max_turn_tokens=4)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trajectories = driver(tokenizer, settings, engines).roll_out(TASKS, 2, SAMPLING)
    return trajectories, [(context, c) for (context,), (c,) in engines.produced]


def turn_routes(row: list[int], requests: list) -> list[tuple[int, int, torch.Tensor]]:
    """The row's turns as (first new position, end, the request's recorded routes): a turn's
    request is the one whose context and tokens the row continues with; its new positions are
    those no earlier turn fed (the environment's tokens and the last turn's final token in its
    prefill, then its own tokens but the last)."""
    turns, fed = [], 0
    for context, c in requests:
        end = len(context) + len(c.token_ids) - 1
        if end > fed and row[: end + 1] == context + c.token_ids:
            turns.append((fed, end, c.routed_experts))
            fed = end
    return turns


def row_checks(row, got: torch.Tensor, requests: list) -> dict:
    """`got` (the batch's routes of `row`) against the routes each of its turns' requests recorded."""
    turns = turn_routes(row.token_ids, requests)
    return {
        "turns": len(turns),
        "each_turn_as_recorded": all(
            torch.equal(got[start:end], recorded[start:end].to(got.dtype)) for start, end, recorded in turns
        ),
        "covered": turns[-1][1] == len(row.token_ids) - 1,
        "after_the_last_fed": got[len(row.token_ids) - 1 :].unique().tolist(),
    }


def agentic_replay_checks(trainer, trajectories: list, requests: list) -> dict:
    """The batch of `trajectories` against their requests' routes; `trainer` (replaying routes)
    against the engine's logprobs."""
    rows = [completion(t, pad=0) for t in trajectories]
    batch, sampler_logprobs = build_batch([[] for _ in TASKS], rows, pad_id=0)
    mask = batch.response_mask.bool()
    return {
        "turns": [t.turns for t in trajectories],
        "routes": [row_checks(row, batch.routed_experts[i], requests) for i, row in enumerate(rows)],
        "replayed_vs_engine": (trainer.forward_logprobs(batch) - sampler_logprobs)[mask].abs().max().item(),
    }
