"""The doctor's capability table (roll_device/doctor/report.py) for a plan's roles, in-process."""

from roll_device.cluster import Inventory, NodeInfo
from roll_device.doctor.capabilities import capabilities_of
from roll_device.doctor.report import format_capabilities
from roll_device.pipeline.run_plan import build_run_plan
from tests.configs import run_config

HOST = Inventory((NodeInfo("h" * 56, "10.0.0.1", "head", cpus=4, is_head=True),))


def strategy_rows(*overrides: str) -> list[str]:
    requests = list(build_run_plan(run_config(*overrides), HOST).requests)
    table = format_capabilities([capabilities_of("cpu", False)], requests)
    return [
        line.split("  ")[0] for line in table.splitlines() if line.startswith(("graph modes", "sleep levels"))
    ]


def test_each_strategy_has_its_rows_and_one_name_of_two_role_types_is_told_apart():
    assert strategy_rows() == [
        "graph modes (vllm)",
        "sleep levels (vllm)",
        "graph modes (fsdp)",
        "sleep levels (fsdp)",
    ]
    assert strategy_rows("algorithm=ppo")[2:] == [
        "graph modes (train fsdp)",
        "sleep levels (train fsdp)",
        "graph modes (critic fsdp)",
        "sleep levels (critic fsdp)",
    ]
