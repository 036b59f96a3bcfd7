"""The vLLM engine arguments and environment built for each device kind and graph mode.

NPU and GPU engines cannot run on this machine: the golden table checks exactly what WOULD BE
PASSED to `vllm.LLM(...)` and set in the engine's environment there. The CPU rows are also
started for real in test_vllm_strategy.py.
"""

import json
import re

import pytest

import roll_device as rd
from roll_device.compat.host_malloc import KEEP_FREED_HOST_MEMORY
from roll_device.errors import ConfigError
from roll_device.platforms.cpu import CpuPlatform
from strategies.inference.vllm_args import WORKER_EXTENSION, build_engine_spec
from tests.configs import rollout_settings, run_config

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
    # (kind, changes to the shipped vllm section, colocated, kwargs, env, sleep level)
    (
        "cpu",
        {},
        False,
        common(enforce_eager=True, kv_cache_memory_bytes=256 << 20),
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **KEEP_FREED_HOST_MEMORY},
        None,
    ),
    (
        "cpu",
        {"enforce_eager": False, "kv_cache_bytes": 1048576},
        True,
        common(enforce_eager=False, kv_cache_memory_bytes=1 << 20),
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **KEEP_FREED_HOST_MEMORY},
        None,
    ),
    (
        "cuda",
        {},
        False,
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
        {"graph_mode": "FULL", "capture_sizes": [1, 2, 4], "kv_cache_bytes": 1073741824},
        True,
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
        {"enforce_eager": True, "sleep_when_colocated": False},
        True,
        common(enforce_eager=True, gpu_memory_utilization=0.5),
        {},
        None,
    ),
    (
        "rocm",
        {"graph_mode": "PIECEWISE"},
        False,
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
        {},
        False,
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
        {"graph_mode": "PIECEWISE", "max_num_seqs": 48},
        True,
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
        {"enforce_eager": True, "env": {**QUIET, "HCCL_CONNECT_TIMEOUT": 1200}},
        False,
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


def golden_id(kind: str, changes: dict, colocated: bool) -> str:
    said = [f"{key}={value}" for key, value in changes.items()] + (["colocated"] if colocated else [])
    return f"{kind}:{' '.join(said) or 'defaults'}"


@pytest.mark.parametrize(
    "kind, changes, colocated, kwargs, env, sleep_level",
    GOLDEN,
    ids=[golden_id(*g[:3]) for g in GOLDEN],
)
def test_engine_args_that_would_be_passed_per_kind(
    tmp_path, kind, changes, colocated, kwargs, env, sleep_level
):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    kwargs = dict(kwargs, model=str(tmp_path), tokenizer=str(tmp_path))
    settings = rollout_settings("vllm", dtype="bfloat16", **changes)  # dtype: independent of the experiment
    spec = build_engine_spec(rd.get_platform(kind), str(tmp_path), settings, colocated, environ={})
    assert spec.kwargs == kwargs
    assert spec.env == {**QUIET, **env}
    assert spec.sleep_level == sleep_level


@pytest.mark.parametrize(
    "kind, changes, force_eager",
    [("cpu", {}, True), ("cpu", {"enforce_eager": False}, False), ("cuda", {"enforce_eager": True}, False)],
)
def test_only_an_eager_engine_in_this_process_runs_compiled_helpers_eager(
    tmp_path, kind, changes, force_eager
):
    """The CPU engine runs eager in the worker's process: vLLM's torch.compile'd sampler helpers
    run eager there too. A GPU engine runs in its own process, where the stance would not reach."""
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    spec = build_engine_spec(
        rd.get_platform(kind), str(tmp_path), rollout_settings("vllm", **changes), environ={}
    )
    assert spec.force_eager is force_eager


def test_reference_npu_experiment_would_pass_its_capture_sizes():
    config = run_config("experiment=qwen2_5_7b_npu8")
    spec = build_engine_spec(rd.get_platform("npu"), config.model.path, config.rollout, environ={})
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
        rollout_settings("vllm", graph_mode="PIECEWISE", max_num_seqs=1024),
        environ={},
    )
    assert spec.capture_sizes == [1, 4, 16, 64, 256, 1024]  # 300 graphs a size: 6 sizes fit in 1800


@pytest.mark.parametrize(
    "kind, changes, message",
    [
        ("cpu", {"graph_mode": "FULL"}, "vLLM has no device graphs on kind 'cpu'"),
        ("cuda", {"enforce_eager": True, "graph_mode": "FULL"}, "enforce_eager=true runs without graphs"),
        (
            "cuda",
            {"graph_mode": "NONE", "capture_sizes": [1, 2]},
            "capture_sizes is set but no graphs are captured",
        ),
        ("cpu", {"capture_sizes": [1, 2]}, "capture_sizes is set but no graphs are captured"),
        (
            "npu",
            {
                "graph_mode": "PIECEWISE",
                "max_num_seqs": 1024,
                "capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
            },
            r"need 3300 graphs \(300 per size\), over the device's budget of 1800: list at most 6 sizes",
        ),
    ],
)
def test_impossible_combinations_are_refused_before_start(tmp_path, kind, changes, message):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 299}))
    with pytest.raises(ConfigError, match=message):
        build_engine_spec(
            rd.get_platform(kind), str(tmp_path), rollout_settings("vllm", **changes), environ={}
        )


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"graph_mode": "SOMETIMES"},
            (
                "rollout.graph_mode='SOMETIMES': input should be 'NONE', 'PIECEWISE', 'FULL', "
                "'FULL_DECODE_ONLY' or 'FULL_AND_PIECEWISE'"
            ),
        ),
        ({"capture_sizes": [8, 128]}, "rollout.capture_sizes has 128, larger than the largest batch 64"),
        ({"capture_sizes": [8, 8]}, "rollout.capture_sizes lists a size twice"),
        ({"max_num_seqs": 0}, "rollout.max_num_seqs=0: input should be greater than or equal to 1"),
        ({"kv_cache_bytes": -5}, "rollout.kv_cache_bytes=-5: input should be greater than or equal to 1"),
        (
            {"gpu_memory_utilization": 1.5},
            "rollout.gpu_memory_utilization=1.5: input should be less than or equal to 1",
        ),
        (
            {"logprobs_mode": "logits"},
            "rollout.logprobs_mode='logits': input should be 'raw_logprobs' or 'processed_logprobs'",
        ),
        ({"gpu_util": 0.9}, "unknown key rollout.gpu_util: the keys here are name, max_model_len,"),
        ({"colocated": True}, "unknown key rollout.colocated: the keys here are"),  # an argument now
    ],
)
def test_impossible_settings_are_refused_when_the_section_is_read(changes, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        rollout_settings("vllm", **changes)


def test_env_must_be_a_mapping():
    with pytest.raises(
        ConfigError, match="^" + re.escape("rollout.env=['A=1']: input should be a valid dictionary")
    ):
        rollout_settings("vllm", env=["A=1"])


def test_launch_blocking_conflicts_with_npu_graphs(tmp_path):
    platform, settings = rd.get_platform("npu"), rollout_settings("vllm")
    with pytest.raises(
        ConfigError, match="ASCEND_LAUNCH_BLOCKING=1 is incompatible with graph_mode=FULL_DECODE_ONLY"
    ):
        build_engine_spec(platform, str(tmp_path), settings, environ={"ASCEND_LAUNCH_BLOCKING": "1"})
    with pytest.raises(ConfigError, match="ASCEND_LAUNCH_BLOCKING=1 is incompatible"):
        build_engine_spec(
            platform, str(tmp_path), rollout_settings("vllm", env={"ASCEND_LAUNCH_BLOCKING": "1"}), environ={}
        )
    eager = build_engine_spec(
        platform,
        str(tmp_path),
        rollout_settings("vllm", enforce_eager=True),
        environ={"ASCEND_LAUNCH_BLOCKING": "1"},
    )
    assert eager.graph_mode == "NONE"


def test_unreadable_model_config_for_piecewise_budget(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the model config"):
        build_engine_spec(
            rd.get_platform("npu"),
            str(tmp_path / "absent"),
            rollout_settings("vllm", graph_mode="PIECEWISE"),
            environ={},
        )


def test_kind_without_a_profile():
    class OtherPlatform(CpuPlatform):
        kind = "other"  # a CPU subclass, but vLLM has no profile for its kind

    with pytest.raises(ConfigError, match="no engine profile for device kind 'other'"):
        build_engine_spec(OtherPlatform(), "/m", rollout_settings("vllm"), environ={})


@pytest.mark.parametrize(
    "kind, level, slept, refusal",
    [
        ("cuda", 2, 2, None),
        ("cuda", None, 1, None),
        (
            "npu",
            2,
            None,
            "rollout.sleep_level=2: vLLM on npu has sleep levels 1: set rollout.sleep_level to null",
        ),
        (
            "cpu",
            1,
            None,
            (
                "rollout.sleep_level=1: vLLM on cpu has sleep levels none (no sleep mode): set "
                "rollout.sleep_level to null"
            ),
        ),
    ],
)
def test_the_sleep_level_is_the_configs_where_the_kind_has_it(tmp_path, kind, level, slept, refusal):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    settings = rollout_settings("vllm", sleep_level=level)
    platform = rd.get_platform(kind)
    if refusal is None:
        assert build_engine_spec(platform, str(tmp_path), settings, True, environ={}).sleep_level == slept
    else:
        with pytest.raises(ConfigError) as refused:
            build_engine_spec(platform, str(tmp_path), settings, True, environ={})
        assert str(refused.value) == refusal
