"""A Megatron trainer's checkpoints: `torch.distributed.checkpoint` of each (pipeline stage,
tensor-parallel rank)'s model shard and each rank's optimizer shard (its master parameters and Adam
state), beside the step count and the layout they were written with (a reload needs the same).
Megatron's own `dist_checkpointing` is not used: its save path starts writer processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from roll_device.errors import ConfigError
from strategies.training import megatron_weights
from strategies.training.common import checkpoint_cause

TRAINER_STATE = "trainer_state.pt"


class MegatronCheckpoints:
    """Saving and loading for MegatronTrainStrategy (its model, optimizer, layout and step count)."""

    def _inner_optimizers(self) -> list[torch.optim.Optimizer]:
        chained = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [wrapper.optimizer for wrapper in chained]

    def _layout(self) -> dict[str, int]:
        return {
            "tensor_parallel": self.settings.tensor_parallel,
            "pipeline_parallel": self.stages.size,
            "data_parallel": self.data_parallel_size,
            "expert_parallel": self.experts.size,  # expert tensor parallel: 1 (megatron_model.describe refuses more)
        }

    def _model_state(self) -> dict[str, torch.nn.Parameter]:
        """The model's parameters under checkpoint keys, `model.pp<S>.tp<T>.<name>`; an expert's
        under its global index and its expert-tensor-parallel rank, so that expert-parallel ranks
        write distinct keys and the model reads back as one of expert_parallel=1."""
        state = {}
        for name, param in self.gpt.named_parameters():
            expert = megatron_weights.LOCAL_EXPERT.search(name) is not None
            tp_rank = self.experts.tp_rank if expert else self.tp_rank
            global_name = megatron_weights.global_expert_name(name, self.plan.shape, self.experts)
            state[f"model.pp{self.stages.rank}.tp{tp_rank}.{global_name}"] = param
        return state

    def _optimizer_prefix(self) -> str:
        return f"optimizer.pp{self.stages.rank}.tp{self.tp_rank}.dp{self.data_parallel_rank}."

    def save_checkpoint(self, directory: str) -> None:
        """torch.distributed.checkpoint of each (pipeline stage, tensor-parallel rank)'s model
        shard and each rank's optimizer shard (its master parameters and Adam state), plus the
        step count. Reloading needs the same tensor-, pipeline- and data-parallel sizes."""
        import torch.distributed.checkpoint as dcp

        optim_prefix = self._optimizer_prefix()
        state = self._model_state()
        for c, inner in enumerate(self._inner_optimizers()):
            params = [p for group in inner.param_groups for p in group["params"]]
            for index, entry in inner.state_dict()["state"].items():
                state[f"{optim_prefix}{c}.{index}.param"] = params[index]
                state.update({f"{optim_prefix}{c}.{index}.{k}": v for k, v in entry.items()})
        with checkpoint_cause():
            dcp.save(state, checkpoint_id=directory)
        if dist.get_rank() == 0:
            torch.save({"steps": self.steps, **self._layout()}, Path(directory) / TRAINER_STATE)
        dist.barrier()

    def load_checkpoint(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp

        path = Path(directory) / TRAINER_STATE
        if not path.is_file():
            raise ConfigError(
                f"'{directory}' holds no Megatron trainer checkpoint ({TRAINER_STATE} missing): pass a "
                "directory written by save_checkpoint"
            )
        saved = torch.load(path, weights_only=True)
        written = {k: saved.get(k, 1) for k in self._layout()}
        if written != self._layout():
            raise ConfigError(
                f"checkpoint '{directory}' was written with the layout {written}; this trainer runs "
                f"{self._layout()}: reload it with the same layout"
            )
        reader = dcp.FileSystemReader(directory)
        stored = reader.read_metadata().state_dict_metadata
        optim_prefix = self._optimizer_prefix()
        state: dict[str, Any] = self._model_state()
        for key, meta in stored.items():
            if key.startswith(optim_prefix):
                state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        with checkpoint_cause():
            dcp.load(state, storage_reader=reader)
        for c, inner in enumerate(self._inner_optimizers()):
            params = [p for group in inner.param_groups for p in group["params"]]
            entries: dict[int, dict[str, Any]] = {}
            for key, value in state.items():
                if key.startswith(f"{optim_prefix}{c}."):
                    index, name = key[len(f"{optim_prefix}{c}.") :].split(".", 1)
                    entries.setdefault(int(index), {})[name] = value
            with torch.no_grad():
                for index, entry in entries.items():
                    params[index].copy_(entry.pop("param"))
            inner.load_state_dict({"state": entries, "param_groups": inner.state_dict()["param_groups"]})
        self.steps = saved["steps"]
