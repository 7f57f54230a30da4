"""The classroom overlay: many machines' probe results on one chart."""

from __future__ import annotations

from typing import Iterable

from matplotlib.figure import Figure

from inference_lab.plots._style import (
    DEVICE_MARKERS, _figure, _style_log, _length_ticks, _base2_batches, _si_ticks, _is_decode,
    _is_prefill, _median_by, _records, _palette)


def classroom_plot(records: Iterable, *, title: str | None = None) -> Figure:
    """Several machines' records overlaid, one colour and marker per ``device``.

    ``records``: a list of records (grouped by their ``device``), or a dict ``{label:
    records}`` (one series per label, e.g. one per probe file: two runs on machines that
    both call themselves "cpu" stay two series).

    Left: prefill tokens/s against prompt length. Right: decode tokens/s against batch size.
    The gap between the panels is each machine's prefill/decode asymmetry.
    """
    if isinstance(records, dict):
        groups = {str(k): _records(v) for k, v in records.items()}
    else:
        flat = _records(records)
        groups = {}
        for r in flat:
            groups.setdefault(str(getattr(r, "device", "?")), []).append(r)
        groups = dict(sorted(groups.items()))
    recs = [r for g in groups.values() for r in g]
    if not recs:
        raise ValueError("classroom_plot needs records: measure.load_records(folder) of the class's probe files")
    devices = list(groups)
    fig, (left, right) = _figure(2, width=11.0, height=4.6)
    cmap = _palette(len(devices))
    for i, dev in enumerate(devices):
        color, marker = cmap[i], DEVICE_MARKERS[i % len(DEVICE_MARKERS)]
        ls = ("-", "--", ":", "-.")[i % 4]
        mine = groups[dev]
        pre = [r for r in mine if _is_prefill(r)]
        dec = [r for r in mine if _is_decode(r)]
        if pre:
            T, tps = _median_by((int(r.prompt_len), r.prefill_tokens_per_s) for r in pre)
            left.plot(T, tps, ls, color=color, marker=marker, ms=7, mec="white", label=dev)
        if dec:
            b, tps = _median_by((int(r.batch), r.decode_tokens_per_s) for r in dec)
            right.plot(b, tps, ls, color=color, marker=marker, ms=7, mec="white", label=dev)
    for ax in (left, right):
        _style_log(ax)
        _si_ticks(ax, "y")
    _length_ticks(left, [int(r.prompt_len) for r in recs if _is_prefill(r)])
    _base2_batches(right, [int(r.batch) for r in recs if _is_decode(r)] or [1])
    left.set_xlabel("prompt length (tokens)")
    left.set_ylabel("prefill throughput (tokens/s)")
    left.set_title("Prefill (reading)")
    right.set_xlabel("batch size (sequences)")
    right.set_ylabel("decode throughput (tokens/s, whole batch)")
    right.set_title("Decode (writing)")
    handles, labels = left.get_legend_handles_labels()
    if not handles:
        handles, labels = right.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False, title="device")
    fig.suptitle(title or f"The class's machines ({len(devices)} " + ("runs)" if isinstance(records, dict) else "devices)"))
    return fig
