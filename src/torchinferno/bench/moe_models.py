"""The models ``bench-moe`` times: random DeepSeek-V3-family models of a named shape (bf16, or block FP8 built
layer by layer: ``kernels.fp8_block_stream``) and the weight bytes one decode step reads."""

from __future__ import annotations

import torch


def _randomize(model, seed: int = 0) -> None:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    _randomize_tensors(model.named_parameters(), model.named_buffers(), g)


def _randomize_tensors(params, buffers, g: torch.Generator) -> None:
    """Norm weights ~ U[0.8, 1.2], everything else ~ N(0, 0.02), router correction biases zero; drawn from ``g`` in
    the order given (a layer-by-layer build passes each piece's tensors in turn: the same numbers)."""
    with torch.no_grad():
        for name, p in params:
            if "norm" in name:
                p.uniform_(0.8, 1.2, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)
        for name, b in buffers:
            if name.endswith("e_score_correction_bias"):
                b.zero_()


MODEL_SHAPES = ("v2-lite", "v3-scaled")


def build_v2_lite(dev, layers: int | None = None):
    return build_model_shape(dev, "v2-lite", layers)


def build_model_shape(dev, shape: str = "v2-lite", layers: int | None = None, quantization: str = "none"):
    """A random ``deepseek_v3`` model of one of :data:`MODEL_SHAPES` on ``dev``: ``v2-lite`` (size
    ``v2-lite-shape``, 16 layers) or ``v3-scaled`` (DeepSeek-V3's layer shape: hidden 7168, 128 heads, q-LoRA 1536,
    256 experts of 2048 top-8 in 8 groups keeping 4, one shared expert; ``layers`` layers (default 4), the first
    dense; 22.5 GB per MoE layer in bf16, so 4 layers fit an H200 and 3 an H100). ``quantization="fp8-block"``
    builds it layer by layer (:func:`build_random`): ~11.5 GB per MoE layer, 8 layers fit an H200 and 4 an H100."""
    from dataclasses import replace

    from torchinferno.models.registry import get_family

    fam = get_family("deepseek-v3.2")
    if shape == "v2-lite":
        cfg = fam.size("v2-lite-shape")
        if layers:
            cfg = replace(cfg, num_hidden_layers=layers)
    elif shape == "v3-scaled":
        cfg = replace(fam.size("deepseek-v3"), num_hidden_layers=layers or 4, first_k_dense_replace=1,
                      num_nextn_predict_layers=0)
    else:
        raise ValueError(f"model shape must be one of {MODEL_SHAPES}, got {shape!r}")
    return build_random(cfg, dev, quantization)


def build_random(cfg, dev, quantization: str = "none", seed: int = 0, variant: str = "v1"):
    """A random bf16 deepseek-v3.2 model of config ``cfg`` on ``dev`` (:func:`_randomize`'s draws from one generator
    seeded ``seed``). ``quantization``: ``none``, or ``fp8-block``: built and swapped layer by layer
    (``kernels.fp8_block_stream``; the same tensors as building it whole, then ``quantize_model_fp8_block``), its
    :class:`~torchinferno.kernels.fp8_block_stream.BuildStats` as ``model.fp8_block_build``."""
    from torchinferno.models.common.module_utils import materialize
    from torchinferno.models.registry import get_family

    if quantization not in ("none", "fp8-block"):
        raise ValueError(f"quantization must be 'none' or 'fp8-block', got {quantization!r}")
    fam = get_family("deepseek-v3.2")
    model = fam.build(cfg, device="meta", variant=variant)
    if quantization == "fp8-block":
        from torchinferno.kernels.fp8_block_stream import build_fp8_block_streamed

        g = torch.Generator(device=dev).manual_seed(seed)
        build_fp8_block_streamed(model, dev, torch.bfloat16,
                                 lambda piece: _randomize_tensors(piece.named_parameters(), piece.named_buffers(), g))
    else:
        materialize(model, dev, torch.bfloat16)
        _randomize(model, seed)
    model.eval()
    model.family = fam
    return model


def active_weights(model, hit_per_layer: list[int]) -> tuple[int, int]:
    """(bytes, elements) of the weights one decode step reads: every tensor but the routed experts' and the embedding
    table's, plus the experts hit (``hit_per_layer``: how many per MoE layer; an expert's share of its module's
    tensors, bf16 or block FP8 with its scales) and one embedding row per token (ignored: tiny). Elements leave the
    FP8 block scales out (what the GEMMs multiply: prefill FLOPs)."""
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts
    from torchinferno.models.common.layers import RoutedExperts

    total = [0, 0]
    expert = [0, 0]  # one expert's bytes, elements
    for name, m in model.named_modules():
        tensors = [(n, t) for n, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))
                   if n not in m._non_persistent_buffers_set]
        if isinstance(m, (RoutedExperts, Fp8BlockExperts)):
            E = tensors[0][1].shape[0]
            expert = [sum(t.numel() * t.element_size() for _, t in tensors) // E,
                      sum(t.numel() for n, t in tensors if not n.endswith("scale_inv")) // E]
            continue
        if "embed_tokens" in name:
            continue
        total[0] += sum(t.numel() * t.element_size() for _, t in tensors)
        total[1] += sum(t.numel() for n, t in tensors if not n.endswith("scale_inv"))
    hit = sum(hit_per_layer)
    return total[0] + hit * expert[0], total[1] + hit * expert[1]


def active_bytes(model, hit_per_layer: list[int]) -> int:
    """:func:`active_weights`' bytes."""
    return active_weights(model, hit_per_layer)[0]
