"""`WorkerGroup`: the workers of one role, one Ray actor per planned device, and how to call them.

`WorkerGroup(plan, role, worker_cls, *args, **kwargs)` reserves the plan's placement groups (once
per plan), then starts `worker_cls(*args, **kwargs)` (a plain `RoleWorker` subclass; the group
makes it a Ray actor) for each rank in its slot's bundle with its share of the device and the
environment its kind needs. It does not wait: `.infos` (each worker's `info()`) does, so several
groups start together. `ray_options` adds Ray actor options (`max_concurrency`, more
`runtime_env` variables, `concurrency_groups`, ...).

Dispatch patterns, each given the worker method itself (`group.call_all(ProbeWorker.info)`), so
that a reader and a tool can follow the call (a method's name in a string is refused):
- `call_all(method, ...)`: every rank, same arguments; results in rank order.
- `scatter_gather(method, shards, ...)`: shard i to rank i (data parallel); results in rank order.
  `shard(batch, n)` cuts a sequence or a `TrainBatch`-like object (`select(slice)`) into n parts.
- `call_rank0(method, ...)`: rank 0 only.
- `async_call_all(method, ...)`: the object refs, for overlapping groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roll_device.cluster.placement import reserve, worker_request
from roll_device.cluster.plan import Plan
from roll_device.cluster.shm import run_key, sweep_cluster, wait_ended
from roll_device.cluster.worker import RoleWorker, worker_env
from roll_device.errors import ConfigError, RollDeviceError

CLASS_OPTIONS = ("concurrency_groups", "enable_tensor_transport")  # Ray honours these in ray.remote(...) only


class DispatchError(RollDeviceError, ValueError):
    """Arguments that do not match the group (shard count, batch size)."""


def actor_options(plan: Plan, role: str, rank: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Ray actor options of `role`'s worker at `rank`, with `extra` merged in."""
    extra = dict(extra or {})
    runtime_env = dict(extra.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **worker_env(plan, role, rank)}
    return {
        **worker_request(plan, role, rank),
        "scheduling_strategy": reserve(plan).scheduling_strategy(plan, role, rank),
        "runtime_env": runtime_env,
        **extra,
    }


def shard(batch: Any, n: int) -> list[Any]:
    """`batch` cut into `n` contiguous parts whose sizes differ by at most one."""
    size = len(batch)
    if n < 1 or size < n:
        raise DispatchError(f"cannot cut a batch of {size} into {n} non-empty shards")
    bounds = [size * i // n for i in range(n + 1)]
    take = batch.select if hasattr(batch, "select") else batch.__getitem__
    return [take(slice(bounds[i], bounds[i + 1])) for i in range(n)]


class WorkerGroup:
    """The workers of one role; see the module docstring."""

    def __init__(
        self,
        plan: Plan,
        role: str,
        worker_cls: type,
        *args: Any,
        ray_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        import ray

        if role not in plan.roles:
            raise ConfigError(f"no role '{role}' in the plan (roles: {', '.join(plan.roles)})")
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, RoleWorker)):
            raise ConfigError(
                f"worker class {worker_cls!r} must be a plain subclass of RoleWorker (the group makes "
                "it a Ray actor; do not decorate it with @ray.remote)"
            )
        self.plan = plan
        self.role = role
        self.worker_cls = worker_cls
        self.placement = plan.roles[role]
        ray_options = dict(ray_options or {})
        class_options = {key: ray_options.pop(key) for key in CLASS_OPTIONS if key in ray_options}
        actor_cls = ray.remote(**class_options)(worker_cls) if class_options else ray.remote(worker_cls)
        self.workers = [
            actor_cls.options(**actor_options(plan, role, rank, ray_options)).remote(*args, **kwargs)
            for rank in range(self.placement.world_size)
        ]
        self._info_refs = self.async_call_all(RoleWorker.info)

    @property
    def infos(self) -> list[dict[str, Any]]:
        """Each worker's `info()` from its start, in rank order (waits for the workers)."""
        import ray

        return ray.get(self._info_refs)

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def _name(self, method: Callable) -> str:
        """The name under which the actors serve `method`, a method of this group's worker class
        (or of a class it derives from: the actor runs its own override)."""
        name = getattr(method, "__name__", None)
        if not any(vars(cls).get(str(name)) is method for cls in self.worker_cls.__mro__):
            shown = getattr(method, "__qualname__", None) or repr(method)  # a function: no address
            raise DispatchError(
                f"{shown} is not a method of {self.worker_cls.__name__}: pass the worker method "
                f"itself (e.g. {self.worker_cls.__name__}.info), not its name or another class's"
            )
        return name

    def async_call_all(self, method: Callable, *args: Any, **kwargs: Any) -> list:
        name = self._name(method)
        return [getattr(w, name).remote(*args, **kwargs) for w in self.workers]

    def call_all(self, method: Callable, *args: Any, **kwargs: Any) -> list:
        import ray

        return ray.get(self.async_call_all(method, *args, **kwargs))

    def async_scatter(self, method: Callable, shards: list, *args: Any, **kwargs: Any) -> list:
        """Call `method` on each worker with its own shard; one result ref per worker."""
        name = self._name(method)
        if len(shards) != self.world_size:
            raise DispatchError(
                f"{len(shards)} shards for the {self.world_size} workers of role '{self.role}': "
                f"give one shard per rank (shard(batch, {self.world_size}))"
            )
        return [getattr(w, name).remote(s, *args, **kwargs) for w, s in zip(self.workers, shards)]

    def scatter_gather(self, method: Callable, shards: list, *args: Any, **kwargs: Any) -> list:
        import ray

        return ray.get(self.async_scatter(method, shards, *args, **kwargs))

    def async_call_rank0(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        return self.async_call_rank(0, method, *args, **kwargs)

    def async_call_rank(self, rank: int, method: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on worker `rank` alone; its result ref."""
        return getattr(self.workers[rank], self._name(method)).remote(*args, **kwargs)

    def call_rank0(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get(self.async_call_rank0(method, *args, **kwargs))

    def master_addr_port(self) -> tuple[str, int]:
        """Rank 0's address and a free port there: the group's torch.distributed rendezvous."""
        return tuple(self.call_rank0(RoleWorker.get_master_addr_port))

    def kill(self) -> None:
        """End the workers (the plan's placement groups stay; `placement.release(plan)` frees them),
        then remove the shared memory their processes held (a killed actor runs no cleanup; what
        they held is on record, cluster/shm.py)."""
        import ray

        for worker in self.workers:
            ray.kill(worker)
        if self.workers:
            wait_ended(self._local_pids())
            sweep_cluster(run_key(), self.role)
        self.workers = []

    def _local_pids(self) -> list[int]:
        """The pids of the workers on this host that had started."""
        import ray

        started, _ = ray.wait(self._info_refs, num_returns=len(self._info_refs), timeout=0)
        here = ray.util.get_node_ip_address()
        infos = []
        for ref in started:
            try:
                infos.append(ray.get(ref))
            except ray.exceptions.RayError:  # a worker that failed to start has no pid to wait for
                continue
        return [info["pid"] for info in infos if info["ip"] == here]
