"""llama3 family vs transformers LlamaForCausalLM (the independent oracle), fp32, same weights."""

import pytest
import torch

from torchinferno.checkpoint.auto import load_model_auto  # noqa: E402
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.common.rope import RopeScaling
from torchinferno.models.llama3.config import Llama3Config, config_to_hf
from torchinferno.models.registry import get_family

transformers = pytest.importorskip("transformers")

CASES = {
    "gqa-llama3rope-untied": dict(rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64), tie_word_embeddings=False),
    "gqa-defaultrope-tied": dict(rope_scaling=RopeScaling(), tie_word_embeddings=True),
    "mha-headdim": dict(num_key_value_heads=4, head_dim=24, tie_word_embeddings=False),
}


def tiny(**kw) -> Llama3Config:
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return Llama3Config(**base)


def hf_model(cfg: Llama3Config, seed=0):
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # norms init to ones; randomize so a missed weight shows
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    cfg = tiny(**CASES[request.param])
    ref = hf_model(cfg)
    d = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(d)
    ours = load_model_auto(d, device="cpu", dtype=torch.float32, variant="v0")
    return ref, ours


def test_prefill_logits_match(pair):
    ref, ours = pair
    ids = torch.randint(0, 300, (1, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits[0]
        h = ours(ids[0], torch.arange(17))
        got = ours.compute_logits(h)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cached_decode_equals_full_forward(pair):
    _, ours = pair
    fam = get_family("llama3")
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = ours.compute_logits(ours(ids, torch.arange(20)))
        caches = fam.kv_spec(ours.config).allocate(num_blocks=4, block_size=8, dtype=torch.float32, device="cpu")
        table = [[3, 1, 0]]  # non-contiguous blocks on purpose
        meta = build_attention_metadata([12], [0], table, 8)
        steps = [ours.compute_logits(ours(ids[:12], positions_for([12], [0]), caches, meta))]
        for t in range(12, 20):
            meta = build_attention_metadata([1], [t], table, 8)
            steps.append(ours.compute_logits(ours(ids[t : t + 1], torch.tensor([t]), caches, meta)))
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)


def test_ragged_batch_equals_per_row(pair):
    ref, ours = pair
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, 300, (n,), generator=g) for n in (5, 11, 1)]
    with torch.no_grad():
        meta = build_attention_metadata([len(r) for r in rows], [0, 0, 0], [[0], [1], [2]], 16)
        got = ours.compute_logits(ours(torch.cat(rows), positions_for(meta.query_lens_list, [0, 0, 0]), None, meta))
        want = torch.cat([ref(r[None]).logits[0] for r in rows])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_v1_matches_v0(pair, tmp_path):
    _, ours = pair
    fam = get_family("llama3")
    v1 = fam.build(ours.config, device="cpu", variant="v1")
    v1.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = ours.compute_logits(ours(ids, torch.arange(9)))
        b = v1.compute_logits(v1(ids, torch.arange(9)))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
