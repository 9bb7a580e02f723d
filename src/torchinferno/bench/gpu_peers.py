"""bench-gpu peers: transformers generate on the same tensors, logits agreement."""

from __future__ import annotations

import time

import torch


# ------------------------------------------------------------------------------------- transformers peer
def hf_peer(model):
    """transformers' LlamaForCausalLM whose parameters are our tensors (no copy)."""
    import transformers

    fam = model.family
    hf_cfg = transformers.LlamaConfig(**fam.config_to_hf(model.config))
    try:
        hf_cfg._attn_implementation = "sdpa"
    except Exception:  # pragma: no cover - older/newer config API
        pass
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(dict(fam.export_weights(model)), strict=True, assign=True)
    dev = next(model.parameters()).device
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg).to(dev)  # its buffers were built on meta
    meta_left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if meta_left:
        raise RuntimeError(f"transformers peer has unmaterialized tensors: {meta_left[:4]}")
    return hf.eval()


def hf_decode_tok_s(hf, batch: int, prompt_len: int, new_tokens: int, vocab: int, repeats: int = 2) -> dict:
    dev = next(hf.parameters()).device
    ids = torch.randint(0, vocab, (batch, prompt_len), device=dev)
    mask = torch.ones_like(ids)

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(2)
    t_full = min(run(new_tokens) for _ in range(repeats))
    t_one = min(run(1) for _ in range(repeats))
    return {"batch": batch, "prompt": prompt_len, "new_tokens": new_tokens, "tok_s": batch * (new_tokens - 1) / (t_full - t_one),
            "step_ms": (t_full - t_one) / (new_tokens - 1) * 1e3}


def our_logits(model, ids: torch.Tensor, cache_dtype=torch.bfloat16) -> torch.Tensor:
    """``ids [T]`` -> logits ``[T, V]`` (fp32) of one paged prefill through our model."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    tokens, dev = ids.shape[0], ids.device
    caches = model.family.kv_spec(model.config).allocate(tokens // 16 + 2, 16, cache_dtype, dev)
    meta = build_attention_metadata([tokens], [0], [list(range(1, tokens // 16 + 2))], 16, dev)
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(tokens, device=dev), caches, meta)).float()


def logits_agreement(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Relative L2 difference and argmax agreement of two ``[T, V]`` logit tensors."""
    return {"rel_diff": float((ours - theirs).norm() / theirs.norm()),
            "argmax_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())}


def hf_agreement(model, hf, tokens: int = 64, cache_dtype=torch.bfloat16) -> dict:
    """Same weights, same prompt: our logits vs transformers'."""
    dev = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (tokens,), device=dev)
    ours = our_logits(model, ids, cache_dtype)
    with torch.inference_mode():
        theirs = hf(ids[None]).logits[0].float()
    return logits_agreement(ours, theirs)


def hf_agreement_fp32_small(size: str, device) -> dict:
    """Semantics check without bf16 noise: a reduced fp32 model of the same family/rope vs transformers."""
    import dataclasses

    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.models.registry import get_family

    fam = get_family("llama3")
    cfg = dataclasses.replace(fam.size(size), hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2)
    m = fam.build(cfg, device=device, variant="v1", attention_backend=TritonPagedAttention).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.uniform_(0.8, 1.2) if "norm" in name else p.normal_(0.0, 0.05)
    m.family = fam
    return hf_agreement(m, hf_peer(m), tokens=48, cache_dtype=torch.float32)


# ------------------------------------------------------------------------------------- engine
