"""The run's configuration, typed once: `RunConfig`, the frozen result of reading the composed
config (roll_device/commands/gate.py composes it and reads it; everything after gets this).

Each section's type is owned by the code that consumes it: `cluster` and `roles` by the cluster
layer, `weight_sync` by comm, `data`, `reward` and `eval` by the inputs, `trainer` and `rollout`
by the strategy their `name` registers (strategies/registry.py), `logger`, `tracking` and
`profile` by roll_device/tracking, `algorithm` by roll_device/pipeline/algorithm_settings.py, and
the run's own keys, `model` and `experiment`, here. What crosses sections is checked here, once:
which role runs which kind of strategy, batch splits across workers, model-parallel layouts, the
context length, the reference the KL term needs, and a reward the data can be scored with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializeAsAny,
    StrictBool,
    StrictInt,
    create_model,
    field_validator,
    model_validator,
)

from roll_device.agentic.settings import AgenticSettings
from roll_device.cluster.settings import ClusterSettings, RoleSettings, check_colocation, owner, read_cluster
from roll_device.comm.options import WeightSyncOptions
from roll_device.errors import ConfigError
from roll_device.inputs.settings import MODEL, REWARD_STRATEGIES, DataSettings, EvalSettings, RewardSettings
from roll_device.pipeline.algorithm_settings import AlgorithmSettings
from roll_device.settings import Count, NonNegative, OpenSection, Section, Seed, read_section, takes_new_key
from roll_device.tracking.registry import check_names
from roll_device.tracking.settings import ProfileSettings, TrackingSettings
from strategies.base import CRITIC, INFERENCE, TRAIN
from strategies.inference.settings import RolloutSettings
from strategies.registry import names, strategy_type
from strategies.training.settings import CriticSettings, TrainSettings

REWARD = "reward"  # the role type of reward workers (the pipeline's own, no strategy registry)
ENV = "env"  # the role type of environment workers (the pipeline's own, roll_device/agentic)
# the section a role type's strategy reads (the critic: the trainer's, with `critic`'s own keys)
SECTION_OF = {INFERENCE: "rollout", TRAIN: "trainer", CRITIC: "trainer"}
TRAINER_TYPES = (TRAIN, CRITIC)  # role types whose workers form a torch.distributed world of their own


@dataclass(frozen=True)
class RoleEntry:
    """One role of the pipeline: the type of strategy its workers run, and whether a run needs it."""

    role_type: str
    required: bool = True


# The pipeline's table of roles. A new role (a critic, environment workers) is one entry here: the
# `roles` section gets its key, the plan places it, and pipeline/roles.py starts it with the worker
# class of its role type.
ROLE_TABLE = {
    "actor_infer": RoleEntry(INFERENCE),
    "actor_train": RoleEntry(TRAIN),
    "reference": RoleEntry(TRAIN, required=False),
    "reward": RoleEntry(REWARD),
    "critic": RoleEntry(CRITIC, required=False),
    "env": RoleEntry(ENV, required=False),
}
ROLE_TYPES = {role: entry.role_type for role, entry in ROLE_TABLE.items()}
REQUIRED_ROLES = tuple(role for role, entry in ROLE_TABLE.items() if entry.required)
OWN_STRATEGIES = {REWARD: REWARD_STRATEGIES, ENV: ("python",)}  # the pipeline's own role types
RESUME_CHOICES = (True, False, "latest_valid")


# transformers' apply_chat_template's own parameters (a test compares): not the template's variables
RENDERING_ARGUMENTS = (
    "conversation",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


class ModelSettings(Section):
    path: str | None = Field(description="a Hugging Face model directory, or null for the tiny model")
    tiny_dir: str
    tiny_layers: Count
    tiny_hidden: Annotated[StrictInt, Field(ge=32, description="attention heads need 32 dims or more")]
    # a default: run folders written before the key was added still read
    tiny_architecture: Literal["qwen2", "qwen3", "qwen3_moe"] = Field(
        default="qwen2",
        description="the tiny model's transformers architecture (qwen3_moe: 8 experts, top-2)",
    )
    chat_template: StrictBool
    chat_template_kwargs: dict[str, Any] = Field(  # a default: run folders written before it still read
        default_factory=dict,
        description="the chat template's variables (verl's apply_chat_template_kwargs; Qwen3's enable_thinking)",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = [key for key in kwargs if key in RENDERING_ARGUMENTS]
        if taken:
            raise ValueError(
                f"{', '.join(taken)} is an argument of the rendering itself, which the run sets: give the "
                "template's own variables only (enable_thinking, ...)"
            )
        return kwargs


class ExperimentSettings(OpenSection):
    name: str


class _Roles(Section):
    """The pipeline's roles (`roles.<role>=null` drops one), one key per entry of `ROLE_TABLE`."""

    @model_validator(mode="after")
    def _colocation(self) -> _Roles:
        roles = self.present()
        for role in REQUIRED_ROLES:  # by its own name, before another role's colocate_with names it
            if role not in roles:
                raise ConfigError(f"roles.{role} is missing: the GRPO pipeline needs it")
        check_colocation(roles)
        return self

    def present(self) -> dict[str, RoleSettings]:
        """The roles that run, by name, in declaration order."""
        return {name: role for name in type(self).model_fields if (role := getattr(self, name)) is not None}

    def without(self, name: str) -> RolesSettings:
        """These roles less `name`."""
        return self.model_copy(update={name: None})


RolesSettings = create_model(
    "RolesSettings",
    __base__=_Roles,
    __doc__=_Roles.__doc__,
    **{role: (RoleSettings | None, ...) for role in ROLE_TABLE},
)


def _strategy_section(role_type: str, values: Any) -> Any:
    """The `trainer` or `rollout` section as the type its `name`'s strategy reads."""
    section = SECTION_OF[role_type]
    if isinstance(values, TrainSettings | RolloutSettings):
        return values
    name = (values or {}).get("name")
    if name not in names(role_type):
        raise ConfigError(f"{section}.name={name!r}: choose one of {', '.join(names(role_type))}")
    return read_section(strategy_type(role_type, name).settings_cls, values, section)


class RunConfig(Section):
    """The top level: the run's own keys and every section."""

    seed: Seed
    max_steps: Annotated[StrictInt, Field(ge=1, description="a run needs at least one step")]
    resume: Literal[RESUME_CHOICES] = Field(
        description="latest_valid: the newest checkpoint that passes its checks"
    )
    save_every: Annotated[NonNegative, Field(description="0 checkpoints only at the end")]
    keep_checkpoints: Count | None = Field(description="the newest N checkpoints are kept; null: all")
    overwrite: StrictBool = Field(description="a new run replaces the checkpoints in its folder")
    model: ModelSettings
    roles: RolesSettings
    weight_sync: WeightSyncOptions
    data: DataSettings
    reward: RewardSettings
    eval: EvalSettings
    algorithm: AlgorithmSettings
    critic: CriticSettings
    experiment: ExperimentSettings
    cluster: ClusterSettings
    trainer: SerializeAsAny[TrainSettings]
    rollout: SerializeAsAny[RolloutSettings]
    logger: list[str] = Field(description="trackers beside metrics.jsonl, docs/observability.md")
    tracking: TrackingSettings
    profile: ProfileSettings
    # a default: run folders written before the section was added still read
    agentic: AgenticSettings = Field(default_factory=AgenticSettings)

    @field_validator("logger")
    @classmethod
    def _known_loggers(cls, names: list[str]) -> list[str]:
        return check_names(names)

    @field_validator("cluster", mode="before")
    @classmethod
    def _cluster_by_name(cls, values: Any) -> ClusterSettings:
        return read_cluster(values)

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_by_name(cls, values: Any) -> TrainSettings:
        return _strategy_section(TRAIN, values)

    @field_validator("rollout", mode="before")
    @classmethod
    def _rollout_by_name(cls, values: Any) -> RolloutSettings:
        return _strategy_section(INFERENCE, values)

    @model_validator(mode="after")
    def _across_sections(self) -> RunConfig:
        if self.resume and self.overwrite:
            raise ConfigError(
                f"resume={self.resume} continues the checkpoints that overwrite=true would replace: "
                "set only one of them"
            )
        self._check_roles()
        self._check_critic()
        self._check_sizes()
        self._check_overlap()
        self._check_trainer_loss()
        self.trainer.scheduled(self.optimizer_steps)  # a warmup that leaves the cosine no step
        self._check_profile()
        self._check_agentic()
        self.reward.check_with(self.data, self.roles.reward.strategy)
        return self

    # ---- what the run derives from it ----------------------------------------------------------
    def roles_to_run(self) -> RolesSettings:
        """The roles that start: the reference only when the KL term needs its logprobs and the
        policy trains every parameter (a LoRA policy's reference is its own base,
        `reference_from_base`: no model of its own)."""
        if self.algorithm.kl_coef == 0 or self.trainer.lora.on:
            return self.roles.without("reference")
        return self.roles

    @property
    def reference_from_base(self) -> bool:
        """Whether the KL term's reference logprobs come from the LoRA policy with its adapters
        disabled (the base model it trains adapters on), in the `actor_train` workers."""
        return self.algorithm.kl_coef > 0 and self.trainer.lora.on

    def strategy_settings(self, role: str) -> TrainSettings | RolloutSettings | None:
        """The section `role`'s strategy is started with (None for the reward role); a trainer's
        learning-rate schedule spans the run's optimizer steps unless it says otherwise, and the
        critic's is the trainer's with the `critic` section's optimizer settings."""
        section = SECTION_OF.get(ROLE_TYPES[role])
        settings = None if section is None else getattr(self, section)
        if isinstance(settings, TrainSettings):
            settings = settings.scheduled(self.optimizer_steps)
        return self.critic.applied_to(settings) if ROLE_TYPES[role] == CRITIC else settings

    @property
    def optimizer_steps(self) -> int:
        """A trainer's optimizer steps over the run (at most: DAPO's small batches take fewer)."""
        return self.max_steps * self.algorithm.ppo_epochs * self.algorithm.mini_batches

    def model_path_of(self, role: str, policy_path: str) -> str:
        """The checkpoint `role` starts from: the policy's (`policy_path`), or the critic's own."""
        return (self.critic.model_path if ROLE_TYPES[role] == CRITIC else None) or policy_path

    @property
    def eval_max_new_tokens(self) -> int:
        return self.eval.max_new_tokens or self.algorithm.max_new_tokens

    # ---- rules across sections ---------------------------------------------------------------
    def _check_roles(self) -> None:
        for role, spec in self.roles.present().items():
            self._check_strategy(role, spec)

    def _check_strategy(self, role: str, spec: RoleSettings) -> None:
        role_type = ROLE_TYPES[role]
        if role_type in OWN_STRATEGIES:
            if spec.strategy not in OWN_STRATEGIES[role_type]:
                raise ConfigError(
                    f"roles.{role}.strategy='{spec.strategy}' is unknown: choose "
                    f"{', '.join(OWN_STRATEGIES[role_type])}"
                )
            return
        if spec.strategy not in names(role_type):
            raise ConfigError(
                f"roles.{role}.strategy='{spec.strategy}' is unknown for {role_type}: choose one of "
                f"{', '.join(names(role_type))}"
            )
        section = SECTION_OF[role_type]
        configured = getattr(self, section).name
        if spec.strategy != configured:
            raise ConfigError(
                f"roles.{role}.strategy='{spec.strategy}' but the {section} section is {configured}'s: "
                f"choose {section}={spec.strategy} (its roles then follow), or roles.{role}.strategy={configured}"
            )

    def _check_critic(self) -> None:
        """gae needs the critic's values, and a critic is there for gae."""
        has_critic, advantage = self.roles.critic is not None, self.algorithm.advantage
        if advantage == "gae" and not has_critic:
            raise ConfigError(
                "algorithm.advantage=gae needs a critic's values: configure roles.critic (algorithm=ppo "
                "does), or choose another algorithm.advantage"
            )
        if has_critic and advantage != "gae":
            raise ConfigError(
                f"roles.critic is configured but algorithm.advantage={advantage} does not use its values: "
                "set algorithm.advantage=gae, or roles.critic=null"
            )

    def engine_sizes(self) -> dict[str, int]:
        """The devices each worker of a role holds where more than one: a rollout engine's
        (`InferenceStrategy.engine_size`, e.g. vLLM's tensor_parallel_size)."""
        infer = self.roles_to_run().present().get("actor_infer")
        if infer is None or infer.strategy not in names(INFERENCE):
            return {}
        return {"actor_infer": strategy_type(INFERENCE, infer.strategy).engine_size(self.rollout)}

    def _check_mini_batches(self, role: str, rows: int, replicas: int) -> None:
        """Each of `algorithm.mini_batches` parts of the batch's `rows` gives each of `role`'s
        data-parallel replicas a row."""
        count = self.algorithm.mini_batches
        if rows < count * replicas:
            raise ConfigError(
                f"algorithm.mini_batches={count} cuts the batch of {rows} sequences into {count} parts, but "
                f"each part needs a row for each of the {replicas} {role} replicas: set mini_batches <= "
                f"{rows // replicas}, or raise data.prompts_per_step"
            )

    def _check_sizes(self) -> None:
        prompts, samples = self.data.prompts_per_step, self.algorithm.samples_per_prompt
        roles = self.roles_to_run().present()
        devices, engine = roles["actor_infer"].num_devices, self.engine_sizes().get("actor_infer", 1)
        if devices % engine:
            raise ConfigError(
                f"roles.actor_infer.num_devices={devices} is not a multiple of the {engine} devices of one "
                f"engine (rollout.tensor_parallel_size): set it to engines x {engine}"
            )
        infer = devices // engine
        if prompts % infer:
            raise ConfigError(
                f"data.prompts_per_step={prompts} does not split across {infer} actor_infer workers: "
                f"make it a multiple of the engines (roles.actor_infer.num_devices / engine devices)"
            )
        per_replica = self.trainer.model_parallel_size
        for role in ("actor_train", "reference", "critic"):
            if role not in roles:
                continue
            workers = roles[role].num_devices
            if (prompts * samples) % workers:
                raise ConfigError(
                    f"the batch of {prompts * samples} sequences (data.prompts_per_step x "
                    f"algorithm.samples_per_prompt) does not split across {workers} {role} workers: "
                    f"make it a multiple of roles.{role}.num_devices"
                )
            if workers % per_replica:
                raise ConfigError(
                    f"roles.{role}.num_devices={workers} is not a multiple of "
                    f"{self.trainer.model_parallel_layout()}: every model replica needs that many workers"
                )
            if role != "reference":  # the reference takes no optimizer step
                self._check_mini_batches(role, prompts * samples, workers // per_replica)
        longest = self.data.prompt_length + 1 + self.algorithm.max_new_tokens
        if longest > self.rollout.max_model_len:
            raise ConfigError(
                f"prompt ({self.data.prompt_length + 1}) + algorithm.max_new_tokens "
                f"({self.algorithm.max_new_tokens}) exceeds rollout.max_model_len ({self.rollout.max_model_len})"
            )
        self.trainer.check_longest_sample(longest, "data.prompt_length + 1 + algorithm.max_new_tokens")
        if self.algorithm.kl_coef > 0 and "reference" not in roles and not self.reference_from_base:
            raise ConfigError(
                f"algorithm.kl_coef={self.algorithm.kl_coef} needs reference logprobs: configure "
                "roles.reference, or set algorithm.kl_coef=0"
            )

    def _check_trainer_loss(self) -> None:
        lacks = self.trainer.lacks_entropy_gradient
        if self.algorithm.entropy_coef > 0 and lacks:
            raise ConfigError(
                f"algorithm.entropy_coef={self.algorithm.entropy_coef} needs the entropy's gradient, "
                f"but {lacks}: set algorithm.entropy_coef=0, or use trainer=fsdp"
            )

    def _check_profile(self) -> None:
        refused = profile_refusal(self.profile, self.max_steps, self.roles_to_run().present())
        if refused:
            raise ConfigError(refused)

    def _check_agentic(self) -> None:
        """An environment needs env workers (and they one), known names, a budget that fits the
        context; the step's parts that are single-turn only are refused with one."""
        agentic, has_env = self.agentic, self.roles.env is not None
        agentic.check_names()
        if agentic.on != has_env:
            fix = "configure roles.env (experiment=agentic_game does)" if agentic.on else "set roles.env=null"
            raise ConfigError(
                f"agentic.environment={agentic.environment} but roles.env is "
                f"{'configured' if has_env else 'null'}: {fix}"
            )
        if not agentic.on:
            return
        agentic.check_budget(self.rollout.max_model_len)
        self.trainer.check_longest_sample(
            agentic.max_prompt_tokens + agentic.max_total_tokens,
            "agentic.max_prompt_tokens + agentic.max_total_tokens",
        )
        single_turn = {  # key: (value, the value that turns it off)
            "algorithm.dynamic_sampling": (self.algorithm.dynamic_sampling, "false"),
            "eval.every_n_steps": (self.eval.every_n_steps, 0),
            "roles.reward.strategy": (self.roles.reward.strategy == MODEL and MODEL, "rule"),
        }
        for key, (value, off) in single_turn.items():
            if value:
                raise ConfigError(
                    f"{key}={str(value).lower()} is single-turn only: with agentic.environment="
                    f"{agentic.environment} set {key}={off}"
                )

    def _check_overlap(self) -> None:
        staleness = self.algorithm.max_staleness
        roles = self.roles.present()
        if staleness > 0 and owner("actor_infer", roles) == owner("actor_train", roles):
            raise ConfigError(
                f"algorithm.max_staleness={staleness} overlaps rollout and training, but actor_infer "
                "and actor_train share devices (colocate_with): set algorithm.max_staleness=0, or "
                "give the two roles devices of their own"
            )


def profile_refusal(profile: ProfileSettings, max_steps: int, roles: Mapping[str, RoleSettings]) -> str:
    """Why `profile` cannot be recorded in a run of `max_steps` steps of `roles` ("" when it can)."""
    if not profile.enabled:
        return ""
    beyond = [step for step in profile.steps if step > max_steps]
    if beyond:
        return (
            f"profile.steps={profile.steps}: step {beyond[0]} is beyond max_steps={max_steps}: profile steps "
            f"1 to {max_steps}"
        )
    missing = [role for role in profile.roles if role not in roles]
    if missing:
        return (
            f"profile.roles={profile.roles}: this run starts no {missing[0]} role: profile some of "
            f"{', '.join(roles)}"
        )
    return ""


def accepts_new_key(key: str, chosen: Mapping[str, str]) -> bool:
    """Whether `+key=...` adds a key the run's configuration reads: one inside an open section or
    a free mapping. `chosen` names the trainer and the rollout (whose types their sections are)."""
    first, *rest = key.split(".")
    for role_type, section in SECTION_OF.items():
        if first == section:
            if chosen.get(section) not in names(role_type):
                return False
            return takes_new_key(strategy_type(role_type, chosen[section]).settings_cls, rest)
    field = RunConfig.model_fields.get(first)
    return field is not None and takes_new_key(field.annotation, rest)
