"""The runtime layer: running the model. Prefill, decode, verify and generate, and the samplers
(``generation``), speculative decoding (``speculative``), one answer token by token
(``streaming``), and reading the compiled programs (``hlo``)."""
