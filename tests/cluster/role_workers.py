"""Role workers the cluster tests start (imported by the Ray workers, so kept in a module)."""

import torch

from roll_device.cluster import RoleWorker


class ProbeWorker(RoleWorker):
    """Reports its binding and does a little work on its device."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def weighted_sum(self, values: list[float]) -> tuple[int, float, str]:
        """Rank, scale * sum(values) computed on this worker's device, and that device."""
        tensor = torch.tensor(values, device=self.device) * self.scale
        return self.rank, float(tensor.sum().cpu()), str(tensor.device)


class DeviceIdentityWorker(RoleWorker):
    """Reports which physical device its tensors live on (by UUID), beside its binding."""

    def identity(self) -> dict:
        tensor = torch.ones(4, device=self.device)
        index = tensor.device.index
        return {
            **self.info(),
            "tensor_device": str(tensor.device),
            "current_index": self.platform.current_device(),
            "uuid": self.platform.facts.device_uuid(index),
        }
