"""chat_template.render_chat_template: HF-compatible jinja environment, errors, caching."""

from __future__ import annotations

import datetime

import pytest

from torchinferno.errors import TokenizerError
from torchinferno.text.chat_template import compile_chat_template, render_chat_template

MSGS = [{"role": "user", "content": "<b>hé</b> \"q\""}]


def test_tojson_does_not_escape_html_or_unicode():
    out = render_chat_template("{{ messages[0].content | tojson }}", MSGS)
    assert out == '"<b>hé</b> \\"q\\""'


def test_tojson_indent_and_sort_keys():
    out = render_chat_template("{{ tools | tojson(indent=2, sort_keys=True) }}", MSGS, tools=[{"b": 1, "a": "ü"}])
    assert out == '[\n  {\n    "a": "ü",\n    "b": 1\n  }\n]'


def test_trim_and_lstrip_blocks():
    template = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render_chat_template(template, [{"role": "user", "content": "x"}]) == "U:x\n"


def test_variables_and_extra():
    template = ("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|"
                "{{ tools is none }}|{{ messages|length }}")
    out = render_chat_template(template, MSGS, add_generation_prompt=False, bos_token="<s>", eos_token="</s>",
                               enable_thinking=True)
    assert out == "<s>|</s>|False|True|True|1"


def test_raise_exception_becomes_tokenizer_error():
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}"
    with pytest.raises(TokenizerError, match="System message required"):
        render_chat_template(template, MSGS)


def test_syntax_error_and_runtime_errors_are_tokenizer_errors():
    with pytest.raises(TokenizerError, match="syntax"):
        compile_chat_template("{% for m in messages %}")
    with pytest.raises(TokenizerError):
        render_chat_template("{{ messages[0].content + 1 }}", MSGS)


def test_strftime_now():
    out = render_chat_template("{{ strftime_now('%Y') }}", MSGS)
    assert out == str(datetime.datetime.now().year)


def test_loopcontrols_namespace_and_generation_block():
    template = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
                "{% generation %}[gen]{% endgeneration %}")
    assert render_chat_template(template, MSGS * 5) == "2[gen]"
    with pytest.raises(TokenizerError):
        render_chat_template("{% set ns = namespace(_x=1) %}{{ ns._x }}", MSGS)


def test_none_values_dropped_and_reasoning_aliased():
    msgs = [{"role": "assistant", "content": None, "reasoning": "think"}]
    template = "{{ messages[0].content is defined }}|{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}"
    assert render_chat_template(template, msgs) == "False|think|think"
    assert msgs[0]["content"] is None  # caller's messages untouched


def test_sandbox_blocks_unsafe_access():
    with pytest.raises(TokenizerError):
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", MSGS)
    with pytest.raises(TokenizerError):  # immutable sandbox: no in-place mutation of inputs
        render_chat_template("{{ messages.append(1) }}", MSGS)


def test_template_compiled_once():
    template = "{{ messages[0].role }} cached"
    assert compile_chat_template(template) is compile_chat_template(template)
    before = compile_chat_template.cache_info().hits
    render_chat_template(template, MSGS)
    assert compile_chat_template.cache_info().hits == before + 1
