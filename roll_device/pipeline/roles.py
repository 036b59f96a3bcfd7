"""Start the pipeline's worker groups on their planned devices, set up their strategies, and
connect the weight-sync path from `actor_train` to `actor_infer`.

A reference on exactly the trainer's devices with the trainer's strategy, one that can hold a
second model in a process (`TrainStrategy.hosts_reference`: FSDP), runs inside the `actor_train`
workers (`RunPlan.hosted`, pipeline/run_plan.py), as verl's fused actor/reference worker does: no processes of its
own to start (about 2 s of the default job's start-up on 2 cores) or to hold device memory. Its
logprobs come from `RoleGroups.logprobs("reference", ...)` either way; a reference on devices of
its own (`roles.reference.colocate_with=null`) keeps its own workers.

Every call to a group goes through `RoleGroups.wait`, which watches all pending calls of all
roles together and turns the first lost worker (a Ray actor that died) into a `WorkerLostError`
naming its role at once, however long the other calls would still wait; a call that raised
becomes a `WorkerFailedError` (a `WorkerLostError` that keeps the worker's traceback). Either on
one end of a weight sync also aborts the sync, so the survivors are free for a checkpoint. A
worker's own `RollDeviceError` (a refused setting) comes back as itself, without a remote
traceback. `wait`, `watch` and `unwatch` belong to the run's main thread; work in another thread
(the multi-turn rollout thread) waits with `wait_alone` and hands its failure to the main
thread's next wait with `fail_in_background`.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from roll_device.cluster import WorkerGroup, shard
from roll_device.comm import Endpoint, SyncPlan, WeightSyncOptions, abort_sync, sync_actor_options
from roll_device.errors import RollDeviceError, WeightSyncError
from roll_device.graph.guard import step_record
from roll_device.pipeline.config import ENV, REWARD, ROLE_TYPES, TRAINER_TYPES, RunConfig
from roll_device.pipeline.env_worker import EnvWorker
from roll_device.pipeline.output import setup_progress
from roll_device.pipeline.reward_worker import RewardWorker
from roll_device.pipeline.run_plan import SYNC_RECEIVER, SYNC_SENDER, RunPlan
from roll_device.pipeline.sync_split import sync_split
from roll_device.pipeline.worker_base import PipelineWorker
from roll_device.pipeline.workers import CriticWorker, RolloutWorker, TrainWorker
from strategies.base import CRITIC, INFERENCE, TRAIN
from strategies.registry import qualified_name

ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # in Ray's task error headers
SYNC_ENDS = (SYNC_SENDER, SYNC_RECEIVER)


class WorkerLostError(RollDeviceError, RuntimeError):
    """A role worker died during a run (`rank`: which of the role's workers, when known)."""

    exit_code = 1
    worker_alive = False

    def __init__(self, role: str, cause: BaseException, advice: str = "", rank: int | None = None) -> None:
        self.role, self.cause, self.rank = role, cause, rank
        message = self.summary()
        super().__init__(f"{message}; {advice}" if advice else message)

    @property
    def worker(self) -> str:
        """The worker in words: `role 'actor_train' (rank 0)`."""
        return f"role '{self.role}'" + ("" if self.rank is None else f" (rank {self.rank})")

    def summary(self) -> str:
        return f"a worker of {self.worker} died: {death_cause(self.cause)}"

    def advised(self, advice: str) -> WorkerLostError:
        """The same error, its message ending with `advice` (what was kept, how to go on)."""
        return type(self)(self.role, self.cause, advice, rank=self.rank)


# Ray's words for how an actor's process ended (its error's text) -> ours
DEATH_CAUSES = (
    (
        "exits with a connection error",
        "the process was killed (SIGKILL: `kill -9` or the out-of-memory killer) or crashed",
    ),
    ("killed by `ray.kill`", "the process was stopped (ray.kill)"),
    ("running low on memory", "Ray's memory monitor killed the process (its node ran low on memory)"),
    ("because its node", "its node died or left the cluster"),
)


def death_cause(cause: BaseException) -> str:
    """How a worker's process ended, in our words (Ray's full report goes to the worker's log)."""
    if getattr(cause, "preempted", False):
        return "its node was preempted"
    text = str(cause)
    for ray_words, ours in DEATH_CAUSES:
        if ray_words in text:
            return ours
    return f"its process is gone ({first_line(cause)})"


class SetupTimeoutError(WorkerLostError):
    """Roles whose workers did not answer a set-up call within `cluster.setup_timeout_s` (`role`:
    the first of them): alive, perhaps stuck; they are stopped with the run."""

    def __init__(self, roles: list[str], cause=None, advice: str = "", bound_s: float = 0) -> None:
        self.roles, self.bound_s = roles, bound_s
        super().__init__(roles[0], cause or TimeoutError(), advice)

    def summary(self) -> str:
        names = ", ".join(f"'{role}'" for role in self.roles)
        return (
            f"{'role' if len(self.roles) == 1 else 'roles'} {names} did not finish set-up within {self.bound_s:g}s "
            "(cluster.setup_timeout_s): a worker is stuck or the machine is too slow for the bound; "
            "its log is in the run's logs/, raise cluster.setup_timeout_s if it was only slow"
        )

    def advised(self, advice: str) -> WorkerLostError:
        return type(self)(self.roles, self.cause, advice, self.bound_s)


class WorkerFailedError(WorkerLostError):
    """A role worker's call raised (not a refusal: a RollDeviceError comes back as itself). The
    worker lives on, but the run cannot: `traceback` is the worker's own."""

    cause: ray.exceptions.RayTaskError
    worker_alive = True

    def summary(self) -> str:
        raised = self.cause.cause
        if isinstance(raised, ray.exceptions.RayError):  # Ray's stand-in, e.g. for an unpicklable error
            found = raised_in(self.traceback)
            if found is not None:
                return f"a worker of {self.worker} failed ({summarised(*found)})"
        return f"a worker of {self.worker} failed ({first_line(raised)})"

    @property
    def traceback(self) -> str:
        """The worker's call and traceback, as Ray reports them (without terminal colours)."""
        return ANSI_COLOUR.sub("", str(self.cause))


# A first line shorter than SHORT_HEADLINE that ends no sentence is a headline ("1 validation error
# for X"): the next line, which says what, joins it. Summaries longer than SUMMARY_CHARS are cut.
SHORT_HEADLINE = 60
SUMMARY_CHARS = 300
RAISED_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): (.*)$")  # `pkg.mod.Type: message`


def first_line(error: BaseException) -> str:
    """`Type: the first line of the message` (the type alone for an empty message); a headline
    (pydantic's "1 validation error for X") is followed by the line that says what."""
    return summarised(type(error).__name__, str(error))


def raised_in(traceback: str) -> tuple[str, str] | None:
    """(type name, message) of the exception a Python traceback's text ends with, if any."""
    lines = traceback.rstrip().splitlines()
    for index in range(len(lines) - 1, -1, -1):
        found = RAISED_LINE.match(lines[index])
        if found:
            return found.group(1), "\n".join([found.group(2), *lines[index + 1 :]])
    return None


def summarised(type_name: str, message: str) -> str:
    """`first_line` of an error known by its type name and message."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return type_name
    summary = lines[0]
    if len(lines) > 1 and len(summary) < SHORT_HEADLINE and not summary.endswith((".", "!", "?")):
        summary = f"{summary.rstrip(':')}: {lines[1]}"
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 3] + "..."
    return f"{type_name}: {summary}"


WAIT_SLICE_S = 1.0  # how often a wait returns to Python (where Ctrl-C is raised)


@contextmanager
def watching(role: str, rank: int | None = None) -> Iterator[None]:
    """Turn the loss of `role`'s worker `rank` into a WorkerLostError naming both, a worker's
    refusal (a RollDeviceError raised remotely) into that error, and any other error a worker
    raised into a WorkerFailedError."""
    try:
        yield
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
        raise WorkerLostError(role, exc, rank=rank) from exc
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, RollDeviceError):
            raise exc.cause from None
        raise WorkerFailedError(role, exc, rank=rank) from exc


def ranks(ref_lists) -> dict[Any, int]:
    """Each call's worker rank: a role's calls are issued one per worker, in rank order (rank 0
    alone for `async_call_rank0`)."""
    return {ref: rank for refs in ref_lists for rank, ref in enumerate(refs)}


@dataclass
class RoleGroups:
    groups: dict[str, WorkerGroup]
    sync: SyncPlan
    options: WeightSyncOptions
    dp_ranks: dict[str, list[int]] = field(default_factory=dict)  # per trainer role, by worker
    endpoints: list[Endpoint] = field(default_factory=list)  # the senders' control stores, once connected
    hosted: dict[str, str] = field(default_factory=dict)  # a role run inside another's workers
    base_reference: bool = False  # the reference is the LoRA policy's base (`reference_from_base`)
    watched: dict[Any, tuple[str, int]] = field(default_factory=dict)  # background calls -> (role, rank)
    background_failure: RollDeviceError | None = None  # a watched call's, raised by the next wait
    bound_s: float | None = None  # while set (the set-up), how long one wait may take
    failure_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def has(self, role: str) -> bool:
        return role in self.groups or role in self.hosted or (role == "reference" and self.base_reference)

    def logprobs(self, role: str, batch) -> list:
        """Per-token logprobs of `batch` from trainer role `role`, one part per data-parallel
        rank; a hosted reference answers from its host's workers, a LoRA policy's base from the
        policy's workers with the adapters disabled."""
        if role == "reference" and self.base_reference:
            return self.data_parallel("actor_train", TrainWorker.base_logprobs, batch)
        host = self.hosted.get(role)
        if host is None:
            return self.data_parallel(role, TrainWorker.logprobs, batch)
        return self.data_parallel(host, TrainWorker.reference_logprobs, batch)

    def data_parallel_size(self, role: str) -> int:
        """How many data-parallel ranks trainer role `role` has."""
        return max(self.dp_ranks[role]) + 1

    def data_parallel(self, role: str, method: Callable, batch, *args: Any) -> list:
        """Call `method` with each worker's data-parallel shard of `batch` (ranks of one
        model-parallel group get the same rows); one result per data-parallel rank, in order."""
        ranks = self.dp_ranks[role]
        parts = shard(batch, self.data_parallel_size(role))
        results = self.scatter(role, method, [parts[r] for r in ranks], *args)
        first = {}
        for rank, result in zip(ranks, results):
            first.setdefault(rank, result)
        return [first[r] for r in sorted(first)]

    def call(self, role: str, method: Callable, *args: Any, **kwargs: Any) -> list:
        return self.wait({role: self.groups[role].async_call_all(method, *args, **kwargs)})[role]

    def scatter(self, role: str, method: Callable, shards: list, *args: Any) -> list:
        return self.wait({role: self.groups[role].async_scatter(method, shards, *args)})[role]

    def wait(
        self, refs_by_role: dict[str, list], on_ready: Callable[[str], None] | None = None
    ) -> dict[str, list]:
        """Results of several roles' calls issued together, in order per role; `on_ready(role)`
        as each call finishes. The first call that fails ends the wait: a lost worker as a
        WorkerLostError naming its role. Calls in flight in the background (`watch`) are watched
        too: one that failed ends the next wait, once this one's calls are done (they run on
        other workers; the step they finish is then kept)."""
        self.raise_background_failure()
        return self._await(refs_by_role, on_ready, main_thread=True)

    def wait_alone(self, role: str, refs: list) -> list:
        """The results of `role`'s calls `refs` (one per worker, in rank order), a lost or failed
        worker raised as in `wait`; unlike `wait` it reads none of the watch state (`watch`,
        `background_failure`, `bound_s`, which belong to the main thread), so another thread may
        call it."""
        return self._await({role: refs}, None, main_thread=False)[role]

    def _await(
        self, refs_by_role: dict[str, list], on_ready: Callable[[str], None] | None, main_thread: bool
    ) -> dict[str, list]:
        """The wait loop of `wait` and `wait_alone`; the main thread's also watches the background
        calls and keeps to the set-up's bound."""
        role_of = {ref: role for role, refs in refs_by_role.items() for ref in refs}
        rank_of = ranks(refs_by_role.values())
        pending = set(role_of)
        bound_s = self.bound_s if main_thread else None
        deadline = None if bound_s is None else time.monotonic() + bound_s
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                raise SetupTimeoutError(sorted({role_of[ref] for ref in pending}), bound_s=bound_s)
            watched = [ref for ref in self.watched if ref not in role_of] if main_thread else []
            ready, _ = ray.wait([*pending, *watched], num_returns=1, timeout=WAIT_SLICE_S)
            for ref in ready:
                if ref not in pending:
                    self._check_background(ref)
                    continue
                pending.discard(ref)
                with watching(role_of[ref], rank_of[ref]):
                    ray.get(ref)
                if on_ready is not None:
                    on_ready(role_of[ref])
        return {role: ray.get(refs) for role, refs in refs_by_role.items()}

    def watch(self, role: str, refs: list) -> None:
        """Watch `role`'s calls `refs`, running in the background, during every wait."""
        self.watched.update({ref: (role, rank) for ref, rank in ranks([refs]).items()})

    def unwatch(self, refs: list) -> None:
        for ref in refs:
            self.watched.pop(ref, None)

    def _check_background(self, ref) -> None:
        role, rank = self.watched.pop(ref)
        try:
            with watching(role, rank):
                ray.get(ref)
        except RollDeviceError as failed:
            self.fail_in_background(failed)

    def raise_background_failure(self) -> None:
        """Raise (once) the error of a background call that failed."""
        with self.failure_lock:
            failed, self.background_failure = self.background_failure, None
        if failed is not None:
            raise failed

    def fail_in_background(self, failed: RollDeviceError) -> None:
        """A failure of work in another thread (the multi-turn rollout thread,
        roll_device/pipeline/rollout_thread.py): the main thread's next wait raises it."""
        with self.failure_lock:
            self.background_failure = self.background_failure or failed

    def sync_weights(self, version: int) -> dict:
        """Trainer rank 0 (or, sharded, every trainer rank) -> every rollout worker; returns the
        senders' stats, merged, with where the time went (`sync_split.py`), and the engines' graph
        guard (`graph_guard`: graphs checked against eager after the update,
        roll_device/graph/guard.py). A worker lost or failed on either end, or a sync that failed
        there, aborts the sync for the other end."""
        try:
            done = self.wait(
                {
                    "actor_train": self.groups["actor_train"].async_call_all(
                        TrainWorker.send_weights, version
                    ),
                    "actor_infer": self.groups["actor_infer"].async_call_all(RolloutWorker.receive_weights),
                }
            )
        except (WorkerLostError, WeightSyncError) as failed:  # free the other end's waits
            reason = failed.summary() if isinstance(failed, WorkerLostError) else str(failed)
            for endpoint in self.endpoints:
                abort_sync(endpoint, reason)
            raise
        return {
            **sync_split([s for s in done["actor_train"] if s is not None], done["actor_infer"]),
            "graph_guard": step_record([r["graph_guard"] for r in done["actor_infer"]]),
        }

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.kill()


# the worker class of each role type (pipeline/config.py's ROLE_TABLE gives each role its type)
WORKER_OF = {
    INFERENCE: RolloutWorker,
    TRAIN: TrainWorker,
    REWARD: RewardWorker,
    CRITIC: CriticWorker,
    ENV: EnvWorker,
}


def start_roles(
    config: RunConfig,
    plan: RunPlan,
    model_path: str,
    log_dir: Path | None = None,
    tool_format: str | None = None,
) -> RoleGroups:
    """Start and set up every planned role (their output in `log_dir` when given); connect the
    weight sync. `tool_format`: the chat template's tool-call format, for the env workers."""
    roles = RoleGroups(
        _start_groups(config, plan),
        plan.sync,
        config.weight_sync,
        hosted=plan.hosted,
        base_reference=config.reference_from_base,
    )
    roles.bound_s = config.cluster.setup_timeout_s
    # each worker runs its calls in order: the capture comes first, and nothing waits for it here
    capture = {
        role: group.async_call_all(PipelineWorker.capture_output, str(log_dir))
        for role, group in roles.groups.items()
        if log_dir is not None
    }
    workers = {role: roles.groups[plan.hosted.get(role, role)].world_size for role in plan.roles}
    try:  # the bar spans the whole set-up: rendezvous, set-up calls, the sync's connection
        with setup_progress(workers) as ready:
            setups = _start_setups(config, plan, roles, model_path)
            if "env" in roles.groups:
                setups["env"] = roles.groups["env"].async_call_all(
                    EnvWorker.setup, config.agentic.host(tool_format)
                )
            done = roles.wait(setups, on_ready=ready)
            roles.wait(capture)
            roles.dp_ranks = {role: done[role] for role in done if ROLE_TYPES[role] in TRAINER_TYPES}
            _connect_sync(config, plan, roles)
    except BaseException:
        roles.shutdown()  # the workers that did start
        raise
    roles.bound_s = None  # the steps' calls take as long as they take
    return roles


def _start_groups(config: RunConfig, plan: RunPlan) -> dict[str, WorkerGroup]:
    """A worker group per role with workers of its own (not a hosted one); the sync's two ends
    get the sync path's Ray options."""
    sync_ends = {"ray_options": sync_actor_options(config.weight_sync.path)}
    return {
        role: WorkerGroup(
            plan.placement, role, WORKER_OF[ROLE_TYPES[role]], **(sync_ends if role in SYNC_ENDS else {})
        )
        for role in plan.roles
        if role not in plan.hosted
    }


def unfinished(refs_by_role: dict[str, list]) -> set[str]:
    """The roles with a call in `refs_by_role` that has not returned yet."""
    return {
        role
        for role, refs in refs_by_role.items()
        if len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs)
    }


def _start_setups(config: RunConfig, plan: RunPlan, roles: RoleGroups, model_path: str) -> dict[str, list]:
    """Every role's set-up calls, in flight: a trainer role's after its rank 0 named the
    rendezvous; a hosted role's in its host's workers, after the host's own set-up."""
    groups = roles.groups
    setups = {
        "actor_infer": groups["actor_infer"].async_call_all(
            RolloutWorker.setup,
            model_path,
            qualified_name(INFERENCE, config.roles.actor_infer.strategy),
            config.rollout,
            plan.sync.path,
            config.trainer.lora if config.trainer.lora.on else None,
            config.trainer.routing_replay,
        ),
        "reward": groups["reward"].async_call_all(
            RewardWorker.setup, config.roles.reward.strategy, config.reward, config.data.task
        ),
    }
    trainer = qualified_name(TRAIN, config.trainer.name)
    for role in (role for role in groups if ROLE_TYPES[role] in TRAINER_TYPES):
        call_rank0 = groups[role].async_call_rank0(TrainWorker.get_master_addr_port)
        try:
            master = roles.wait({role: [call_rank0]})[role][0]
        except SetupTimeoutError as slow:  # the set-ups already in flight may be the stuck ones
            raise SetupTimeoutError(
                sorted(set(slow.roles) | unfinished(setups)), bound_s=slow.bound_s
            ) from None
        setups[role] = groups[role].async_call_all(
            TrainWorker.setup,
            config.model_path_of(role, model_path),
            qualified_name(ROLE_TYPES[role], config.roles.present()[role].strategy),
            config.strategy_settings(role),
            master,
        )
    for role, host in plan.hosted.items():  # a worker runs its calls in order
        setups[role] = groups[host].async_call_all(
            TrainWorker.setup_reference, model_path, trainer, config.trainer
        )
    return setups


def _connect_sync(config: RunConfig, plan: RunPlan, roles: RoleGroups) -> None:
    """Open the sender on the trainer's workers and connect every process of every engine."""
    groups, options = roles.groups, config.weight_sync
    engine_size = plan.strategy("actor_infer").engine_size(config.rollout)  # every engine process receives
    opened = roles.wait(
        {
            "actor_train": groups["actor_train"].async_call_all(
                TrainWorker.open_sender,
                plan.sync,
                plan.sync_nodes(engine_size),
                options,
                None if config.rollout.dtype == "auto" else config.rollout.dtype,
            )
        }
    )["actor_train"]
    roles.endpoints = [endpoint for endpoint in opened if endpoint is not None]  # rank order
    # several senders: every trainer rank sends its slices, and every engine joins each of them
    joins = roles.endpoints if len(roles.endpoints) > 1 else roles.endpoints[0]
    roles.wait(
        {
            "actor_train": groups["actor_train"].async_call_all(TrainWorker.connect_sender),
            "actor_infer": groups["actor_infer"].async_call_all(
                RolloutWorker.connect_receiver, joins, options.timeout_s
            ),
        }
    )
