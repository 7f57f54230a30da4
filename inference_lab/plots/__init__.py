"""Figures for the lessons, split by subject; every public figure function is importable from
``inference_lab.plots``.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (so nothing
is shown twice in a notebook and nothing needs a display: works under Agg), sized for a
notebook cell; ``fig.savefig("x.png")`` writes the PNG. Records are read by attribute
(:class:`inference_lab.measure.records.PrefillRecord`/``DecodeRecord`` or anything with the same
fields), so plots never depend on where records came from.

Every figure carries ``fig.alt_text``, a one-line description with its numbers (``alt_text(fig)``
reads it), and uses one colour-blind-safe palette (``OKABE_ITO``) with a marker, line style, fill
or hatching difference between any two of its series (tests/test_plot_accessibility.py).

- :mod:`~inference_lab.plots.ceilings`: the roofline, ridge points, intensity, the kitchen
- :mod:`~inference_lab.plots.phases`: measured prefill and decode
- :mod:`~inference_lab.plots.classroom`: many machines on one chart
- :mod:`~inference_lab.plots.serving`: prices, serving latency and goodput (simulated or a vLLM run), pool sizes,
  a trace's gaps beside the engine's steps
- :mod:`~inference_lab.plots.streaming`: one answer token by token, and what the KV cache saves
- :mod:`~inference_lab.plots.experiments`: the discriminating experiments and the three regimes
- :mod:`~inference_lab.plots.speculation`: speculative decoding's speed-up over k, its verify cost over batch
- :mod:`~inference_lab.plots.quantization`: decode throughput over the batch for each weight format
"""

from inference_lab.plots.style import (DECODE_COLOR, MODE_STYLES, OKABE_ITO, PREFILL_COLOR, ROOF_COLOR,
                                       LabFigure, alt_text)
from inference_lab.plots.classroom import classroom_plot
from inference_lab.plots.phases import (decode_bytes_bars, decode_throughput_plot, decode_time_vs_bytes,
                                        prefill_flops_vs_length, request_timeline, ttft_plot, two_speeds_bars)
from inference_lab.plots.ceilings import (intensity_vs_context, kitchen, ridge_comparison, roofline_plot,
                                          time_split_bars)
from inference_lab.plots.streaming import cache_vs_recompute, token_timeline
from inference_lab.plots.speculation import speedup_over_k, verify_cost_over_batch
from inference_lab.plots.quantization import quantization_plot
from inference_lab.plots.serving import (goodput_plot, kv_memory_plot, latency_distributions, pool_balance_plot,
                                         price_ratio_plot, serving_plot, step_timeline_plot)
from inference_lab.plots.experiments import (flops_or_bytes, kernel_vs_model, ratio_vs_ridge, three_regimes,
                                             users_vs_total)

__all__ = ["roofline_plot", "ridge_comparison", "intensity_vs_context", "time_split_bars", "kitchen",
           "request_timeline", "two_speeds_bars", "ttft_plot", "prefill_flops_vs_length", "decode_bytes_bars",
           "decode_time_vs_bytes", "decode_throughput_plot", "classroom_plot", "price_ratio_plot",
           "serving_plot", "kv_memory_plot", "latency_distributions", "goodput_plot", "pool_balance_plot", "flops_or_bytes",
           "kernel_vs_model", "three_regimes", "users_vs_total", "ratio_vs_ridge", "PREFILL_COLOR",
           "DECODE_COLOR", "ROOF_COLOR", "OKABE_ITO", "MODE_STYLES", "LabFigure", "alt_text", "token_timeline",
           "cache_vs_recompute", "speedup_over_k", "verify_cost_over_batch", "quantization_plot",
           "step_timeline_plot"]
