"""The model layer: the transformer (``transformer``), its KV cache (``kv_cache``), the
tensor-parallel split (``parallel``), the safetensors file (``weights``) and the trained model
the lab ships (``pretrained``)."""
