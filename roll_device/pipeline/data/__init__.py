"""Prompts and reference answers for the pipeline: the toy tasks' generated streams, or records
read from a JSONL, Parquet or `datasets`-saved file, shuffled per epoch with a seed and split into
training and held-out evaluation samples."""

from roll_device.pipeline.data.settings import DataSettings
from roll_device.pipeline.data.sources import DatasetPrompts, PromptSource, Sample, TaskPrompts, load_source

__all__ = ["DataSettings", "DatasetPrompts", "PromptSource", "Sample", "TaskPrompts", "load_source"]
