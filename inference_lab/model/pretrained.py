"""The trained model the lab ships: a small byte-level model that writes Shakespeare-like text.

    from inference_lab import generate
    from inference_lab.model import pretrained
    model = pretrained.load()                      # kernels="auto", as Transformer
    print(generate(model, "ROMEO:", 200))

The weights live in the package (``inference_lab/weights/shakespeare.safetensors``, shape:
the ``shakespeare`` preset); nothing is ever downloaded. ``weights/README.md`` says how they
were trained (:mod:`inference_lab.train`), on what, and how well. The random-weight presets
remain the lab's speed measurements' models: how long a matmul takes does not depend on the
values in it. This one is for seeing the same prefill/decode machinery produce real text.

:func:`load` goes through :meth:`Transformer.load`, which checks the file before building the
model (:mod:`inference_lab.model.weights`): every tensor the config needs must be there with the right
shape and dtype, and nothing else, so a wrong or damaged file fails with a message naming the
tensor rather than deep inside a forward pass.
"""

from __future__ import annotations

from pathlib import Path

from inference_lab.base.config import ModelConfig

PRESET = "shakespeare"
WEIGHTS_PATH = Path(__file__).resolve().parents[1] / "weights" / "shakespeare.safetensors"

def load(kernels: str = "auto", path=None):
    """The trained model as a :class:`~inference_lab.model.transformer.Transformer` (``kernels`` as there).

    ``path=None`` loads the weights shipped in the package; another path loads any file
    written by ``Transformer.save`` or ``python -m inference_lab train``. Never downloads.
    """
    from inference_lab.model.transformer import Transformer

    shipped = path is None
    path = WEIGHTS_PATH if shipped else Path(path)
    if shipped and not path.is_file():
        raise ValueError(
            f"the shipped weights {str(path)!r} are missing: this copy of inference_lab was installed "
            "without its package data, or the file was deleted. Reinstall the package, or train them "
            "again with the command in inference_lab/weights/README.md (nothing is downloaded)")
    model = Transformer.load(path, kernels=kernels)   # every tensor checked against the file's config
    if shipped and model.cfg != ModelConfig.preset(PRESET):
        raise ValueError(f"the shipped weights {str(path)!r} were trained for {model.cfg}, but the "
                         f"{PRESET!r} preset is now {ModelConfig.preset(PRESET)}; make them agree")
    return model
