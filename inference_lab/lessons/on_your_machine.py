"""Notebook 06, on your machine: the probe, its JSON, the overlay of every probe file measured
(the project's own, kept in ``docs/measurements/``, and the classroom's), and each machine's
prefill/decode ratio against the one its ceilings allow."""

from __future__ import annotations

import re
from pathlib import Path

from inference_lab import measure, plots
from inference_lab.lessons import one_model_two_speeds as two_speeds
from inference_lab.lessons.machine import Machine

MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "measurements"


def probe_filename(here: Machine) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", here.device).strip("-").lower() or "device"
    return f"probe-{slug}-{here.config.name}-{here.kernels}.json"


def run_probe(here: Machine, folder, *, new_tokens: int = 8, repeats: int | None = 3) -> dict:
    """``python -m inference_lab probe`` for the lesson preset: prints the table and writes
    the JSON into ``folder`` (named after this machine) for the classroom overlay."""
    import json

    from inference_lab import probe

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / probe_filename(here)
    argv = ["--preset", here.config.name, "--prompt-len", str(here.sizes.prompt_len),
            "--batch", ",".join(str(b) for b in here.sizes.probe_batches), "--new-tokens", str(new_tokens),
            "--json", str(path)]
    if repeats is not None:
        argv += ["--repeats", str(repeats)]
    report = probe.run(probe.build_parser().parse_args(argv))
    print(probe.format_table(report))
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return report


def split(records):
    """(the batch-1 prefill record, the decode records by batch) of one machine's records."""
    pre = [r for r in records if r.phase == "prefill"]
    dec = {r.batch: r for r in records if r.phase == "decode"}
    if not pre or 1 not in dec:
        raise ValueError("a machine's records need a prefill and a batch-1 decode (a probe file has both)")
    return pre[0], dec


def load_measured(*folders) -> dict:
    """Every probe or records file in ``folders``, one entry per file (a file is one machine's
    run): ``{label: records}``, read with :func:`inference_lab.measure.load_records`."""
    out = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.suffix in (".json", ".csv")):
            records = list(measure.load_records(path))
            if records:
                out[f"{records[0].device} ({path.parent.name}/{path.stem})"] = records
    return out


def ceilings_of(records) -> tuple[float, float]:
    """(matmul FLOP/s, bandwidth) the machine measured, recovered from its records: MFU is
    FLOPs / time / peak and MBU bytes / time / bandwidth, so each record carries its ceiling."""
    pre, dec = split(records)
    d1 = dec[1]
    return pre.flops / pre.seconds / pre.mfu, d1.bytes_per_step / d1.step_seconds / d1.mbu


def ratio_points(machines: dict, *, reference: bool = True) -> list[dict]:
    """Per machine: the measured prefill/decode ratio at batch 1 and the ideal one its own
    ceilings allow (``ridge * dtype_bytes / 2``: :class:`two_speeds.Gap`'s ideal without the
    KV and attention terms). With ``reference``, the reference node's quoted figures too."""
    points = []
    for label, records in machines.items():
        pre, dec = split(records)
        peak, bw = ceilings_of(records)
        b = 2 if pre.dtype in ("bfloat16", "float16") else 4
        points.append({"label": label, "ideal": peak / bw * b / 2,
                       "measured": pre.prefill_tokens_per_s / dec[1].decode_tokens_per_s})
    if reference:
        ref = two_speeds.reference_gap()
        points.append({"label": f"{two_speeds.REFERENCE_NODE['name']} (quoted, assumed shape)",
                       "ideal": ref.ideal, "measured": ref.measured, "quoted": True})
    return points


def ratio_table(points) -> str:
    width = max(len(p["label"]) for p in points) + 2
    lines = [f"{'machine':<{width}}{'ceilings allow':>15}{'measured':>10}{'measured/allowed':>18}"]
    for p in points:
        lines.append(f"{p['label']:<{width}}{p['ideal']:>14,.1f}x{p['measured']:>9,.1f}x{p['measured'] / p['ideal']:>18.2f}")
    return "\n".join(lines)


def classroom_view(machines: dict, batch: int):
    """The overlay of ``{label: records}`` with the chosen batch marked, and a readout."""
    fig = plots.classroom_plot(machines)
    fig.axes[1].axvline(batch, color="black", lw=1, ls=":")
    dec = [(label, r) for label, recs in machines.items() for r in recs if r.phase == "decode" and r.batch == batch]
    if not dec:
        return fig, f"batch size {batch}: no machine measured it"
    label, best = max(dec, key=lambda x: x[1].decode_tokens_per_s)
    return fig, (f"batch size {batch}: {len(dec)} run(s) measured it; fastest decode {best.decode_tokens_per_s:,.0f} "
                 f"tok/s ({label})")
