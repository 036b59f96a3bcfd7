"""`roll-device export RUN_DIR_OR_CHECKPOINT OUT_DIR [--model PATH]`: a Hugging Face model
directory (safetensors weights, config.json, tokenizer) from a checkpoint of either trainer, for
transformers, vLLM or any HF tool.

The source is a run directory (its latest checkpoint), a `checkpoints/step_<N>` folder, or that
folder's `policy/` (the trainer's own files). The model the run started from (its config and
tokenizer) is the run's `model` section (the run directory's config.yaml), or `--model`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from roll_device.errors import ConfigError
from roll_device.files import make_folder
from roll_device.pipeline.config import ModelSettings
from roll_device.pipeline.experiment import POLICY_DIR, RUN_CONFIG_FILE, model_path
from roll_device.pipeline.state import Checkpoints
from roll_device.settings import read_section


def checkpoint_and_run(source: Path) -> tuple[Path, Path | None]:
    """The trainer checkpoint folder `source` names, and the run directory it belongs to (None
    when it is a folder outside a run)."""
    if (source / RUN_CONFIG_FILE).is_file() and (source / "checkpoints").is_dir():
        latest = Checkpoints(source).latest()
        if latest is None:
            raise ConfigError(f"export: run directory {source} holds no committed checkpoint")
        return latest[0] / POLICY_DIR, source
    if (source / POLICY_DIR).is_dir():
        source = source / POLICY_DIR
    run = source.parent.parent.parent if source.name == POLICY_DIR else None
    return source, run if run is not None and (run / RUN_CONFIG_FILE).is_file() else None


def base_model(run_dir: Path | None, given: str | None) -> str:
    """The directory of the model the run started from."""
    if given is not None:
        return given
    if run_dir is None:
        raise ConfigError(
            "export: the checkpoint is not inside a run directory, so its model is unknown: pass "
            "--model PATH (the model directory the run trained)"
        )
    saved = yaml.safe_load((run_dir / RUN_CONFIG_FILE).read_text())
    return model_path(read_section(ModelSettings, saved["model"], "model"))


def export_command(source: str, out_dir: str, model: str | None = None) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from strategies.tied_weights import state_once
    from strategies.training.checkpoint_export import hf_state_dict

    checkpoint, run_dir = checkpoint_and_run(Path(source).expanduser())
    base = base_model(run_dir, model)
    state = hf_state_dict(str(checkpoint), base)
    config = AutoConfig.from_pretrained(base)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    expected = set(state_once(hf_model))  # a tied head: the embedding
    if missing := sorted(expected - set(state)):
        raise ConfigError(f"export: checkpoint {checkpoint} lacks {', '.join(missing[:3])} of model {base}")
    hf_model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    hf_model.tie_weights()  # assigning the embedding replaced the parameter the head shared
    out = make_folder(out_dir, "export's OUT_DIR")
    hf_model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    print(f"exported {checkpoint} ({len(expected)} tensors of {base}) to {out}")
    return 0
