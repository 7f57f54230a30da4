"""Notebook 06, on your machine: the probe, its JSON, and the classroom overlay."""

from __future__ import annotations

import re

from inference_lab import plots
from inference_lab.lessons.machine import Machine


def probe_filename(here: Machine) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", here.device).strip("-").lower() or "device"
    return f"probe-{slug}-{here.config.name}-{here.kernels}.json"


def run_probe(here: Machine, folder, *, new_tokens: int = 16) -> dict:
    """``python -m inference_lab probe`` for the lesson preset: prints the table and writes
    the JSON into ``folder`` (named after this machine) for the classroom overlay."""
    import json
    from pathlib import Path

    from inference_lab import probe

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / probe_filename(here)
    args = probe.build_parser().parse_args([
        "--preset", here.config.name, "--prompt-len", str(here.sizes.prompt_len),
        "--batch", ",".join(str(b) for b in here.sizes.probe_batches), "--new-tokens", str(new_tokens),
        "--json", str(path)])
    report = probe.run(args)
    print(probe.format_table(report))
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return report


def classroom_view(records, batch: int):
    fig = plots.classroom_plot(records)
    right = fig.axes[1]
    right.axvline(batch, color="black", lw=1, ls=":")
    dec = [r for r in records if r.phase == "decode" and r.batch == batch]
    best = max(dec, key=lambda r: r.decode_tokens_per_s) if dec else None
    text = (f"batch size {batch}: {len({r.device for r in dec})} machine(s); fastest decode {best.device} at "
            f"{best.decode_tokens_per_s:,.0f} tok/s" if best else f"batch size {batch}: no machine measured it")
    return fig, text
