"""Prompt encoding with and without a chat template, stop ids from generation_config.json, and
the checks of a model directory."""

import json
import warnings

import pytest

from roll_device.errors import ConfigError
from roll_device.inputs.prompts import PromptEncoder
from roll_device.models.hf_dir import check_model_dir
from roll_device.models.tiny import build_tokenizer

TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<bos>a:{% endif %}"
)


def test_raw_prompts_get_the_bos_token_and_chat_prompts_the_template():
    tokenizer = build_tokenizer()
    raw = PromptEncoder(tokenizer)
    assert not raw.chat, "the tiny tokenizer has no chat template"
    assert raw.encode("ab=") == [
        tokenizer.bos_token_id,
        *tokenizer("ab=", add_special_tokens=False).input_ids,
    ]
    tokenizer.chat_template = TEMPLATE
    chat = PromptEncoder(tokenizer)
    assert chat.render("1+1") == "<bos>u:1+1<eos><bos>a:"
    assert tokenizer.decode(chat.encode("1+1")) == "<bos>u:1+1<eos><bos>a:"
    assert PromptEncoder(tokenizer, use_chat_template=False).render("1+1") == "1+1", "the switch"


THINKING = (  # Qwen3's switch, as its template reads it: thinking unless enable_thinking is false
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}a:{% if enable_thinking is defined and not enable_thinking %}"
    "<pad><pad>{% endif %}{% endif %}"
)


def test_the_chat_templates_variables_reach_the_prompts_and_the_agentic_turns():
    from roll_device.agentic.chat import ChatRenderer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = THINKING
    assert PromptEncoder(tokenizer).render("1+1") == "u:1+1<eos>a:"
    off = {"enable_thinking": False}
    assert PromptEncoder(tokenizer, template_kwargs=off).render("1+1") == "u:1+1<eos>a:<pad><pad>"
    user = [{"role": "user", "content": "1+1"}]
    assert ChatRenderer(tokenizer, None, []).render(user, generation=True) == "u:1+1<eos>a:"
    assert ChatRenderer(tokenizer, None, [], off).render(user, generation=True) == "u:1+1<eos>a:<pad><pad>"


def test_the_renderings_own_arguments_are_refused_as_template_variables():
    import inspect

    from transformers import PreTrainedTokenizerBase

    from roll_device.commands.gate import load_config
    from roll_device.pipeline.config import RENDERING_ARGUMENTS

    own = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    assert RENDERING_ARGUMENTS == tuple(name for name in own if name not in ("self", "kwargs"))
    with pytest.raises(
        ConfigError, match="model.chat_template_kwargs=.*tokenize is an argument of the rendering"
    ):
        load_config(["+model.chat_template_kwargs.tokenize=true"])
    assert load_config(["+model.chat_template_kwargs.enable_thinking=false"]).model.chat_template_kwargs == {
        "enable_thinking": False
    }


def test_chat_messages_are_rendered_as_given_and_refused_without_a_template():
    tokenizer = build_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"}]
    with pytest.raises(
        ConfigError, match="chat messages, which need a chat template, but the model's tokenizer has none"
    ):
        PromptEncoder(tokenizer).encode("1+1", messages)
    tokenizer.chat_template = TEMPLATE
    assert PromptEncoder(tokenizer).render("1+1", messages) == "<bos>s:be brief<eos><bos>u:1+1<eos><bos>a:"
    with pytest.raises(
        ConfigError, match="but model.chat_template=false: set model.chat_template=true, or give"
    ):
        PromptEncoder(tokenizer, use_chat_template=False).encode("1+1", messages)


def test_responses_are_decoded_for_the_reward_without_special_tokens():
    tokenizer = build_tokenizer()
    encoder = PromptEncoder(tokenizer)
    answer = tokenizer("12", add_special_tokens=False).input_ids
    responses = [answer + [tokenizer.eos_token_id], [tokenizer.bos_token_id, *answer], []]
    assert encoder.decode(responses) == ["12", "12", ""]


UNKNOWN = (
    "the tokenizer does not know {} (in prompt {!r}): it encodes them as '<pad>', which decodes to nothing, "
    "so the model never sees them; write the prompts in characters it knows, or use a model whose tokenizer "
    "knows them (model.path)"
)


def test_characters_the_tokenizer_does_not_know_are_named_once_each():
    # Before: the tiny tokenizer turned them into <pad> (nothing, decoded) without a word.
    encoder = PromptEncoder(build_tokenizer())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt in ("What is 2+2?", "What is 3+3?", "Ok: what is 1+1!", "what is 4+4?"):
            encoder.encode(prompt)
    assert [str(w.message) for w in caught] == [
        UNKNOWN.format("'W'", "What is 2+2?"),
        UNKNOWN.format("'!', 'O'", "Ok: what is 1+1!"),  # 'W' was named already
    ]


def test_stop_ids_include_the_generation_configs_eos_ids(tmp_path):
    tokenizer = build_tokenizer()
    assert PromptEncoder(tokenizer).tokens.stop == (tokenizer.eos_token_id,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert PromptEncoder(tokenizer, model_path=str(tmp_path)).tokens.stop == (2, 7)


def _model_dir(tmp_path, model_type="qwen3", tokenizer=True):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    if tokenizer:
        (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_model_directories_are_checked(tmp_path, tiny_model_path):
    check_model_dir(tiny_model_path)
    check_model_dir(_model_dir(tmp_path))
    with pytest.raises(ConfigError, match="model.path=/nowhere does not exist: give a local Hugging Face"):
        check_model_dir("/nowhere")
    with pytest.raises(
        ConfigError, match="is a 'bert' model: the strategies run qwen2, qwen3, qwen3_moe, llama causal LMs"
    ):
        check_model_dir(_model_dir(tmp_path / "bert", "bert"))
    with pytest.raises(ConfigError, match="has no tokenizer"):
        check_model_dir(_model_dir(tmp_path / "t", tokenizer=False))
