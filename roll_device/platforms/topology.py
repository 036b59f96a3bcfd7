"""`platform.topology`: where a device sits in the host (its PCI address, its NUMA node,
the CPUs close to it) and binding this process to those CPUs, as NVML's PCI-info and CPU-affinity
queries do.

Every accelerator is a PCI device: a kind says how to find its address (`_pci_address`, from the
device's properties on CUDA and ROCm, from `npu-smi` on Ascend); the NUMA node and the CPUs then
come from the kernel's record of that PCI device in sysfs, the source NVML reads them from too. The
CPU kind answers for the host itself: the CPUs this process may run on, and their NUMA node.
"""

from __future__ import annotations

import os
from pathlib import Path

from roll_device.platforms.groups import PlatformGroup

PCI_DEVICES = Path("/sys/bus/pci/devices")
NUMA_NODES = Path("/sys/devices/system/node")


def parse_cpu_list(text: str) -> list[int]:
    """CPU ids from the kernel's list format (`0-3,8,10-11`)."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def numa_nodes() -> dict[int, list[int]]:
    """The host's NUMA nodes and their CPUs (one node 0 with every CPU where sysfs shows none)."""
    nodes = {
        int(d.name[4:]): parse_cpu_list((d / "cpulist").read_text())
        for d in NUMA_NODES.glob("node[0-9]*")
        if (d / "cpulist").exists()
    }
    return nodes or {0: sorted(range(os.cpu_count() or 1))}


class Topology(PlatformGroup):
    """The topology group; kinds name a subclass that provides `_pci_address`, the CPU one that
    answers for the host."""

    attribute = "topology"

    def _pci_address(self, index: int) -> str:
        self._unsupported("pci_bus_id", "no PCI address is known for this kind's devices")

    def pci_bus_id(self, index: int | None = None) -> str:
        """The PCI address of device `index` (`0000:c1:00.0`, lower case, as sysfs names it)."""
        return self._pci_address(self._index(index)).lower()

    def _pci_record(self, index: int | None, member: str) -> Path:
        record = PCI_DEVICES / self.pci_bus_id(index)
        if not record.exists():
            self._unsupported(member, f"the kernel has no record of PCI device {record.name}")
        return record

    def numa_node(self, index: int | None = None) -> int:
        """The NUMA node device `index` is attached to."""
        node = int((self._pci_record(index, "numa_node") / "numa_node").read_text())
        if node >= 0:
            return node
        if len(numa_nodes()) == 1:  # the kernel reports -1 where the host has a single node
            return next(iter(numa_nodes()))
        self._unsupported("numa_node", f"the kernel reports no NUMA node for {self.pci_bus_id(index)}")

    def cpu_affinity(self, index: int | None = None) -> list[int]:
        """The CPUs closest to device `index` (its NUMA node's), as NVML's CPU affinity lists them."""
        return parse_cpu_list((self._pci_record(index, "cpu_affinity") / "local_cpulist").read_text())

    def set_cpu_affinity(self, index: int | None = None) -> list[int]:
        """Bind this process to the CPUs closest to device `index` (those it may use at all, where
        a cgroup narrows them); returns the CPUs it is bound to now."""
        allowed = os.sched_getaffinity(0)
        cpus = [c for c in self.cpu_affinity(index) if c in allowed] or self.cpu_affinity(index)
        os.sched_setaffinity(0, cpus)
        return sorted(os.sched_getaffinity(0))
