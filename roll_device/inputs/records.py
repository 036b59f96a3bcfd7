"""Read prompt records (one dict per row) from a file: JSON lines (`.jsonl`, or `.json` holding
lines or one list), Parquet (`.parquet`, through pyarrow), or a folder written by the `datasets`
library's `save_to_disk` (Arrow stream files named in its `state.json`). The format follows the
file's extension unless `data.format` names it."""

from __future__ import annotations

import json
from pathlib import Path

from roll_device.errors import ConfigError

FORMATS = ("jsonl", "parquet", "arrow")
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
DATASET_STATE = "state.json"  # written by datasets' save_to_disk beside its Arrow files
DATASET_DICT = "dataset_dict.json"  # a DatasetDict: one sub-folder per split


def detect_format(path: Path, fmt: str = "auto") -> str:
    """The reader for `path`: `fmt` when given, else from the extension or a datasets folder."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ConfigError(f"data.format='{fmt}' is unknown: choose auto, {', '.join(FORMATS)}")
        return fmt
    if path.is_dir():
        if (path / DATASET_DICT).exists():
            splits = ", ".join(sorted(p.name for p in path.iterdir() if p.is_dir()))
            raise ConfigError(
                f"data.path={path} holds a DatasetDict with splits {splits}: point data.path at one "
                f"split's folder, e.g. data.path={path}/train"
            )
        if (path / DATASET_STATE).exists():
            return "arrow"
        raise ConfigError(
            f"data.path={path} is a folder without {DATASET_STATE}: give a .jsonl or .parquet file, "
            "or a folder written by datasets' save_to_disk"
        )
    if path.suffix in EXTENSIONS:
        return EXTENSIONS[path.suffix]
    raise ConfigError(
        f"data.path={path}: cannot tell the format from '{path.suffix}': use .jsonl, .json, .parquet, "
        f"or set data.format to one of {', '.join(FORMATS)}"
    )


def _json_lines(path: Path) -> list[dict]:
    text = path.read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"data.path={path} line {number} is not JSON: {exc.msg}") from exc
    return rows


def _parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _arrow_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    state = json.loads((path / DATASET_STATE).read_text())
    return [path / entry["filename"] for entry in state["_data_files"]]


def _arrow(path: Path) -> list[dict]:
    import pyarrow as pa

    rows = []
    for file in _arrow_files(path):
        with pa.memory_map(str(file)) as source:
            rows.extend(pa.ipc.open_stream(source).read_all().to_pylist())
    return rows


READERS = {"jsonl": _json_lines, "parquet": _parquet, "arrow": _arrow}


def read_records(path: str | Path, fmt: str = "auto") -> list[dict]:
    """Every row of the file at `path` as a dict; a missing path is a ConfigError."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"data.path={path} does not exist: give a .jsonl, .parquet or datasets folder")
    rows = READERS[detect_format(path, fmt)](path)
    if not rows:
        raise ConfigError(f"data.path={path} holds no records: give a file with at least one prompt")
    return rows
