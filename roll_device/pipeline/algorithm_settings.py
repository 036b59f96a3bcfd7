"""The `algorithm` section: an advantage estimator and a policy loss by name (docs/algorithms.md),
sampling, the KL to the reference (fixed or adaptive), the entropy bonus, PPO's critic options and
DAPO's data side, with the refusals of options that do not apply to the chosen estimator and loss."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, field_validator, model_validator

from roll_device.errors import ConfigError
from roll_device.settings import Count, NonNegative, Section
from strategies.training.advantages import ADVANTAGES, GROUP_ESTIMATORS, AdvantageSpec
from strategies.training.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, LossSpec

IMPORTANCE_CORRECTIONS = ("stale", "always")  # which samples' loss the rollout/trainer ratio weighs


class AlgorithmSettings(Section):
    """The RL algorithm: an advantage estimator and a policy loss by name (docs/algorithms.md),
    sampling, the KL to the reference, and DAPO's data side (dynamic sampling, overlong penalty)."""

    name: Annotated[
        str,
        Field(min_length=1, description="the recipe's name (configs/algorithm/), shown in the progress bar"),
    ]
    samples_per_prompt: Annotated[
        Count, Field(description="samples of each prompt; the group estimators compare them, 2 or more")
    ]
    max_new_tokens: Count
    temperature: Annotated[StrictFloat, Field(ge=0, description="0 samples greedily")]
    advantage: str
    norm_std: StrictBool
    std_unbiased: StrictBool
    policy_loss: str
    loss_agg: str
    clip_ratio: Annotated[StrictFloat, Field(gt=0)]
    clip_ratio_high: Annotated[StrictFloat, Field(gt=0)] | None = Field(description="null: clip_ratio")
    clip_ratio_c: (
        Annotated[StrictFloat, Field(gt=1, description="the dual clip, 3.0 is usual; null: off")] | None
    )
    kl_coef: Annotated[StrictFloat, Field(ge=0, description="0 runs without the reference role")]
    kl_estimator: Literal[KL_ESTIMATORS]
    kl_in_reward: StrictBool
    entropy_coef: Annotated[StrictFloat, Field(ge=0, description="the entropy bonus's weight (0: off)")]
    kl_target: Annotated[StrictFloat, Field(gt=0)] | None = Field(
        description="null: a fixed kl_coef; a KL: kl_coef adapts toward it after each step (Ziegler et al. 2019)"
    )
    kl_horizon: Count
    dynamic_sampling: StrictBool
    max_sampling_rounds: Annotated[
        Count, Field(description="dynamic sampling's rounds of prompts per step at most (1: no refill)")
    ]
    overlong_buffer: NonNegative
    overlong_penalty: Annotated[StrictFloat, Field(ge=0)]
    ppo_epochs: Annotated[Count, Field(description="passes over each step's batch")]
    mini_batches: Annotated[
        Count,
        Field(description="optimizer steps per pass: the batch's rows cut into this many contiguous parts"),
    ]
    max_staleness: Annotated[
        NonNegative,
        Field(description="0 is synchronous; k lets rollouts come from weights up to k steps old"),
    ]
    importance_correction: Literal[IMPORTANCE_CORRECTIONS] = Field(
        description="stale: samples of older weights carry the rollout's logprobs into the loss; always: every sample"
    )
    importance_ratio_cap: Annotated[
        StrictFloat,
        Field(ge=1, description="truncation of the old-policy/rollout-policy ratio of the corrected samples"),
    ]
    gamma: Annotated[StrictFloat, Field(ge=0, le=1, description="gae's discount; null: 1.0")] | None
    lam: Annotated[StrictFloat, Field(ge=0, le=1, description="gae's lambda; null: 1.0")] | None
    value_clip: Annotated[StrictFloat, Field(gt=0, description="the critic's clipped value loss")]

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, name: str) -> str:
        ADVANTAGES.check(name)
        return name

    @field_validator("policy_loss")
    @classmethod
    def _known_policy_loss(cls, name: str) -> str:
        POLICY_LOSSES.check(name)
        return name

    @field_validator("loss_agg")
    @classmethod
    def _known_loss_agg(cls, mode: str) -> str:
        if mode not in LOSS_AGGREGATIONS:
            raise ValueError(f"choose one of {', '.join(LOSS_AGGREGATIONS)}")
        return mode

    @model_validator(mode="after")
    def _options_apply(self) -> AlgorithmSettings:
        for refused in algorithm_refusals(self):
            raise ConfigError(refused)
        return self

    def advantage_spec(self, kl_coef: float | None = None) -> AdvantageSpec:
        """The estimator's settings; `kl_coef` this step's KL coefficient (None: `kl_coef`)."""
        return AdvantageSpec(
            self.advantage,
            self.norm_std,
            self.std_unbiased,
            self.kl_coef if kl_coef is None else kl_coef,
            self.kl_in_reward,
            1.0 if self.gamma is None else self.gamma,
            1.0 if self.lam is None else self.lam,
        )

    def loss_spec(self, kl_coef: float | None = None) -> LossSpec:
        """The loss the trainers run: the KL (coefficient `kl_coef`, None: `algorithm.kl_coef`) is
        in the loss unless it is in the reward."""
        coef = self.kl_coef if kl_coef is None else kl_coef
        return LossSpec(
            POLICY_LOSSES.qualified(self.policy_loss),
            self.clip_ratio,
            self.clip_ratio_high,
            self.clip_ratio_c,
            0.0 if self.kl_in_reward else coef,
            self.loss_agg,
            self.importance_ratio_cap,
            self.max_new_tokens,
            self.kl_estimator,
            self.entropy_coef,
        )


def group_refusal(algo: AlgorithmSettings) -> str | None:
    """One sample a prompt with an estimator, or dynamic sampling, that compares a prompt's samples."""
    if algo.samples_per_prompt >= 2 or not (algo.advantage in GROUP_ESTIMATORS or algo.dynamic_sampling):
        return None
    compares = (
        "algorithm.dynamic_sampling=true"
        if algo.dynamic_sampling
        else f"algorithm.advantage={algo.advantage}"
    )
    takes_one = ", ".join(name for name in ADVANTAGES.names() if name not in GROUP_ESTIMATORS)
    return (
        f"algorithm.samples_per_prompt={algo.samples_per_prompt}: {compares} compares the samples of one "
        f"prompt: use 2 or more (one sample a prompt suits {takes_one})"
    )


def algorithm_refusals(algo: AlgorithmSettings) -> list[str]:
    """What does not apply to the chosen estimator and loss, each as its one-line refusal."""
    refusals = []
    if (groups := group_refusal(algo)) is not None:
        refusals.append(groups)
    if not algo.norm_std and algo.advantage != "grpo":
        refusals.append(
            f"algorithm.norm_std=false applies to algorithm.advantage=grpo only (got {algo.advantage}): "
            "set algorithm.norm_std=true"
        )
    if not algo.std_unbiased and (algo.advantage != "grpo" or not algo.norm_std):
        refusals.append(
            "algorithm.std_unbiased=false applies to algorithm.advantage=grpo with algorithm.norm_std=true "
            "only: set algorithm.std_unbiased=true"
        )
    if algo.clip_ratio_c is not None and algo.policy_loss != "ppo_clip":
        refusals.append(
            f"algorithm.clip_ratio_c (the dual clip) applies to algorithm.policy_loss=ppo_clip only "
            f"(got {algo.policy_loss}): set algorithm.clip_ratio_c=null"
        )
    if algo.kl_in_reward and algo.kl_estimator != "k3":
        refusals.append(
            f"algorithm.kl_estimator={algo.kl_estimator} applies to the KL in the loss, but "
            "algorithm.kl_in_reward=true puts k1 in the reward: set algorithm.kl_estimator=k3"
        )
    if algo.kl_in_reward and algo.kl_coef == 0:
        refusals.append(
            "algorithm.kl_in_reward=true with algorithm.kl_coef=0 has no KL to put in the reward: set kl_coef > 0"
        )
    if algo.kl_target is not None and algo.kl_coef == 0:
        refusals.append(
            f"algorithm.kl_target={algo.kl_target} adapts a KL coefficient, but algorithm.kl_coef=0 "
            "runs without the reference: set kl_coef > 0 (the starting coefficient) or kl_target=null"
        )
    if algo.max_sampling_rounds > 1 and not algo.dynamic_sampling:
        refusals.append(
            f"algorithm.max_sampling_rounds={algo.max_sampling_rounds} refills the groups dynamic sampling "
            "drops, but algorithm.dynamic_sampling=false: set dynamic_sampling=true or max_sampling_rounds=1"
        )
    if algo.max_sampling_rounds > 1 and algo.max_staleness > 0:
        refusals.append(
            f"algorithm.max_sampling_rounds={algo.max_sampling_rounds} takes the prompts after the step's, "
            f"which the overlapped rollouts of algorithm.max_staleness={algo.max_staleness} already took: "
            "set max_sampling_rounds=1 or max_staleness=0"
        )
    for key in ("gamma", "lam"):
        if getattr(algo, key) is not None and algo.advantage != "gae":
            refusals.append(
                f"algorithm.{key} applies to algorithm.advantage=gae only (got {algo.advantage}): "
                f"set algorithm.{key}=null"
            )
    if algo.overlong_buffer >= algo.max_new_tokens:
        refusals.append(
            f"algorithm.overlong_buffer={algo.overlong_buffer} must be below algorithm.max_new_tokens "
            f"({algo.max_new_tokens}): the penalty covers the last tokens of the budget (0: off)"
        )
    return refusals
