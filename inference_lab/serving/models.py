"""Which model a server serves: the trained Shakespeare models by preset name, a file written
by ``Transformer.save`` or ``python -m inference_lab train``, a Hugging Face model folder
(``--model``: :mod:`inference_lab.model.huggingface`, its tokenizer :mod:`inference_lab.base.folder_tokenizer`),
or any other preset with seeded random weights (its text is noise; its tokens/s are what a model
of that size gives)."""

from __future__ import annotations

from inference_lab.base.config import PRESETS, ModelConfig

DEFAULT_PRESET = "shakespeare_large"


def load_model(preset: str = DEFAULT_PRESET, weights=None, kernels: str = "auto", quantization: str = "none",
               group_size: int | None = None, *, folder=None, max_model_len: int | None = None):
    """The model to serve (a :class:`~inference_lab.model.transformer.Transformer`): ``folder``'s
    (a Hugging Face folder, ``max_model_len`` positions) when given, else ``weights``' or
    ``preset``'s; its weights quantized when ``quantization`` is "int8" or "int4"
    (:mod:`inference_lab.model.quantize`; a file that is already quantized is served as it is, with
    ``quantization="none"``). Never downloads."""
    if folder is not None:
        from inference_lab.model import huggingface

        model = huggingface.load(folder, max_model_len=max_model_len, kernels=kernels)
    else:
        model = _float_or_stored_model(preset, weights, kernels)
    if quantization == "none":
        return model
    if model.cfg.quantization != "none":
        raise ValueError(f"the weights file is already {model.cfg.quantization}; serve it with --quantization none")
    return model.quantized(quantization, group_size)


def _float_or_stored_model(preset, weights, kernels):
    from inference_lab.model import pretrained   # (here: the server reads its flags before jax loads)

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
