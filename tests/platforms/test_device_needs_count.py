"""benchmarks/device_needs.py's classifier: which platform member serves a framework's device use
(the counts in docs/porting.md come from it). Runs on snippets; the mirrors are not needed."""

from benchmarks.device_needs import ROOT, platform_members, uses

SNIPPET = """
import torch_npu
x = torch.cuda.current_device()          # a comment: torch.cuda.synchronize()
t = t.cuda()
dist.init_process_group("nccl")
os.environ["HCCL_CONNECT_TIMEOUT"] = "1800"
os.environ["NCCL_DEBUG"] = "INFO"
get_torch_device().memory._record_memory_history(max_entries=1)
torch.cuda.cudart().cudaHostRegister(ptr, n, 0)
torch.cuda.nvtx.range_push("step")
y = torch_npu.npu_rms_norm(x, w)
ids = ray.get_runtime_context().get_accelerator_ids()["NPU"]
torch.cuda.memory_stats()
torch.cuda.is_bf16_supported()
"""


def test_each_use_maps_to_its_member_or_to_itself():
    members = platform_members(ROOT)
    assert {"kind", "dist_backend", "range_push"} <= members, "identity annotations count"
    assert uses(SNIPPET, members) == [
        ("device_module", "device_module"),
        ("current_device", "current_device"),
        ("device", "device"),
        ("dist_backend", "dist_backend"),
        ("collective_env", "collective_env"),
        ("NCCL_DEBUG", None),
        ("record_memory_history", "record_memory_history"),
        ("pin_memory", "pin_memory"),
        ("range_push", "range_push"),
        ("torch_npu fused kernels", None),
        ("ray_device_ids", "ray_device_ids"),
        ("memory_stats", "memory_stats"),
        ("torch.cuda.is_bf16_supported", None),
    ]
    assert ("range_push", None) in uses(SNIPPET, members - {"range_push"}), "a missing member never serves"
