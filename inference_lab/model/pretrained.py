"""The trained models the lab ships: two byte-level models that write Shakespeare-like text.

    from inference_lab import generate
    from inference_lab.model import pretrained
    model = pretrained.load()                      # kernels="auto", as Transformer
    print(generate(model, "ROMEO:", 200))
    target = pretrained.load(preset="shakespeare_large")   # notebook 08's target; `shakespeare` drafts for it

The weights live in the package (``inference_lab/weights/*.safetensors``, shapes: the presets
of :data:`SHIPPED`); nothing is ever downloaded. ``weights/README.md`` says how each was
trained (:mod:`inference_lab.train`), on what, and how well. The random-weight presets remain
the lab's speed measurements' models: how long a matmul takes does not depend on the values in
it. These are for seeing the same prefill/decode machinery produce real text, and for
speculative decoding, whose speed depends on how often one model guesses another's next byte.

``shakespeare_large`` is stored in bfloat16 (half the bytes in the repository) and loaded as
the float32 its preset computes in: every bf16 value is exactly a float32 one, so nothing is
lost in loading (the README gives its held-out loss as stored).

:func:`load` checks the file before building the model (:mod:`inference_lab.model.weights`):
every tensor the config needs must be there with the right shape and dtype, and nothing else,
so a wrong or damaged file fails with a message naming the tensor rather than deep inside a
forward pass.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from inference_lab.base.config import ModelConfig
from inference_lab.model import weights

PRESET = "shakespeare"
WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
SHIPPED = {"shakespeare": WEIGHTS_DIR / "shakespeare.safetensors",
           "shakespeare_large": WEIGHTS_DIR / "shakespeare_large.safetensors"}
WEIGHTS_PATH = SHIPPED[PRESET]
HELDOUT_PROMPTS = WEIGHTS_DIR / "heldout_prompts.json"


def heldout_prompts() -> list[str]:
    """Eight prompts from the held-out end of the corpus (never trained on): a speech and the
    next speaker's name, so the model is asked for the next speech. ``heldout_prompts.json``
    says where each comes from."""
    import json

    return [p["text"] for p in json.loads(HELDOUT_PROMPTS.read_text())["prompts"]]


HELDOUT_EXCERPT = WEIGHTS_DIR / "heldout_excerpt.txt"


def heldout_text() -> bytes:
    """16 KB from the start of the corpus's held-out end (never trained on), as bytes: what a
    model's held-out loss is measured on without the corpus (``weights/README.md`` says where)."""
    return HELDOUT_EXCERPT.read_bytes()


def load(kernels: str = "auto", path=None, *, preset: str = PRESET):
    """A trained model as a :class:`~inference_lab.model.transformer.Transformer` (``kernels`` as there).

    ``path=None`` loads the weights the package ships for ``preset`` (a key of :data:`SHIPPED`);
    another path loads any file written by ``Transformer.save`` or ``python -m inference_lab
    train``. A file stored in another dtype than its preset computes in is cast to the preset's.
    Never downloads.
    """
    from inference_lab.model.transformer import Transformer

    if preset not in SHIPPED:
        raise ValueError(f"preset={preset!r} has no shipped weights; choose one of {', '.join(SHIPPED)}")
    shipped = path is None
    path = SHIPPED[preset] if shipped else Path(path)
    if shipped and not path.is_file():
        raise ValueError(
            f"the shipped weights {str(path)!r} are missing: this copy of inference_lab was installed "
            "without its package data, or the file was deleted. Reinstall the package, or train them "
            "again with the command in inference_lab/weights/README.md (nothing is downloaded)")
    if not shipped:
        return Transformer.load(path, kernels=kernels)   # every tensor checked against the file's config
    cfg, params = weights.read(path)                    # checked against the file's config
    want = ModelConfig.preset(preset)
    if dataclasses.replace(cfg, dtype=want.dtype) != want:
        raise ValueError(f"the shipped weights {str(path)!r} were trained for {cfg}, but the "
                         f"{preset!r} preset is now {want}; make them agree")
    if cfg.dtype != want.dtype:
        params = weights.astype(params, want.dtype)
    return Transformer(want, kernels=kernels, params=params)
