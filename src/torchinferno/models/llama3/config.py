"""Typed Llama-3 config, HF config.json mapping and named sizes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torchinferno.errors import ConfigError
from torchinferno.models.common.config_overrides import override_config
from torchinferno.models.common.rope import RopeScaling


@dataclass(frozen=True)
class Llama3Config:
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = 128000
    eos_token_id: int | list[int] | None = 128001
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size must be divisible by num_attention_heads when head_dim is not given")

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    def num_params(self, include_embedding: bool = True) -> int:
        d, hd = self.hidden_size, self.head_dim_
        attn = d * hd * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else emb
        return self.num_hidden_layers * per_layer + d + (emb if include_embedding else 0) + head


_HF_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
)


def config_from_hf(d: dict) -> Llama3Config:
    """Llama3Config from an HF ``config.json`` dict (transformers 4.x and 5.x spellings)."""
    kw = {k: d[k] for k in _HF_KEYS if k in d}
    kw.setdefault("num_key_value_heads", d.get("num_attention_heads", 32))
    rope = d.get("rope_scaling") or None
    params = d.get("rope_parameters")  # transformers >= 5 puts rope_theta + scaling here
    if isinstance(params, dict):
        if "rope_theta" in params:
            kw["rope_theta"] = params["rope_theta"]
        if params.get("rope_type", "default") != "default":
            rope = params
    kw["rope_scaling"] = RopeScaling.from_hf(rope)
    try:
        return Llama3Config(**kw)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"invalid llama config.json: {e}") from None


def config_to_hf(c: Llama3Config) -> dict:
    d = {k: v for k, v in asdict(c).items() if k in _HF_KEYS}
    d["head_dim"] = c.head_dim_
    d["rope_scaling"] = c.rope_scaling.to_hf()
    d.update(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu")
    return d


def debug_config(**overrides) -> Llama3Config:
    """Tiny random config for tests: GQA 4:2, two layers, llama3 rope scaling.

    ``overrides`` replace fields of these defaults (``models/common/config_overrides.py``: unknown names are
    refused, ``max_seq_len`` means ``max_position_embeddings``, special-token ids left out of a shrunk vocab
    move to its top).
    """
    base = Llama3Config(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64), tie_word_embeddings=False,
        bos_token_id=256, eos_token_id=257,
    )
    return override_config(base, overrides, "debug_config") if overrides else base


def smollm2_135m_config() -> Llama3Config:
    return Llama3Config(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )


def llama3_8b_config() -> Llama3Config:
    """Llama-3.1-8B public shapes (128k context, llama3 rope scaling)."""
    return Llama3Config(
        max_position_embeddings=131072, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
        eos_token_id=[128001, 128008, 128009],
    )


def llama3_70b_config() -> Llama3Config:
    """Llama-3.1-70B public shapes."""
    return Llama3Config(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        max_position_embeddings=131072, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
        eos_token_id=[128001, 128008, 128009],
    )


SIZES = {
    "debug": debug_config,
    "smollm2-135m": smollm2_135m_config,
    "llama3-8b": llama3_8b_config,
    "llama3-70b": llama3_70b_config,
}
