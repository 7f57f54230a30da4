"""Which model a server serves: the trained Shakespeare models by preset name, a file written
by ``Transformer.save`` or ``python -m inference_lab train``, or any other preset with seeded
random weights (its text is noise; its tokens/s are what a model of that size gives)."""

from __future__ import annotations

from inference_lab.base.config import PRESETS, ModelConfig
from inference_lab.model import pretrained

DEFAULT_PRESET = "shakespeare_large"


def load_model(preset: str = DEFAULT_PRESET, weights=None, kernels: str = "auto"):
    """The model to serve (a :class:`~inference_lab.model.transformer.Transformer`). Never downloads."""
    if weights is not None:   # the file carries its own config
        from inference_lab.model.transformer import Transformer

        return Transformer.load(weights, kernels=kernels)
    if preset in pretrained.SHIPPED:
        return pretrained.load(kernels, preset=preset)
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    from flax import nnx

    from inference_lab.model.transformer import Transformer

    return Transformer(ModelConfig.preset(preset), rngs=nnx.Rngs(0), kernels=kernels)
