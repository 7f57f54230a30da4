"""The runtime layer: running the model. Prefill, decode and generate (``engine``), one answer
token by token (``streaming``), and reading the compiled programs (``hlo``)."""
