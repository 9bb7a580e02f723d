"""Helpers for checkpoint tests: tiny llama GGUF files written in-process with gguf.GGUFWriter."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 64, 4, 2, 16, 128, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<think>"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # 12 + 34 = 46",
    "Tokenizers split text into pieces; the pieces are then merged.",
    "The weather in Paris is lovely in the spring, and the wine is good.",
    "naive cafe resume: 100% of 2024 was great!!",
] * 20
SAMPLE_TEXTS = [
    "Hello world!",
    "The quick brown fox, 12345 dogs and 3.14159 pies.",
    "  two  spaces\tand a tab\r\nnew lines\n\n\nend",
    "<|im_start|>user\nhi there<|im_end|>\n<think>hmm</think>",
    "naïve café — 東京 🚀 ünïcödé",
    "def f(x):\n    return x ** 2  # square",
    "",
]


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF q_proj/k_proj rows (written here, independently)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@functools.lru_cache(maxsize=None)
def tiny_bpe() -> tuple[list[str], list[str]]:
    """Tokens (id order) and merges of a byte-level BPE trained on CORPUS, digits kept apart."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + [USER_DEFINED]
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    return tokens, merges


def tiny_spm() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, byte tokens, merged pieces, single characters."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    import json

    model = json.loads(tok.to_str())["model"]
    merged = ["".join(m if isinstance(m, list) else m.split(" ")) for m in model["merges"]]
    chars = [t for t in model["vocab"] if len(t) == 1]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    for piece in merged + chars:
        if piece not in tokens:
            tokens.append(piece)
            types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, types


@dataclass
class TinyGGUF:
    path: Path
    hf: dict[str, torch.Tensor] = field(default_factory=dict)  # the HF-layout weights before quantization
    tokens: list[str] = field(default_factory=list)


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    tied: bool = False,
    tokenizer: str = "gpt2",
    pre: str = "smollm",
    add_bos: bool | None = True,
    drop: tuple[str, ...] = (),
    rope_freqs: list[float] | None = None,
    seed: int = 0,
) -> TinyGGUF:
    """A 2-layer llama GGUF (hidden 64, 4 heads, 2 kv heads) with quantized weights and a tokenizer."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    if tokenizer == "gpt2":
        tokens, merges = tiny_bpe()
        types = [3 if t in SPECIALS else 4 if t == USER_DEFINED else 1 for t in tokens]
        scores = None
    else:
        tokens, scores, types = tiny_spm()
        merges = None
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0 if rope_freqs is not None else 10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(3)
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    bos, eos = (1, 2)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_unk_token_id(0)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHAT_TEMPLATE)

    hf: dict[str, torch.Tensor] = {}

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)

    def put(gname: str, hname: str, arr: np.ndarray, qtype: Q) -> None:
        if gname in drop:
            return
        hf[hname] = torch.from_numpy(arr.copy())
        if gname.endswith(".attn_q.weight"):
            arr = llama_cpp_permute(arr, HEADS)
        elif gname.endswith(".attn_k.weight"):
            arr = llama_cpp_permute(arr, KV_HEADS)
        if qtype == Q.F32:
            w.add_tensor(gname, arr)
        elif qtype == Q.F16:
            w.add_tensor(gname, arr.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    put("token_embd.weight", "model.embed_tokens.weight", mat(vocab, HIDDEN), Q.Q8_0)
    for i in range(LAYERS):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        norm = (1 + 0.1 * rng.normal(size=HIDDEN)).astype(np.float32)
        put(b + "attn_norm.weight", h + "input_layernorm.weight", norm, Q.F32)
        put(b + "ffn_norm.weight", h + "post_attention_layernorm.weight", norm[::-1].copy(), Q.F32)
        put(b + "attn_q.weight", h + "self_attn.q_proj.weight", mat(HEADS * HEAD_DIM, HIDDEN), Q.Q4_1)
        put(b + "attn_k.weight", h + "self_attn.k_proj.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN), Q.Q4_1)
        put(b + "attn_v.weight", h + "self_attn.v_proj.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN),
            Q.Q5_0 if i else Q.Q4_1)
        put(b + "attn_output.weight", h + "self_attn.o_proj.weight", mat(HIDDEN, HEADS * HEAD_DIM), Q.Q4_1)
        put(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", mat(INTER, HIDDEN), Q.Q4_1)
        put(b + "ffn_up.weight", h + "mlp.up_proj.weight", mat(INTER, HIDDEN), Q.Q5_1 if i else Q.Q4_1)
        put(b + "ffn_down.weight", h + "mlp.down_proj.weight", mat(HIDDEN, INTER), Q.Q4_0 if i else Q.Q4_1)
    put("output_norm.weight", "model.norm.weight", np.ones(HIDDEN, np.float32) * 1.5, Q.F32)
    if not tied:
        put("output.weight", "lm_head.weight", mat(vocab, HIDDEN), Q.F16)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path=path, hf=hf, tokens=tokens)
