"""The reward model's scores (roll_device/inputs/reward_model.py) against the paper's definition,
on tiny real transformers checkpoints, and the checks of its folder."""

import json

import pytest
import torch

from roll_device.errors import ConfigError
from roll_device.inputs.reward_model import RewardModel, check_reward_model_dir, conversation
from roll_device.inputs.rewards import RewardFunctionError, Scoring
from tests.inputs.reward_models import make_last_digit_reward_model, make_reward_model

TEMPLATE = "{% for m in messages %}<bos>{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
ITEMS = [  # lengths differ, so the batch is padded; the second ends with the pad token's text
    Scoring("abc=", "12", None),
    Scoring("ab=", "3<pad>", None),
    Scoring("abcdef=", "", None),
    Scoring("x", "9q", None, messages=(("system", "short"), ("user", "x"))),
]


def paper_scores(path, rows):
    """InstructGPT's reward (Ouyang et al. 2022, section 3.5): the model with its unembedding
    replaced by a projection to a scalar, read at the sequence's final token. Each row alone,
    unpadded: r = w . h_T, with h_T the last position's final hidden state."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype="float32").eval()
    with torch.no_grad():
        return [
            float(model.score.weight[0] @ model.model(torch.tensor([row])).last_hidden_state[0, -1])
            for row in rows
        ]


@pytest.mark.parametrize("template", [None, TEMPLATE])
def test_the_score_is_the_heads_output_at_each_conversations_last_token(tmp_path, template):
    path = make_reward_model(tmp_path / "rm", chat_template=template)
    model = RewardModel(path, torch.device("cpu"), "float32", micro_batch_size=3)
    rows = [model.token_ids(item) for item in ITEMS]
    assert rows[1][-1] == (0 if template is None else 2)  # pad (transformers' pooling skips it), or <eos>
    got = model.score(ITEMS)
    assert got == pytest.approx(paper_scores(path, rows), abs=1e-5)
    assert len(set(got)) == len(got)


def test_a_conversation_is_rendered_by_the_reward_models_template_with_the_records_messages(tmp_path):
    model = RewardModel(make_reward_model(tmp_path / "rm", TEMPLATE), torch.device("cpu"), "float32", 4)
    rendered = model.tokenizer.decode(model.token_ids(ITEMS[3]))
    assert rendered == "<bos>s:short<eos><bos>u:x<eos><bos>a:9q<eos>"
    assert conversation(ITEMS[0]) == [
        {"role": "user", "content": "abc="},
        {"role": "assistant", "content": "12"},
    ]
    plain = RewardModel(make_reward_model(tmp_path / "plain"), torch.device("cpu"), "float32", 4)
    assert plain.tokenizer.decode(plain.token_ids(ITEMS[0])) == "abc=12"


def test_the_last_digit_model_scores_what_it_is_built_to(tmp_path):
    """The run tests' reward model (tests/inputs/reward_models.py) scores 1 for a last digit."""
    model = RewardModel(make_last_digit_reward_model(tmp_path / "rm"), torch.device("cpu"), "float32", 2)
    assert model.score(ITEMS) == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-4)
    assert model.score([Scoring("a=", "4", None)]) == pytest.approx([1.0], abs=1e-4)


def test_a_score_that_is_not_finite_ends_the_step_naming_the_sample(tmp_path):
    path = make_reward_model(tmp_path / "rm")
    model = RewardModel(path, torch.device("cpu"), "float32", 4)
    with torch.no_grad():
        model.model.score.weight.fill_(float("inf"))
    with pytest.raises(
        RewardFunctionError, match=r"reward.model_path=.* scored (inf|-inf|nan) on the sample prompt='abc='"
    ):
        model.score(ITEMS[:1])


def test_a_reward_model_with_a_shorter_context_than_the_rollouts_is_refused(tmp_path):
    path = make_reward_model(tmp_path / "rm")  # 256 positions
    with pytest.raises(
        ConfigError, match=r"reads at most 256 tokens \(max_position_embeddings\), and a prompt"
    ):
        check_reward_model_dir(path, 512)
    model = RewardModel(path, torch.device("cpu"), "float32", 4)
    with pytest.raises(RewardFunctionError, match=r"reads at most 256 tokens, and the sample prompt='aaa"):
        model.score([Scoring("a" * 250, "12345678", None)])  # its template's tokens beyond the rollout's


def _config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_a_folder_that_holds_no_reward_model_is_refused(tmp_path, tiny_model_path):
    check_reward_model_dir(make_reward_model(tmp_path / "rm"), 256)
    with pytest.raises(ConfigError, match=r"reward.model_path=\S+nowhere does not exist"):
        check_reward_model_dir(str(tmp_path / "nowhere"), 256)
    with pytest.raises(ConfigError, match=r"is a Qwen2ForCausalLM, not a reward model"):
        check_reward_model_dir(tiny_model_path, 256)
    _config(tmp_path / "rm", id2label={"0": "bad", "1": "good"})
    with pytest.raises(ConfigError, match=r"has 2 labels, a reward model one"):
        check_reward_model_dir(str(tmp_path / "rm"), 256)
    make_reward_model(tmp_path / "bare")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bare" / name).unlink()
    with pytest.raises(ConfigError, match=r"has no tokenizer"):
        check_reward_model_dir(str(tmp_path / "bare"), 256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_on_a_gpu_the_reward_model_scores_as_on_the_cpu(tmp_path):
    import roll_device as rd

    path = make_reward_model(tmp_path / "rm", chat_template=TEMPLATE)
    on_cpu = RewardModel(path, torch.device("cpu"), "float32", 3).score(ITEMS)
    on_device = RewardModel(path, rd.current_platform().device(), "float32", 3)
    assert next(on_device.model.parameters()).device.type == rd.current_platform().device_type
    assert on_device.score(ITEMS) == pytest.approx(on_cpu, abs=1e-4)
