"""llama3 v1 (the fused ops: the CPU fast paths of ``kernels.api`` and ``TorchAttention``'s decode
views) vs transformers LlamaForCausalLM, fp32, at the same 1e-5 as the v0 oracle.

Decode runs in the static generator's cache layout (one block per row, rows consecutive,
``block_tables_host`` set), with equal and ragged lengths, so the strided K/V write and read
paths are both exercised.
"""

import pytest
import torch

from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.llama3.config import Llama3Config, config_to_hf
from torchinferno.models.registry import get_family

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = Llama3Config(vocab_size=300, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=128, bos_token_id=1,
                       eos_token_id=2, tie_word_embeddings=True)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # norms init to ones; randomize so a missed weight shows
        for n, p in ref.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    d = tmp_path_factory.mktemp("llama3-v1")
    ref.save_pretrained(d)
    ours = load_model_auto(d, device="cpu", dtype=torch.float32, variant="v1")
    return ref, ours, get_family("llama3")


def test_prefill_matches_transformers(pair):
    ref, ours, _ = pair
    ids = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
        got = ours.compute_logits(ours(ids, torch.arange(13)))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prompt_lens", [[7], [5, 5], [3, 9, 6]])
def test_dense_row_decode_matches_transformers(pair, prompt_lens):
    ref, ours, fam = pair
    g = torch.Generator().manual_seed(2)
    steps = 6
    seqs = [torch.randint(0, 300, (n + steps,), generator=g) for n in prompt_lens]
    B, block = len(seqs), 32
    caches = fam.kv_spec(ours.config).allocate(num_blocks=B + 1, block_size=block, dtype=torch.float32, device="cpu")
    rows = [[1 + b] for b in range(B)]  # consecutive rows, not starting at 0
    with torch.inference_mode():
        meta = build_attention_metadata(prompt_lens, [0] * B, rows, block)
        ids = torch.cat([s[:n] for s, n in zip(seqs, prompt_lens)])
        ours(ids, torch.cat([torch.arange(n) for n in prompt_lens]), caches, meta)
        for t in range(steps):
            ctx = [n + t for n in prompt_lens]
            meta = build_attention_metadata([1] * B, ctx, rows, block)
            meta.block_tables_host = rows
            got = ours.compute_logits(ours(torch.stack([s[c] for s, c in zip(seqs, ctx)]), torch.tensor(ctx), caches, meta))
            want = torch.stack([ref(s[None, : c + 1]).logits[0, -1] for s, c in zip(seqs, ctx)])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
