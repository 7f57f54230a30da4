"""Notebook 06, on your machine: the probe, its JSON, and the classroom overlay."""

from __future__ import annotations

from inference_lab import plots, probe
from inference_lab.lessons.machine import Machine
from inference_lab.records import machine_key, machine_label


def probe_filename(here: Machine, name: str | None = None) -> str:
    """This machine's probe file name: its name (or processor), its id, the preset and the
    kernels; two laptops never share one."""
    return probe.filename(probe.machine(name), here.config.name, here.kernels)


def run_probe(here: Machine, folder, *, new_tokens: int = 16, name: str | None = None) -> dict:
    """``python -m inference_lab probe`` for the lesson preset: prints the table and writes
    the JSON into ``folder`` (named after this machine) for the classroom overlay.

    The file is written after every measured point, whole or not at all: interrupting the
    cell keeps what was measured (marked ``"complete": false``) and says so."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flags = ["--preset", here.config.name, "--prompt-len", str(here.sizes.prompt_len),
             "--batch", ",".join(str(b) for b in here.sizes.probe_batches), "--new-tokens", str(new_tokens),
             "--json", str(folder), "--force"]  # the name is this machine's own: re-running replaces it
    args = probe.build_parser().parse_args(flags + (["--name", name] if name else []))
    path = probe.output_path(args)
    kept = {}

    def save(r):
        kept["r"] = r
        probe.write(path, r)

    try:
        report = probe.run(args, save=save)
    except KeyboardInterrupt:
        if "r" in kept:
            print(f"interrupted: the {1 + len(kept['r']['decode'])} point(s) measured so far are in {path}")
        raise
    print(probe.format_table(report))
    print(f"wrote {path}")
    return report


def _machines(records) -> dict:
    """machine key -> its label, in first-seen order."""
    seen = {}
    for r in records:
        seen.setdefault(machine_key(r), machine_label(r))
    return seen


def skipped_lines(records) -> list[str]:
    """One line per file ``measure.load_records`` left out: its name and why."""
    return [f"skipped {getattr(path, 'name', path)}: {reason}" for path, reason in getattr(records, "skipped", [])]


def classroom_summary(records) -> str:
    """What the overlay shows: how many records from how many machines (told apart by their
    ids, not their device names), then every file that was skipped and why."""
    machines = _machines(records)
    lines = [f"{len(records)} records from {len(machines)} machine(s): {', '.join(machines.values()) or '-'}"]
    return "\n".join(lines + skipped_lines(records))


def classroom_view(records, batch: int):
    fig = plots.classroom_plot(records)
    right = fig.axes[1]
    right.axvline(batch, color="black", lw=1, ls=":")
    dec = [r for r in records if r.phase == "decode" and r.batch == batch]
    best = max(dec, key=lambda r: r.decode_tokens_per_s) if dec else None
    text = (f"batch size {batch}: {len(_machines(dec))} machine(s); fastest decode {machine_label(best)} at "
            f"{best.decode_tokens_per_s:,.0f} tok/s" if best else f"batch size {batch}: no machine measured it")
    skipped = getattr(records, "skipped", [])
    if skipped:  # the reasons are in classroom_summary(records)
        names = [str(getattr(p, "name", p)) for p, _ in skipped]
        text += f"; {len(names)} file(s) skipped: {', '.join(names[:5])}" + (", ..." if len(names) > 5 else "")
    return fig, text
