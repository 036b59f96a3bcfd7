"""Topology members read from the kernel's PCI records (a stand-in sysfs here) and, on Ascend,
from `npu-smi` (a stand-in script that prints what the tool prints): no device needed."""

import os
import stat

import pytest

import roll_device as rd
from roll_device.platforms import topology
from roll_device.platforms.npu import NpuPlatform

ADDRESS = "0000:c1:00.0"


@pytest.fixture
def pci(tmp_path, monkeypatch):
    record = tmp_path / "pci" / ADDRESS
    record.mkdir(parents=True)
    (record / "numa_node").write_text("1\n")
    (record / "local_cpulist").write_text("8-11,16\n")
    monkeypatch.setattr(topology, "PCI_DEVICES", tmp_path / "pci")
    return record


def test_cpu_lists_parse():
    assert topology.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_numa_node_and_cpus_come_from_the_pci_record(pci, monkeypatch):
    cuda = rd.get_platform("cuda")
    monkeypatch.setattr(type(cuda.topology), "_pci_address", lambda self, index: ADDRESS.upper())
    monkeypatch.setattr(type(cuda), "current_device", lambda self: 0)
    assert cuda.topology.pci_bus_id() == ADDRESS
    assert cuda.topology.numa_node(0) == 1 and cuda.topology.cpu_affinity(0) == [8, 9, 10, 11, 16]
    (pci / "numa_node").write_text("-1\n")
    monkeypatch.setattr(topology, "numa_nodes", lambda: {0: [0, 1]})
    assert cuda.topology.numa_node(0) == 0, "one node on the host: that one"
    monkeypatch.setattr(topology, "numa_nodes", lambda: {0: [0], 1: [1]})
    with pytest.raises(NotImplementedError, match="platform 'cuda' does not support topology.numa_node"):
        cuda.topology.numa_node(0)


def test_a_device_the_kernel_does_not_know_fails_loudly(pci, monkeypatch):
    cuda = rd.get_platform("cuda")
    monkeypatch.setattr(type(cuda.topology), "_pci_address", lambda self, index: "0000:99:00.0")
    with pytest.raises(
        NotImplementedError, match="does not support topology.cpu_affinity: the kernel has no record"
    ):
        cuda.topology.cpu_affinity(0)


NPU_SMI = """#!/bin/sh
if [ "$2" = "-m" ]; then
  echo "NPU ID  Chip ID  Chip Logic ID  Chip Name"
  echo "4       0        4              Ascend 910B2"
  echo "5       0        5              Ascend 910B2"
  echo "5       1        -              Mcu"
else
  echo "NPU ID : $5"
  echo "PCIe Bus Info                  : 0000:C$5:00.0"
fi
"""


def test_npu_addresses_come_from_npu_smi(tmp_path, monkeypatch, pci):
    tool = tmp_path / "bin" / "npu-smi"
    tool.parent.mkdir()
    tool.write_text(NPU_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
    npu = NpuPlatform()
    assert npu.topology.pci_bus_id(1) == "0000:c5:00.0", "visible device 1 is logical device 5"
    with pytest.raises(NotImplementedError, match="pci_bus_id: npu-smi reports no PCI address for device 7"):
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "7")
        npu.topology.pci_bus_id(0)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(NotImplementedError, match="pci_bus_id: npu-smi is not installed here"):
        npu.topology.pci_bus_id(0)
