"""A training step's metrics record: one line of the run's metrics.jsonl (docs/pipeline.md).

`StepRecord.build` makes it from what the step's algorithm yields (`StepOutcome`) and its timing
(`StepTimeline`, roll_device/pipeline/timeline.py): the algorithm's fields first, then the
waits, the sync's fields (empty until it runs), the seconds of the parts, the device bytes the
colocated turns freed, and the wall-clock timeline. The sync extends the record: `add_turns` for
the turn taken before it, `add_sync` for the sync itself; a sync cut short leaves its fields
empty, and the record is still written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll_device.pipeline.state import PipelineState
from roll_device.pipeline.timeline import Spans, StepTimeline, Timed, turn_seconds
from strategies.base import TrainBatch
from strategies.training.routing import METRICS as ROUTING_METRICS

SYNC_PARTS = ("export_s", "cast_s", "transfer_s", "load_s")  # roll_device/pipeline/sync_split.py
SYNC_FIELDS = (*(f"sync_{part}" for part in SYNC_PARTS), "sync_calls_s", "sync_bytes", "sync_senders")


@dataclass(frozen=True)
class StepOutcome:
    """What a step's algorithm yields for its record."""

    rewards: torch.Tensor  # one per completion
    batch: TrainBatch  # as trained on: its response mask and the trainer's old logprobs
    sampler_logprobs: torch.Tensor  # the engines' own logprobs of the same tokens
    update: dict  # the trainer's metrics, averaged over the step's updates (updates.py)
    rollout_version: int  # the oldest weight version the rollout was generated with
    staleness: int  # the trainer's step before the update minus `rollout_version`
    engine_idle_s: float  # the longest any engine stood idle before the rollout


def logprob_gap(outcome: StepOutcome) -> float:
    """Mean absolute difference of the engines' and the trainer's logprobs over response tokens."""
    mask = outcome.batch.response_mask
    gap = ((outcome.sampler_logprobs - outcome.batch.old_logprobs).abs() * mask).sum()
    return (gap / mask.sum().clamp(min=1)).item()


class StepRecord(dict):
    """A step's record, its keys in metrics.jsonl's order (a plain dict to every reader)."""

    @classmethod
    def build(cls, state: PipelineState, outcome: StepOutcome, timeline: StepTimeline) -> StepRecord:
        """The record of step `state.step` (just advanced); the step's timeline ends now."""
        rewards, update = outcome.rewards, outcome.update
        return cls(
            {
                "step": state.step,
                "epoch": state.data_epoch,
                "reward_mean": rewards.mean().item(),
                "reward_std": rewards.std(unbiased=False).item(),
                "response_len": outcome.batch.response_mask.sum(dim=1).mean().item(),
                "loss": update.get("loss", 0.0),
                "kl": update.get("kl", 0.0),
                "grad_norm": update["grad_norm"],
                "entropy": update.get("entropy"),  # the policy's mean per-token entropy (None: not reported)
                **{key: update[key] for key in ROUTING_METRICS if key in update},  # a mixture of experts'
                "lr": update["lr"],
                # the loss's clipped share and pi / pi_old over the updates (None: a loss that reports
                # none; 1 in a one-update step), the policy's optimizer steps (pipeline/updates.py)
                "clip_fraction": update.get("clip_fraction"),
                "ratio_mean": update.get("ratio_mean"),
                "updates": update["updates"],
                "rollout_vs_train_logprob_gap": logprob_gap(outcome),
                "rollout_version": outcome.rollout_version,
                "staleness": outcome.staleness,
                "importance_ratio_mean": update.get("importance_ratio_mean", 1.0),
                "importance_clipped_share": update.get("importance_clipped_share", 0.0),
                "trainer_wait_s": timeline.waited_s,
                "rollout_wait_s": outcome.engine_idle_s,
                "weights_version": None,  # the sync's (`add_sync`)
                "sync_path": None,
                "graph_guard": None,  # the engines' graphs checked after the sync (roll_device/graph/guard.py)
                **dict.fromkeys(SYNC_FIELDS),  # where the sync's time went (`add_sync`)
                **timeline.fields(),
            }
        )

    def add_turns(self, turns: Spans) -> None:
        """Turns taken after the update (the sync's): their spans, and their seconds in the step's."""
        swap_s = turn_seconds(turns)
        self["swap_s"] += swap_s
        self["step_s"] += swap_s
        self["timeline"].update(turns)

    def add_sync(self, sync: dict, took: Timed) -> None:
        """The weight sync `sync` (`RoleGroups.sync_weights`' report), timed as `took`."""
        self.update(weights_version=sync["version"], sync_path=sync["path"], graph_guard=sync["graph_guard"])
        self["sync_s"] = took.seconds
        self.update({f"sync_{part}": sync[part] for part in SYNC_PARTS})
        self.update(sync_bytes=sync["nbytes"], sync_senders=sync["senders"])
        self["sync_calls_s"] = max(took.seconds - sync["seconds"], 0.0)  # the Ray calls around the sync
        self["step_s"] += took.seconds
        self["timeline"]["sync"] = took.span
