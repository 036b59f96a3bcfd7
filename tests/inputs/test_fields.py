"""A record's prompt and answer: dotted keys into nested records, chat-message prompts (verl's
prepared datasets, written to Parquet and read back), and the refusals of values a run cannot
read."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll_device.errors import ConfigError
from roll_device.inputs.fields import Sample, to_samples
from roll_device.inputs.records import read_records

# one row as verl's examples/data_preprocess/gsm8k.py writes it
VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [
        {"role": "system", "content": "think step by step"},
        {"role": "user", "content": "what is 3+4?"},
    ],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "7"},
    "extra_info": {"split": "train", "index": 0},
}


def test_a_verl_parquet_row_gives_its_messages_and_its_nested_ground_truth(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([VERL_ROW]), path)
    [sample] = to_samples(read_records(path), "prompt", "reward_model.ground_truth", str(path))
    messages = (("system", "think step by step"), ("user", "what is 3+4?"))
    assert sample == Sample("what is 3+4?", "7", messages, "openai/gsm8k", {"split": "train", "index": 0})
    assert sample.chat() == VERL_ROW["prompt"]


def test_a_plain_row_and_a_numeric_answer():
    assert to_samples([{"q": "1+1", "a": 2}], "q", "a", "d") == [Sample("1+1", "2")]
    assert to_samples([{"q": "1+1", "a": 2.5}], "q", "a", "d")[0].chat() is None
    assert to_samples([{"q.x": "p", "a": "1"}], "q.x", "a", "d") == [Sample("p", "1")], "a key with a dot"


@pytest.mark.parametrize(
    "row, answer_key, message",
    [
        ({"q": "", "a": "1"}, "a", "record 0 of d: 'q' is an empty prompt"),
        ({"q": ["hi"], "a": "1"}, "a", "record 0 of d: 'q'[0] is str 'hi': each chat message is"),
        ({"q": [], "a": "1"}, "a", "'q' is list []: a prompt is a string or a list of chat messages"),
        ({"q": {"text": "p"}, "a": "1"}, "a", "'q' is dict {'text': 'p'}: a prompt is a string"),
        (
            {"q": "p", "a": None},
            "a",
            "record 0 of d: 'a' is NoneType None: a reference answer is a string or",
        ),
        ({"q": "p", "a": ["1", "2"]}, "a", "'a' is list ['1', '2']: a reference answer"),
        ({"q": "p", "a": True}, "a", "'a' is bool True: a reference answer"),
        (
            {"q": "p", "rm": {"style": "rule"}},
            "rm.ground_truth",
            "record 0 of d has no key 'rm.ground_truth' (data.answer_key): its keys under 'rm' are style;",
        ),
        ({"q": "p", "rm": "x"}, "rm.truth", "its keys under 'rm' are none (str);"),
    ],
)
def test_values_a_run_cannot_read_are_refused_naming_the_record(row, answer_key, message):
    with pytest.raises(ConfigError) as refused:
        to_samples([row], "q", answer_key, "d")
    assert message in str(refused.value)
