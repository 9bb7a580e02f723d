"""Typed DeepSeek-V3 / V3.2 config, HF ``config.json`` mapping and named sizes.

One dataclass covers both checkpoints: ``index_n_heads == 0`` is DeepSeek-V3 (dense MLA), a
positive value adds the V3.2 lightning indexer (DeepSeek Sparse Attention). ``config_from_hf``
reads what transformers 5.24 writes for ``DeepseekV3Config`` / ``DeepseekV32Config`` and the
hub's original spelling (``rope_scaling`` + top-level ``rope_theta``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torchinferno.errors import ConfigError
from torchinferno.models.common.config_overrides import override_config
from torchinferno.models.common.rope import RopeScaling, yarn_attention_factor, yarn_get_mscale

HF_MODEL_TYPES = ("deepseek_v3", "deepseek_v32")


@dataclass(frozen=True)
class DeepSeekV32Config:
    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432  # dense MLP of the first ``first_k_dense_replace`` layers
    moe_intermediate_size: int = 2048  # per routed expert (and per shared expert)
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    # MLA
    q_lora_rank: int | None = 1536  # None: direct q_proj (no query LoRA)
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    attention_bias: bool = False
    rope_interleave: bool = True  # rope on adjacent pairs of the rope dims (DeepSeek's layout)
    # MoE
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    first_k_dense_replace: int = 3
    mlp_layer_types: tuple[str, ...] | None = None  # per layer "dense" | "sparse"; None: from first_k_dense_replace
    # DeepSeek Sparse Attention (V3.2); index_n_heads == 0 turns the indexer off (V3)
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048
    # misc
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(
        default_factory=lambda: RopeScaling("yarn", factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    )
    max_position_embeddings: int = 163840
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0  # MTP layers stored after the last layer (ignored at load)
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.n_routed_experts <= 0:
            raise ConfigError("n_routed_experts must be positive")
        if self.n_group <= 0 or self.n_routed_experts % self.n_group:
            raise ConfigError(f"n_routed_experts={self.n_routed_experts} must be a multiple of n_group={self.n_group}")
        if not 0 < self.topk_group <= self.n_group:
            raise ConfigError(f"topk_group={self.topk_group} must be in 1..n_group={self.n_group}")
        if self.n_group > 1 and self.n_routed_experts // self.n_group < 2:
            raise ConfigError("group-limited routing needs at least 2 experts per group (group score = top-2 sum)")
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts // self.n_group * self.topk_group:
            raise ConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds the experts in topk_group={self.topk_group} groups"
            )
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        if self.mlp_layer_types is not None:
            if len(self.mlp_layer_types) != self.num_hidden_layers:
                raise ConfigError(f"mlp_layer_types has {len(self.mlp_layer_types)} entries, expected {self.num_hidden_layers}")
            bad = sorted(set(self.mlp_layer_types) - {"dense", "sparse"})
            if bad:
                raise ConfigError(f"mlp_layer_types: unknown type(s) {bad} (valid: dense, sparse)")
        if self.index_n_heads:
            if self.q_lora_rank is None:
                raise ConfigError("the V3.2 indexer reads the query latent: index_n_heads > 0 needs q_lora_rank")
            if self.index_head_dim < self.qk_rope_head_dim:
                raise ConfigError(f"index_head_dim={self.index_head_dim} must be >= qk_rope_head_dim={self.qk_rope_head_dim}")
            if self.index_topk <= 0:
                raise ConfigError("index_topk must be positive")
        if self.rope_scaling.rope_type not in ("default", "yarn"):
            raise ConfigError(f"unsupported rope_type '{self.rope_scaling.rope_type}' for deepseek (valid: default, yarn)")

    # ---------------------------------------------------------------- derived values
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def has_indexer(self) -> bool:
        return self.index_n_heads > 0

    @property
    def latent_dim(self) -> int:
        """Values cached per token per layer for MLA: ``c_kv`` (kv_lora_rank) + shared ``k_pe``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def layer_mlp_types(self) -> tuple[str, ...]:
        if self.mlp_layer_types is not None:
            return tuple(self.mlp_layer_types)
        k = min(self.first_k_dense_replace, self.num_hidden_layers)
        return ("dense",) * k + ("sparse",) * (self.num_hidden_layers - k)

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim**-0.5``, times YaRN mscale² when ``mscale_all_dim`` is set (as transformers does)."""
        scale = self.qk_head_dim**-0.5
        s = self.rope_scaling
        if s.rope_type != "default" and s.mscale_all_dim:
            m = yarn_get_mscale(s.factor, s.mscale_all_dim)
            scale = scale * m * m
        return scale

    @property
    def rope_attention_factor(self) -> float:
        """cos/sin multiplier of YaRN (``common.rope.yarn_attention_factor``); 1 without YaRN."""
        s = self.rope_scaling
        return yarn_attention_factor(s) if s.rope_type == "yarn" else 1.0

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    def num_params(self, include_embedding: bool = True) -> int:
        from torchinferno.models.common.mla_projections import mla_projection_params

        d = self.hidden_size
        attn = mla_projection_params(self)
        if self.has_indexer:
            attn += self.q_lora_rank * self.index_n_heads * self.index_head_dim + d * self.index_head_dim
            attn += 2 * self.index_head_dim + d * self.index_n_heads
        dense = 3 * d * self.intermediate_size
        moe = (self.n_routed_experts + self.n_shared_experts) * 3 * d * self.moe_intermediate_size
        moe += self.n_routed_experts * (d + 1)
        total = sum(attn + 2 * d + (dense if t == "dense" else moe) for t in self.layer_mlp_types)
        emb = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else emb
        return total + d + (emb if include_embedding else 0) + head

    def kv_values_per_token(self) -> int:
        per_layer = self.latent_dim + (self.index_head_dim if self.has_indexer else 0)
        return per_layer * self.num_hidden_layers


# ------------------------------------------------------------------------ HF mapping

_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "moe_intermediate_size")
_PLAIN = _REQUIRED + (
    "intermediate_size", "q_lora_rank", "attention_bias", "n_shared_experts", "num_experts_per_tok", "n_group",
    "topk_group", "norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace", "rms_norm_eps",
    "max_position_embeddings", "tie_word_embeddings", "num_nextn_predict_layers", "bos_token_id", "eos_token_id",
    "pad_token_id",
)
_INDEX_KEYS = ("index_n_heads", "index_head_dim", "index_topk")


def config_from_hf(d: dict) -> DeepSeekV32Config:
    """DeepSeekV32Config from an HF ``config.json`` dict (``deepseek_v3`` or ``deepseek_v32``)."""
    model_type = d.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError(f"config.json key 'model_type' is {model_type!r}; deepseek-v3.2 reads {', '.join(HF_MODEL_TYPES)}")
    for k in _REQUIRED:
        if d.get(k) is None:
            raise ConfigError(f"config.json ({model_type}) is missing required key '{k}'")
    _check_supported(d)
    kw = {k: d[k] for k in _PLAIN if k in d}
    for k in ("n_group", "topk_group"):  # transformers allows None: no grouping
        if kw.get(k) is None:
            kw[k] = 1
    for k in ("first_k_dense_replace", "num_experts_per_tok"):
        if kw.get(k) is None:
            kw.pop(k, None)
    if "norm_topk_prob" in d:  # transformers tests it for truth: null means "do not normalize"
        kw["norm_topk_prob"] = bool(d["norm_topk_prob"])
    if "num_nextn_predict_layers" not in kw and "num_mtp_layers" in d:
        kw["num_nextn_predict_layers"] = d["num_mtp_layers"]
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = list(kw["eos_token_id"])
    if d.get("mlp_layer_types") is not None:
        types = tuple(d["mlp_layer_types"])
        k = min(kw.get("first_k_dense_replace", 3), kw["num_hidden_layers"])
        if types != ("dense",) * k + ("sparse",) * (kw["num_hidden_layers"] - k):  # else: implied by first_k
            kw["mlp_layer_types"] = types
    if model_type == "deepseek_v32":
        for k in _INDEX_KEYS:
            if d.get(k) is None:
                raise ConfigError(f"config.json (deepseek_v32) is missing required key '{k}'")
            kw[k] = d[k]
        kw["rope_interleave"] = True  # transformers' V3.2 always uses the interleaved MLA rope
    else:
        kw["index_n_heads"] = 0
        if d.get("rope_interleave") is not None:
            kw["rope_interleave"] = bool(d["rope_interleave"])
    kw["rope_theta"], kw["rope_scaling"] = _rope_from_hf(d)
    try:
        return DeepSeekV32Config(**kw)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"invalid deepseek config.json: {e}") from None


def _check_supported(d: dict) -> None:
    checks = {
        "hidden_act": ("silu",),
        "scoring_func": ("sigmoid",),
        "topk_method": ("noaux_tc",),
        "moe_layer_freq": (1,),
    }
    for key, valid in checks.items():
        if key in d and d[key] is not None and d[key] not in valid:
            raise ConfigError(f"config.json key '{key}' = {d[key]!r} is not supported (valid: {', '.join(map(str, valid))})")
    if d.get("quantization_config") and d["quantization_config"].get("quant_method") not in (None, "fp8"):
        raise ConfigError(f"config.json key 'quantization_config': unsupported quant_method {d['quantization_config'].get('quant_method')!r}")


def _rope_from_hf(d: dict) -> tuple[float, RopeScaling]:
    theta = d.get("rope_theta")
    params = d.get("rope_parameters")  # transformers >= 5: theta + scaling in one dict
    scaling = d.get("rope_scaling")  # hub / transformers 4 spelling
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
    if scaling and scaling.get("truncate") is False:
        raise ConfigError("config.json rope 'truncate': false is not supported by deepseek-v3.2 (YaRN range is truncated)")
    if scaling and scaling.get("attention_factor") is not None:
        raise ConfigError("config.json rope 'attention_factor' is not supported by deepseek-v3.2 (derived from mscale)")
    s = RopeScaling.from_hf(scaling)
    if s.rope_type == "yarn":
        if scaling.get("factor") is None:
            orig = scaling.get("original_max_position_embeddings") or d.get("max_position_embeddings")
            s = replace(s, factor=d.get("max_position_embeddings", 163840) / orig)
        if "original_max_position_embeddings" not in scaling:
            s = replace(s, original_max_position_embeddings=d.get("max_position_embeddings", 163840))
        # transformers treats a missing/zero mscale as "use mscale(factor)"; keep that distinguishable
        s = replace(s, mscale=float(scaling.get("mscale") or 0.0), mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0))
    return float(10000.0 if theta is None else theta), s


def config_to_hf(c: DeepSeekV32Config) -> dict:
    """The ``config.json`` dict transformers 5.24 reads back as the same model."""
    d = {k: getattr(c, k) for k in _PLAIN}
    rope = {"rope_type": c.rope_scaling.rope_type, "rope_theta": c.rope_theta}
    if c.rope_scaling.rope_type == "yarn":
        s = c.rope_scaling
        rope.update(factor=s.factor, original_max_position_embeddings=s.original_max_position_embeddings,
                    beta_fast=s.beta_fast, beta_slow=s.beta_slow, mscale=s.mscale, mscale_all_dim=s.mscale_all_dim)
    d["rope_parameters"] = rope
    d["num_key_value_heads"] = c.num_attention_heads
    d["hidden_act"] = "silu"
    d["mlp_layer_types"] = list(c.layer_mlp_types)
    if c.has_indexer:
        d.update({k: getattr(c, k) for k in _INDEX_KEYS})
        d.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"])
        if c.q_lora_rank is None or not c.rope_interleave:  # pragma: no cover - guarded by __post_init__
            raise ConfigError("transformers' DeepseekV32 needs q_lora_rank and interleaved rope")
    else:
        d.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], rope_interleave=c.rope_interleave)
        d.pop("mlp_layer_types")
        k = min(c.first_k_dense_replace, c.num_hidden_layers)
        if c.layer_mlp_types != ("dense",) * k + ("sparse",) * (c.num_hidden_layers - k):
            raise ConfigError("deepseek_v3 config.json can only express 'first k layers dense' (mlp_layer_types)")
    return d


# ------------------------------------------------------------------------ named sizes


def tiny_deepseek_v32_config(**overrides) -> DeepSeekV32Config:
    """Tiny random V3.2 config for tests (CPU, milliseconds): 3 layers, 8 experts in 4 groups, YaRN.

    The indexer has 16 heads so that an exactly-zero (tied) ReLU score is rare in random weights.

    ``overrides`` replace fields of these defaults (``models/common/config_overrides.py``: unknown names are
    refused, ``max_seq_len`` means ``max_position_embeddings``, special-token ids left out of a shrunk vocab
    move to its top).
    """
    base = DeepSeekV32Config(
        vocab_size=320, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=2.5, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16, index_topk=8,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
        rope_scaling=RopeScaling("yarn", factor=4.0, original_max_position_embeddings=128, mscale=1.0, mscale_all_dim=0.8),
        bos_token_id=256, eos_token_id=257,
    )
    return override_config(base, overrides, "tiny_deepseek_v32_config") if overrides else base


def tiny_deepseek_v3_config(**overrides) -> DeepSeekV32Config:
    """The tiny config without the indexer (DeepSeek-V3 dense MLA); same overrides."""
    return override_config(tiny_deepseek_v32_config(), {"index_n_heads": 0, **overrides}, "tiny_deepseek_v3_config")


def tiny_deepseek_v3_no_q_lora_config(**overrides) -> DeepSeekV32Config:
    """The V3 tiny config with a direct query projection; same overrides."""
    return override_config(tiny_deepseek_v32_config(), {"index_n_heads": 0, "q_lora_rank": None, **overrides},
                           "tiny_deepseek_v3_no_q_lora_config")


def deepseek_v3_config() -> DeepSeekV32Config:
    """DeepSeek-V3 / V3.1 public shapes (671B total, 37B active; build on ``meta``)."""
    return DeepSeekV32Config(index_n_heads=0, num_nextn_predict_layers=1)


def deepseek_v32_config() -> DeepSeekV32Config:
    """DeepSeek-V3.2(-Exp) public shapes: V3 + lightning indexer (64 heads x 128, top-2048)."""
    return DeepSeekV32Config(num_nextn_predict_layers=1)


def v2_lite_shape_config() -> DeepSeekV32Config:
    """A DeepSeek-V2-Lite-like ``deepseek_v3`` shape for benchmarks (issue 24): 16 layers (first dense), hidden
    2048, 16 heads, MLA without query LoRA (kv_lora_rank 512, nope 128 + rope 64, v 128), 64 routed experts of
    1408 top-6 (sigmoid, ungrouped) + 2 shared: 9.3 B parameters, 1.54 B read per batch-1 decode step."""
    return DeepSeekV32Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=16,
        num_attention_heads=16, q_lora_rank=None, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=1, index_n_heads=0,
        rope_scaling=RopeScaling("default"), max_position_embeddings=4096, bos_token_id=100000, eos_token_id=100001,
    )


SIZES = {
    "debug": tiny_deepseek_v32_config,
    "debug-v3": tiny_deepseek_v3_config,
    "debug-v3-no-q-lora": tiny_deepseek_v3_no_q_lora_config,
    "deepseek-v3": deepseek_v3_config,
    "deepseek-v3.2": deepseek_v32_config,
    "v2-lite-shape": v2_lite_shape_config,
}
