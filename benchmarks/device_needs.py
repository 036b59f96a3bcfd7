"""Count the device call sites of RL frameworks and how many a roll-device `Platform` member serves.

Reads the runtime packages of ROLL (`roll/` and `mcore_adapter/src/`), verl (`verl/`) and OpenRLHF
(`openrlhf/`) from git mirrors at the snapshot commits in `FRAMEWORKS` (no checkout: files are read
with `git cat-file`), skipping tests, examples and docs, with comments and docstrings blanked, and
finds every device use in them (`RULES` below): attributes of a device module (`torch.cuda.X`, `torch.npu.X`, verl's `get_torch_device().X`,
ROLL's `current_platform.X` and `roll_current_platform.X`), `torch_npu` uses, NVML, cupy and
PyNccl-style communicators, the frameworks' own device helpers, hard-coded device and backend
strings, `.cuda()`, `.is_cuda`, `num_gpus`, cuDNN switches, vendor environment variables (each by its
name), the IPC rebuild patch and engines' device-graph flags. Left out: the frameworks' own device
layers (`DEVICE_LAYERS`: what a port replaces with roll-device) and their torch_npu code (modules
that import torch_npu at top level, which run on Ascend only). `current_platform` bound to vLLM's (`from vllm.platforms import current_platform`) is vLLM's device
layer, not the framework's: its uses are not counted.

Each use is one call site and has one need: the exact thing it does. A rule names the `Platform`
members (a group's by dotted name: `memory.ipc_collect`) that do that thing on the kinds that have
it; the need is served only if the measured `Platform` has every one of them (a rule with none is
unserved). A device-module attribute no rule names is served by the member of that name, if any.
Coverage = served call sites / all call sites, and served needs / all distinct needs; the table
and the numbers go into docs/porting.md (section `device-needs`), the method beside it.

Usage: python benchmarks/device_needs.py [--mirrors /work/.mirror] [--platform-root DIR] [--no-write]
       [--sites NEED]  (print the matched spellings and files of one need, or of all with `all`)
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "porting.md"
FRAMEWORKS = {  # name: (mirror directory under --mirrors, runtime packages, snapshot)
    "ROLL": ("alibaba+ROLL", ("roll/", "mcore_adapter/src/"), "8eb27cc2"),
    "verl": ("volcengine+verl", ("verl/",), "b178a3cd"),
    "OpenRLHF": ("OpenRLHF+OpenRLHF", ("openrlhf/",), "3c3be623"),
}
SKIP = re.compile(r"(^|/)(tests?|examples?|docs?)/|(^|/)test_[^/]*\.py$")
# The frameworks' own device layers: what a port replaces with roll-device, not call sites it serves.
DEVICE_LAYERS = re.compile(
    r"^(?:roll/platforms/|mcore_adapter/src/mcore_adapter/platforms/|verl/utils/device\.py$)"
)
# torch_npu code (a module importing it at top level): the framework's NPU port, Ascend only.
TORCH_NPU_MODULE = re.compile(r"^(?:import torch_npu\b|from torch_npu\b)", re.MULTILINE)
DM = (
    r"\b(?:torch\.cuda|torch\.npu|torch_npu\.npu|get_torch_device\(\)|(?:roll_)?current_platform)"
    r"\.(?:memory\.|random\.)?"
)
VLLM_PLATFORM = re.compile(r"from vllm\.platforms import [^\n]*\bcurrent_platform\b(?: as (\w+))?")
NOT_SERVED: tuple[str, ...] = ()
SAME = None  # a rule whose need is the matched text itself (one need per spelling)
# NVML queries a port makes; its session (init, handles, errors) is needed while one is not a member.
NVML_QUERIES = ("facts.device_uuid", "topology.pci_bus_id", "topology.set_cpu_affinity")

# (pattern, the exact need (the framework use the table shows; SAME: the matched text), the members
# that serve it). At a position the longest match wins, then the first rule.
RULES: list[tuple[str, str | None, tuple[str, ...]]] = [
    # profiling
    (
        DM + r"nvtx\.(?:range_push|range_start)\b|\bmstx\.range_start\b|\bmark_start_range\(",
        "nvtx/mstx range start",
        ("profiling.range_push",),
    ),
    (
        DM + r"nvtx\.(?:range_pop|range_end)\b|\bmstx\.range_end\b|\bmark_end_range\(",
        "nvtx/mstx range end",
        ("profiling.range_pop",),
    ),
    (
        DM + r"nvtx\.range\b|\bmstx\.mstx_range\b|\bmark_annotate\(|\bnvtx\.annotate\b",
        "nvtx.range / mstx_range",
        ("profiling.range",),
    ),
    (DM + r"nvtx\.mark\b|\bmstx\.mark\b", "nvtx.mark / mstx.mark", ("profiling.mark",)),
    (DM + r"profiler\.start\b|cudaProfilerStart", "torch.cuda.profiler.start", ("profiling.profiler_start",)),
    (DM + r"profiler\.stop\b|cudaProfilerStop", "torch.cuda.profiler.stop", ("profiling.profiler_stop",)),
    (r"ProfilerActivity\.(?:CUDA|NPU)\b", "ProfilerActivity.CUDA / .NPU", ("profiling.profiler_activity",)),
    (r"\btorch_npu\.profiler\.profile\b", "torch_npu.profiler.profile", ("profiling.profile",)),
    (
        r"\btorch_npu\.profiler\.(?!profile\b)\w+",
        "torch_npu.profiler settings (ProfilerLevel, ExportType, ...)",
        ("profiling.profiler_module",),
    ),
    # device facts
    (DM + r"get_device_name\b", "torch.cuda.get_device_name", ("device_name",)),
    (DM + r"get_device_properties\b", "torch.cuda.get_device_properties", ("facts.device_properties",)),
    (
        DM + r"get_device_capability\b|\bget_device_capability\(",
        "torch.cuda.get_device_capability",
        ("facts.device_capability",),
    ),
    (
        DM + r"get_device_uuid\b|\bget_device_uuid\(|\bnvmlDeviceGetUUID\b",
        "device UUID (vLLM / NVML)",
        ("facts.device_uuid",),
    ),
    (r"\bnvmlDeviceGetPciInfo\b", "PCI bus id (NVML)", ("topology.pci_bus_id",)),
    (r"\bnvmlDeviceSetCpuAffinity\b", "bind to the device's CPUs (NVML)", ("topology.set_cpu_affinity",)),
    (
        r"\bimport pynvml\b|\bpynvml\.(?:nvmlInit|nvmlShutdown|nvmlDeviceGetHandleByIndex|NVMLError)\b",
        "NVML session (init, handle, errors)",
        NVML_QUERIES,
    ),
    (DM + r"device_memory_used\b", "device memory used (all processes)", ("memory.device_memory_used",)),
    (r"\.is_(?:cuda|npu)\b(?!\()", "tensor.is_cuda", ("is_device_tensor",)),
    # devices and identity
    (
        DM + r"device_type\b|\bget_device_name\(\)|\bauto_set_device\(|[\"'](?:cuda|npu)(?::\d+)?[\"']",
        '"cuda" / get_device_name() / auto_set_device',
        ("device_type",),
    ),
    (r"\.(?:cuda|npu)\((?!\))?", ".cuda() / .npu()", ("device",)),
    (DM + r"current_device\b|\bget_device_id\(\)", "torch.cuda.current_device", ("current_device",)),
    (DM + r"init\b", "torch.cuda.init", ("runtime.init",)),
    (DM + r"is_available\b|\bis_torch_npu_available\(", "torch.cuda.is_available", ("is_available",)),
    (
        DM + r"is_(?:cuda|npu|rocm)\b|\bis_(?:cuda|npu)_available\b|\btorch\.version\.(?:cuda|hip)\b",
        "is_npu_available / is_cuda()",
        ("kind",),
    ),
    (r"\bROCM_PATH\b", "ROCM_PATH (the ROCm toolkit's home)", ("kernels.toolkit_home",)),
    (
        r"\bimport torch_npu\b|\btorch_npu\.__version__\b",
        "import torch_npu",
        ("device_module",),
    ),
    (r"\btorch_npu\.contrib\b", "torch_npu.contrib (CUDA calls rewritten)", NOT_SERVED),
    (r"\btorch_npu\.npu_\w+|\bNPU_CROSS_ENTROPY_LOSS_AVAILABLE\b", SAME, NOT_SERVED),  # fused kernels
    (r"\btorch_npu\.(?!npu\b|profiler\b|contrib\b|npu_)\w+", SAME, NOT_SERVED),
    (
        r"[\"'](?:nccl|hccl)[\"']|\bget_nccl_backend\(\)|" + DM + r"communication_backend\b",
        '"nccl" / get_nccl_backend()',
        ("dist_backend",),
    ),
    (r"\bnum_gpus\b", "num_gpus", ("ray_actor_options",)),
    (
        r"\bget_resource_name\(\)|" + DM + r"ray_device_key\b",
        'Ray resource name ("GPU" / "NPU")',
        ("ray_resource",),
    ),
    (
        r"\bray\.get_gpu_ids\(\)|\bget_accelerator_ids\(\)",
        "ray get_accelerator_ids()",
        ("ray_device_ids",),
    ),
    # process environment
    (r"RAY_EXPERIMENTAL_NOSET_\w+", "RAY_EXPERIMENTAL_NOSET_*", ("env.ray_noset_env",)),
    (r"\bROCR_VISIBLE_DEVICES\b", "ROCR_VISIBLE_DEVICES", ("env.pin_devices",)),
    (
        r"\b(?:CUDA|HIP|ASCEND_RT)_VISIBLE_DEVICES\b|\bget_visible_devices_keyword\(\)|"
        + DM
        + r"device_control_env_var\b",
        "CUDA_VISIBLE_DEVICES",
        ("visible_devices_env",),
    ),
    (DM + r"get_visible_gpus\b", "visible device ids", ("env.visible_device_ids",)),
    (DM + r"update_env_vars_for_visible_devices\b", "visible-device pin of one rank", ("env.pin_devices",)),
    # ROLL's per-kind environments, by what their device variables are (the rest is Ray and vLLM)
    (
        DM + r"get_custom_env_vars\b",
        "ROLL's worker environment (allocator, NCCL cuMem and NVLS, TE SM margin)",
        ("allocator_env", "collective_env", "env.switch_reduction_env", "kernels.sm_margin_env"),
    ),
    (
        DM + r"get_vllm_run_time_env_vars\b",
        "ROLL's vLLM rank environment (pin, allocator conf cleared)",
        ("env.rank_env", "allocator_conf_env"),
    ),
    (
        r"\bNCCL_DEBUG(?:_SUBSYS|_FILE)?\b",
        "NCCL_DEBUG (collective library logging)",
        ("env.collective_debug_env",),
    ),
    (r"\bNCCL_NVLS_ENABLE\b", "NCCL_NVLS_ENABLE (NVLink SHARP)", ("env.switch_reduction_env",)),
    (
        r"\bHCCL_(?:HOST|NPU)_SOCKET_PORT_RANGE\b",
        "HCCL socket port ranges (colocated processes)",
        ("env.collective_ports_env",),
    ),
    (
        r"\b(?:TORCH_)?NCCL_DETERMINISTIC\b|\bHCCL_DETERMINISTIC\b",
        "deterministic collectives",
        ("determinism.deterministic_env",),
    ),
    (r"\bCUBLAS_WORKSPACE_CONFIG\b", "CUBLAS_WORKSPACE_CONFIG", ("determinism.deterministic_env",)),
    (
        r"\bCLOSE_MATMUL_K_SHIFT\b",
        "CLOSE_MATMUL_K_SHIFT (Ascend matmul determinism)",
        ("determinism.deterministic_env",),
    ),
    (
        r"\btorch\.backends\.cudnn\.(?:deterministic|benchmark)\b|\buse_deterministic_algorithms\b",
        "cudnn.deterministic / benchmark, deterministic algorithms",
        ("determinism.set_deterministic",),
    ),
    (r"\btorch\.backends\.cudnn\.enabled\b", "cudnn on/off", ("kernels.set_dnn_library_enabled",)),
    (r"\btorch\.backends\.cudnn\.\w+", SAME, NOT_SERVED),
    (r"\bNCCL_CUMEM_ENABLE\b", "NCCL_CUMEM_ENABLE", ("collective_env",)),
    (r"\bTORCH_NCCL_AVOID_RECORD_STREAMS\b", "TORCH_NCCL_AVOID_RECORD_STREAMS", ("collective_env",)),
    (r"\bHCCL_(?:CONNECT|EXEC)_TIMEOUT\b", "HCCL timeouts", ("collective_env",)),
    (r"\b(?:TORCH_)?NCCL_\w+|\bHCCL_\w+", SAME, NOT_SERVED),  # any other collective variable, by name
    (
        r"\bCUDA_DEVICE_MAX_CONNECTIONS\b",
        "CUDA_DEVICE_MAX_CONNECTIONS (the value an engine asks for)",
        ("env.device_connections_env",),
    ),
    (r"\bTORCH_CUDA_ARCH_LIST\b", "TORCH_CUDA_ARCH_LIST", ("kernels.kernel_build_env",)),
    (r"\bCUDA_MODULE_LOADING\b", "CUDA_MODULE_LOADING", ("kernels.module_loading_env",)),
    (
        r"\bNVTE_(?:FLASH|FUSED|UNFUSED)_ATTN\b",
        "NVTE_*_ATTN (attention backend switches)",
        ("kernels.attention_backend_env",),
    ),
    (r"\bNVTE_(?:FWD|BWD)_LAYERNORM_SM_MARGIN\b", "NVTE_*_LAYERNORM_SM_MARGIN", ("kernels.sm_margin_env",)),
    (r"\bNVTE_\w+", SAME, NOT_SERVED),
    (r"\bPYTORCH_(?:CUDA|HIP|NPU)_ALLOC_CONF\b", "PYTORCH_CUDA_ALLOC_CONF", ("allocator_conf_env",)),
    (r"\bTASK_QUEUE_ENABLE\b", "TASK_QUEUE_ENABLE", ("rollout_env",)),
    (r"\bVLLM_ASCEND_\w+|\bVLLM_ROCM_\w+", SAME, NOT_SERVED),  # the engine's own variables
    # memory
    (DM + r"mem_get_info\b", "torch.cuda.mem_get_info", ("mem_get_info",)),
    (
        DM + r"(?:reset_max_memory_allocated|reset_max_memory_cached|reset_peak_memory_stats)\b",
        "reset_peak_memory_stats",
        ("reset_peak_memory_stats",),
    ),
    (
        DM + r"set_per_process_memory_fraction\b",
        "set_per_process_memory_fraction",
        ("memory.set_memory_fraction",),
    ),
    (DM + r"_record_memory_history\b", "memory._record_memory_history", ("memory.record_memory_history",)),
    (DM + r"_dump_snapshot\b", "memory._dump_snapshot", ("memory.dump_memory_snapshot",)),
    (
        DM + r"_?set_allocator_settings\b",
        "memory._set_allocator_settings",
        ("memory.set_allocator_settings",),
    ),
    (r"\bset_expandable_segments\(", "expandable segments on/off", ("memory.set_expandable_segments",)),
    (
        DM + r"clear_cublas_workspaces\b|_cuda_clearCublasWorkspaces",
        "clear cuBLAS workspaces",
        ("memory.clear_library_workspaces",),
    ),
    (
        DM + r"cudart\(\)\.cudaHostRegister\b|\bcudaHostRegister\b",
        "cudaHostRegister (pin host memory in place)",
        ("memory.register_host_memory",),
    ),
    (
        DM + r"cudart\(\)\.cudaHostUnregister\b|\bcudaHostUnregister\b",
        "cudaHostUnregister",
        ("memory.unregister_host_memory",),
    ),
    (
        r"\bimport cupy\b|\bcp\.(?:zeros|empty|asarray|ndarray|uint8)\b",
        "cupy device buffers (outside torch's allocator)",
        NOT_SERVED,
    ),
    # inter-process handles and communicators
    (
        r"\breductions\.(?:_?rebuild_cuda_tensor\w*|_?reduce_tensor\w*|init_reductions)\b|\brebuild_ipc\(",
        "IPC handle opened under another device numbering (the IPC rebuild patch)",
        ("open_ipc_handle", "facts.device_index_of_uuid"),
    ),
    (
        (
            r"\bPy[NH]cclCommunicator\b|\bStatelessProcessGroup\b|\bpy[nh]ccl\b|\bNcclCommunicator\b"
            r"|\bcupy\.cuda\.nccl\b|\bget_unique_id\b"
        ),
        "device communicator outside torch.distributed (PyNccl / PyHccl / cupy NCCL)",
        ("runtime.device_communicator",),
    ),
    # randomness, streams, graphs
    (DM + r"manual_seed(?:_all)?\b", "torch.cuda.manual_seed_all", ("manual_seed",)),
    (DM + r"get_rng_state_all\b", "torch.cuda.get_rng_state_all", ("determinism.get_rng_state_all",)),
    (DM + r"set_rng_state_all\b", "torch.cuda.set_rng_state_all", ("determinism.set_rng_state_all",)),
    (DM + r"Stream\b", "torch.cuda.Stream", ("new_stream",)),
    (DM + r"Event\b", "torch.cuda.Event", ("new_event",)),
    (DM + r"(?:CUDAGraph|NPUGraph)\b", "torch.cuda.CUDAGraph", ("graph_class",)),
    (DM + r"graph\b", "torch.cuda.graph", ("graph_capture",)),
    (
        r"\benforce_eager\b|\bdisable_cuda_graph\b|\bcuda_graph_config\b|\bCudaGraphConfig\b|\bcuda_graph_impl\b",
        "engine graphs on/off (enforce_eager, disable_cuda_graph, ...)",
        ("supports_graphs",),
    ),
    (r"\bcudagraph_mode\b|\bcuda_graph_scope\b", "engine graph mode / scope", NOT_SERVED),
    (
        r"\bcudagraph_capture_sizes\b|\bcuda_graph_sizes\b",
        "engine graph capture sizes",
        NOT_SERVED,
    ),
    (DM + r"\w+", "", ("attribute",)),  # any other device-module attribute: see attribute_need
]
COMPILED = [(re.compile(p), use, members) for p, use, members in RULES]


def attribute_need(text: str, members: set[str]) -> tuple[str, tuple[str, ...]]:
    """A device-module attribute no rule names: served by the member (or group member) of its name."""
    name = re.sub(DM, "", text)
    same = sorted(m for m in members if m.rpartition(".")[2] == name)
    return (name, (same[0],)) if same else (text, NOT_SERVED)


def source_files(mirror: Path, packages: tuple[str, ...], snapshot: str) -> list[tuple[str, str]]:
    """(path, text) of the in-scope Python files of `packages` at commit `snapshot` of `mirror`."""
    git = ["git", f"--git-dir={mirror}"]
    found = subprocess.run(
        [*git, "cat-file", "-e", f"{snapshot}^{{commit}}"], check=False, capture_output=True
    )
    if found.returncode:
        raise SystemExit(f"{mirror} has no commit {snapshot}: fetch that snapshot (see docs/porting.md)")
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", snapshot, *packages],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    names = [n for n in names if n.endswith(".py") and not SKIP.search(n) and not DEVICE_LAYERS.search(n)]
    blob = subprocess.run(
        [*git, "cat-file", "--batch"],
        input="".join(f"{snapshot}:{n}\n" for n in names).encode(),
        check=True,
        capture_output=True,
    ).stdout
    files, pos = [], 0
    for name in names:
        header_end = blob.index(b"\n", pos)
        size = int(blob[pos:header_end].split()[2])
        text = blob[header_end + 1 : header_end + 1 + size].decode(errors="replace")
        if not TORCH_NPU_MODULE.search(text):
            files.append((name, text))
        pos = header_end + 2 + size
    return files


def code_only(text: str) -> str:
    """`text` with comments and triple-quoted strings (docstrings) blanked: they are not call sites."""
    lines = text.splitlines(keepends=True)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):  # not Python 3: drop whole-line comments only
        return re.sub(r"^\s*#.*$", "", text, flags=re.MULTILINE)
    for tok in reversed(tokens):
        prose = tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and tok.string.endswith(('"""', "'''"))
        )
        if prose:
            (row, col), (end_row, end_col) = tok.start, tok.end
            head, tail = lines[row - 1][:col], lines[end_row - 1][end_col:]
            lines[row - 1 : end_row] = [head + "\n" * (end_row - row) + tail]
    return "".join(lines)


def without_vllm_platform(text: str) -> str:
    """`text` with the uses of vLLM's `current_platform` blanked (vLLM's device layer, which the
    engine keeps on every kind), where the file binds that name to vLLM's."""
    for m in VLLM_PLATFORM.finditer(text):
        name = m.group(1) or "current_platform"
        text = re.sub(rf"\b{name}\.\w+", lambda use: " " * len(use.group(0)), text)
    return text


def uses(text: str, members: set[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(need, matched text, serving members; empty: unserved) of every device use in `text`,
    non-overlapping, earliest and longest first."""
    text = without_vllm_platform(code_only(text))
    found = []
    for order, (pattern, use, needed) in enumerate(COMPILED):
        for m in pattern.finditer(text):
            found.append((m.start(), -(m.end() - m.start()), order, m.end(), m.group(0), use, needed))
    taken, end = [], -1
    for start, _, _, stop, matched, use, needed in sorted(found):
        if start < end:
            continue
        end = stop
        if needed == ("attribute",):
            need, needed = attribute_need(matched, members)
        else:
            need = matched if use is SAME else use
        # a rule's members serve only where the measured Platform has every one of them (a checkout
        # from before the groups has a group's member flat, under its own name)
        have = all(m in members or m.rpartition(".")[2] in members for m in needed)
        taken.append((need, matched, needed if needed and have else NOT_SERVED))
    return taken


def count(mirrors: Path, members: set[str]) -> dict:
    sites: dict[str, Counter] = defaultdict(Counter)  # need -> framework -> call sites
    served: dict[str, tuple[str, ...]] = {}
    where: dict[str, Counter] = defaultdict(Counter)  # need -> (framework, file, spelling) -> sites
    for framework, (mirror, packages, snapshot) in FRAMEWORKS.items():
        for name, text in source_files(mirrors / mirror / "repo", packages, snapshot):
            for need, matched, member in uses(text, members):
                sites[need][framework] += 1
                served[need] = member
                where[need][(framework, name, matched)] += 1
    return {"sites": sites, "served": served, "where": where}


def totals(result: dict) -> dict[str, int]:
    sites, served = result["sites"], result["served"]
    return {
        "sites": sum(sum(c.values()) for c in sites.values()),
        "served_sites": sum(sum(c.values()) for n, c in sites.items() if served[n]),
        "needs": len(sites),
        "served_needs": sum(1 for n in sites if served[n]),
    }


def render(result: dict) -> str:
    sites, served = result["sites"], result["served"]
    t = totals(result)
    snapshots = ", ".join(f"{f} {snap}" for f, (_, _, snap) in FRAMEWORKS.items())
    lines = [
        (
            f"Measured by `benchmarks/device_needs.py` over {snapshots}: **{t['sites']} call sites, "
            f"{t['needs']} distinct needs; platform members serve {t['served_sites']} call sites "
            f"({100 * t['served_sites'] / t['sites']:.1f}%) and {t['served_needs']} needs "
            f"({100 * t['served_needs'] / t['needs']:.1f}%)**."
        ),
        "",
        "| Framework use (the need) | Platform member | "
        + " | ".join(f"{f} sites" for f in FRAMEWORKS)
        + " |",
        "|---|---|" + "---|" * len(FRAMEWORKS),
    ]
    order = sorted(sites, key=lambda n: (not served[n], -sum(sites[n].values()), n))
    for need in order:
        cell = " + ".join(f"`{m}`" for m in served[need]) if served[need] else "not served"
        counts = " | ".join(str(sites[need][f]) for f in FRAMEWORKS)
        lines.append(f"| {need.replace('|', '/')} | {cell} | {counts} |")
    return "\n".join(lines)


def print_sites(result: dict, need: str) -> None:
    for name in sorted(result["where"]) if need == "all" else [need]:
        print(
            f"{name}: {'served by ' + ' + '.join(result['served'][name]) if result['served'][name] else 'unserved'}"
        )
        for (framework, path, matched), n in sorted(result["where"][name].items()):
            print(f"    {framework} {path} {matched!r} x{n}")


MEMBERS_CODE = (  # a checkout from before the groups has none: its members are all flat
    "from roll_device.platforms import Platform\n"
    "names = set(dir(Platform))\n"
    "for cls in Platform.__mro__:\n"
    "    names |= set(getattr(cls, '__annotations__', {}))\n"
    "for name in sorted(names):\n"
    "    if getattr(getattr(Platform, name, None), 'attribute', None) == name:  # a group\n"
    "        names |= {f'{name}.{m}' for m in dir(getattr(Platform, name)) if not m.startswith('_')}\n"
    "print(' '.join(sorted(n for n in names if not n.startswith('_'))))\n"
)


def platform_members(source_root: Path) -> set[str]:
    """The public members (identity and groups' members, dotted, included) of the `Platform` in
    the checkout at `source_root`: this one, or another to measure it before a change."""
    out = subprocess.run(
        [sys.executable, "-c", MEMBERS_CODE],
        cwd=source_root,
        env={"PYTHONPATH": str(source_root)},
        check=True,
        capture_output=True,
        text=True,
    )
    return set(out.stdout.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument(
        "--platform-root", type=Path, default=ROOT, help="checkout whose Platform is measured"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/porting.md alone")
    parser.add_argument("--sites", metavar="NEED", help="list the call sites of NEED ('all': every need)")
    args = parser.parse_args()
    result = count(args.mirrors, platform_members(args.platform_root))
    if args.sites:
        print_sites(result, args.sites)
        return
    body = render(result)
    print(body)
    if not args.no_write:
        replace_section(DOC, "device-needs", body)


if __name__ == "__main__":
    main()
