"""Typed DeepSeek-V4 config, its config.json mapping (transformers' ``deepseek_v4``) and named sizes.

Field names follow transformers' ``DeepseekV4Config``. Per layer: ``layer_types`` (``sliding_attention``,
``compressed_sparse_attention`` = CSA, rate ``compress_rate_csa``; ``heavily_compressed_attention`` = HCA,
rate ``compress_rate_hca``) and ``mlp_layer_types`` (``hash_moe`` routes by ``tid2eid[token]``, ``moe`` by
learned top-k). Two rope tables: ``main`` (``rope_theta``) for sliding layers, ``compress``
(``compress_rope_theta``, optional YaRN ``compress_rope_scaling``) for compressed layers and their compressors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torchinferno.errors import ConfigError
from torchinferno.models.common.config_overrides import override_config
from torchinferno.models.common.rope import RopeScaling

HF_MODEL_TYPE = "deepseek_v4"
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
MLP_TYPES = ("hash_moe", "moe")
_RATIO_TO_TYPE = {0: SLIDING, 4: CSA, 128: HCA}


@dataclass(frozen=True)
class DeepSeekV4Config:
    vocab_size: int = 129280
    hidden_size: int = 4096
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512  # one shared K=V head of this size
    q_lora_rank: int = 1024
    qk_rope_head_dim: int = 64  # trailing rope dims of each head
    num_experts_per_tok: int = 6
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    max_position_embeddings: int = 1048576
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    compress_rope_scaling: dict | None = None  # HF yarn dict for the "compress" table, or None
    layer_types: tuple[str, ...] = ()
    mlp_layer_types: tuple[str, ...] = ()
    compress_rate_csa: int = 4
    compress_rate_hca: int = 128
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    swiglu_limit: float = 10.0
    sliding_window: int = 128
    o_groups: int = 8
    o_lora_rank: int = 1024
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
                  "moe_intermediate_size", "n_routed_experts", "hc_mult", "sliding_window", "o_groups", "o_lora_rank",
                  "index_n_heads", "index_head_dim", "index_topk", "compress_rate_csa", "compress_rate_hca"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"deepseek-v4 config: '{k}' must be a positive integer, got {v!r}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (HCA,) * min(n, 2) + tuple(CSA if i % 2 else HCA for i in range(max(n - 2, 0))))
        if not self.mlp_layer_types:
            object.__setattr__(self, "mlp_layer_types", ("hash_moe",) * min(n, 3) + ("moe",) * max(0, n - 3))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_layer_types", tuple(self.mlp_layer_types))
        for name, types, allowed in (("layer_types", self.layer_types, LAYER_TYPES), ("mlp_layer_types", self.mlp_layer_types, MLP_TYPES)):
            if len(types) != n:
                raise ConfigError(f"deepseek-v4 config: len({name})={len(types)} must equal num_hidden_layers={n}")
            bad = [t for t in types if t not in allowed]
            if bad:
                raise ConfigError(f"deepseek-v4 config: '{name}' entries must be one of {', '.join(allowed)}; got {bad[0]!r}")
        if self.qk_rope_head_dim % 2 or not 0 < self.qk_rope_head_dim <= self.head_dim:
            raise ConfigError(f"deepseek-v4 config: qk_rope_head_dim={self.qk_rope_head_dim} must be even and <= head_dim")
        if (self.num_attention_heads * self.head_dim) % self.o_groups:
            raise ConfigError(f"deepseek-v4 config: o_groups={self.o_groups} must divide num_attention_heads * head_dim")
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
            raise ConfigError(f"deepseek-v4 config: num_experts_per_tok={self.num_experts_per_tok} must be in 1..{self.n_routed_experts}")
        if self.n_shared_experts != 1:
            raise ConfigError(f"deepseek-v4 config: n_shared_experts={self.n_shared_experts} (transformers builds exactly one)")
        if self.scoring_func != "sqrtsoftplus":
            raise ConfigError(f"deepseek-v4 config: scoring_func={self.scoring_func!r} is not supported (valid: sqrtsoftplus)")
        if self.hc_sinkhorn_iters < 1:
            raise ConfigError("deepseek-v4 config: hc_sinkhorn_iters must be >= 1")

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim

    @property
    def compress_scaling(self) -> RopeScaling:
        return RopeScaling.from_hf(self.compress_rope_scaling)

    def compress_rate(self, layer_type: str) -> int:
        """Tokens per compressed entry of a layer type (0 for sliding-only layers)."""
        return {SLIDING: 0, CSA: self.compress_rate_csa, HCA: self.compress_rate_hca}[layer_type]

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    def num_params(self, include_embedding: bool = True) -> int:
        d, h, hd, n = self.hidden_size, self.num_attention_heads, self.head_dim, self.hc_mult
        hc = 2 * ((2 + n) * n * n * d + (2 + n) * n + 3)
        attn = d * self.q_lora_rank + self.q_lora_rank * (1 + h * hd) + d * hd + hd + h
        attn += h * hd * self.o_lora_rank + self.o_groups * self.o_lora_rank * d
        moe = (self.n_routed_experts + 1) * 3 * d * self.moe_intermediate_size + self.n_routed_experts * d
        total = 0
        for t in self.layer_types:
            extra = 0
            if t == HCA:
                extra = 2 * d * hd + self.compress_rate_hca * hd + hd
            elif t == CSA:
                ih = self.index_head_dim
                extra = 4 * d * hd + self.compress_rate_csa * 2 * hd + hd
                extra += 4 * d * ih + self.compress_rate_csa * 2 * ih + ih + self.q_lora_rank * self.index_n_heads * ih + d * self.index_n_heads
            total += hc + attn + extra + moe + 2 * d
        emb = self.vocab_size * d
        return total + d + n * n * d + n + 1 + (emb if include_embedding else 0) + (0 if self.tie_word_embeddings else emb)


_FIELDS = tuple(DeepSeekV4Config.__dataclass_fields__)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim")


def config_from_hf(d: dict) -> DeepSeekV4Config:
    """DeepSeekV4Config from a transformers ``deepseek_v4`` config.json dict (legacy keys folded as transformers does)."""
    if d.get("model_type") != HF_MODEL_TYPE:
        raise ConfigError(f"config.json key 'model_type' is {d.get('model_type')!r}; deepseek-v4 reads {HF_MODEL_TYPE!r}")
    for k in _REQUIRED:
        if d.get(k) is None:
            raise ConfigError(f"config.json ({HF_MODEL_TYPE}) is missing required key '{k}'")
    kw = {k: d[k] for k in _FIELDS if k in d and d[k] is not None and k not in ("layer_types", "mlp_layer_types")}
    n = d["num_hidden_layers"]
    rates = dict(d.get("compress_rates") or {})
    if d.get("compress_rate_csa") is not None:
        rates[CSA] = d["compress_rate_csa"]
    if d.get("compress_rate_hca") is not None:
        rates[HCA] = d["compress_rate_hca"]
    kw["compress_rate_csa"] = int(rates.get(CSA, 4))
    kw["compress_rate_hca"] = int(rates.get(HCA, 128))
    types = d.get("layer_types")
    if types is None and d.get("compress_ratios") is not None:
        try:
            types = [_RATIO_TO_TYPE[r] for r in d["compress_ratios"]]
        except KeyError as e:
            raise ConfigError(f"config.json key 'compress_ratios': unknown ratio {e.args[0]!r} (valid: 0, 4, 128)") from None
    if types is not None:
        kw["layer_types"] = tuple(types[:n])
    mtypes = d.get("mlp_layer_types")
    if mtypes is None and d.get("num_hash_layers") is not None:
        k = d["num_hash_layers"]
        mtypes = ["hash_moe"] * min(n, k) + ["moe"] * max(0, n - k)
    if mtypes is not None:
        kw["mlp_layer_types"] = tuple(mtypes[:n])
    if d.get("qk_rope_head_dim") is None and d.get("partial_rotary_factor") is not None:
        kw["qk_rope_head_dim"] = int(d["head_dim"] * d["partial_rotary_factor"])
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}  # raw hub configs may still say rope_scaling
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        kw["rope_theta"] = float(rp["main"].get("rope_theta", kw.get("rope_theta", 10000.0)))
        comp = rp["compress"]
        kw["compress_rope_theta"] = float(comp.get("rope_theta", kw.get("compress_rope_theta", 160000.0)))
        if "partial_rotary_factor" in comp and d.get("qk_rope_head_dim") is None:
            kw["qk_rope_head_dim"] = int(d["head_dim"] * comp["partial_rotary_factor"])
        rp = comp
    elif rp.get("rope_theta") is not None and d.get("rope_theta") is None:
        kw["rope_theta"] = float(rp["rope_theta"])
    rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
    if rope_type == "yarn":
        if rp.get("attention_factor") not in (None, 1.0):
            raise ConfigError(f"config.json key 'rope_parameters.compress.attention_factor'={rp['attention_factor']!r}: only 1.0 is supported")
        kw["compress_rope_scaling"] = {"rope_type": "yarn", **{k: rp[k] for k in ("factor", "original_max_position_embeddings",
                                                                                "beta_fast", "beta_slow") if k in rp}}
    elif rope_type != "default":
        raise ConfigError(f"config.json key 'rope_parameters': rope_type {rope_type!r} is not supported (valid: default, yarn)")
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = list(kw["eos_token_id"])
    try:
        return DeepSeekV4Config(**kw)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"invalid {HF_MODEL_TYPE} config.json: {e}") from None


def config_to_hf(c: DeepSeekV4Config) -> dict:
    """A config.json transformers' ``DeepseekV4Config`` reads back to the same model."""
    d = asdict(c)
    for k in ("compress_rate_csa", "compress_rate_hca", "compress_rope_scaling", "layer_types", "mlp_layer_types"):
        d.pop(k)
    yarn = dict(c.compress_rope_scaling or {})
    d.update(
        model_type=HF_MODEL_TYPE, architectures=["DeepseekV4ForCausalLM"], hidden_act="silu",
        layer_types=list(c.layer_types), mlp_layer_types=list(c.mlp_layer_types),
        compress_rates={CSA: c.compress_rate_csa, HCA: c.compress_rate_hca},
        partial_rotary_factor=c.qk_rope_head_dim / c.head_dim, num_key_value_heads=1, norm_topk_prob=True,
    )
    d.pop("qk_rope_head_dim")
    if yarn:
        d["rope_parameters"] = {**yarn, "rope_type": "yarn"}
    return d


# ------------------------------------------------------------------------ named sizes


def tiny_deepseek_v4_config(**overrides) -> DeepSeekV4Config:
    """Tiny random config for tests (CPU, milliseconds): 4 layers sliding / CSA(4) / HCA(8) / CSA, the first
    two hash-routed, window 6, index_topk 3 (so CSA really selects), YaRN on the compress rope.

    ``overrides`` replace fields (``models/common/config_overrides.py`` rules).
    """
    base = DeepSeekV4Config(
        vocab_size=320, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        head_dim=32, q_lora_rank=48, qk_rope_head_dim=8, num_experts_per_tok=2, n_routed_experts=6,
        routed_scaling_factor=1.5, max_position_embeddings=512, rope_theta=10000.0, compress_rope_theta=160000.0,
        compress_rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                               "beta_fast": 32.0, "beta_slow": 1.0},
        layer_types=(SLIDING, CSA, HCA, CSA), mlp_layer_types=("hash_moe", "hash_moe", "moe", "moe"),
        compress_rate_csa=4, compress_rate_hca=8, hc_mult=3, hc_sinkhorn_iters=5, swiglu_limit=3.0,
        sliding_window=6, o_groups=2, o_lora_rank=24, index_n_heads=8, index_head_dim=16, index_topk=3,
        bos_token_id=256, eos_token_id=257,
    )
    return override_config(base, overrides, "tiny_deepseek_v4_config") if overrides else base


def small_deepseek_v4_config() -> DeepSeekV4Config:
    """A mid-size random config (~0.3B) for GPU and serving experiments."""
    return DeepSeekV4Config(
        vocab_size=32000, hidden_size=1024, moe_intermediate_size=512, num_hidden_layers=8, num_attention_heads=16,
        head_dim=128, q_lora_rank=256, qk_rope_head_dim=32, num_experts_per_tok=4, n_routed_experts=16,
        max_position_embeddings=8192, layer_types=(SLIDING, CSA, HCA, CSA, HCA, CSA, HCA, CSA),
        mlp_layer_types=("hash_moe",) * 2 + ("moe",) * 6, compress_rate_hca=32, hc_mult=4, sliding_window=64,
        o_groups=4, o_lora_rank=256, index_n_heads=16, index_head_dim=64, index_topk=64,
    )


def flash_deepseek_v4_config() -> DeepSeekV4Config:
    """The config's defaults: DeepSeek-V4-Flash's shape (43 layers, 64 heads of 512, 256 experts of 2048, 6 active);
    for planning on ``meta`` (``plan-parallel --size deepseek-v4-flash``), never allocated in tests."""
    return DeepSeekV4Config()


SIZES = {"debug": tiny_deepseek_v4_config, "small": small_deepseek_v4_config, "deepseek-v4-flash": flash_deepseek_v4_config}
