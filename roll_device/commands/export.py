"""`roll-device export RUN_DIR_OR_CHECKPOINT OUT_DIR [--model PATH] [--overwrite]`: a Hugging Face
model directory (safetensors weights, config.json, tokenizer) from a checkpoint of either trainer,
for transformers, vLLM or any HF tool.

The source is a run directory (its latest checkpoint), a `checkpoints/step_<N>` folder, or that
folder's `policy/` (the trainer's own files); a PPO run's `critic/` is refused as such. The model
the run started from (its config and tokenizer) is the run's `model` section (the run directory's
config.yaml), or `--model`.

The input is checked as `run resume=true` checks it, before torch loads: a committed checkpoint's
files against its manifest (sizes and CRC32s; a damaged one is named, with the newest complete
checkpoint to export instead), the model directory, and an output folder that already holds files
(refused unless `--overwrite`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from roll_device.errors import ConfigError
from roll_device.files import give_ordinary_mode, make_folder
from roll_device.models.hf_dir import check_model_dir
from roll_device.pipeline.state import (
    CHECKPOINTED,
    MANIFEST_FILE,
    POLICY_DIR,
    RUN_CONFIG_FILE,
    STATE_FILE,
    Checkpoints,
)

SOURCES = "a run directory, a checkpoints/step_<N> folder or its policy/ folder"


def checkpoint_and_run(source: Path) -> tuple[Path, Path | None]:
    """The trainer checkpoint folder `source` names, and the run directory it belongs to (None
    when it is a folder outside a run)."""
    if not source.exists():
        raise ConfigError(f"export: {source} does not exist: pass {SOURCES}")
    if (source / RUN_CONFIG_FILE).is_file() and (source / "checkpoints").is_dir():
        latest = Checkpoints(source).latest_path()
        if latest is None:
            raise ConfigError(f"export: run directory {source} holds no committed checkpoint")
        return latest / POLICY_DIR, source
    if source.name == CHECKPOINTED["critic"] and (source.parent / POLICY_DIR).is_dir():
        raise ConfigError(
            f"export: {source} is PPO's critic, a value model; export writes the policy: pass "
            f"{source.parent} (or its {POLICY_DIR}/)"
        )
    if (source / POLICY_DIR).is_dir():
        source = source / POLICY_DIR
    run = source.parent.parent.parent if source.name == POLICY_DIR else None
    return source, run if run is not None and (run / RUN_CONFIG_FILE).is_file() else None


def check_committed(policy: Path) -> None:
    """A ConfigError naming the damaged file when the pipeline checkpoint holding `policy`
    (a `step_<N>` folder, with its manifest) fails resume's check, offering the newest complete
    checkpoint beside it. A trainer checkpoint outside a pipeline checkpoint has no manifest."""
    step = policy.parent
    if not ((step / MANIFEST_FILE).exists() or (step / STATE_FILE).exists()):
        return
    checkpoints = Checkpoints(step.parent.parent)  # the run directory of checkpoints/step_<N>
    problem = checkpoints.problem(step)
    if problem is None:
        return
    fallback = checkpoints.newest_complete(besides=step)
    offer = (
        f"the newest complete checkpoint is {fallback.name}: roll-device export {fallback} OUT_DIR"
        if fallback is not None
        else "no other complete checkpoint exists beside it"
    )
    raise ConfigError(f"export: checkpoint {step} is damaged: {problem}; {offer}")


def base_model(run_dir: Path | None, given: str | None) -> dict | str:
    """The directory of the model the run started from (checked), or the run's `model` section
    when that is the tiny model (made on first use, see `model_dir`)."""
    if given is not None:
        check_model_dir(given, "--model", "the one the run trained")
        return given
    if run_dir is None:
        raise ConfigError(
            "export: the checkpoint is not inside a run directory, so its model is unknown: pass "
            "--model PATH (the model directory the run trained)"
        )
    section = yaml.safe_load((run_dir / RUN_CONFIG_FILE).read_text())["model"]
    if section["path"] is None:
        return section
    check_model_dir(section["path"], f"{run_dir / RUN_CONFIG_FILE}'s model.path", "or pass --model PATH")
    return section["path"]


def model_dir(base: dict | str) -> str:
    """`base_model`'s directory: the tiny model is made (or reused) as the run made it."""
    if isinstance(base, str):
        return base
    from roll_device.pipeline.config import ModelSettings
    from roll_device.pipeline.experiment import model_path
    from roll_device.settings import read_section

    return model_path(read_section(ModelSettings, base, "model"))


def output_folder(out_dir: str, overwrite: bool) -> Path:
    """OUT_DIR, made; a folder that already holds files is refused unless `overwrite`."""
    out = Path(out_dir).expanduser()
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"export: OUT_DIR {out} is not empty: choose a new folder, or pass --overwrite to write "
            "the model over the files of the same names in it"
        )
    return make_folder(out, "export's OUT_DIR")


def export_command(
    source: str, out_dir: str, model: str | None = None, overwrite: bool = False, merge: bool = False
) -> int:
    checkpoint, run_dir = checkpoint_and_run(Path(source).expanduser())
    check_committed(checkpoint)
    base = base_model(run_dir, model)
    out = output_folder(out_dir, overwrite)
    return write_model(checkpoint, model_dir(base), out, merge)


def write_model(checkpoint: Path, base: str, out: Path, merge: bool = False) -> int:
    """Write the model of trainer checkpoint `checkpoint` (of the model at `base`) into `out`; a
    LoRA checkpoint's adapter in PEFT's format, or with `merge` its model with the adapter merged
    (roll_device/commands/export_lora.py)."""
    from strategies.training.checkpoint_export import hf_state_dict
    from strategies.training.lora import ADAPTER_CONFIG

    state = hf_state_dict(str(checkpoint), base)
    if (checkpoint / ADAPTER_CONFIG).is_file():
        from roll_device.commands.export_lora import write_adapter

        return write_adapter(checkpoint, state, base, out, merge)
    if merge:
        raise ConfigError(f"export --merge: checkpoint {checkpoint} holds no LoRA adapter: leave --merge out")
    return write_state(checkpoint, state, base, out)


def write_state(checkpoint: Path, state: dict, base: str, out: Path) -> int:
    """Write the HF-named tensors `state` (read from `checkpoint`) as a model of `base` into `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from strategies.tied_weights import state_once

    config = AutoConfig.from_pretrained(base)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    expected = set(state_once(hf_model))  # a tied head: the embedding
    if missing := sorted(expected - set(state)):
        raise ConfigError(f"export: checkpoint {checkpoint} lacks {', '.join(missing[:3])} of model {base}")
    hf_model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    hf_model.tie_weights()  # assigning the embedding replaced the parameter the head shared
    hf_model.save_pretrained(out, safe_serialization=True)
    give_ordinary_mode(sorted(out.glob("*.safetensors")))
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    print(f"exported {checkpoint} ({len(expected)} tensors of {base}) to {out}")
    return 0
