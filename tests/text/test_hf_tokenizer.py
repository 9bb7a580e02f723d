"""HFTokenizer must behave like transformers' AutoTokenizer on the same directory."""

from __future__ import annotations

import json

import pytest

from torchinferno.errors import TokenizerError
from torchinferno.text import HFTokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")

CHATS = [
    [{"role": "user", "content": "Hello 世界 🙂"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hey! <b>bold</b>"}, {"role": "user", "content": "again\n\nplease"}],
]

VARIANTS = {
    "chatml": {},
    "bos_postprocessor": {"bos_in_postprocessor": True},
    "jinja_file": {"template_in_jinja_file": True},
    "gpt2_class": {"tokenizer_class": "GPT2Tokenizer"},
    # bos is an ordinary vocab entry -> both must turn it into a special added token
    "plain_word_bos": {"extra_config": {"bos_token": "hello", "add_bos_token": True}},
    # special tokens missing from tokenizer.json and an extra non-special added token
    "new_tokens": {"extra_config": {
        "eos_token": "<|new_eos|>", "sep_token": "<sep>", "additional_special_tokens": ["<think>"],
        "extra_special_tokens": {}, "image_token": "<image>"}},
}


def _auto(path):
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory, bpe_dir_builder):
    path = bpe_dir_builder(tmp_path_factory.mktemp(request.param), **VARIANTS[request.param])
    return HFTokenizer(path), _auto(path)


def _texts(sample_texts):
    return sample_texts + ["hello world hello", "x <think> y <image> z <sep>", "<|new_eos|>tail"]


def test_encode_matches_transformers(pair, sample_texts):
    ours, hf = pair
    for text in _texts(sample_texts):
        for add in (True, False):
            assert ours.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add), (text, add)


def test_decode_matches_transformers(pair, sample_texts):
    ours, hf = pair
    for text in _texts(sample_texts):
        ids = hf.encode(text, add_special_tokens=True)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (text, skip)
    assert ours.vocab_size == len(hf)


def test_chat_template_matches_transformers(pair):
    ours, hf = pair
    for chat in CHATS:
        for gen in (True, False):
            expected = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == expected
        expected_ids = hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert ours.encode_chat(chat) == list(expected_ids)


def test_special_ids(pair):
    ours, hf = pair
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_ids[0] == hf.eos_token_id


def test_skip_special_tokens_really_differs(bpe_tokenizer):
    ids = bpe_tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert bpe_tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert bpe_tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert bpe_tokenizer.is_special(ids[0]) and not bpe_tokenizer.is_special(ids[1])


def test_bos_added_only_with_special_tokens(bpe_tokenizer_factory):
    tok = HFTokenizer(bpe_tokenizer_factory(bos_in_postprocessor=True))
    bos = tok.backend.token_to_id("<|endoftext|>")
    assert tok.encode("hi", add_special_tokens=True)[0] == bos
    assert tok.encode("hi", add_special_tokens=False)[0] != bos
    assert tok.encode_chat(CHATS[0])[0] == tok.backend.token_to_id("<|im_start|>")  # no extra bos


def test_eos_ids_from_generation_config_and_template(bpe_tokenizer_factory):
    path = bpe_tokenizer_factory(generation_eos=[0, 2], extra_config={"eos_token": "<|endoftext|>"})
    tok = HFTokenizer(path)
    im_end = tok.backend.token_to_id("<|im_end|>")
    assert tok.eos_token_ids == [0, 2] and im_end == 2
    path2 = bpe_tokenizer_factory(generation_eos=1, extra_config={"eos_token": "<|endoftext|>"})
    assert HFTokenizer(path2).eos_token_ids == [0, 1, im_end]  # eos, generation_config, <|im_end|> in template


def test_template_without_im_end_does_not_add_it(bpe_tokenizer_factory):
    path = bpe_tokenizer_factory(extra_config={"eos_token": "<|endoftext|>",
                                               "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    assert HFTokenizer(path).eos_token_ids == [0]


def test_load_tokenizer_specs(bpe_tokenizer_dir, tmp_path):
    assert load_tokenizer("byte").name == "byte"
    assert isinstance(load_tokenizer(bpe_tokenizer_dir), HFTokenizer)
    assert isinstance(load_tokenizer(str(bpe_tokenizer_dir / "tokenizer.json")), HFTokenizer)
    for bad in ["nonexistent-model", tmp_path, str(tmp_path / "x.json")]:
        with pytest.raises(TokenizerError, match="tokenizer.json"):
            load_tokenizer(bad)


def test_corrupt_files_raise_tokenizer_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError):
        HFTokenizer(tmp_path)


def test_no_chat_template_raises(bpe_tokenizer_factory):
    path = bpe_tokenizer_factory()
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match="no chat template"):
        HFTokenizer(path).apply_chat_template(CHATS[0])


def test_out_of_range_id_raises(bpe_tokenizer):
    with pytest.raises(TokenizerError, match="out of range"):
        bpe_tokenizer.decode([bpe_tokenizer.vocab_size])


TOOL_TEMPLATE = """{%- set ns = namespace(system=none) -%}
{%- if messages[0].role == 'system' %}{% set ns.system = messages[0].content %}{% endif -%}
{{ bos_token }}<|im_start|>system
{{ ns.system if ns.system else 'Default system.' }}
{%- if tools %}

# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}
{%- endif %}<|im_end|>
{% for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- if m.role not in ['user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}
<|im_start|>{{ m.role }}
{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson(indent=1) }}</tool_call>{% endfor %}{% else %}{{ m.content | trim }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>
{% endif %}{% endif %}"""


def test_tool_template_matches_transformers(bpe_tokenizer_factory):
    path = bpe_tokenizer_factory(extra_config={"chat_template": TOOL_TEMPLATE})
    ours, hf = HFTokenizer(path), _auto(path)
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function",
              "function": {"name": "get_weather", "description": "Météo <city>", "parameters": params}}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}}
    chat = [{"role": "system", "content": "You help."}, {"role": "user", "content": "  Weather in 東京?  "},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "sunny"}]
    for kwargs in ({}, {"enable_thinking": False}):
        expected = hf.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
        assert ours.apply_chat_template(chat, tools=tools, **kwargs) == expected
    assert "<think>" in ours.apply_chat_template(chat, enable_thinking=False)
    with pytest.raises(TokenizerError, match="bad role"):
        ours.apply_chat_template([{"role": "robot", "content": "x"}])
