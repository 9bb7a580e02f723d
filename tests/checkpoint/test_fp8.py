"""FP8 block dequantization: exact vs the published per-block formula (non-multiple-of-128 shapes),
pairing of weight/scale in either order, and the deepseek-v3.2 loader dequantizing at load."""

import json

import pytest
import torch

from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.checkpoint.fp8 import Fp8Pairer, dequantize_fp8_block, quantize_fp8_block
from torchinferno.cli.variants_cmds import randomize
from torchinferno.errors import CheckpointError
from torchinferno.models.registry import get_family


def reference_dequant(w: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    """DeepSeek's formula, one block at a time: W[i, j] = float(W_fp8[i, j]) * s[i // block, j // block]."""
    out = torch.empty(w.shape, dtype=torch.float32)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            rows, cols = slice(bi * block, (bi + 1) * block), slice(bj * block, (bj + 1) * block)
            out[rows, cols] = w[rows, cols].float() * s[bi, bj]
    return out


def _random_fp8(n, k, block, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-440, 440).to(torch.float8_e4m3fn)
    s = torch.rand(-(-n // block), -(-k // block), generator=g) * 0.01 + 1e-4
    return w, s


@pytest.mark.parametrize("n,k,block", [(300, 200, 128), (128, 256, 128), (1, 130, 128), (257, 129, 64), (37, 5, 16)])
def test_dequant_matches_published_formula_exactly(n, k, block):
    w, s = _random_fp8(n, k, block, seed=n + k)
    want = reference_dequant(w, s, block)
    assert torch.equal(dequantize_fp8_block(w, s, block, out_dtype=torch.float32), want)
    assert torch.equal(dequantize_fp8_block(w, s, block), want.to(torch.bfloat16))  # default: bf16 like the release


def test_quantize_round_trip_is_close():
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(1))
    q, s = quantize_fp8_block(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
    torch.testing.assert_close(dequantize_fp8_block(q, s, out_dtype=torch.float32), w, atol=0.1, rtol=0.07)


def test_wrong_scale_shape_names_tensor():
    w, s = _random_fp8(300, 200, 128, seed=0)
    with pytest.raises(CheckpointError, match=r"'layer\.weight_scale_inv' has shape \(2, 2\).*needs \(3, 2\)"):
        dequantize_fp8_block(w, s[:2], name="layer.weight")
    with pytest.raises(CheckpointError, match="2-D"):
        dequantize_fp8_block(w[None], s, name="x")


def test_pairer_either_order_and_errors():
    w, s = _random_fp8(130, 70, 128, seed=2)
    plain = torch.ones(3)
    want = reference_dequant(w, s, 128)
    for order in ([("a.weight", w), ("a.weight_scale_inv", s), ("b", plain)],
                  [("a.weight_scale_inv", s), ("b", plain), ("a.weight", w)]):
        got = dict(Fp8Pairer()(order))
        assert set(got) == {"a.weight", "b"} and torch.equal(got["a.weight"], want) and got["b"] is plain
    with pytest.raises(CheckpointError, match=r"FP8 tensor 'a\.weight' has no 'a\.weight_scale_inv'"):
        list(Fp8Pairer()([("a.weight", w)]))
    with pytest.raises(CheckpointError, match=r"block scale 'a\.weight_scale_inv' has no matching tensor 'a\.weight'"):
        list(Fp8Pairer()([("a.weight_scale_inv", s)]))
    for order in ([("a.weight", plain), ("a.weight_scale_inv", s)], [("a.weight_scale_inv", s), ("a.weight", plain)]):
        with pytest.raises(CheckpointError, match=r"'a\.weight_scale_inv'.*not stored as FP8"):
            list(Fp8Pairer()(order))


def _quantizable(name: str, t: torch.Tensor) -> bool:
    # The public FP8 release keeps embeddings, the head, norms and the router in high precision.
    return t.dim() == 2 and name.endswith(".weight") and "norm" not in name and "embed" not in name \
        and "lm_head" not in name and not name.endswith("mlp.gate.weight")


@pytest.fixture(scope="module")
def fp8_deepseek(tmp_path_factory):
    """A tiny deepseek-v3.2 checkpoint with FP8 block-scaled linears, and its dequantized reference model."""
    fam = get_family("deepseek-v3.2")
    m = randomize(fam.build(fam.size("debug"), device="cpu", variant="v0")).eval()
    m.family = fam
    tensors, exact = {}, {}
    for name, t in fam.export_weights(m):
        if _quantizable(name, t):
            q, s = quantize_fp8_block(t)
            tensors[name], tensors[name + "_scale_inv"] = q, s
            exact[name] = reference_dequant(q, s, 128)
        else:
            tensors[name] = t.clone()
            exact[name] = t
    cfg = {**fam.config_to_hf(m.config), "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                               "weight_block_size": [128, 128]}}
    ref = fam.build(m.config, device="cpu", variant="v0").eval()
    fam.load_weights(ref, exact.items())
    d = tmp_path_factory.mktemp("fp8_ds")
    safetensors_io.save_hf_dir(d, cfg, tensors, max_shard_bytes=40_000)
    return fam, d, tensors, ref


def test_deepseek_loader_dequantizes_fp8_in_either_order(fp8_deepseek):
    fam, d, tensors, ref = fp8_deepseek
    assert len(list(d.glob("model-*.safetensors"))) > 1
    assert any(tensors[n].dtype == torch.float8_e4m3fn and tensors[n].shape[0] > 128 for n in tensors)  # edge blocks
    ids = torch.randint(0, 320, (10,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref.compute_logits(ref(ids, torch.arange(10)))
        got = load_model_auto(d, variant="v0")
        torch.testing.assert_close(got.compute_logits(got(ids, torch.arange(10))), want, atol=0, rtol=0)
        # scales first (as when a scale's shard is read before its weight's), everything reversed
        other = fam.build(ref.config, device="cpu", variant="v0").eval()
        fam.load_weights(other, reversed(list(tensors.items())))
        torch.testing.assert_close(other.compute_logits(other(ids, torch.arange(10))), want, atol=0, rtol=0)


def test_fp8_scale_errors_name_tensor(fp8_deepseek, tmp_path):
    fam, d, tensors, _ = fp8_deepseek
    cfg = json.loads((d / "config.json").read_text())
    name = next(n for n in tensors if tensors[n].dtype == torch.float8_e4m3fn)
    bad = {k: v for k, v in tensors.items() if k != name + "_scale_inv"}
    safetensors_io.save_hf_dir(tmp_path / "noscale", cfg, bad)
    with pytest.raises(CheckpointError, match=f"FP8 tensor '{name}' has no '{name}_scale_inv'"):
        load_model_auto(tmp_path / "noscale")
    bad = {**tensors, name + "_scale_inv": torch.ones(5, 5)}
    safetensors_io.save_hf_dir(tmp_path / "badscale", cfg, bad)
    with pytest.raises(CheckpointError, match=f"'{name}_scale_inv' has shape \\(5, 5\\)"):
        load_model_auto(tmp_path / "badscale")
