"""What a model asks of a vLLM engine's settings, checked on the driver before any engine starts
(`VllmStrategy.check_model`), so that a run that cannot start is refused before Ray does:

- `rollout.tensor_parallel_size` divides the model's attention heads and KV heads (each rank
  holds whole heads; vLLM refuses the first, and the weights read back from the ranks for
  verification assume the second, where vLLM would replicate KV heads instead);
- `rollout.max_model_len` within the model's `max_position_embeddings`, as vLLM requires (not
  checked where rope scaling stretches the positions, which vLLM then derives itself, nor where
  `VLLM_ALLOW_LONG_MAX_MODEL_LEN` lets vLLM go past them);
- one sequence of `rollout.max_model_len` tokens fits the KV cache the engine gets: the
  `rollout.kv_cache_bytes` given, or the default size of a kind whose engine runs in-process (the
  CPU). The bytes counted are a lower bound of vLLM's own count, which rounds up to whole cache
  blocks and keeps one block free: keys and values of every layer, KV heads x head dims each, in
  the dtype the engine computes in (`dtype: auto` keeps a 16-bit model's dtype and takes a float32
  model to 16 bits, as vLLM's automatic choice does on every platform whose first supported dtype
  has 16 bits). The size the refusal advises is enough for any block size vLLM uses.

Where the KV cache is a share of device memory (`gpu_memory_utilization`), its size is vLLM's to
measure on the device, and vLLM's own refusal ends the run in set-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from roll_device.compat.vllm import profile_for
from roll_device.errors import ConfigError
from roll_device.platforms import Platform
from strategies.inference.settings import VllmSettings
from strategies.inference.vllm_args import DEFAULT_CPU_KV_CACHE_BYTES, engine_env, text_model_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
PURPOSE = "check rollout.max_model_len and the KV cache against it"
# vLLM's largest KV-cache block in tokens (its backends use 16 to 256, each dividing 256): the size
# advised is whole blocks of this many tokens plus the block vLLM's pool keeps free (its null block),
# enough for every such block size.
LARGEST_BLOCK = 256


def check_engine_fit(platform: Platform | None, settings: VllmSettings, model_path: str) -> None:
    """A ConfigError when the engine that `settings` describe cannot hold one sequence of the
    model at `model_path`."""
    max_model_len = settings.max_model_len
    config = text_model_config(model_path, PURPOSE, required=False)  # other names: no check
    _check_heads(config, settings, model_path)
    _check_positions(config, settings, model_path)
    kv_bytes, source = _kv_cache_bytes(platform, settings)
    per_token = kv_bytes_per_token(config, settings.dtype)
    if kv_bytes is None or per_token is None:
        return
    need = per_token.total * max_model_len
    if need > kv_bytes:
        blocks = -(-max_model_len // LARGEST_BLOCK) + 1  # whole blocks, and the one vLLM keeps free
        raise ConfigError(
            f"{source} holds {kv_bytes // per_token.total} tokens of this model's KV cache, fewer than "
            f"one sequence of rollout.max_model_len={max_model_len} ({need} bytes at {per_token}): "
            f"raise rollout.kv_cache_bytes to {blocks * LARGEST_BLOCK * per_token.total} or more (vLLM "
            f"counts whole cache blocks of up to {LARGEST_BLOCK} tokens and keeps one free), or lower "
            "rollout.max_model_len"
        )


class TokenBytes:
    """KV-cache bytes of one token, and what they are made of."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> None:
        self.layers, self.kv_heads, self.head_dim, self.dtype_bytes = layers, kv_heads, head_dim, dtype_bytes
        self.total = 2 * layers * kv_heads * head_dim * dtype_bytes

    def __str__(self) -> str:
        return (
            f"{self.total} bytes per token: keys and values x {self.layers} layers x {self.kv_heads} "
            f"KV heads x {self.head_dim} dims x {self.dtype_bytes} bytes"
        )


def kv_bytes_per_token(config: Mapping[str, Any], dtype: str) -> TokenBytes | None:
    """The KV-cache bytes of one token for the language model `config` in the engine's `dtype`
    (`auto`: 16 bits, see the module docstring); None where the config does not say."""
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim")
    if head_dim is None and isinstance(heads, int) and isinstance(config.get("hidden_size"), int):
        head_dim = config["hidden_size"] // heads
    numbers = (layers, kv_heads, head_dim)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        return None
    return TokenBytes(layers, kv_heads, head_dim, DTYPE_BYTES.get(dtype, 2))


def _kv_cache_bytes(platform: Platform | None, settings: VllmSettings) -> tuple[int | None, str]:
    given = settings.kv_cache_bytes
    if given is not None:
        return given, f"rollout.kv_cache_bytes={given}"
    engine = profile_for(platform) if platform is not None else None
    if engine is None or not engine.in_process:
        return None, ""  # a share of device memory: measured by vLLM on the device
    default = DEFAULT_CPU_KV_CACHE_BYTES
    return (
        default,
        f"the KV cache of an engine on {platform.kind} ({default >> 20} MiB, rollout.kv_cache_bytes=null)",
    )


def _check_heads(config: Mapping[str, Any], settings: VllmSettings, model_path: str) -> None:
    ranks, heads = settings.tensor_parallel_size, config.get("num_attention_heads")
    for key, count in (
        ("num_attention_heads", heads),
        ("num_key_value_heads", config.get("num_key_value_heads")),
    ):
        if isinstance(count, int) and count % ranks:
            divisors = [d for d in range(1, count + 1) if count % d == 0]
            raise ConfigError(
                f"rollout.tensor_parallel_size={ranks} does not divide the model's {key} ({count}, in "
                f"{model_path}/config.json): each rank holds whole heads; choose one of {divisors}"
            )


def _check_positions(config: Mapping[str, Any], settings: VllmSettings, model_path: str) -> None:
    limit, max_model_len = config.get("max_position_embeddings"), settings.max_model_len
    if not isinstance(limit, int) or max_model_len <= limit or _rope_scaled(config):
        return
    env = {**os.environ, **engine_env(settings)}
    if env.get(LONG_CONTEXT_ENV, "0").strip().lower() in ("1", "true"):
        return
    raise ConfigError(
        f"rollout.max_model_len={max_model_len} exceeds the model's max_position_embeddings ({limit}, "
        f"in {model_path}/config.json), which vLLM refuses: lower rollout.max_model_len to {limit} or less"
    )


def _rope_scaled(config: Mapping[str, Any]) -> bool:
    """Whether any rope setting of `config` is other than the default (a scaling type)."""
    found = [config.get("rope_scaling"), config.get("rope_parameters")]
    types = []
    while found:
        item = found.pop()
        if isinstance(item, Mapping):
            types.append(item.get("rope_type", item.get("type")))
            found += [v for v in item.values() if isinstance(v, Mapping)]
    return any(t not in (None, "default") for t in types)
