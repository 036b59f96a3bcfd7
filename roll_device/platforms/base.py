"""The `Platform` base class: one explicit member for everything the framework asks of a device.

Identity members are class attributes, readable without the device or its package. Device
operations go through the kind's torch device module (`torch.cuda`, `torch.npu`, `torch.cpu`),
fetched lazily; a member the module or the kind cannot serve raises `NotImplementedError` that
names the platform and the member. There is no `__getattr__` fall-through.

On the class itself: the identity and the members the framework calls. The porting helpers other
frameworks need live in named groups reached from it (`groups.py`), one file each: `env`
(process_env.py), `kernels` (kernel_env.py), `memory` (memory.py), `profiling` (profiling.py),
`determinism` (determinism.py), `facts` (device_facts.py), `topology` (topology.py), `runtime`
(runtime.py). A kind changes a group by naming its own subclass (`memory = group(CudaMemory)`).
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any, ClassVar, NoReturn

import torch

from roll_device.errors import MissingPackageError
from roll_device.packages import Package
from roll_device.platforms.determinism import Determinism
from roll_device.platforms.device_facts import DeviceFacts
from roll_device.platforms.groups import group
from roll_device.platforms.kernel_env import Kernels
from roll_device.platforms.memory import Memory
from roll_device.platforms.process_env import ProcessEnv
from roll_device.platforms.profiling import Profiling
from roll_device.platforms.runtime import Runtime
from roll_device.platforms.topology import Topology

# Where a device tensor's rebuild arguments (torch.multiprocessing.reductions) hold its device index.
IPC_DEVICE_ARG = 6


class Platform:
    """A device kind as the framework sees it. Subclasses set the identity, may override ops and
    name their own group classes."""

    # ---- groups (docs/platforms.md, "Groups") ----------------------------------------------
    env = group(ProcessEnv)
    kernels = group(Kernels)
    memory = group(Memory)
    profiling = group(Profiling)
    determinism = group(Determinism)
    facts = group(DeviceFacts)
    topology = group(Topology)
    runtime = group(Runtime)

    kind: ClassVar[str]
    device_type: ClassVar[str]
    dispatch_key: ClassVar[str]
    ray_resource: ClassVar[str | None]
    visible_devices_env: ClassVar[str | None]
    ray_noset_visible_devices_env: ClassVar[str | None] = None
    # Prefixes of Ray accelerator types (node resource `accelerator_type:<type>`) that mark this
    # kind's devices where kinds share one Ray resource: NVIDIA and AMD GPUs both count as `GPU`.
    ray_accelerator_type_prefixes: ClassVar[tuple[str, ...]] = ()
    dist_backend: ClassVar[str]
    graph_class_name: ClassVar[str | None] = None
    # Device graphs a process may hold at once on one device (None: no limit known); see
    # roll_device/graph/budget.py, which sizes capture sizes to it.
    graph_budget: ClassVar[int | None] = None
    # The torch.compile backend for the pieces of a piecewise-captured forward (roll_device/graph/
    # prefill.py): a kernel compiler where torch has one for the kind; "eager" where the port of
    # the field uses dynamo's eager backend (the NPU: SGLang's Ascend piecewise graphs).
    compile_backend: ClassVar[str] = "inductor"
    supports_ipc: ClassVar[bool] = False
    # The kind is the host processor itself: no device memory apart from host memory, nothing to
    # pin or offload to, fp32 the fast dtype.
    is_host: ClassVar[bool] = False
    # The collective backend's all-gather and reduce-scatter copy the whole tensor through a
    # temporary of their own (twice the gathered bytes at once): trainers gather and reduce in
    # their own buffers instead (strategies/training/in_place_collectives.py).
    collectives_copy_whole: ClassVar[bool] = False
    allocator_conf_env: ClassVar[str | None] = None
    required_package: ClassVar[str | None] = None
    # The package that extends torch for this kind (released per torch major.minor), and the
    # name of the vendor toolkit whose version the doctor reports.
    torch_companion: ClassVar[Package | None] = None
    toolkit_name: ClassVar[str | None] = None
    # Collective-library tuning every process of the kind gets (the NCCL_* / HCCL_* family), and
    # the variables that bound how long the library waits (seconds), set to one timeout.
    collective_tuning_env: ClassVar[dict[str, str]] = {}
    collective_timeout_envs: ClassVar[tuple[str, ...]] = ()
    install_hint: ClassVar[str] = "install the packages for this kind (docs/install.md)"

    def __init__(self, simulated: bool = False) -> None:
        self.simulated = simulated

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{self.kind} (simulated)" if self.simulated else self.kind

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"

    @classmethod
    def is_available(cls) -> bool:
        """Whether this kind has a usable device here. Never raises."""
        raise NotImplementedError(f"platform class {cls.__name__} does not implement is_available")

    @classmethod
    def toolkit_version(cls) -> str | None:
        """The installed version of `toolkit_name` (read from its files, never by importing), or
        None when absent or the kind has no toolkit of its own."""
        return None

    def device_module(self) -> ModuleType:
        """The torch device module of this kind (`torch.cuda`, `torch.npu`, `torch.cpu`)."""
        return torch.get_device_module(self.device_type)

    def _unsupported(self, member: str, why: str = "") -> NoReturn:
        detail = f": {why}" if why else ""
        raise NotImplementedError(f"platform '{self.name}' does not support {member}{detail}")

    def _call(self, member: str, *args: Any, **kwargs: Any) -> Any:
        return self._call_as(member, member, *args, **kwargs)

    def _call_as(self, member: str, torch_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call `torch.<device>.<torch_name>` for the platform member `member`."""
        fn = getattr(self.device_module(), torch_name, None)
        if fn is None:
            self._unsupported(member, f"torch.{self.device_type} has no '{torch_name}'")
        return fn(*args, **kwargs)

    # ---- Ray ------------------------------------------------------------------------------
    def ray_actor_options(self, num_devices: float) -> dict[str, Any]:
        """Ray `.options(...)` that request `num_devices` of this kind (fractions colocate)."""
        if self.ray_resource is None:
            return {}
        if self.ray_resource == "GPU":
            return {"num_gpus": num_devices}
        return {"resources": {self.ray_resource: num_devices}}

    # ---- devices --------------------------------------------------------------------------
    def device(self, index: int | None = None) -> torch.device:
        if index is None:
            index = self.current_device()
        return torch.device(self.device_type, index)

    def device_count(self) -> int:
        return int(self._call("device_count"))

    def set_device(self, index: int) -> None:
        count = self.device_count()
        if not 0 <= index < count:
            raise ValueError(
                f"platform '{self.name}': device index {index} out of range: {count} visible "
                f"(check {self.visible_devices_env or 'the device count'})"
            )
        self._call("set_device", index)

    def current_device(self) -> int:
        return int(self._call("current_device"))

    def synchronize(self) -> None:
        self._call("synchronize")

    def empty_cache(self) -> None:
        self._call("empty_cache")

    # ---- memory ---------------------------------------------------------------------------
    def memory_allocated(self) -> int:
        return int(self._call("memory_allocated"))

    def max_memory_allocated(self) -> int:
        return int(self._call("max_memory_allocated"))

    def reset_peak_memory_stats(self) -> None:
        self._call("reset_peak_memory_stats")

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        free, total = self._call("mem_get_info")
        return int(free), int(total)

    def device_name(self, index: int | None = None) -> str:
        """The product name of device `index` (default: the current one)."""
        index = self.current_device() if index is None else index
        return str(self._call_as("device_name", "get_device_name", index))

    def total_memory(self, index: int | None = None) -> int:
        """Bytes of memory device `index` has in all."""
        return int(self.facts.device_properties(index).total_memory)

    def is_device_tensor(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lives on this kind's device (what `tensor.is_cuda` answers on CUDA)."""
        return tensor.device.type == self.device_type

    @property
    def supports_pinned_memory(self) -> bool:
        """Whether host memory can be page-locked for this kind's devices here (real and present)."""
        return not self.is_host and not self.simulated and self.is_available()

    def allocator_env(self) -> dict[str, str]:
        """Allocator settings for processes on this kind (expandable segments where supported)."""
        if self.allocator_conf_env is None:
            return {}
        return {self.allocator_conf_env: "expandable_segments:True"}

    # ---- randomness -----------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator and every device generator of this kind."""
        torch.manual_seed(seed)
        self._call("manual_seed_all", seed)

    def get_rng_state(self) -> torch.Tensor:
        return self._call("get_rng_state")

    def set_rng_state(self, state: torch.Tensor) -> None:
        self._call("set_rng_state", state)

    # ---- streams and events ---------------------------------------------------------------
    def new_stream(self) -> Any:
        return self._call("Stream")

    def current_stream(self) -> Any:
        return self._call("current_stream")

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return self._call("stream", stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return self._call("Event", enable_timing=enable_timing)

    # ---- graphs ---------------------------------------------------------------------------
    @property
    def supports_graphs(self) -> bool:
        """Whether decode steps can be captured as device graphs on this kind, here and now."""
        if self.graph_class_name is None or not self.is_available():
            return False
        return hasattr(self.device_module(), self.graph_class_name)

    def _require_graphs(self, member: str) -> ModuleType:
        if not self.supports_graphs:
            self._unsupported(member, "no device graphs on this kind here (run eager)")
        return self.device_module()

    def graph_class(self) -> type:
        return getattr(self._require_graphs("graph_class"), self.graph_class_name)

    def graph_capture(self, graph: Any, pool: Any = None, stream: Any = None):
        """Context manager that captures the work issued inside it into `graph`."""
        return self._require_graphs("graph_capture").graph(graph, pool=pool, stream=stream)

    def graph_pool_handle(self) -> Any:
        """A memory-pool handle that several graphs can share."""
        return self._require_graphs("graph_pool_handle").graph_pool_handle()

    def weak_ref_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """A view of `tensor`'s memory that does not keep it alive (for graph outputs)."""
        self._require_graphs("weak_ref_tensor")
        storage = torch._C._construct_storage_from_data_pointer(
            tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes()
        )
        return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
            storage, tensor.storage_offset(), tensor.size(), tensor.stride()
        )

    # ---- inter-process handles ------------------------------------------------------------
    def ipc_handle(self, tensor: torch.Tensor) -> tuple:
        """A picklable handle another process on the same device can open without a copy. It names
        the device by its UUID, so the process that opens it may number its devices differently
        (another visible-devices list)."""
        if not self.supports_ipc:
            self._unsupported("ipc_handle", "use the shared-memory path")
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(tensor)
        if self.is_device_tensor(tensor):
            device = self.facts.device_uuid(args[IPC_DEVICE_ARG])
            args = (*args[:IPC_DEVICE_ARG], device, *args[IPC_DEVICE_ARG + 1 :])
        return rebuild, args

    def open_ipc_handle(self, handle: tuple) -> torch.Tensor:
        """The tensor of `handle` (from `ipc_handle`, or torch's own with a device index)."""
        if not self.supports_ipc:
            self._unsupported("open_ipc_handle", "use the shared-memory path")
        rebuild, args = handle
        if len(args) > IPC_DEVICE_ARG and isinstance(args[IPC_DEVICE_ARG], str):
            index = self.facts.device_index_of_uuid(args[IPC_DEVICE_ARG])
            args = (*args[:IPC_DEVICE_ARG], index, *args[IPC_DEVICE_ARG + 1 :])
        return rebuild(*args)

    def ipc_allocation(self) -> contextlib.AbstractContextManager:
        """A context in which device memory is allocated so that `ipc_handle` can share it (the
        weight-sync slots); nothing to change on kinds whose allocator needs no setting for it."""
        return contextlib.nullcontext()

    # ---- processes: what a role worker's environment and binding take ----------------------
    def collective_env(self, timeout_s: int | None = None) -> dict[str, str]:
        """Variables for a process that runs this kind's collectives. On kinds whose library has
        no timeout variable (NCCL), the timeout is the process group's `timeout` argument."""
        env = dict(self.collective_tuning_env)
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError(f"platform '{self.name}': collective timeout {timeout_s} s must be positive")
            env.update(dict.fromkeys(self.collective_timeout_envs, str(int(timeout_s))))
        return env

    def ray_device_ids(self) -> list[str]:
        """The ids of this kind's devices that Ray assigned to the calling worker (physical ids;
        empty outside a Ray worker and for kinds Ray does not schedule)."""
        if self.ray_resource is None:
            return []
        import ray

        if not ray.is_initialized():
            return []
        ids = ray.get_runtime_context().get_accelerator_ids().get(self.ray_resource, [])
        return [str(i) for i in ids]

    # ---- rollout engines ------------------------------------------------------------------
    def rollout_env(self, graph_mode: bool) -> dict[str, str]:
        """Environment variables a rollout engine process needs on this kind."""
        return {}

    # ---- facts strategies and the cluster ask for (engines, debugging, simulation, hints) --
    # The variable that makes kernel launches synchronous, where it cannot be combined with device
    # graphs: set to anything but 0, an engine that would capture graphs is refused.
    launch_blocking_env: ClassVar[str | None] = None
    # The `ROLL_DEVICE` value that runs this kind's simulation, and the variable that tells it how
    # many devices to show. None: no simulation; on a simulated node a worker of this kind then
    # computes on the host.
    simulated_kind: ClassVar[str | None] = None
    simulated_count_env: ClassVar[str | None] = None

    @property
    def kernels_kind(self) -> str:
        """The kind whose kernels compute this platform's ops: its own, or the host's on a simulation
        (roll_device/sim runs every op on CPU kernels). Backends ready themselves for it: what
        patches a device's own kernels (MindSpeed on the NPU) has nothing to patch on a simulation,
        which runs as the host does (megatron-core through the CUDA redirects, compat/megatron.py)."""
        from roll_device.platforms.cpu import HOST_KIND  # cpu.py subclasses this module's class

        return HOST_KIND if self.simulated else self.kind

    def simulated_devices_env(self, count: int) -> dict[str, str]:
        """Environment that makes this kind's simulation show `count` devices."""
        if self.simulated_count_env is None:
            self._unsupported("simulated devices", "this kind has no simulation")
        return {self.simulated_count_env: str(count)}

    @classmethod
    def unavailable_hint(cls) -> str:
        """Why a process asked for this kind may find no usable device, and what to do."""
        return f"platform '{cls.kind}' reports no usable device here: {cls.install_hint}"

    @classmethod
    def _import_required_package(cls) -> ModuleType | None:
        """Import `required_package` (None when the kind needs none); a MissingPackageError that
        names it and the install hint when it cannot be imported."""
        if cls.required_package is None:
            return None
        try:
            return importlib.import_module(cls.required_package)
        except Exception as exc:
            raise MissingPackageError(
                f"platform '{cls.kind}' needs the package {cls.required_package}, which could not "
                f"be imported ({type(exc).__name__}: {exc}): {cls.install_hint}"
            ) from exc
