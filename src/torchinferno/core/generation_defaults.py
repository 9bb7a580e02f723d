"""Default sampling for requests that leave fields out: a model's ``generation_config.json`` (``serve
--generation-config``, ``LLM(generation_config=)`` and ``LLM.get_default_sampling_params()``), as vLLM's
``--generation-config auto`` does.

Model authors ship their recommended sampling there (Llama-3-Instruct: temperature 0.6, top_p 0.9). A request's own
fields always win; a field neither the request nor the file sets keeps the OpenAI default (temperature 1, top_p 1,
no top-k / min-p, 16 new tokens for completions, the rest of the context for chat).

* ``auto`` (the default): the served checkpoint's ``generation_config.json`` when it has one;
* ``vllm``: none (the API's own defaults, whatever the checkpoint says);
* a folder: that folder's ``generation_config.json`` (it must exist).

Keys read: ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``max_new_tokens`` (the default ``max_tokens``,
clamped to the context left). ``do_sample`` is not read (as in vLLM: a file that sets a temperature means it).
``repetition_penalty`` and other sampling keys this engine does not implement are named in the startup line and not
applied. A value out of range is a one-line ``ConfigError`` naming the file and key, at startup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.errors import ConfigError

__all__ = ["MODES", "UNIMPLEMENTED", "SamplingDefaults", "load_sampling_defaults"]

MODES = ("auto", "vllm")  # or a folder
FILE = "generation_config.json"
# sampling keys this engine does not implement, with the value that changes nothing (in a file: not reported; in a
# request: accepted, server.protocol)
UNIMPLEMENTED = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "typical_p": 1.0,
                "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "no_repeat_ngram_size": 0}


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets for a field it leaves out (None: the OpenAI default). ``source``: the file read ("" when
    none); ``unsupported``: sampling keys of that file this engine does not apply."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # -1 = off (a file's 0 too)
    min_p: float | None = None
    max_tokens: int | None = None
    source: str = ""
    unsupported: tuple[str, ...] = ()

    def __post_init__(self):
        if self.top_k == 0:  # off, spelled as SamplingParams spells it
            object.__setattr__(self, "top_k", -1)

    def values(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("source", "unsupported") and getattr(self, f.name) is not None}

    def sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with these defaults in place of its own (``LLM.get_default_sampling_params``)."""
        return SamplingParams(**self.values())

    def describe(self) -> str:
        """The startup line ("" when nothing applies)."""
        vals = self.values()
        if not vals and not self.unsupported:
            return ""
        shown = ", ".join(f"{k}={v}" for k, v in vals.items()) or "nothing applicable"
        line = f"default sampling from {self.source}: {shown} (a request's own fields win; --generation-config vllm " \
               f"ignores the file)"
        if self.unsupported:
            line += f"; not applied (not implemented): {', '.join(self.unsupported)}"
        return line


def load_sampling_defaults(setting: str, model_dir: str | Path | None) -> SamplingDefaults:
    """``setting``: ``auto`` | ``vllm`` | a folder (module docstring); ``model_dir``: the served checkpoint's folder,
    None for a random model."""
    if setting == "vllm":
        return SamplingDefaults()
    if setting == "auto":
        if model_dir is None or not (Path(model_dir) / FILE).is_file():
            return SamplingDefaults()
        path = Path(model_dir) / FILE
    else:
        path = Path(setting) / FILE
        if not path.is_file():
            raise ConfigError(f"--generation-config {setting!r}: no {FILE} there (valid: {', '.join(MODES)} or a "
                              f"folder holding {FILE})")
    from torchinferno.checkpoint.safetensors_io import read_json_object

    cfg = read_json_object(path, FILE)
    return SamplingDefaults(
        temperature=_number(cfg, "temperature", path, lambda v: v >= 0, ">= 0"),
        top_p=_number(cfg, "top_p", path, lambda v: 0 < v <= 1, "in (0, 1]"),
        top_k=_integer(cfg, "top_k", path, -1),
        min_p=_number(cfg, "min_p", path, lambda v: 0 <= v <= 1, "in [0, 1]"),
        max_tokens=_integer(cfg, "max_new_tokens", path, 1),
        source=str(path),
        unsupported=tuple(k for k, neutral in UNIMPLEMENTED.items() if cfg.get(k) not in (None, neutral)),
    )


def _number(cfg: dict, key: str, path: Path, ok, rule: str) -> float | None:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise ConfigError(f"{path}: {key} must be a finite number {rule}, got {v!r}")
    return float(v)


def _integer(cfg: dict, key: str, path: Path, low: int) -> int | None:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"{path}: {key} must be an integer >= {low}, got {v!r}")
    return v
