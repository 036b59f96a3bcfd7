"""The vLLM engine arguments and environment built for each device kind and graph mode.

NPU and GPU engines cannot run on this machine: the golden table checks exactly what WOULD BE
PASSED to `vllm.LLM(...)` and set in the engine's environment there. The CPU rows are also
started for real in test_vllm_strategy.py.
"""

import json
from types import MappingProxyType

import pytest

import roll_device as rd
from roll_device.errors import ConfigError
from roll_device.platforms.cpu import CpuPlatform
from strategies.inference.vllm_args import WORKER_EXTENSION, build_engine_spec
from tests.strategies.inference.conftest import rollout_config

NOSET_NPU = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"


def common(**changes):
    args = {
        "model": "/m",
        "tokenizer": "/m",
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 64,
        "tensor_parallel_size": 1,
        "seed": 42,
        "logprobs_mode": "raw_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": False,
    }
    args.update(changes)
    return args


NPU_RL = {"additional_config": {"rl_config": {"enabled": True}}}
QUIET = {"VLLM_LOGGING_LEVEL": "ERROR"}  # configs/rollout/vllm.yaml `env`: on every kind
NPU_SIZES = [1, 2, 4, 8, 16, 32, 64]

GOLDEN = [
    # (kind, overrides, kwargs, env, sleep level)
    (
        "cpu",
        [],
        common(enforce_eager=True, kv_cache_memory_bytes=256 << 20),
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        None,
    ),
    (
        "cpu",
        ["enforce_eager=false", "kv_cache_bytes=1048576", "colocated=true"],
        common(enforce_eager=False, kv_cache_memory_bytes=1 << 20),
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        None,
    ),
    (
        "cuda",
        [],
        common(
            enforce_eager=False,
            gpu_memory_utilization=0.5,
            compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"},
        ),
        {},
        None,
    ),
    (
        "cuda",
        ["colocated=true", "graph_mode=FULL", "capture_sizes=[1,2,4]", "kv_cache_bytes=1073741824"],
        common(
            enforce_eager=False,
            kv_cache_memory_bytes=1 << 30,
            enable_sleep_mode=True,
            compilation_config={"cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4]},
        ),
        {},
        1,
    ),
    (
        "cuda",
        ["enforce_eager=true", "colocated=true", "sleep_when_colocated=false"],
        common(enforce_eager=True, gpu_memory_utilization=0.5),
        {},
        None,
    ),
    (
        "rocm",
        ["graph_mode=piecewise"],
        common(
            enforce_eager=False,
            gpu_memory_utilization=0.5,
            compilation_config={"cudagraph_mode": "PIECEWISE"},
        ),
        {},
        None,
    ),
    (
        "npu",
        [],
        common(
            enforce_eager=False,
            gpu_memory_utilization=0.5,
            **NPU_RL,
            compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": NPU_SIZES},
        ),
        {"TASK_QUEUE_ENABLE": "1", "VLLM_ASCEND_ENABLE_NZ": "0", NOSET_NPU: "1"},
        None,
    ),
    (
        "npu",
        ["colocated=true", "graph_mode=PIECEWISE", "max_num_seqs=48"],
        common(
            enforce_eager=False,
            gpu_memory_utilization=0.5,
            max_num_seqs=48,
            enable_sleep_mode=True,
            **NPU_RL,
            compilation_config={
                "cudagraph_mode": "PIECEWISE",
                "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 48],
            },
        ),
        {"TASK_QUEUE_ENABLE": "1", "VLLM_ASCEND_ENABLE_NZ": "0", NOSET_NPU: "1"},
        1,
    ),
    (
        "npu",
        ["enforce_eager=true", "+env.HCCL_CONNECT_TIMEOUT=1200"],
        common(enforce_eager=True, gpu_memory_utilization=0.5, **NPU_RL),
        {
            "HCCL_CONNECT_TIMEOUT": "1200",
            "TASK_QUEUE_ENABLE": "2",
            "VLLM_ASCEND_ENABLE_NZ": "0",
            NOSET_NPU: "1",
        },
        None,
    ),
]


@pytest.mark.parametrize(
    "kind, overrides, kwargs, env, sleep_level",
    GOLDEN,
    ids=[f"{g[0]}:{' '.join(g[1]) or 'defaults'}" for g in GOLDEN],
)
def test_engine_args_that_would_be_passed_per_kind(tmp_path, kind, overrides, kwargs, env, sleep_level):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    kwargs = dict(kwargs, model=str(tmp_path), tokenizer=str(tmp_path))
    config = rollout_config("vllm", "dtype=bfloat16", *overrides)  # dtype: independent of the experiment
    spec = build_engine_spec(rd.get_platform(kind), str(tmp_path), config, environ={})
    assert spec.kwargs == kwargs
    assert spec.env == {**QUIET, **env}
    assert spec.sleep_level == sleep_level


@pytest.mark.parametrize(
    "kind, overrides, force_eager",
    [("cpu", [], True), ("cpu", ["enforce_eager=false"], False), ("cuda", ["enforce_eager=true"], False)],
)
def test_only_an_eager_engine_in_this_process_runs_compiled_helpers_eager(
    tmp_path, kind, overrides, force_eager
):
    """The CPU engine runs eager in the worker's process: vLLM's torch.compile'd sampler helpers
    run eager there too. A GPU engine runs in its own process, where the stance would not reach."""
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    spec = build_engine_spec(
        rd.get_platform(kind), str(tmp_path), rollout_config("vllm", *overrides), environ={}
    )
    assert spec.force_eager is force_eager


def test_reference_npu_experiment_would_pass_its_capture_sizes():
    from omegaconf import OmegaConf

    from roll_device.commands.compose import compose

    cfg = compose(["experiment=qwen2_5_7b_npu8"])
    spec = build_engine_spec(
        rd.get_platform("npu"), cfg.model.path, OmegaConf.to_container(cfg.rollout, resolve=True), environ={}
    )
    assert spec.kwargs["compilation_config"] == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [8, 16, 32, 64, 128],
    }
    assert spec.kwargs["kv_cache_memory_bytes"] == 16 << 30 and spec.kwargs["enforce_eager"] is False


def test_npu_derivation_reads_the_layer_count(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 299}}))
    spec = build_engine_spec(
        rd.get_platform("npu"),
        str(tmp_path),
        rollout_config("vllm", "graph_mode=PIECEWISE", "max_num_seqs=1024"),
        environ={},
    )
    assert spec.capture_sizes == [1, 4, 16, 64, 256, 1024]  # 300 graphs a size: 6 sizes fit in 1800


@pytest.mark.parametrize(
    "kind, overrides, message",
    [
        ("cpu", ["graph_mode=FULL"], "vLLM has no device graphs on kind 'cpu'"),
        ("cuda", ["enforce_eager=true", "graph_mode=FULL"], "enforce_eager=true runs without graphs"),
        ("cuda", ["graph_mode=SOMETIMES"], "choose one of NONE, PIECEWISE"),
        (
            "cuda",
            ["graph_mode=NONE", "capture_sizes=[1,2]"],
            "capture_sizes is set but no graphs are captured",
        ),
        ("cpu", ["capture_sizes=[1,2]"], "capture_sizes is set but no graphs are captured"),
        ("npu", ["capture_sizes=[8,128]"], "has 128, larger than the largest batch 64"),
        ("npu", ["capture_sizes=[8,8]"], "lists a size twice"),
        (
            "npu",
            [
                "graph_mode=PIECEWISE",
                "max_num_seqs=1024",
                "capture_sizes=[1,2,4,8,16,32,64,128,256,512,1024]",
            ],
            r"need 3300 graphs \(300 per size\), over the device's budget of 1800: list at most 6 sizes",
        ),
        ("cuda", ["max_num_seqs=0"], "rollout.max_num_seqs must be a positive integer"),
        ("cuda", ["kv_cache_bytes=-5"], "rollout.kv_cache_bytes must be a positive integer"),
        ("cuda", ["gpu_memory_utilization=1.5"], r"gpu_memory_utilization must be in \(0, 1\]"),
        ("cuda", ["logprobs_mode=logits"], "choose one of raw_logprobs, processed_logprobs"),
        ("cuda", ["+gpu_util=0.9"], r"unknown rollout keys for vllm: \['gpu_util'\]"),
    ],
)
def test_impossible_combinations_are_refused_before_start(tmp_path, kind, overrides, message):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 299}))
    with pytest.raises(ConfigError, match=message):
        build_engine_spec(
            rd.get_platform(kind), str(tmp_path), rollout_config("vllm", *overrides), environ={}
        )


def test_env_must_be_a_mapping():
    with pytest.raises(ConfigError, match="rollout.env must map variable names to values"):
        build_engine_spec(
            rd.get_platform("cuda"), "/m", dict(rollout_config("vllm"), env=["A=1"]), environ={}
        )


def test_launch_blocking_conflicts_with_npu_graphs(tmp_path):
    platform, config = rd.get_platform("npu"), rollout_config("vllm")
    with pytest.raises(
        ConfigError, match="ASCEND_LAUNCH_BLOCKING=1 is incompatible with graph_mode=FULL_DECODE_ONLY"
    ):
        build_engine_spec(platform, str(tmp_path), config, environ={"ASCEND_LAUNCH_BLOCKING": "1"})
    with pytest.raises(ConfigError, match="ASCEND_LAUNCH_BLOCKING=1 is incompatible"):
        build_engine_spec(
            platform, str(tmp_path), dict(config, env={"ASCEND_LAUNCH_BLOCKING": "1"}), environ={}
        )
    eager = build_engine_spec(
        platform, str(tmp_path), dict(config, enforce_eager=True), environ={"ASCEND_LAUNCH_BLOCKING": "1"}
    )
    assert eager.graph_mode == "NONE"


def test_unreadable_model_config_for_piecewise_budget(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the model config"):
        build_engine_spec(
            rd.get_platform("npu"),
            str(tmp_path / "absent"),
            rollout_config("vllm", "graph_mode=PIECEWISE"),
            environ={},
        )


def test_kind_without_a_profile():
    class OtherPlatform(CpuPlatform):
        kind = "other"
        # hosts no rollout engine (a CPU subclass would inherit vllm-cpu)
        rollout_engines = MappingProxyType({})

    with pytest.raises(ConfigError, match="no engine profile for device kind 'other'"):
        build_engine_spec(OtherPlatform(), "/m", rollout_config("vllm"), environ={})
