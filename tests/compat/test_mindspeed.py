"""MindSpeed glue of the Megatron trainer on NPU, tested on the simulated NPU with a STAND-IN
`mindspeed` package (tests/compat/standin): it checks order and options only. MindSpeed itself
cannot be installed here; nothing in these tests counts as MindSpeed support."""

from __future__ import annotations

from tests.isolated import run_isolated


def test_standin_is_applied_before_megatron_with_the_trainer_options(tiny_model_path):
    out = run_isolated("tests.compat.mindspeed_checks:order_and_options", tiny_model_path)
    assert "tests/compat/standin/mindspeed" in out["stand_in_file"]
    assert out["error"] == "StandInStop: stand-in stops after repatch"
    imported, first_repatch, second_repatch = out["events"]
    assert imported == ["import megatron_adaptor", False]
    assert first_repatch == [
        "repatch",
        False,
        {
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 1,
            "expert_model_parallel_size": 1,
            "expert_tensor_parallel_size": 2,  # megatron's default: the tensor-parallel size
            "use_distributed_optimizer": True,
            "use_fused_rmsnorm": True,
        },
    ]
    assert second_repatch == ["repatch", False, {"second": True}]  # imported once, repatched again


def test_missing_mindspeed_is_named_and_late_application_is_refused(tiny_model_path):
    out = run_isolated("tests.compat.mindspeed_checks:missing_then_too_late", tiny_model_path)
    assert out["missing"].startswith(
        "MissingPackageError: the Megatron trainer on NPU needs the package mindspeed"
    )
    assert out["too_late"].startswith("MindSpeedOrderError: megatron is already imported")
