"""TorchInferno: a torch-native LLM inference workbench.

Top-level names are resolved lazily (PEP 562) so ``import torchinferno`` has no side effects
and stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "LLM": "torchinferno.engine.llm",  # offline batch API, as ``from vllm import LLM``
    "SamplingParams": "torchinferno.core.sampling_params",
    "load_model_auto": "torchinferno.checkpoint.auto",
    "from_pretrained": "torchinferno.checkpoint.auto",
    "save_pretrained": "torchinferno.checkpoint.auto",
    "generate": "torchinferno.engine.generate",
    "llama3_8b_config": "torchinferno.models.llama3.config",
    "llama3_70b_config": "torchinferno.models.llama3.config",
    "Llama3Config": "torchinferno.models.llama3.config",
    "Llama3ForCausalLM": "torchinferno.models.llama3.model",
    "get_family": "torchinferno.models.registry",
    "DeepSeekV32Config": "torchinferno.models.deepseek_v32.config",
    "DeepSeekV32ForCausalLM": "torchinferno.models.deepseek_v32.model",
    "tiny_deepseek_v32_config": "torchinferno.models.deepseek_v32.config",
    "DSv4Config": "torchinferno.models.dsv4.config",
    "DSv4ForCausalLM": "torchinferno.models.dsv4.model",
    "tiny_dsv4_config": "torchinferno.models.dsv4.config",
    "DeepSeekV4Config": "torchinferno.models.deepseek_v4.config",
    "DeepSeekV4ForCausalLM": "torchinferno.models.deepseek_v4.model",
    "tiny_deepseek_v4_config": "torchinferno.models.deepseek_v4.config",
    "dequantize_fp8_block": "torchinferno.checkpoint.fp8",
}

# Documented names that live under another name: name -> (module, attribute).
_RENAMED = {
    "load_text_tokenizer": ("torchinferno.text.tokenizer", "load_tokenizer"),
}

__all__ = sorted([*_LAZY, *_RENAMED]) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _RENAMED:
        module, attr = _RENAMED[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'torchinferno' has no attribute '{name}'")
