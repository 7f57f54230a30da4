"""The base layer: what every other layer stands on. Model shapes (``config``), the byte-level
``tokenizer``, chips and their ceilings (``hardware``), the lab's cache folder and machine id
(``disk_cache``), progress bars (``progress``) and the argument checks every public entry point
runs (``checks``). Nothing here imports jax at import time."""
