"""Typed dsv4 config (a local compact family, not DeepSeek-V4), its config.json mapping and sizes.

``config.json`` uses ``model_type = "torchinferno_dsv4"`` (no other library reads it). Field
names follow the DeepSeek-V3 spelling so a DeepSeek-style config maps field by field:
``config_from_deepseek_hf`` reads a ``deepseek_v3`` / ``deepseek_v32`` config.json and refuses
(naming the key) what this family cannot represent: YaRN or other rope scaling, group-limited
routing, non-SiLU activations, non-sigmoid scoring, per-layer MLP patterns other than
"first k dense".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torchinferno.errors import ConfigError
from torchinferno.models.common.config_overrides import override_config

HF_MODEL_TYPE = "torchinferno_dsv4"
DEEPSEEK_MODEL_TYPES = ("deepseek_v3", "deepseek_v32")


@dataclass(frozen=True)
class DSv4Config:
    vocab_size: int = 32000
    hidden_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    # latent attention: cache per token = kv_lora_rank + qk_rope_head_dim values
    q_lora_rank: int | None = 256  # None: direct q_proj (no query LoRA)
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    rope_interleave: bool = False  # True: rotate adjacent pairs (DeepSeek's MLA layout); False: halves
    # MLPs: the first ``first_k_dense_replace`` layers are dense, the rest MoE
    intermediate_size: int = 2816
    first_k_dense_replace: int = 1
    moe_intermediate_size: int = 512
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # misc
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "moe_intermediate_size", "n_routed_experts"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) <= 0:
                raise ConfigError(f"dsv4 config: '{k}' must be a positive integer, got {getattr(self, k)!r}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ConfigError(f"dsv4 config: 'q_lora_rank' must be positive or null, got {self.q_lora_rank!r}")
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
            raise ConfigError(f"dsv4 config: num_experts_per_tok={self.num_experts_per_tok} must be in 1..n_routed_experts={self.n_routed_experts}")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"dsv4 config: qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise ConfigError(f"dsv4 config: first_k_dense_replace={self.first_k_dense_replace} must be in 0..num_hidden_layers")
        if self.n_shared_experts < 0:
            raise ConfigError("dsv4 config: n_shared_experts must be >= 0")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values cached per token per layer: ``c_kv`` (kv_lora_rank) + the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim**-0.5

    @property
    def layer_mlp_types(self) -> tuple[str, ...]:
        k = self.first_k_dense_replace
        return ("dense",) * k + ("sparse",) * (self.num_hidden_layers - k)

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    def num_params(self, include_embedding: bool = True) -> int:
        from torchinferno.models.common.mla_projections import mla_projection_params

        d = self.hidden_size
        attn = mla_projection_params(self)
        dense = 3 * d * self.intermediate_size
        moe = (self.n_routed_experts + self.n_shared_experts) * 3 * d * self.moe_intermediate_size + self.n_routed_experts * (d + 1)
        total = sum(attn + 2 * d + (dense if t == "dense" else moe) for t in self.layer_mlp_types)
        emb = self.vocab_size * d
        return total + d + (emb if include_embedding else 0) + (0 if self.tie_word_embeddings else emb)


_FIELDS = tuple(DSv4Config.__dataclass_fields__)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "moe_intermediate_size")


def _build(kw: dict, where: str) -> DSv4Config:
    try:
        return DSv4Config(**kw)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"invalid {where}: {e}") from None


def config_from_hf(d: dict) -> DSv4Config:
    """DSv4Config from a ``torchinferno_dsv4`` config.json dict."""
    if d.get("model_type") != HF_MODEL_TYPE:
        raise ConfigError(f"config.json key 'model_type' is {d.get('model_type')!r}; dsv4 reads {HF_MODEL_TYPE!r}")
    for k in _REQUIRED:
        if d.get(k) is None:
            raise ConfigError(f"config.json ({HF_MODEL_TYPE}) is missing required key '{k}'")
    kw = {k: d[k] for k in _FIELDS if k in d}
    if "norm_topk_prob" in kw:
        kw["norm_topk_prob"] = bool(kw["norm_topk_prob"])  # null: do not normalize (as transformers reads it)
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = list(kw["eos_token_id"])
    return _build(kw, f"{HF_MODEL_TYPE} config.json")


def config_to_hf(c: DSv4Config) -> dict:
    d = asdict(c)
    d.update(model_type=HF_MODEL_TYPE, architectures=["DSv4ForCausalLM"], hidden_act="silu",
             torchinferno_family="dsv4", torchinferno_note="local compact DeepSeek-style family, not DeepSeek-V4")
    return d


def config_from_deepseek_hf(d: dict) -> DSv4Config:
    """DSv4Config from a DeepSeek-V3 / V3.2 config.json, refusing (ConfigError naming the key)
    settings dsv4 cannot represent. The V3.2 indexer and MTP layers are refused per tensor by
    the converter, not here."""
    mt = d.get("model_type")
    if mt == HF_MODEL_TYPE:
        return config_from_hf(d)
    if mt not in DEEPSEEK_MODEL_TYPES:
        raise ConfigError(f"config.json key 'model_type' is {mt!r}; dsv4 converts {', '.join(DEEPSEEK_MODEL_TYPES + (HF_MODEL_TYPE,))}")
    for k in _REQUIRED:
        if d.get(k) is None:
            raise ConfigError(f"config.json ({mt}) is missing required key '{k}'")
    unsupported = {"hidden_act": ("silu",), "scoring_func": ("sigmoid",), "topk_method": ("noaux_tc", "greedy"),
                   "moe_layer_freq": (1,)}
    for key, valid in unsupported.items():
        if d.get(key) is not None and d[key] not in valid:
            raise ConfigError(f"config.json key '{key}' = {d[key]!r} cannot be represented by dsv4 (valid: {', '.join(map(str, valid))})")
    q = d.get("quantization_config")
    if q and q.get("quant_method") not in (None, "fp8"):
        raise ConfigError(f"config.json key 'quantization_config': quant_method {q.get('quant_method')!r} cannot be converted (valid: fp8)")
    n_group, topk_group = d.get("n_group") or 1, d.get("topk_group") or 1
    if n_group > 1 and topk_group < n_group:
        raise ConfigError(f"config.json keys 'n_group'={n_group} / 'topk_group'={topk_group}: group-limited routing "
                          "cannot be represented by dsv4 (needs topk_group == n_group)")
    theta = d.get("rope_theta")
    params = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        key = "rope_parameters" if scaling is params else "rope_scaling"
        raise ConfigError(f"config.json key '{key}': rope_type {scaling.get('rope_type', scaling.get('type'))!r} "
                          "cannot be represented by dsv4 (default rope only)")
    kw = {k: d[k] for k in _FIELDS if k in d and d[k] is not None}
    if "norm_topk_prob" in d:  # transformers tests it for truth: null means "do not normalize"
        kw["norm_topk_prob"] = bool(d["norm_topk_prob"])
    kw["rope_theta"] = float(10000.0 if theta is None else theta)
    kw["rope_interleave"] = True if mt == "deepseek_v32" else bool(d.get("rope_interleave", True))
    kw.setdefault("first_k_dense_replace", 3)  # DeepSeek-V3's default
    types = d.get("mlp_layer_types")
    if types is not None:
        k = min(kw["first_k_dense_replace"], kw["num_hidden_layers"])
        if tuple(types) != ("dense",) * k + ("sparse",) * (kw["num_hidden_layers"] - k):
            raise ConfigError("config.json key 'mlp_layer_types' is not 'first k dense': cannot be represented by dsv4")
    kw["first_k_dense_replace"] = min(kw["first_k_dense_replace"], kw["num_hidden_layers"])
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = list(kw["eos_token_id"])
    return _build(kw, f"{mt} config.json")


# ------------------------------------------------------------------------ named sizes


def tiny_dsv4_config(**overrides) -> DSv4Config:
    """Tiny random config for tests (CPU, milliseconds): 3 layers (1 dense + 2 MoE), 8 experts top-2.

    ``overrides`` replace fields of these defaults (``models/common/config_overrides.py``: unknown names are
    refused, ``max_seq_len`` means ``max_position_embeddings``, special-token ids left out of a shrunk vocab
    move to its top).
    """
    base = DSv4Config(
        vocab_size=320, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128, first_k_dense_replace=1,
        moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        routed_scaling_factor=1.5, max_position_embeddings=512, bos_token_id=256, eos_token_id=257,
    )
    return override_config(base, overrides, "tiny_dsv4_config") if overrides else base


def tiny_dsv4_no_q_lora_config(**overrides) -> DSv4Config:
    """The tiny config with a direct query projection (``q_lora_rank=None``); same overrides."""
    return override_config(tiny_dsv4_config(), {"q_lora_rank": None, **overrides}, "tiny_dsv4_no_q_lora_config")


def small_dsv4_config() -> DSv4Config:
    """~0.2B parameters: big enough for GPU cache/serving experiments, small enough for a laptop."""
    return DSv4Config()


SIZES = {
    "debug": tiny_dsv4_config,
    "debug-no-q-lora": tiny_dsv4_no_q_lora_config,
    "small": small_dsv4_config,
}
