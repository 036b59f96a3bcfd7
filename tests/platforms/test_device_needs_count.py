"""benchmarks/device_needs.py's classifier: which platform members serve a framework's device use,
judged by the exact need, and which files are in scope (the counts in docs/porting.md come from
it). Runs on snippets; the mirrors are not needed."""

from benchmarks.device_needs import DEVICE_LAYERS, ROOT, TORCH_NPU_MODULE, platform_members, uses

SNIPPET = """
import torch_npu
x = torch.cuda.current_device()          # a comment: torch.cuda.synchronize()
t = t.cuda()
dist.init_process_group("nccl")
os.environ["HCCL_CONNECT_TIMEOUT"] = "1800"
os.environ["NCCL_DEBUG"] = "INFO"
os.environ["NCCL_P2P_LEVEL"] = "NVL"
get_torch_device().memory._record_memory_history(max_entries=1)
torch.cuda.cudart().cudaHostRegister(ptr, n, 0)
torch.backends.cudnn.enabled = False
torch.cuda.nvtx.range_push("step")
y = torch_npu.npu_rms_norm(x, w)
ids = ray.get_runtime_context().get_accelerator_ids()["NPU"]
env = roll_current_platform.get_custom_env_vars()
torch.cuda.memory_stats()
torch.cuda.is_bf16_supported()
"""


def test_each_use_is_judged_by_the_members_that_do_exactly_that():
    members = platform_members(ROOT)
    assert {"kind", "dist_backend", "profiling.range_push"} <= members, "identity and groups count"
    found = [(need, served) for need, _, served in uses(SNIPPET, members)]
    assert found == [
        ("import torch_npu", ("device_module",)),
        ("torch.cuda.current_device", ("current_device",)),
        (".cuda() / .npu()", ("device",)),
        ('"nccl" / get_nccl_backend()', ("dist_backend",)),
        ("HCCL timeouts", ("collective_env",)),
        ("NCCL_DEBUG (collective library logging)", ("env.collective_debug_env",)),
        ("NCCL_P2P_LEVEL", ()),  # a collective variable no member sets, judged by its name
        ("memory._record_memory_history", ("memory.record_memory_history",)),
        ("cudaHostRegister (pin host memory in place)", ("memory.register_host_memory",)),
        ("cudnn on/off", ("kernels.set_dnn_library_enabled",)),
        ("nvtx/mstx range start", ("profiling.range_push",)),
        ("torch_npu.npu_rms_norm", ()),
        ("ray get_accelerator_ids()", ("ray_device_ids",)),
        (
            "ROLL's worker environment (allocator, NCCL cuMem and NVLS, TE SM margin)",
            ("allocator_env", "collective_env", "env.switch_reduction_env", "kernels.sm_margin_env"),
        ),
        ("memory_stats", ("memory.memory_stats",)),  # a device-module attribute, found in its group
        ("torch.cuda.is_bf16_supported", ()),
    ]
    assert ("nvtx/mstx range start", ()) in [
        (need, served) for need, _, served in uses(SNIPPET, members - {"profiling.range_push"})
    ], "a missing member never serves"
    without_one = [served for _, _, served in uses(SNIPPET, members - {"kernels.sm_margin_env"})]
    assert without_one[13] == (), "a need is served only where every member it names exists"


def test_vllm_current_platform_is_vllm_s_device_layer_not_the_framework_s():
    text = "from vllm.platforms import current_platform\ncurrent_platform.is_cuda_alike()\n"
    assert uses(text, platform_members(ROOT)) == []


def test_device_layers_and_torch_npu_modules_are_out_of_scope():
    for path in (
        "roll/platforms/cuda.py",
        "mcore_adapter/src/mcore_adapter/platforms/npu.py",
        "verl/utils/device.py",
    ):
        assert DEVICE_LAYERS.search(path), path
    for path in (
        "roll/utils/context_managers.py",
        "verl/utils/device_utils.py",
        "verl/workers/fsdp_workers.py",
    ):
        assert not DEVICE_LAYERS.search(path), path
    assert TORCH_NPU_MODULE.search('"""Doc."""\nimport torch\nimport torch_npu\n')
    assert TORCH_NPU_MODULE.search("from torch_npu import npu_rms_norm\n")
    assert not TORCH_NPU_MODULE.search("if is_npu_available:\n    import torch_npu\n"), "a lazy import is not"


def test_a_checkout_from_before_the_groups_is_measured_by_its_flat_names():
    text = 'torch.cuda.nvtx.range_push("step")\n'
    assert uses(text, {"range_push"}) == [
        ("nvtx/mstx range start", "torch.cuda.nvtx.range_push", ("profiling.range_push",))
    ]
    assert uses(text, {"kind"})[0][2] == (), "neither flat nor in a group: not served"
