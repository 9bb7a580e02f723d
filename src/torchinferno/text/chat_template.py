"""Render Hugging Face style jinja2 chat templates.

The environment mirrors what ``transformers`` gives a template, so a template from a model repo
renders to the same string: a sandboxed, immutable jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a no-op ``{% generation %}`` block, the
globals ``raise_exception`` and ``strftime_now``, a ``namespace`` that refuses underscore names,
and a ``tojson`` filter that does not HTML-escape (``ensure_ascii=False``, ``indent``,
``separators`` and ``sort_keys`` supported).

Variables seen by the template: ``messages``, ``add_generation_prompt``, ``tools`` and
``documents`` (``None`` unless given), ``bos_token``/``eos_token`` and any ``**extra``.

Invariants: each distinct template string is compiled once (LRU cache); any error a template
raises (``raise_exception``, syntax error, undefined call) surfaces as ``TokenizerError`` with a
one-line message. Nothing happens at import time.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

from torchinferno.errors import TokenizerError

__all__ = ["compile_chat_template", "render_chat_template", "normalize_messages"]

# Names under which a message's reasoning may arrive; templates usually read the first.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise TokenizerError(f"chat template error: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Unlike jinja's built-in filter this does not HTML-escape ('<' stays '<'), as HF templates expect.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _build_environment():
    """Create the sandboxed jinja2 environment (only called on first compile)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body unchanged.

        transformers uses the block to build assistant-token masks for training; inference only
        needs the text.
        """

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        """A jinja ``namespace`` that refuses underscore-prefixed attribute names."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (jinja's signature trick)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for key in attrs:
                SafeNamespace._check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            SafeNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise TokenizerError(f"chat template tried to set underscore attribute {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = SafeNamespace
    return env


@lru_cache(maxsize=1)
def _environment():
    return _build_environment()


@lru_cache(maxsize=64)
def compile_chat_template(template: str):
    """Compile ``template`` once; later calls with the same string return the cached object."""
    import jinja2

    if not isinstance(template, str) or not template:
        raise TokenizerError("chat template must be a non-empty string")
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TokenizerError(f"chat template has a syntax error at line {e.lineno}: {e.message}") from None


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copy ``messages`` to plain dicts the way transformers prepares them for a template.

    Keys whose value is ``None`` are dropped (OpenAI clients send ``content=None``), and a
    message's reasoning given under any of ``reasoning_content``/``thinking``/``reasoning`` is
    also made available under ``reasoning_content`` and ``thinking``.
    """
    if isinstance(messages, Mapping) or not isinstance(messages, Sequence) or isinstance(messages, str):
        raise TokenizerError("messages must be a list of dicts with 'role' and 'content'")
    if len(messages) == 0:
        raise TokenizerError("cannot apply a chat template to an empty list of messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TokenizerError(f"message {i} must be a dict, got {type(message).__name__}")
        msg = {k: v for k, v in message.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_KEYS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **extra: Any,
) -> str:
    """Render ``messages`` with ``template`` and return the prompt text.

    ``extra`` becomes template variables (e.g. ``tools``, ``documents``, other special tokens,
    ``enable_thinking``); it overrides ``bos_token``/``eos_token`` if it repeats them.
    Raises ``TokenizerError`` for any template failure.
    """
    import jinja2

    compiled = compile_chat_template(template)
    variables: dict[str, Any] = {"tools": None, "documents": None}
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    variables.update(extra)
    variables["messages"] = normalize_messages(messages)
    variables["add_generation_prompt"] = add_generation_prompt
    try:
        return compiled.render(**variables)
    except TokenizerError:
        raise
    except jinja2.TemplateError as e:
        raise TokenizerError(f"chat template failed: {type(e).__name__}: {e}") from None
    except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
        raise TokenizerError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None
