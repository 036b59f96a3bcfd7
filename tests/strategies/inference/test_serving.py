"""The serving thread (strategies/inference/serving.py) on the toy engine of docs/extending.md, an
engine with only a batched `generate`: its requests are served one at a time, each as `generate`
serves its prompt; ids in flight are refused; a failure inside the thread is raised by every later
call. The HF and vLLM request paths: test_hf_strategy.py and test_vllm_strategy.py."""

import pytest

import roll_device as rd
from roll_device.errors import ConfigError
from strategies.base import Request, SamplingConfig
from strategies.inference.serving import serve_one_at_a_time
from tests.strategies.inference.serving_checks import PROMPTS, take
from tests.strategies.toy_engine import ToyEngine, ToySettings

SAMPLING = SamplingConfig(max_tokens=4, temperature=1.0, seed=3)


@pytest.fixture
def toy(tiny_model_path):
    engine = ToyEngine(rd.get_platform("cpu"))
    settings = ToySettings(
        name="toy",
        max_model_len=64,
        dtype="float32",
        update_bucket_bytes=1 << 20,
        logprobs_mode="raw_logprobs",
        capture_sizes=None,
        greedy_only=False,
    )
    engine.initialize(tiny_model_path, settings)
    serve_one_at_a_time(engine)  # as its worker does
    yield engine
    engine.shutdown()


def test_an_engine_with_only_a_batched_generate_serves_requests(toy):
    toy.submit([Request(str(i), tuple(p), SAMPLING) for i, p in enumerate(PROMPTS)])
    with pytest.raises(
        ConfigError, match="request id '0' is already in flight: give every request its own id"
    ):
        toy.submit([Request("0", (5,), SAMPLING)])
    answers = take(toy, len(PROMPTS))
    served = [s for answer in answers for s in answer]
    assert [s.request_id for s in served] == ["0", "1", "2"]  # one at a time, in order
    for s, prompt in zip(served, PROMPTS):
        assert s.completions[0].token_ids == toy.generate([prompt], SAMPLING)[0].token_ids


def test_a_failure_in_the_serving_thread_is_raised_by_every_later_call(toy):
    toy.submit([Request("bad", (10**6,), SAMPLING)])  # outside the vocabulary: the toy checks nothing
    with pytest.raises(IndexError):
        take(toy, 1)
    with pytest.raises(IndexError):
        toy.submit([Request("next", (5,), SAMPLING)])
