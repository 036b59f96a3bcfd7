"""Reading prompt records: JSONL, JSON lists, Parquet, datasets' save_to_disk folders, and the
one-line refusals of a missing path, an unknown format and an empty file."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll_device.errors import ConfigError
from roll_device.inputs.records import read_records

ROWS = [{"question": "what is 1+1?", "answer": "#### 2"}, {"question": "what is 2+2?", "answer": "#### 4"}]


def _save_like_datasets(folder, rows):
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow stream files named in state.json."""
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as writer,
    ):
        writer.write_table(table)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text("{}")


def test_every_format_gives_the_same_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    _save_like_datasets(tmp_path / "saved", ROWS)
    (tmp_path / "rows.txt").write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]))
    for path in ("a.jsonl", "a.json", "a.parquet", "saved"):
        assert read_records(tmp_path / path) == ROWS, path
    assert read_records(tmp_path / "rows.txt", "jsonl") == ROWS, "data.format overrides the extension"


@pytest.mark.parametrize(
    "name, content, fmt, message",
    [
        ("missing.jsonl", None, "auto", "data.path={path} does not exist"),
        ("empty.jsonl", "\n", "auto", "data.path={path} holds no records"),
        ("bad.jsonl", '{"question": 1}\n{oops\n', "auto", "data.path={path} line 2 is not JSON"),
        ("rows.csv", "a,b\n", "auto", "cannot tell the format from '.csv'"),
        ("rows.jsonl", "{}\n", "xml", "data.format='xml' is unknown: choose auto, jsonl, parquet, arrow"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path, name, content, fmt, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_records(path, fmt)
    assert message.format(path=path) in str(err.value) and "\n" not in str(err.value)


def test_a_dataset_dict_folder_names_its_splits(tmp_path):
    (tmp_path / "dict").mkdir()
    (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    for split in ("train", "test"):
        _save_like_datasets(tmp_path / "dict" / split, ROWS)
    with pytest.raises(ConfigError, match="holds a DatasetDict with splits test, train: point data.path"):
        read_records(tmp_path / "dict")
    assert read_records(tmp_path / "dict" / "train") == ROWS
