"""The analytic layer: predictions from shapes and ceilings, never a run of the model. The
FLOPs and bytes of each phase (``costs``), the roofline (``roofline``), seeded request traffic
(``workload``), serving-iteration times (``phases``), the serving simulator (``simulator``), its
metrics (``serving_metrics``) and token prices (``economics``). Nothing here imports jax."""
