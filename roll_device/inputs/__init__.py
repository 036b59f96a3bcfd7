"""What a run reads besides its model weights, self-contained: the `data`, `reward` and `eval`
sections (settings.py), the toy tasks (tasks.py), records of JSONL, Parquet or `datasets` files
(records.py) and roll-device's own arithmetic dataset (arithmetic.py), the prompt streams with
their held-out evaluation samples (sources.py), prompt text to token ids (prompts.py), the
rewards (rewards.py), and the driver's loading of all of it before workers start (loading.py).
It imports nothing of the pipeline, the cluster or the strategies."""

from roll_device.inputs.settings import DataSettings, EvalSettings, RewardSettings
from roll_device.inputs.sources import DatasetPrompts, PromptSource, Sample, TaskPrompts, load_source

__all__ = [
    "DataSettings",
    "DatasetPrompts",
    "EvalSettings",
    "PromptSource",
    "RewardSettings",
    "Sample",
    "TaskPrompts",
    "load_source",
]
