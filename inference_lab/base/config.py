"""Model shapes: one dataclass and the presets the lessons use.

| preset      | mirrors                     | what for                                            |
|-------------|-----------------------------|-----------------------------------------------------|
| ``tiny``    | nothing                     | tests: compiles and runs in well under a second      |
| ``small``   | a ~56M-parameter decoder    | CPU lessons: 224 MB of f32 weights, far larger than |
|             |                             | any CPU cache, so decode is visibly bandwidth-bound |
| ``shakespeare`` | a ~1.7M-parameter byte model | the trained weights the lab ships                 |
|             |                             | (``inference_lab.model.pretrained.load()``): real text    |
| ``shakespeare_large`` | a ~12.8M-parameter byte model | its trained sibling, 51 MB of f32 weights: the |
|             |                             | target of speculative decoding (notebook 08)        |
| ``base``    | Llama-3.2-1B                | GPU lessons                                         |
| ``llama3_8b`` | Llama-3-8B                | H200-class GPUs                                     |
"""

from __future__ import annotations

import dataclasses

from inference_lab.base import checks

DTYPES = ("float32", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int4")   # how the streamed matrices are stored (inference_lab.model.quantize)
KV_CACHE_DTYPES = ("auto", "int8")         # how the KV cache is stored (vLLM's --kv-cache-dtype names)
INT4_GROUP_SIZES = (32, 64, 128)           # = pallas_kernels.quantization.INT4_GROUP_SIZES (tested)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    dtype: str = "float32"
    # Weights stored in fewer bytes (the dtype above stays what the model computes and caches in):
    # "int8" (a float32 scale per output column) or "int4" (two values a byte, a scale per group of
    # group_size input rows). Made by Transformer.quantized(); the roofline reads the bytes from here.
    quantization: str = "none"
    group_size: int | None = None
    # The KV cache's storage: "auto" (the dtype above) or "int8" (a float32 scale per token and KV
    # head). Made by Transformer.with_kv_cache_dtype(); the roofline reads the KV bytes from here.
    kv_cache_dtype: str = "auto"
    # Llama 3's long-context RoPE (a Hugging Face config's rope_scaling with rope_type "llama3"):
    # (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), or None for
    # plain RoPE. The model turns it into its rotary frequencies (transformer.rope_frequencies).
    rope_scaling: tuple | None = None
    # Biases on the Q, K and V projections (Qwen2): one more tensor per layer, b_qkv [Hkv, G + 2, Dh].
    qkv_bias: bool = False

    def __post_init__(self):
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                      "head_dim", "d_ff", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{field}={value!r} must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} must be a multiple of "
                f"n_kv_heads={self.n_kv_heads} (grouped-query attention shares each KV head "
                "among a whole number of query heads)"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even (rotary embeddings rotate pairs)")
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype={self.dtype!r}: use one of {DTYPES}")
        checks.positive("ModelConfig.rope_theta", self.rope_theta)
        checks.finite("ModelConfig.norm_eps", self.norm_eps, 1e-12, 1.0)
        checks.flag("ModelConfig.tie_embeddings", self.tie_embeddings)
        checks.flag("ModelConfig.qkv_bias", self.qkv_bias)
        self._check_rope_scaling()
        self._check_quantization()
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ModelConfig.name={self.name!r} must be a non-empty string")
        if self.vocab_size < 259:
            raise ValueError(
                f"ModelConfig.vocab_size={self.vocab_size} is too small for the byte-level "
                "tokenizer (256 bytes + 3 special tokens): use at least 259"
            )

    def _check_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        if isinstance(scaling, list):   # read back from JSON (a weights file's metadata): keep it hashable
            scaling = tuple(scaling)
            object.__setattr__(self, "rope_scaling", scaling)
        fix = ("; give (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) as Llama 3's "
               "config.json has them, e.g. (32.0, 1.0, 4.0, 8192), or None")
        if not isinstance(scaling, tuple) or len(scaling) != 4:
            raise ValueError(f"ModelConfig.rope_scaling={scaling!r} is not four numbers{fix}")
        factor, low, high, original = scaling
        for name, value in (("factor", factor), ("low_freq_factor", low), ("high_freq_factor", high)):
            checks.positive(f"ModelConfig.rope_scaling's {name}", value)
        if not (factor >= 1 and high > low):
            raise ValueError(f"ModelConfig.rope_scaling={scaling!r} needs factor >= 1 and high_freq_factor > "
                             f"low_freq_factor{fix}")
        if not isinstance(original, int) or isinstance(original, bool) or original < 1:
            raise ValueError(f"ModelConfig.rope_scaling's original_max_position_embeddings={original!r} must be a "
                             f"positive integer{fix}")

    def _check_quantization(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} must be one of {', '.join(KV_CACHE_DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={self.quantization!r} must be one of {', '.join(QUANTIZATIONS)}")
        if self.quantization != "int4":
            if self.group_size is not None:
                raise ValueError(f"group_size={self.group_size!r} applies to int4 only; {self.quantization} "
                                 "takes group_size=None")
            return
        g = self.group_size
        if isinstance(g, bool) or g not in INT4_GROUP_SIZES:
            raise ValueError(f"group_size={g!r} is not an int4 group size; use one of "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        for rows, where in ((self.d_model, "d_model (the rows of w_qkv, w_gate_up and the head)"),
                            (self.n_heads * self.head_dim, "n_heads * head_dim (the rows of w_o)"),
                            (self.d_ff, "d_ff (the rows of w_down)")):
            if rows % g:
                raise ValueError(f"group_size={g} does not divide {where} = {rows} of {self.name}; int4 cannot "
                                 f"pack that layer: pick a group size that divides {rows} (or quantize to int8)")

    def matrix_shapes(self) -> list[tuple[int, int]]:
        """Every streamed matrix as (input rows K, output columns N): the layers' four, then the head."""
        hkv, g = self.n_kv_heads, self.n_heads // self.n_kv_heads
        layer = [(self.d_model, hkv * (g + 2) * self.head_dim), (self.n_heads * self.head_dim, self.d_model),
                 (self.d_model, 2 * self.d_ff), (self.d_ff, self.d_model)]
        return layer * self.n_layers + [(self.d_model, self.vocab_size)]

    @property
    def matmul_weight_bytes(self) -> float:
        """Bytes of the streamed matrices as stored: ``matmul_params * dtype_bytes`` in float;
        one byte a weight plus a float32 scale per column in int8; half a byte a weight plus a
        float32 scale per group of ``group_size`` rows per column in int4."""
        if self.quantization == "none":
            return float(self.matmul_params * self.dtype_bytes)
        if self.quantization == "int8":
            return float(sum(k * n + 4 * n for k, n in self.matrix_shapes()))
        return float(sum(k * n / 2 + 4 * (k // self.group_size) * n for k, n in self.matrix_shapes()))

    @property
    def kv_bytes_per_element(self) -> float:
        """Bytes one K or V element costs in the cache: the dtype's, or 1 + 4 / head_dim in int8
        (the value and its share of the token's and head's float32 scale)."""
        return self.dtype_bytes if self.kv_cache_dtype == "auto" else 1 + 4 / self.head_dim

    @property
    def bytes_per_weight(self) -> float:
        """Mean stored bytes per streamed weight (scales included): 4, 2, ~1.0 or ~0.5 + 4 / group_size."""
        return self.matmul_weight_bytes / self.matmul_params

    @classmethod
    def preset(cls, preset: str, /, **overrides) -> "ModelConfig":
        """A named preset (``tiny``, ``small``, ``shakespeare``, ``base``, ``llama3_8b``), fields
        overridable, ``name`` too (the preset's name is positional only, so it never collides with
        the field). An override that is not a field is refused by name."""
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ValueError(f"preset={preset!r} is unknown; choose one of {', '.join(PRESETS)}")
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{unknown[0]}= is not a ModelConfig field; the fields are "
                             f"{', '.join(f.name for f in dataclasses.fields(cls))}")
        return dataclasses.replace(PRESETS[preset], **overrides)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    # Parameter counts, split the way the roofline needs them.
    @property
    def layer_params(self) -> int:
        """Weights of one transformer block (matrices and the two RMSNorm scales)."""
        q = self.d_model * self.n_heads * self.head_dim
        kv = 2 * self.d_model * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.d_model
        mlp = 3 * self.d_model * self.d_ff
        return q + kv + o + mlp + 2 * self.d_model + self.bias_params

    @property
    def bias_params(self) -> int:
        """The Q, K and V biases of one block (zero unless ``qkv_bias``): added, never multiplied."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim if self.qkv_bias else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model

    @property
    def head_params(self) -> int:
        """The output projection (shared with the embedding when tied)."""
        return self.vocab_size * self.d_model

    @property
    def num_params(self) -> int:
        """Stored parameters (a tied head is counted once)."""
        head = 0 if self.tie_embeddings else self.head_params
        return self.n_layers * self.layer_params + self.embedding_params + head + self.d_model

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul for every token (layers + output head)."""
        return self.n_layers * (self.layer_params - 2 * self.d_model - self.bias_params) + self.head_params


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4,
        head_dim=32, d_ff=512, max_seq_len=512, rope_theta=10_000.0, tie_embeddings=False,
        dtype="float32",
    ),
    "small": ModelConfig(
        name="small", vocab_size=512, d_model=768, n_layers=8, n_heads=12, n_kv_heads=4,
        head_dim=64, d_ff=2304, max_seq_len=2048, rope_theta=10_000.0, tie_embeddings=False,
        dtype="float32",
    ),
    # Trained on Shakespeare (inference_lab/weights/README.md): sized so that it trains on a
    # 2-core CPU in about half an hour. 256 = the training window: longer contexts are untrained.
    "shakespeare": ModelConfig(
        name="shakespeare", vocab_size=259, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2,
        head_dim=32, d_ff=512, max_seq_len=256, rope_theta=10_000.0, tie_embeddings=False,
        dtype="float32",
    ),
    # Trained on the same text with the same bytes (inference_lab/weights/README.md): the target of
    # speculative decoding (notebook 08), with `shakespeare` as its draft. 51 MB of float32
    # weights, past a laptop's last-level cache, so its batch-1 step is bound by reading them.
    "shakespeare_large": ModelConfig(
        name="shakespeare_large", vocab_size=259, d_model=384, n_layers=8, n_heads=6, n_kv_heads=2,
        head_dim=64, d_ff=1024, max_seq_len=256, rope_theta=10_000.0, tie_embeddings=False,
        dtype="float32",
    ),
    "base": ModelConfig(
        name="base", vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        head_dim=64, d_ff=8192, max_seq_len=8192, rope_theta=500_000.0, tie_embeddings=True,
        dtype="bfloat16",
    ),
    "llama3_8b": ModelConfig(
        name="llama3_8b", vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32,
        n_kv_heads=8, head_dim=128, d_ff=14_336, max_seq_len=8192, rope_theta=500_000.0,
        tie_embeddings=False, dtype="bfloat16",
    ),
}
