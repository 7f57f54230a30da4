"""The Triton tier: the readable Triton-style Pallas kernels (Ampere and newer, and under the
interpreter anywhere): ``matmul``, ``flash_attention``, ``decode_attention``, the online-softmax
update the two attention kernels share, and the plumbing all three use (``common``)."""
