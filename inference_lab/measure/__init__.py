"""The measurement layer: timing the model on this machine (``timing``), the model's kernels
alone (``kernels``), the records those leave and their files (``records``, ``schema``), the
probe (``probe``, ``probe_args``) and vLLM's benchmark files (``vllm_bench``)."""
