"""The classroom overlay: many machines' probe results on one chart."""

from __future__ import annotations

from matplotlib.figure import Figure

from inference_lab.plots.style import (
    DEVICE_MARKERS, describe, new_figure, log_axes, length_ticks, batch_ticks, si_ticks, is_decode,
    is_prefill, median_by, as_records, palette, plain_text)
from inference_lab.measure.records import machine_key, machine_label


def classroom_plot(records, *, title: str | None = None) -> Figure:
    """Several machines' records overlaid, each with its own colour, marker and line style
    (markers cycle every eleven and line styles every four, so no two of the first 44 share all
    three, and none differ by colour alone).

    ``records``: a list of records, grouped by machine: by their ids
    (:func:`inference_lab.measure.records.machine_key`), not by device name, so thirty laptops that all
    report ``cpu`` are thirty lines, each labelled with its name or processor and id; or a dict
    ``{label: records}``, one series per label (e.g. one per probe file). Labels are drawn as
    plain text (a ``$`` in a name is just a ``$``).

    Left: prefill tokens/s against prompt length. Right: decode tokens/s against batch size.
    The gap between the panels is each machine's prefill/decode asymmetry.
    """
    if isinstance(records, dict):
        groups = {str(k): as_records(v) for k, v in records.items()}
    else:
        flat = as_records(records)
        by_key, labels = {}, {}
        for r in flat:
            by_key.setdefault(machine_key(r), []).append(r)
            labels.setdefault(machine_key(r), machine_label(r))
        groups = {labels[k]: by_key[k] for k in sorted(by_key, key=lambda k: (labels[k], str(k)))}
    recs = [r for g in groups.values() for r in g]
    if not recs:
        raise ValueError("classroom_plot needs records: measure.load_records(folder) of the class's probe files")
    names = list(groups)
    fig, (left, right) = new_figure(2, width=11.0, height=4.6)
    cmap = palette(len(names))
    for i, name in enumerate(names):
        color, marker = cmap[i], DEVICE_MARKERS[i % len(DEVICE_MARKERS)]
        ls = ("-", "--", ":", "-.")[i % 4]
        mine = groups[name]
        pre = [r for r in mine if is_prefill(r)]
        dec = [r for r in mine if is_decode(r)]
        if pre:
            T, tps = median_by((int(r.prompt_len), r.prefill_tokens_per_s) for r in pre)
            left.plot(T, tps, ls, color=color, marker=marker, ms=7, mec="white", label=plain_text(name))
        if dec:
            b, tps = median_by((int(r.batch), r.decode_tokens_per_s) for r in dec)
            right.plot(b, tps, ls, color=color, marker=marker, ms=7, mec="white", label=plain_text(name))
    for ax in (left, right):
        log_axes(ax)
        si_ticks(ax, "y")
    length_ticks(left, [int(r.prompt_len) for r in recs if is_prefill(r)])
    batch_ticks(right, [int(r.batch) for r in recs if is_decode(r)] or [1])
    left.set_xlabel("prompt length (tokens)")
    left.set_ylabel("prefill throughput (tokens/s)")
    left.set_title("Prefill (reading)")
    right.set_xlabel("batch size (sequences)")
    right.set_ylabel("decode throughput (tokens/s, whole batch)")
    right.set_title("Decode (writing)")
    handles, legend_labels = left.get_legend_handles_labels()
    if not handles:
        handles, legend_labels = right.get_legend_handles_labels()
    kind = "runs" if isinstance(records, dict) else "machines"
    fig.legend(handles, legend_labels, loc="outside right upper", fontsize=8, frameon=False, title=kind[:-1])
    fig.suptitle(plain_text(title) if title else f"The class's {kind} ({len(names)})")
    return describe(fig, f"Two log-log panels with one line and marker per {kind[:-1]} ({len(names)}: "
                          f"{', '.join(names)}): prefill tokens/s against prompt length, and decode "
                          "tokens/s against batch size.")
