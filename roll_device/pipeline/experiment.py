"""Run one experiment: make the model if needed, connect the cluster, plan and start the roles,
run GRPO steps with a progress bar, checkpoint, and write metrics and plots (metrics.png,
memory.png). Rollouts run ahead of training as far as `algorithm.max_staleness` allows
(roll_device/pipeline/overlap.py). Each record also goes to the trackers `logger` names, with
each role's memory per phase; `profile.steps` are profiled in `profile.roles`' workers
(roll_device/pipeline/observe.py, docs/observability.md).

`run_experiment(config, run_dir, model, start=None, on_step=None)` runs the checked configuration
on the model directory `model` (`model_path(config.model)`: the tiny model is made there): the
commands' gate (roll_device/commands/gate.py) checked it and found `start`, the checkpoint a
resumed run continues from, before anything was written. `on_step(record, roles)` is called
after each step (for custom logging or fault drills). A lost worker of any role ends the run with a `WorkerLostError` (a worker
call that raised: a `WorkerFailedError`, its traceback in the run's logs/), Ctrl-C with a
`RunInterruptedError` (SIGTERM, where the command made it an interrupt, with a
`RunTerminatedError`), a user reward function that raises or returns a reward that is not finite
with a `RewardFunctionError` (with the offending sample), a policy update the trainer refused as
not finite with a `NonFiniteUpdateError` (naming the step), a weight sync that fails with a
`WeightSyncError`; each says which checkpoint to resume from and how. The last finished step is
checkpointed first whenever the trainer still holds exactly it, so nothing is lost. A new run
(no `start`) first removes the checkpoints an earlier run left in `run_dir` (the gate let them
be replaced: `overwrite=true`). With
`eval.every_n_steps` set, pass@1 on the held-out prompts (greedy by default) is measured before
the first step, every N steps and after the last.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from roll_device.agentic.chat import ChatRenderer
from roll_device.agentic.environment import EnvironmentFaultError
from roll_device.cluster import read_inventory, start_cluster
from roll_device.cluster.placement import release
from roll_device.cluster.submit import SUBMITTED_TO_ENV
from roll_device.doctor.preflight import preflight
from roll_device.errors import RollDeviceError, WeightSyncError
from roll_device.files import make_folder
from roll_device.graph.guard import EAGER, RECAPTURED
from roll_device.inputs.loading import RunInputs, load_inputs, load_tokenizer, read_data
from roll_device.inputs.prompts import PromptEncoder
from roll_device.inputs.rewards import RewardFunctionError
from roll_device.pipeline.agentic_step import AgenticStep, chat_renderer
from roll_device.pipeline.config import ModelSettings, RunConfig
from roll_device.pipeline.evaluation import eval_sampling, evaluate
from roll_device.pipeline.generations import GenerationsLog
from roll_device.pipeline.interrupts import how_stopped
from roll_device.pipeline.loop import Collected, GrpoStep
from roll_device.pipeline.metrics import PASS_KEY, MetricsLog
from roll_device.pipeline.observe import RunObserver, open_trackers
from roll_device.pipeline.output import LOG_DIR, append_report, quiet_driver, summarise_worker_logs
from roll_device.pipeline.overlap import Rollout, RolloutQueue
from roll_device.pipeline.roles import (
    RoleGroups,
    SetupTimeoutError,
    WorkerFailedError,
    WorkerLostError,
    start_roles,
)
from roll_device.pipeline.run_plan import RunPlan, build_run_plan
from roll_device.pipeline.state import CHECKPOINTED, RUN_CONFIG_FILE, Checkpoints, PipelineState, ResumePoint
from roll_device.pipeline.step_plan import step_plan
from roll_device.pipeline.workers import TrainWorker
from roll_device.tracking.memory import plot_memory
from roll_device.tracking.registry import Trackers
from strategies.base import NonFiniteUpdateError


def model_path(model: ModelSettings) -> str:
    """`model.path` (checked by the gate), or the tiny model made locally."""
    if model.path:
        return model.path
    from roll_device.models.tiny import make_tiny_model

    tiny_dir = make_folder(model.tiny_dir, "model.tiny_dir")
    sizes = {"num_layers": model.tiny_layers, "hidden_size": model.tiny_hidden}
    return str(make_tiny_model(tiny_dir, architecture=model.tiny_architecture, **sizes))


class Run:
    """The state of one run: checkpoints, metrics, and the roles it drives."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        roles: RoleGroups,
        inputs: RunInputs,
        trackers: Trackers,
        renderer: ChatRenderer | None = None,
    ) -> None:
        self.config, self.run_dir, self.roles, self.inputs = config, run_dir, roles, inputs
        self.checkpoints = Checkpoints(run_dir)
        self.metrics, self.generations = MetricsLog(run_dir), GenerationsLog(run_dir)
        self.observer = RunObserver(config, run_dir, roles, trackers)
        # multi-turn trajectories with an environment (`renderer`: its chat template), else GRPO's step
        self.step = (
            GrpoStep(config, roles, inputs)
            if renderer is None
            else AgenticStep(config, roles, inputs, renderer)
        )
        self.state = PipelineState()
        self.saved_step = 0
        self.last_step = inputs.last_step

    def begin(self, start: ResumePoint | None) -> None:
        """Continue from checkpoint `start`, or start afresh (dropping the records an earlier
        run left in this directory: each step is recorded once)."""
        if start is None:
            self.metrics.clear()
            self.generations.clear()
        else:
            self.restore(*start)

    def restore(self, path: Path, state: PipelineState) -> None:
        self.state = state
        self.saved_step = state.step
        for role, folder in self.checkpointed():
            self.roles.call(role, TrainWorker.load, str(path / folder))
        self.metrics.truncate_after(state.step)
        self.generations.truncate_after(state.step)
        self.roles.sync_weights(version=state.step)
        print(f"resumed from {path} at step {state.step}")

    def save(self) -> Path:
        staging = self.checkpoints.staging_dir(self.state.step)
        for role, folder in self.checkpointed():
            self.roles.call(role, TrainWorker.save, str(staging / folder))
        self.saved_step = self.state.step
        committed = self.checkpoints.commit(staging, self.state)
        if self.config.keep_checkpoints is not None:
            self.checkpoints.prune(self.config.keep_checkpoints)
        return committed

    def checkpointed(self) -> list[tuple[str, str]]:
        """The roles of this run a checkpoint holds, each with its folder (`CHECKPOINTED`)."""
        return [(role, folder) for role, folder in CHECKPOINTED.items() if self.roles.has(role)]

    def due(self) -> bool:
        every = self.config.save_every
        return self.state.step == self.last_step or (every > 0 and self.state.step % every == 0)

    def evaluate(self) -> dict:
        config = self.config
        stop = list(self.step.tokens.stop)
        sampling = eval_sampling(config.eval, config.eval_max_new_tokens, stop, config.seed)
        record = evaluate(
            self.step, self.inputs.eval_samples, sampling, self.state.step, config.tracking.generations
        )
        self.write(record)
        return record

    def write(self, record: dict) -> None:
        """A record to metrics.jsonl and the trackers, the generations it carries to theirs."""
        evaluation = PASS_KEY in record
        shown = self.generations.take(record, evaluation)
        self.metrics.append(record)
        self.observer.write(record, shown, evaluation)

    def launch(self, step: int, position: int, version: int) -> Rollout:
        """Launch rollout `step` (for the step `step` + 1), its profile first when it is profiled."""
        self.observer.launching(step + 1)
        return self.step.launch(step, position, version)

    def loop(self, on_step: Callable | None) -> None:
        from tqdm import tqdm

        if self.config.eval.enabled and self.state.step == 0:
            self.evaluate()
        bar = tqdm(
            total=self.last_step, initial=self.state.step, desc=self.config.algorithm.name, unit="step"
        )
        rollouts = RolloutQueue(
            self.config.algorithm.max_staleness, self.last_step, self.launch, self.step.drop
        )
        rollouts.start(self.state.step, self.state.data_position, engine_version=self.state.step)
        rollouts.fill()
        try:
            while self.state.step < self.last_step:
                rollout, collected = self.next_rollout(rollouts)
                record = self.step.train(self.state, rollout, collected)
                rollouts.took_prompts_to(self.state.data_position)
                try:
                    self.step.sync(record)
                    rollouts.synced(self.state.step)
                    self.observer.after_sync(record)  # memory, traces: before the next rollouts start
                    rollouts.fill()  # the next rollouts run on the engines from here on
                finally:  # a finished step is recorded once, even when its sync was cut short
                    self.write(record)
                bar.update(1)
                self.say_graph_guard(record, bar)
                postfix = {"reward": f"{record['reward_mean']:.3f}"}
                if self.config.eval.due(self.state.step, self.last_step):
                    postfix["pass@1"] = f"{self.evaluate()[PASS_KEY]:.3f}"
                postfix.update({k: f"{record[k + '_s']:.2f}s" for k in ("rollout", "train", "sync")})
                bar.set_postfix(postfix)
                if self.due():
                    self.save()
                if on_step is not None:
                    on_step(record, self.roles)
        finally:
            self.step.close()  # the rollouts in the background halted: none outlives the loop
            bar.close()

    def say_graph_guard(self, record: dict, bar) -> None:
        """One line above the bar when an engine's graphs disagreed with eager after the sync."""
        line = graph_guard_line(record, self.config.model.path or "the tiny model")
        if line:
            bar.write(line)

    def next_rollout(self, rollouts: RolloutQueue) -> tuple[Rollout, Collected]:
        """The rollout for this step, collected; one beyond `max_staleness` is never trained on
        (it is launched again from the current weights)."""
        while True:
            rollout = rollouts.take(self.state.step)
            collected = self.step.collect(rollout.pending)
            if rollouts.admit(rollout, collected.version):
                return rollout, collected

    def keep_last_step(self, lost: str | None = None) -> str:
        """Checkpoint the last finished step if it is not saved and the trainers hold exactly it;
        returns why it could not be kept ("" when kept or nothing to keep). `lost`: a checkpointed
        role whose worker is gone (the policy's trainer or the critic)."""
        if self.state.step == self.saved_step:
            return ""
        if lost is not None:
            return f"step {self.state.step} could not be saved without its {lost} worker; "
        if self.step.training:
            return f"step {self.state.step} could not be saved: the next policy update was under way; "
        try:
            self.save()
        except (WorkerLostError, KeyboardInterrupt) as exc:
            return f"saving step {self.state.step} failed ({type(exc).__name__}); "
        return ""

    def resume_advice(self, unsaved: str) -> str:
        return f"the run stopped after step {self.state.step}; {unsaved}{resume_advice(self.run_dir)}"

    def fail(self, error: WorkerLostError) -> WorkerLostError:
        """Checkpoint what can be kept, and say how to resume."""
        lost = error.role in CHECKPOINTED and not error.worker_alive
        unsaved = self.keep_last_step(lost=error.role if lost else None)
        return final_error(error, self.resume_advice(unsaved), self.run_dir / LOG_DIR)

    def ended(self, error: type[RollDeviceError], what: str) -> RollDeviceError:
        """`error` for a run that stopped with its workers alive (a reward function that raised,
        an update that was not finite, a weight sync that failed, Ctrl-C or SIGTERM): `what`
        happened, then what was kept and how to resume."""
        unsaved = self.keep_last_step()
        return error(f"{what}; {self.resume_advice(unsaved)}")


def run_experiment(
    config: RunConfig,
    run_dir: Path,
    model: str,
    start: ResumePoint | None = None,
    on_step: Callable | None = None,
) -> Path:
    """Run the checked `config` on the model at `model` with outputs in `run_dir` (made by the
    gate), continuing from `start` when resumed; returns the run directory."""
    if start is None:  # a new run: the checkpoints here are an earlier run's (overwrite=true)
        Checkpoints(run_dir).clear()
    (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    trackers, ended = open_trackers(config, run_dir, start), False
    try:
        _run(config, run_dir, model, start, on_step, trackers)
        ended = True
    except KeyboardInterrupt as stop:  # before the steps, or again while the run was stopping
        error, what = how_stopped(stop)
        raise error(f"{what}; {resume_advice(run_dir)}") from None
    finally:
        trackers.close(ok=ended)
    shown = ", generations.jsonl" if config.tracking.generations else ""
    print(f"run directory: {run_dir} (metrics.jsonl{shown}, metrics.png, memory.png, checkpoints/)")
    return run_dir


def _inputs(config: RunConfig, tokenizer, path: str, data) -> RunInputs:
    encoder = PromptEncoder(tokenizer, config.model.chat_template, path, config.model.chat_template_kwargs)
    return load_inputs(
        config.data,
        config.eval,
        data,
        encoder,
        prompt_budget=config.rollout.max_model_len - config.algorithm.max_new_tokens,
        rollout_workers=config.roles.actor_infer.num_devices,
        max_steps=config.max_steps,
    )


def _run(
    config: RunConfig, run_dir: Path, path: str, start, on_step: Callable | None, trackers: Trackers
) -> None:
    quiet_driver()
    tokenizer = load_tokenizer(path)
    inputs = _inputs(config, tokenizer, path, read_data(config.data, config.seed))  # before Ray
    renderer = chat_renderer(config, tokenizer)
    print(step_plan(config), flush=True)
    started = time.perf_counter()
    with start_cluster(config.cluster) as cluster:
        plan = build_run_plan(config, read_inventory())
        dashboard = f"; Ray dashboard: {cluster.dashboard_url}" if cluster.dashboard_url else ""
        ready = f"cluster ready in {time.perf_counter() - started:.1f}s{dashboard}"
        print(f"{ready}; device plan:\n{plan.format()}", flush=True)
        checking = time.perf_counter()
        nodes = preflight(plan.placement, list(plan.requests))
        print(
            f"preflight: {nodes} node(s) ready for their roles ({time.perf_counter() - checking:.1f}s)",
            flush=True,
        )
        setting_up = time.perf_counter()  # what the set-up bar counts
        try:
            roles = start_roles(
                config, plan, path, log_dir=run_dir / LOG_DIR, tool_format=renderer and renderer.tool_format
            )
        except WorkerLostError as lost:
            release(plan.placement)
            again = "no step ran; run the same command again once the cause is fixed"
            raise final_error(lost, again, run_dir / LOG_DIR) from lost
        try:
            print(
                f"workers ready in {time.perf_counter() - setting_up:.1f}s (set-up; "
                f"{time.perf_counter() - started:.1f}s since the cluster's start); {describe_roles(roles)}",
                flush=True,
            )
            _drive(Run(config, run_dir, roles, inputs, trackers, renderer), plan, start, on_step)
        finally:
            roles.shutdown()
            release(plan.placement)
            print(summarise_worker_logs(run_dir / LOG_DIR), flush=True)


def describe_roles(roles: RoleGroups) -> str:
    """The weight sync's path and the roles hosted in other roles' workers."""
    hosted = "".join(f"; {role} runs in {host}'s workers" for role, host in roles.hosted.items())
    return f"weight sync: {roles.sync.describe()}{hosted}"


def _drive(run: Run, plan: RunPlan, start: ResumePoint | None, on_step: Callable | None) -> None:
    """Run the steps; every way a run ends early becomes its error, after what can be kept is."""
    try:
        run.begin(start)
        run.loop(on_step)
    except WorkerLostError as lost:
        raise run.fail(lost) from lost
    except EnvironmentFaultError as failed:  # agentic.on_env_fault=run
        raise run.ended(EnvironmentFaultError, str(failed)) from None
    except RewardFunctionError as failed:  # its one line, not Ray's wrapped traceback
        cause = getattr(failed, "cause", None) or failed
        raise run.ended(RewardFunctionError, str(cause).splitlines()[0]) from None
    except NonFiniteUpdateError as refused:
        raise run.ended(NonFiniteUpdateError, f"step {run.state.step + 1}: {refused}") from None
    except WeightSyncError as failed:
        raise run.ended(WeightSyncError, str(failed)) from failed
    except KeyboardInterrupt as stop:
        raise run.ended(*how_stopped(stop)) from None
    named = f"{run.config.experiment.name}: {run.config.algorithm.name}"
    title = f"{named}, {data_summary(run.config)} ({plan.summary()})"
    png = run.metrics.plot(title, with_kl="reference" in plan.roles)
    plot_memory(
        run.metrics.steps(),
        run.run_dir / "memory.png",
        f"{run.config.experiment.name}: memory per role and phase",
    )
    print(f"{run.metrics.summary()}; plot: {png}")


def graph_guard_line(record: dict, model: str) -> str:
    """What a step's graph guard did, in one line, where its engines' graphs disagreed with eager
    after the sync (re-captured, or eager from then on); "" otherwise. The engines' own lines are
    in their worker logs."""
    guard = record.get("graph_guard") or {}
    if guard.get("status") not in (RECAPTURED, EAGER):
        return ""
    return (
        f"graph guard: {model}, step {record['step']}: graphs differed from eager after the weight update "
        f"(largest difference {guard['max_error']:.3g}); engines by outcome: {guard['engines']}"
    )


def resume_advice(run_dir: Path) -> str:
    """The last checkpoint in `run_dir` and the command that continues from it."""
    latest = Checkpoints(run_dir).latest()
    if latest is None:
        where, again = "no checkpoint was written yet", ""
    else:
        where, again = f"the last checkpoint is step {latest[1].step} in {latest[0]}", "resume=true "
    address = os.environ.get(SUBMITTED_TO_ENV)  # a submitted job is continued by another
    command = f"roll-device submit --address {address}" if address else "roll-device run"
    return f"{where}; continue with: {command} {again}hydra.run.dir={run_dir} (and the same overrides)"


def final_error(error: WorkerLostError, advice: str, log_dir: Path) -> WorkerLostError:
    """The error that ends the run: `error` ending with `advice`; a failed worker's traceback is
    written to `log_dir` and named; a dead worker's log gets Ray's full report and is named. The
    worker's log gets our report either way (the end-of-run summary leaves that log out)."""
    if isinstance(error, WorkerFailedError):
        log_dir.mkdir(parents=True, exist_ok=True)
        saved = log_dir / f"{error.role}_traceback.txt"
        saved.write_text(error.traceback)
        advice = f"the worker's traceback: {saved}; {advice}"
        if error.rank is not None:
            append_report(
                log_dir / f"{error.role}_{error.rank}.log", f"{error.summary()}; traceback: {saved}", ""
            )
    elif not isinstance(error, SetupTimeoutError) and error.rank is not None:
        log = log_dir / f"{error.role}_{error.rank}.log"
        append_report(log, f"this worker died ({error.summary()}); Ray's report:", str(error.cause))
        advice = f"its log: {log}; {advice}"
    return error.advised(advice)


def data_summary(config: RunConfig) -> str:
    """What the run learns from: the environment of a multi-turn run, the data file or the toy task."""
    if config.agentic.environment:
        tools = f", tools {', '.join(config.agentic.tools)}" if config.agentic.tools else ""
        return f"environment '{config.agentic.environment}'{tools}"
    reward = f", reward {config.reward.name(config.data.task)}"
    if config.data.path:
        return f"{Path(config.data.path).name}{reward}"
    return f"task '{config.data.task}'{reward if config.reward.model_path else ''}"
