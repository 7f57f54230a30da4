"""Figures for the lessons, split by subject; every public figure function is importable from
``inference_lab.plots``.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (so nothing
is shown twice in a notebook and nothing needs a display: works under Agg), sized for a
notebook cell; ``fig.savefig("x.png")`` writes the PNG. Records are read by attribute
(:class:`inference_lab.records.PrefillRecord`/``DecodeRecord`` or anything with the same
fields), so plots never depend on where records came from.

- :mod:`~inference_lab.plots.ceilings`: the roofline, ridge points, intensity, the kitchen
- :mod:`~inference_lab.plots.phases`: measured prefill and decode
- :mod:`~inference_lab.plots.classroom`: many machines on one chart
- :mod:`~inference_lab.plots.serving`: prices and simulated serving latency
- :mod:`~inference_lab.plots.experiments`: the discriminating experiments and the three regimes
"""

from inference_lab.plots._style import DECODE_COLOR, PREFILL_COLOR, ROOF_COLOR
from inference_lab.plots.classroom import classroom_plot
from inference_lab.plots.phases import (decode_bytes_bars, decode_throughput_plot, decode_time_vs_bytes,
                                        prefill_flops_vs_length, request_timeline, ttft_plot, two_speeds_bars)
from inference_lab.plots.ceilings import (intensity_vs_context, kitchen, ridge_comparison, roofline_plot,
                                          time_split_bars)
from inference_lab.plots.serving import latency_distributions, price_ratio_plot, serving_plot
from inference_lab.plots.experiments import (flops_or_bytes, kernel_vs_model, ratio_vs_ridge, three_regimes,
                                             users_vs_total)

__all__ = ["roofline_plot", "ridge_comparison", "intensity_vs_context", "time_split_bars", "kitchen",
           "request_timeline", "two_speeds_bars", "ttft_plot", "prefill_flops_vs_length", "decode_bytes_bars",
           "decode_time_vs_bytes", "decode_throughput_plot", "classroom_plot", "price_ratio_plot",
           "serving_plot", "latency_distributions", "flops_or_bytes", "kernel_vs_model", "three_regimes",
           "users_vs_total", "ratio_vs_ridge", "PREFILL_COLOR", "DECODE_COLOR", "ROOF_COLOR"]
