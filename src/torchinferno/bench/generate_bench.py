"""bench-generate: decode tokens/s of our generator vs transformers' ``generate`` on the same model.

Both figures exclude prefill: ours from the generator's decode-phase timer; the peer's as
``B * (N - 1) / (t(N tokens) - t(1 token))`` with greedy decoding and EOS ignored. The
batch-1 figure is also shown as a fraction of the bandwidth bound: bytes read per decode step
(every weight except the embedding gather, plus the KV cache) over the memory bandwidth measured
in this run: on CPU the read bandwidth (the better of a probe before and one after the timed batches:
a shared host's bandwidth drifts; a decode step only streams its weights; a copy pays
write-allocate traffic too, and a step can read faster than it copies), elsewhere the copy bandwidth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from torchinferno.core.sampling_params import SamplingParams


@dataclass
class BenchRow:
    batch_size: int
    ours_tok_s: float
    hf_tok_s: float | None = None
    bound_tok_s: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.ours_tok_s / self.hf_tok_s if self.hf_tok_s else None


@dataclass
class BenchReport:
    model: str
    dtype: str
    device: str
    threads: int
    bandwidth_gb_s: float  # copy, read + write counted
    weight_bytes_per_step: int
    read_bandwidth_gb_s: float | None = None  # CPU: loads only (the bound's bandwidth there)
    rows: list[BenchRow] = field(default_factory=list)


def weight_bytes_per_step(model) -> int:
    """Bytes of parameters (and FP8 weight buffers) a decode step streams (the embedding table only if it
    doubles as the head)."""
    total = 0
    emb = model.model.embed_tokens.weight if hasattr(model, "model") else None
    tied = getattr(model, "lm_head", None) is None
    for name, p in model.named_parameters():
        if emb is not None and p is emb and not tied:
            continue
        total += p.numel() * p.element_size()
    for name, b in model.named_buffers():  # quantized linears hold their weights as buffers (kernels/fp8_linear.py)
        if name.endswith((".weight_fp8", ".weight_scale")):
            total += b.numel() * b.element_size()
    return total + _packed_bytes(model)


def _packed_bytes(model) -> int:
    """Bytes of pre-packed / block-quantized weights (``PackedLinear`` buffers, the packed head included); the
    embedding is then only gathered, except when a tied head was not packed (counted above as a parameter)."""
    from torchinferno.kernels.cpu_linear import PackedLinear

    total = sum(m.packed_weight.numel() * m.packed_weight.element_size()
                for m in model.modules() if isinstance(m, PackedLinear))
    emb = model.model.embed_tokens.weight if hasattr(model, "model") else None
    if total and emb is not None and getattr(model, "packed_head", None) is not None:
        total -= emb.numel() * emb.element_size()  # counted above as the tied head; the packed head replaces it
    return total


def prompts_for(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]


def ours_decode_tok_s(model, prompts: list[list[int]], new_tokens: int, repeats: int = 3) -> float:
    from torchinferno.engine.generate import StaticGenerator

    gen = StaticGenerator(model, len(prompts), len(prompts[0]) + new_tokens)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    gen.generate(prompts, params)  # warm-up
    best = 0.0
    for _ in range(repeats):
        gen.generate(prompts, params)
        best = max(best, gen.stats.decode_tok_per_s)
    return best


def hf_decode_tok_s(hf_model, prompts: list[list[int]], new_tokens: int, repeats: int = 3) -> float:
    ids = torch.tensor(prompts, device=hf_model.device)
    mask = torch.ones_like(ids)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0)
        if ids.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(new_tokens)  # warm-up
    t_full = min(run(new_tokens) for _ in range(repeats))
    t_one = min(run(1) for _ in range(repeats))
    return len(prompts) * (new_tokens - 1) / max(t_full - t_one, 1e-9)


def run_bench(model_spec: str, batch_sizes: list[int], new_tokens: int, dtype: str, device: str, compare_hf: bool,
              prompt_len: int = 32, cache_dir=None, log=print, prepack: bool = True, quantization: str = "none",
              keep_model: list | None = None) -> BenchReport:
    """Our decode tok/s per batch size (and transformers' with ``compare_hf``); ``keep_model`` (a list) gets the
    model appended, for a caller that times it again (``--compare-llamacpp``)."""
    from torchinferno.bench.ceilings import copy_bandwidth, read_bandwidth
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.engine.assembly import ModelSpec, build_model, resolve_auto

    spec = resolve_auto(ModelSpec(model=model_spec, dtype=dtype, device=device, quantization=quantization,
                                  prepack=prepack, cache_dir=cache_dir))
    dtype = spec.dtype
    model = build_model(spec)
    if keep_model is not None:
        keep_model.append(model)
    wbytes = weight_bytes_per_step(model)  # packed and block-quantized weights as their buffers' bytes
    bw = copy_bandwidth(device)
    report = BenchReport(model_spec, dtype, device, torch.get_num_threads(), bw / 1e9, wbytes)
    if torch.device(device).type == "cpu":
        bw = read_bandwidth(device, nbytes=1024**3)
        report.read_bandwidth_gb_s = bw / 1e9
    hf = None
    if compare_hf:
        from torchinferno.errors import ConfigError

        try:
            import transformers
        except ImportError:
            raise ConfigError("--compare-hf needs transformers (pip install 'torchinferno[test]')") from None
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(model.checkpoint_dir), dtype=resolve_dtype(dtype), attn_implementation="sdpa").to(device).eval()
    kv_per_tok = model.family.kv_spec(model.config).bytes_per_token(resolve_dtype(dtype))
    for b in batch_sizes:
        prompts = prompts_for(b, prompt_len, model.config.vocab_size)
        ours = ours_decode_tok_s(model, prompts, new_tokens)
        row = BenchRow(b, ours)
        if hf is not None:
            row.hf_tok_s = hf_decode_tok_s(hf, prompts, new_tokens)
        report.rows.append(row)
    if torch.device(device).type == "cpu":  # a shared host's bandwidth drifts: the bound takes the better of two probes
        bw = max(bw, read_bandwidth(device, nbytes=1024**3))
        report.read_bandwidth_gb_s = bw / 1e9
    for row in report.rows:
        if row.batch_size == 1:  # bytes of one step: the weights and the KV rows at the run's mean context
            row.bound_tok_s = bw / (wbytes + kv_per_tok * (prompt_len + new_tokens / 2))
        log(format_row(row))
    return report


def format_row(r: BenchRow) -> str:
    s = f"batch {r.batch_size:3d}: ours {r.ours_tok_s:9.1f} tok/s"
    if r.hf_tok_s is not None:
        s += f" | transformers {r.hf_tok_s:9.1f} tok/s | ratio {r.ratio:5.2f}x"
    if r.bound_tok_s is not None:
        s += f" | bandwidth bound {r.bound_tok_s:8.1f} tok/s ({100 * r.ours_tok_s / r.bound_tok_s:5.1f}% of bound)"
    return s
