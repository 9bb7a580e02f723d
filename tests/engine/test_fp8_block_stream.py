"""The layer-by-layer block-FP8 build (``kernels.fp8_block_stream``) against load-then-quantize, on CPU (torch path).

* state: every FP8 weight, scale and kept float tensor bitwise equal to the whole-model build followed by
  ``quantize_model_fp8_block``, for a bf16 checkpoint, an FP8 checkpoint (its own blocks kept) and a random build
  (``bench.moe_bench.build_random``, what ``bench-moe --quantization fp8-block`` runs);
* greedy tokens through ``LLM(..., quantization="fp8-block")`` (now the streamed path) equal the old path's;
* memory: float bytes alive at once <= the built model's float bytes + the largest piece's; the whole-model path
  breaks that bound (sabotage: the bound can fail);
* each checkpoint tensor is read once; a bad tensor names itself before any layer is built.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch

from torchinferno.checkpoint import fp8, safetensors_io
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.errors import CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from fp8_block_checks import save_fp8_checkpoint, tiny_deepseek  # noqa: E402

PROMPTS = [torch.randint(0, 320, (6,), generator=torch.Generator().manual_seed(1)).tolist() for _ in range(2)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> int:
    """Same tensor names, dtypes and bits (FP8 compared as bytes); returns how many tensors were compared."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys(), sorted(set(sa) ^ set(sb))[:6]
    bad = [k for k in sa if sa[k].dtype != sb[k].dtype or not torch.equal(_bits(sa[k]), _bits(sb[k]))]
    assert not bad, bad[:6]
    assert torch.equal(a.rope_cos, b.rope_cos) and torch.equal(a.rope_sin, b.rope_sin)
    return len(sa)


def old_path(ckpt: Path, dtype: str):
    """Today's path: the whole model loaded in float, then quantized; (model, float bytes at the peak)."""
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.kernels.fp8_block_model import quantize_model_fp8_block
    from torchinferno.kernels.fp8_block_stream import float_bytes

    m = load_model_auto(ckpt, dtype=dtype)
    peak = float_bytes(m)
    quantize_model_fp8_block(m)
    return m, peak


def check_memory_bound(streamed: torch.nn.Module, old: torch.nn.Module, old_peak: int) -> None:
    """Streamed: no float tensor it materialized outlives the build but those the model holds, and the float bytes
    alive at once <= the model's float bytes (embedding, head, norms, kv_b_proj, routers) + the largest piece's. The
    old path's peak breaks the same bound (sabotage: it can fail)."""
    from torchinferno.kernels.fp8_block_stream import float_bytes

    st = streamed.fp8_block_build
    held = float_bytes(streamed)  # + the rope tables (made at the end, not counted by the build)
    assert 0 < st.final_float_bytes <= held, (held, st.summary())  # a leaked float copy would stay counted
    assert st.peak_float_bytes <= held + st.max_piece_bytes, (held, st.summary())
    assert st.max_piece_bytes < st.peak_float_bytes
    assert old_peak > float_bytes(old) + st.max_piece_bytes, (old_peak, float_bytes(old), st.summary())


def test_memory_bound_catches_a_leaked_float_copy(monkeypatch):
    """Sabotage of the streamed path itself: keeping the replaced experts alive breaks the bound's first half."""
    from torchinferno.bench.moe_bench import build_random
    from torchinferno.kernels import fp8_block_moe
    from torchinferno.kernels.fp8_block_stream import float_bytes
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config

    leak, real = [], fp8_block_moe.swap_experts_for_fp8_block

    def leaky(model, kernel="auto", kept=None):
        leak.extend(m for m in model.modules() if type(m).__name__ == "RoutedExperts")
        return real(model, kernel=kernel, kept=kept)

    monkeypatch.setattr(fp8_block_moe, "swap_experts_for_fp8_block", leaky)
    m = build_random(tiny_deepseek_v32_config(moe_intermediate_size=128), "cpu", "fp8-block")
    assert leak and m.fp8_block_build.final_float_bytes > float_bytes(m)


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream_fp8")
    return d, save_fp8_checkpoint(d, num_hidden_layers=4)


@pytest.fixture(scope="module")
def bf16_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream_bf16")
    model = tiny_deepseek("cpu", torch.bfloat16, num_hidden_layers=4)
    safetensors_io.save_hf_dir(d, model.family.config_to_hf(model.config),
                               {n: t.detach().clone() for n, t in model.family.export_weights(model)})
    return d


@pytest.mark.parametrize("which,dtype", [("bf16", "bfloat16"), ("fp8", "float32"), ("fp8", "bfloat16")])
def test_streamed_load_equals_load_then_quantize(which, dtype, fp8_ckpt, bf16_ckpt, monkeypatch):
    from torchinferno.kernels.fp8_block import Fp8BlockLinear
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts
    from torchinferno.kernels.fp8_block_stream import load_model_fp8_block

    d = bf16_ckpt if which == "bf16" else fp8_ckpt[0]
    old, old_peak = old_path(d, dtype)
    reads = collections.Counter()
    real = safetensors_io.iter_tensors

    def counting(ckpt, names=None, device="cpu"):
        for n, t in real(ckpt, names, device):
            reads[n] += 1
            yield n, t

    dequantized, real_dequant = [], fp8.dequantize_fp8_block

    def dequant(w, s, block=128, out_dtype=torch.bfloat16, name="weight"):
        if not w.is_meta:  # (the index check runs on meta tensors)
            dequantized.append(name)
        return real_dequant(w, s, block, out_dtype, name)

    monkeypatch.setattr(safetensors_io, "iter_tensors", counting)
    monkeypatch.setattr(fp8, "dequantize_fp8_block", dequant)
    new = load_model_fp8_block(d, dtype=dtype)
    monkeypatch.undo()
    # kept blocks are never dequantized: only the pairs of modules that stay float (MLA's kv_b_proj, read as a weight)
    assert sorted(dequantized) == ([f"model.layers.{i}.self_attn.kv_b_proj.weight" for i in range(4)]
                                   if which == "fp8" else [])
    assert assert_same_state(old, new) > 50
    assert set(reads.values()) == {1} and set(reads) == set(safetensors_io.tensor_index(d))  # each tensor read once
    n_fp8 = sum(isinstance(m, (Fp8BlockLinear, Fp8BlockExperts)) for m in new.modules())
    assert n_fp8 == len(new.fp8_block_build.swapped) > 0
    assert new.fp8_block_kept == old.fp8_block_kept == (n_fp8 if which == "fp8" else 0)
    check_memory_bound(new, old, old_peak)


def test_random_build_equals_build_then_quantize():
    """``bench-moe --quantization fp8-block``'s builder: the same draws, the same FP8 tensors."""
    from torchinferno.bench.moe_bench import build_random
    from torchinferno.kernels.fp8_block_model import quantize_model_fp8_block
    from torchinferno.kernels.fp8_block_stream import float_bytes
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config

    cfg = tiny_deepseek_v32_config(moe_intermediate_size=128, num_hidden_layers=4)
    old = build_random(cfg, "cpu")
    old_peak = float_bytes(old)
    quantize_model_fp8_block(old)
    new = build_random(cfg, "cpu", "fp8-block")
    assert_same_state(old, new)
    check_memory_bound(new, old, old_peak)
    assert new.fp8_block_build.pieces == 4 + 2  # embedding | 4 layers | norm + head


def test_greedy_tokens_match_old_path(fp8_ckpt):
    from torchinferno.engine.llm import LLM

    d, _ = fp8_ckpt
    old, _ = old_path(d, "float32")
    new = LLM(str(d), dtype="float32", tokenizer="byte", quantization="fp8-block")  # the streamed path
    assert new.model.fp8_block_build.pieces == 6
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in LLM(old, tokenizer="byte").generate(PROMPTS, sp)]
    assert [o.token_ids for o in new.generate(PROMPTS, sp)] == want


def _broken(src: Path, dst: Path, edit) -> Path:
    tensors = dict(safetensors_io.iter_tensors(src))
    edit(tensors)
    safetensors_io.save_hf_dir(dst, safetensors_io.read_config(src), tensors)
    return dst


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.update({"model.layers.2.self_attn.o_proj.weight": t["model.layers.2.self_attn.o_proj.weight"][:, 1:]}),
     r"model\.layers\.2\.self_attn\.o_proj\.weight"),
    (lambda t: t.pop("model.layers.3.mlp.experts.5.down_proj.weight_scale_inv"),
     r"model\.layers\.3\.mlp\.experts\.5\.down_proj\.weight"),
    (lambda t: t.pop("model.layers.1.post_attention_layernorm.weight"),
     r"missing 1 tensor.*model\.layers\.1\.post_attention_layernorm\.weight"),
    (lambda t: t.update({"model.layers.1.mlp.bogus.weight": torch.zeros(2)}),
     r"unexpected tensor 'model\.layers\.1\.mlp\.bogus"),
])
def test_bad_tensor_names_itself_before_any_layer_is_built(fp8_ckpt, tmp_path, monkeypatch, edit, match):
    from torchinferno.kernels import fp8_block_stream
    from torchinferno.kernels.fp8_block_stream import load_model_fp8_block

    d = _broken(fp8_ckpt[0], tmp_path / "bad", edit)
    monkeypatch.setattr(fp8_block_stream, "build_fp8_block_streamed",
                        lambda *a, **k: pytest.fail("the build started before the index was checked"))
    with pytest.raises(CheckpointError, match=match):
        load_model_fp8_block(d, dtype="float32")


def test_one_layer_load_checks_its_own_tensors(fp8_ckpt):
    """``load_weights(..., only=)`` (each piece's fill): the layer's tensors must all be there (a missing one is
    named), another layer's tensor is refused by name, the rest of the model is neither written nor required."""
    from torchinferno.checkpoint.auto import load_model_auto

    d, _ = fp8_ckpt
    m = load_model_auto(d, dtype="float32")
    only = {k for k in m.state_dict() if k.startswith("model.layers.1.")}
    layer1 = [(n, t) for n, t in safetensors_io.iter_tensors(d) if n.startswith("model.layers.1.")]
    before = m.model.layers[2].input_layernorm.weight.clone()
    m.family.load_weights(m, layer1, only=only)
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.1\.input_layernorm\.weight"):
        m.family.load_weights(m, [x for x in layer1 if x[0] != "model.layers.1.input_layernorm.weight"], only=only)
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.2\.input_layernorm\.weight'"):
        m.family.load_weights(m, layer1 + [("model.layers.2.input_layernorm.weight", torch.zeros_like(before))],
                              only=only)
    assert torch.equal(m.model.layers[2].input_layernorm.weight, before)


def test_multi_token_prediction_layers_are_checked_not_read(fp8_ckpt, tmp_path, monkeypatch):
    """A checkpoint's MTP layer (stored after the last layer; the causal LM skips it) is checked on meta but never
    read; the model equals the old path's."""
    from torchinferno.kernels.fp8_block_stream import load_model_fp8_block

    src, _ = fp8_ckpt
    tensors = dict(safetensors_io.iter_tensors(src))
    tensors |= {n.replace("model.layers.3.", "model.layers.4."): t for n, t in tensors.items()
                if n.startswith("model.layers.3.")}
    cfg = safetensors_io.read_config(src) | {"num_nextn_predict_layers": 1}
    safetensors_io.save_hf_dir(tmp_path / "mtp", cfg, tensors)
    old, _ = old_path(tmp_path / "mtp", "float32")
    reads, real = collections.Counter(), safetensors_io.iter_tensors

    def counting(ckpt, names=None, device="cpu"):
        for n, t in real(ckpt, names, device):
            reads[n] += 1
            yield n, t

    monkeypatch.setattr(safetensors_io, "iter_tensors", counting)
    new = load_model_fp8_block(tmp_path / "mtp", dtype="float32")
    monkeypatch.undo()
    assert_same_state(old, new)
    assert reads and not [n for n in reads if n.startswith("model.layers.4.")] and set(reads.values()) == {1}
