"""`roll-device make-tiny-model PATH [--shapes S] [--layers N] [--hidden N]`: write the tiny Qwen2
model and its character tokenizer (`tiny-qwen3`, `tiny-qwen3-moe`: the tiny Qwen3 and Qwen3-MoE), or a
randomly initialised model of a Qwen model's shapes with that tokenizer, for measurements at size."""

from __future__ import annotations

from roll_device.errors import ConfigError
from roll_device.files import make_folder

TINY_SHAPES = "tiny"
# the tiny shapes -> the architecture of roll_device/models/tiny.py's ARCHITECTURES they make
TINY_ARCHITECTURES = {TINY_SHAPES: "qwen2", "tiny-qwen3": "qwen3", "tiny-qwen3-moe": "qwen3_moe"}
# the shapes of real models, as roll_device/models/qwen_shaped.py names them (not imported: it loads
# transformers)
QWEN_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-30b-a3b")
SHAPES = (*TINY_ARCHITECTURES, *QWEN_SHAPES)


def make_model_command(path: str, shapes: str, seed: int, layers: int | None, hidden: int | None) -> int:
    make_folder(path, "make-tiny-model's PATH")
    if shapes in QWEN_SHAPES:
        from roll_device.models.qwen_shaped import make_qwen_shaped_model

        if hidden is not None:
            raise ConfigError(f"make-tiny-model: --hidden applies to the tiny shapes, not {shapes}")
        made = make_qwen_shaped_model(path, num_layers=layers, seed=seed, tokenizer=True, shapes=shapes)
        print(f"randomly initialised model of {shapes}'s shapes and a character tokenizer in {made}")
        return 0
    from roll_device.models.tiny import make_tiny_model

    sizes = {
        key: value for key, value in (("num_layers", layers), ("hidden_size", hidden)) if value is not None
    }
    architecture = TINY_ARCHITECTURES[shapes]
    made = make_tiny_model(path, seed=seed, architecture=architecture, **sizes)  # sizes not given: its own
    print(f"tiny {architecture} model and tokenizer in {made}")
    return 0
