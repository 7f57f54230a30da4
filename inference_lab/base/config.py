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
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ModelConfig.name={self.name!r} must be a non-empty string")
        if self.vocab_size < 259:
            raise ValueError(
                f"ModelConfig.vocab_size={self.vocab_size} is too small for the byte-level "
                "tokenizer (256 bytes + 3 special tokens): use at least 259"
            )

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        """A named preset (``tiny``, ``small``, ``shakespeare``, ``base``, ``llama3_8b``), fields overridable."""
        if name not in PRESETS:
            raise ValueError(f"preset={name!r} is unknown; choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

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
        return q + kv + o + mlp + 2 * self.d_model

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
        return self.n_layers * (self.layer_params - 2 * self.d_model) + self.head_params


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
