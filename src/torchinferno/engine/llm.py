"""Offline batch API: ``LLM(model).generate(prompts, SamplingParams)`` over the serving engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from torchinferno.core.generation_defaults import load_sampling_defaults
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.outputs import TokenLogprob
from torchinferno.errors import ConfigError

__all__ = ["LLM", "CompletionOutput"]


@dataclass
class CompletionOutput:
    """The finished result of one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0


def _resolve_tokenizer(model: nn.Module, tokenizer):
    from torchinferno.text.tokenizer import load_tokenizer

    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    ckpt = getattr(model, "checkpoint_dir", None)
    if ckpt is not None and (Path(ckpt) / "tokenizer.json").exists():
        return load_tokenizer(ckpt)
    return None


class LLM:
    """A model plus an in-process ``LLMEngine``; ``generate`` runs a list of prompts with continuous batching.

    ``model`` is a built ``nn.Module`` (with ``.family``) or anything ``load_model_auto`` accepts
    (registry name, HF dir, ``.gguf``, hub id), built through ``engine.assembly.build_model`` like every
    other entry point (``quantization``: one of ``engine.assembly.QUANTIZATIONS``, e.g. ``"fp8"`` or
    ``"fp8-block"``; bf16 CPU weights are pre-packed).
    ``dtype`` defaults to bfloat16 on CUDA and float32 elsewhere. ``tokenizer``: a ``Tokenizer``,
    ``"byte"``, a path, or ``None`` (the checkpoint's ``tokenizer.json`` if there is one; without a
    tokenizer prompts must be token-id lists and outputs have empty text). Extra keyword arguments are
    ``EngineConfig`` fields; unset ones take the device's defaults (on CUDA the KV pool fills
    ``gpu_memory_utilization`` of the device). ``kernel_artifacts``: a ``prepare-deepseek-v4-kernels`` directory
    for a deepseek-v4 model, only loaded (``kernels/v4_artifacts.py``: one notice line and the torch path when it
    does not fit). ``generation_config``: where ``generate`` without ``sampling_params`` takes its defaults
    (``core.generation_defaults``: ``"auto"`` the checkpoint's generation_config.json, ``"vllm"`` none, or a folder).
    """

    def __init__(self, model: str | nn.Module, tokenizer=None, dtype: str | torch.dtype | None = None,
                 device: str | torch.device | None = None, quantization: str = "none",
                 kernel_artifacts: str | None = None, generation_config: str = "auto", **engine_kwargs):
        from dataclasses import replace

        from torchinferno.engine.assembly import ModelSpec, build_model

        if kernel_artifacts is not None and isinstance(model, ModelSpec):  # build_model loads them
            model, kernel_artifacts = replace(model, kernel_artifacts=str(kernel_artifacts)), None
        if engine_kwargs.get("tensor_parallel_size", 1) != 1 or engine_kwargs.get("pipeline_parallel_size", 1) != 1:
            self._init_tensor_parallel(model, tokenizer, dtype, device, quantization, engine_kwargs, kernel_artifacts)
            self._defaults = load_sampling_defaults(generation_config, self._checkpoint)
            return
        if isinstance(model, ModelSpec):
            model = build_model(model)
        elif isinstance(model, (str, Path)):
            dev = str(device or "cpu")
            if dtype is None:
                dtype = "bfloat16" if dev.startswith("cuda") else "float32"
            dtype = str(dtype).replace("torch.", "")
            model = build_model(ModelSpec(model=str(model), device=dev, dtype=dtype, quantization=quantization))
        else:
            if dtype is not None or device is not None:
                from torchinferno.checkpoint.auto import resolve_dtype

                model = model.to(device=device, dtype=resolve_dtype(dtype, next(model.parameters()).dtype))
                if hasattr(model, "init_buffers"):
                    model.init_buffers()
        if kernel_artifacts is not None:  # only loads: kernels/v4_artifacts.py (one notice line when it cannot)
            from torchinferno.kernels import v4_artifacts

            v4_artifacts.apply(model, kernel_artifacts)
        self.model = model
        self._checkpoint = getattr(model, "checkpoint_dir", None)
        self._defaults = load_sampling_defaults(generation_config, self._checkpoint)
        self.tokenizer = _resolve_tokenizer(model, tokenizer)
        self.engine = LLMEngine(model, self.tokenizer, EngineConfig(**engine_kwargs))
        if self.engine.device.type == "cuda":  # kernel compiles now, not inside the first generate() call
            self.engine.warmup()
        self._next_id = 0

    def _init_tensor_parallel(self, model, tokenizer, dtype, device, quantization, engine_kwargs,
                              kernel_artifacts: str | None = None) -> None:
        """``tensor_parallel_size=N``: N worker processes, each building its shard of ``model`` (a checkpoint
        name or directory: ranks read only their slices; or an ``engine.assembly.ModelSpec``, e.g. a tiny random
        model), driven by a ``MultiprocExecutor`` (or, launched by torchrun, this rank's ``TorchrunExecutor``)."""
        from torchinferno.engine.assembly import ModelSpec
        from torchinferno.engine.torchrun_executor import parallel_executor

        if isinstance(model, ModelSpec):
            spec = model
        elif isinstance(model, (str, Path)):
            dev = str(device or "cpu")
            dtype = str(dtype or ("bfloat16" if dev.startswith("cuda") else "float32")).replace("torch.", "")
            spec = ModelSpec(model=str(model), device=dev, dtype=dtype, quantization=quantization, prepack=False,
                             kernel_artifacts=None if kernel_artifacts is None else str(kernel_artifacts))
        else:
            raise ConfigError("tensor_parallel_size > 1 needs a checkpoint (name or directory) or a ModelSpec, not a "
                              "built module: each rank loads its own shard")
        config = EngineConfig(**engine_kwargs)
        executor = parallel_executor(spec, config)
        self.model = None
        ckpt = self._checkpoint = spec.checkpoint_dir()
        if tokenizer is None and ckpt is not None and (ckpt / "tokenizer.json").exists():
            tokenizer = str(ckpt)
        self.tokenizer = _resolve_tokenizer(None, tokenizer)
        self.engine = LLMEngine(None, self.tokenizer, config, executor=executor)
        self._next_id = 0

    def shutdown(self) -> None:
        """End worker processes now (tensor parallel); they also end when the LLM is collected or at exit."""
        self.engine.executor.shutdown()

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` uses without ``sampling_params``: ``SamplingParams()`` with the checkpoint's
        generation_config.json defaults (``generation_config="auto"``; ``"vllm"``: none; a folder: its file)."""
        return self._defaults.sampling_params()

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("string prompts need a tokenizer (pass tokenizer='byte' or a path)")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(self, prompts: str | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[CompletionOutput]:
        """Run every prompt to completion; results in input order. ``use_tqdm``: a progress bar of finished
        prompts on stderr (like vLLM's; only when more than one prompt runs)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        sampling_params = sampling_params or self.get_default_sampling_params()
        plist = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(plist) != len(prompts):
            raise ConfigError(f"got {len(plist)} SamplingParams for {len(prompts)} prompts")
        encoded = [self._encode(p) for p in prompts]
        for ids, sp in zip(encoded, plist):  # validate everything before anything runs
            self.engine.validate_request(f"llm-{self._next_id}", ids, sp)
        ids = []
        for prompt_ids, sp in zip(encoded, plist):
            rid = f"llm-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(rid, prompt_ids, sp)
            ids.append(rid)
        logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in ids}
        final = {}
        bar = None
        if use_tqdm and len(ids) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", unit="prompt", dynamic_ncols=True)
        try:
            while self.engine.has_unfinished():
                for o in self.engine.step():
                    if o.logprobs and o.request_id in logprobs:
                        logprobs[o.request_id].extend(o.logprobs)
                    if o.finished:
                        final[o.request_id] = o
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [
            CompletionOutput(rid, p, final[rid].token_ids, final[rid].text, final[rid].finish_reason,
                             final[rid].stop_reason, logprobs[rid] if sp.logprobs is not None else None,
                             final[rid].num_cached_tokens)
            for rid, p, sp in zip(ids, encoded, plist)
        ]
