"""Notebook 06, on your machine: the probe, its JSON, the overlay of every probe file measured
(the project's own, kept in ``docs/measurements/``, and the classroom's), and each machine's
prefill/decode ratio against the one its ceilings allow."""

from __future__ import annotations

from pathlib import Path

from inference_lab import plots
from inference_lab.analytic import roofline
from inference_lab.measure.records import load_records, machine_key, machine_label
from inference_lab.lessons import claims, one_model_two_speeds as two_speeds
from inference_lab.lessons.machine import Machine

MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "measurements"


def probe_filename(here: Machine, name: str | None = None) -> str:
    """This machine's probe file name: its name (or processor), its id, the preset and the
    kernels; two laptops never share one."""
    from inference_lab.measure import probe_args

    return probe_args.filename(probe_args.machine(name), here.config.name, here.kernels)


def run_probe(here: Machine, folder, *, new_tokens: int = 8, repeats: int | None = 3,
              name: str | None = None) -> dict:
    """``python -m inference_lab probe`` for the lesson preset: prints the table and writes
    the JSON into ``folder`` (named after this machine) for the classroom overlay.

    The file is written after every measured point, whole or not at all: interrupting the
    cell keeps what was measured (marked ``"complete": false``) and says so."""
    from inference_lab.measure import probe, probe_args

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flags = ["--preset", here.config.name, "--prompt-len", str(here.sizes.prompt_len),
             "--batch", ",".join(str(b) for b in here.sizes.probe_batches), "--new-tokens", str(new_tokens),
             "--json", str(folder), "--force"]  # the name is this machine's own: re-running replaces it
    flags += (["--repeats", str(repeats)] if repeats is not None else []) + (["--name", name] if name else [])
    args = probe_args.build_parser().parse_args(flags)
    probe_args.check_args(args)
    path = probe_args.output_path(args)
    try:
        report = probe.run(args, path=path)
    except KeyboardInterrupt as err:
        kept = getattr(err, "probe_result", None)
        if kept is not None:
            print(f"interrupted: the {1 + len(kept['decode'])} point(s) measured so far are in {path}")
        raise
    print(probe.format_table(report))
    print(f"wrote {path}")
    return report


def split(records):
    """(the batch-1 prefill record, the decode records by batch) of one machine's records."""
    pre = [r for r in records if r.phase == "prefill"]
    dec = {r.batch: r for r in records if r.phase == "decode"}
    if not pre or 1 not in dec:
        raise ValueError("a machine's records need a prefill and a batch-1 decode (a probe file has both)")
    return pre[0], dec


class Runs(dict):
    """``{label: records}``, one entry per probe or records file; ``.skipped`` holds
    ``(path, reason)`` for every file (or folder) that could not be read (never fatal for the
    others), ``.partial`` the labels of runs that did not finish, ``.folder`` each label's folder
    name."""

    skipped: list
    partial: list
    folder: dict


MAX_OVERLAY = 60   # runs drawn at once: past this the chart is unreadable and slow (the rest are listed)
MAX_FILES = 1000   # files read per folder (each is checked against the schema: ~3 ms apiece on a laptop)


def load_measured(*folders) -> Runs:
    """Every probe or records file in ``folders`` (``load_records``' rules: ``.json`` or
    ``.csv`` in any case, hidden files left out), one entry per machine in each file (a probe
    file is one run of one machine; a records file a class aggregated holds several machines:
    each is its own run), labelled by the machine's name or processor and id and the folder (and
    the file, where one machine has two files there). A damaged or foreign file goes to
    ``.skipped`` with its reason, and so do a folder that does not exist or cannot be listed and
    an entry that is itself a folder (``loop.json -> .``: a link back to the class's folder would
    read every machine again as one run); a file given instead of a folder is read as one run; a
    run that did not finish is labelled "(partial)"."""
    out = Runs()
    out.skipped, out.partial, out.folder = [], [], {}
    for folder in folders:
        folder = Path(folder)
        if folder.is_file():
            paths = [folder]
        elif folder.is_dir():
            try:
                paths = [p for p in sorted(folder.iterdir()) if p.suffix.lower() in (".json", ".csv")
                         and not p.name.startswith(".")]
            except OSError as err:
                out.skipped.append((folder, f"cannot be listed ({err.strerror or err}); check its permissions"))
                continue
            if len(paths) > MAX_FILES:
                out.skipped.append((folder, f"holds {len(paths):,} files; the overlay read the first {MAX_FILES:,} "
                                            "(split the class into folders to see the rest)"))
                paths = paths[:MAX_FILES]
        else:
            out.skipped.append((folder, "the folder does not exist (a typo in its name?)"))
            continue
        for path in paths:
            if path.is_dir():   # listed by its name: a folder called x.json, or a link to a folder
                out.skipped.append((path, "is a folder (or a link to one), not a probe or records file"))
                continue
            try:
                records = load_records(path)
            except ValueError as err:
                reason = str(err)  # the message starts with the path; the file name is shown beside it
                out.skipped.append((path, reason.removeprefix(str(path)).lstrip(": ")))
                continue
            by_machine: dict = {}
            for r in records:
                by_machine.setdefault(machine_key(r), []).append(r)
            where = path.parent.name   # the folder says whose file it is; the file name only where a
            for own in by_machine.values():   # machine ran twice
                who = f"{machine_label(own[0])} [{own[0].preset}]"   # the model: tiny is not small
                label, again = f"{who} ({where})", 2
                if label in out:
                    label = f"{who} ({where}/{path.stem})"
                while label in out:   # two machines with one label in one file: never one over the other
                    label, again = f"{who} ({where}/{path.stem}, {again})", again + 1
                if records.partial:
                    label += " (partial)"
                    out.partial.append(label)
                out[label] = own
                out.folder[label] = where
    return out


def classroom_summary(runs) -> str:
    """What the overlay shows: how many runs (or records) from how many machines, told apart by
    their ids, not their device names; then every file that was skipped and why.

    ``runs``: :func:`load_measured`'s ``{label: records}``, or ``load_records(folder)``'s
    flat list."""
    if isinstance(runs, dict):
        machines = {machine_key(recs[0]) for recs in runs.values() if recs}
        head = f"{len(runs)} run(s) from {len(machines)} machine(s)"
        if len(runs) > MAX_OVERLAY:
            head += f"; the chart draws the first {MAX_OVERLAY}"
    else:
        head = f"{len(runs)} records from {len({machine_key(r) for r in runs})} machine(s)"
    lines = [head]
    presets = sorted({recs[0].preset for recs in runs.values() if recs}) if isinstance(runs, dict) else []
    if len(presets) > 1:
        lines.append(f"the runs measured {len(presets)} models ({', '.join(presets)}): tokens/s compare only "
                     "between runs of one model; the ratio table (each machine against what its own ceilings "
                     "allow) compares across them")
    lines += [f"partial run (did not finish; drawn for what it measured): {label}"
              for label in getattr(runs, "partial", [])]
    return "\n".join(lines + [f"skipped {getattr(p, 'name', p)}: {why}" for p, why in getattr(runs, "skipped", [])])


def _count(n: int, one: str, many: str) -> str:
    return f"{'one' if n == 1 else n} {one if n == 1 else many}"


def overlay_line(runs: dict) -> str:
    """What the overlay of ``runs`` (:func:`load_measured`'s) can show, worded from what was
    loaded: one machine measured several times shows only its run-to-run spread; several machines
    show one line per run, apart by their ceilings. Says which folders the runs came from and
    whether any ran on a GPU, so the notebook's prose never has to guess either."""
    folder = getattr(runs, "folder", None) or {}
    runs = {label: recs for label, recs in runs.items() if recs}
    if not runs:
        return "the folders hold no run yet: the overlay is empty"
    by_machine: dict = {}
    for label, recs in runs.items():
        by_machine.setdefault(machine_key(recs[0]), []).append(label)
    n_runs, n_machines = len(runs), len(by_machine)
    folders = sorted({folder[label] for label in runs if label in folder})
    source = f" (from {' and '.join(folders)})" if folders else ""
    gpus = sum(1 for labels in by_machine.values() if str(runs[labels[0]][0].device).lower() != "cpu")
    if n_machines == 1:
        what = "a GPU" if gpus else "no GPU"
        return (f"one machine{source}, {what}: "
                + ("a single run, so the overlay has nothing to compare it with yet" if n_runs == 1 else
                   f"measured {n_runs} times, so the gaps between its {n_runs} lines are this machine's "
                   "run-to-run spread, not a difference between machines"))
    device = ("no GPU among them" if gpus == 0 else "all of them GPUs" if gpus == n_machines else
              f"{gpus} of them GPUs")
    again = sum(1 for labels in by_machine.values() if len(labels) > 1)
    spread = (f"; {_count(again, 'machine was', 'machines were')} measured more than once, and the lines of one "
              "machine (one #id) differ by its run-to-run spread" if again else "")
    return (f"{n_machines} machines{source}, {device}, {n_runs} runs: one line per run, and lines of different "
            f"machines sit apart by their ceilings{spread}")


def classroom(folder="classroom") -> Runs:
    """The instructor's one call: every probe file in ``folder`` beside the project's own
    (``docs/measurements/``), loaded one run per file; prints what was read (and what was skipped,
    and why) and what the overlay can show (:func:`overlay_line`); returns the runs for
    :func:`plots.classroom_plot`, :func:`classroom_view` and ``ratio_table(ratio_points(runs))``."""
    runs = load_measured(MEASUREMENTS, folder)
    print(classroom_summary(runs))
    print(f"what the overlay shows: {overlay_line(runs)}")
    return runs


def knee_line(records) -> str:
    """This machine's measured knee, the course's word for it: the first decode batch whose step
    takes at least 1.5x the batch-1 step (:func:`roofline.measured_knee`), with the two times."""
    _, dec = split(records)
    knee = roofline.measured_knee(dec.values())
    one = dec[1].step_seconds
    if knee is None:
        top = max(dec)
        return (f"knee (the first batch whose decode step takes >= 1.5x batch 1's): beyond this probe's batches "
                f"(its largest, {top}, took x{dec[top].step_seconds / one:.2f} batch 1's {1e3 * one:.2f} ms step)")
    return (f"knee (the first batch whose decode step takes >= 1.5x batch 1's): batch {knee} "
            f"({1e3 * dec[knee].step_seconds:.2f} ms against {1e3 * one:.2f} ms, x{dec[knee].step_seconds / one:.2f})")


def ceilings_of(records) -> tuple[float, float]:
    """(matmul FLOP/s, bandwidth) the machine measured, recovered from its records: MFU is
    FLOPs / time / peak and MBU bytes / time / bandwidth, so each record carries its ceiling."""
    pre, dec = split(records)
    d1 = dec[1]
    if not (pre.flops and pre.mfu and d1.bytes_per_step and d1.mbu):
        raise ValueError("its records carry no MFU/MBU (or no FLOPs and bytes: a preset this lab does not "
                         "know?), so no ceilings to compare with")
    return pre.flops / pre.seconds / pre.mfu, d1.bytes_per_step / d1.step_seconds / d1.mbu


def predicted_batch_gain(records) -> tuple[int, float]:
    """(the largest decode batch in a machine's records, the throughput gain over batch 1 predicted
    for it from the file alone, without looking at that batch's own time).

    The prediction starts from the batch-1 step the file measured: the batch-``B`` step moves
    ``bytes_B / bytes_1`` times the bytes at the rate batch 1 moved them, and does its extra FLOPs
    at the matmul peak the file was measured against, the two not overlapping (the cautious form of
    the roofline, which takes their maximum: on a 2-core CPU a matrix-matrix kernel streams its
    weight more slowly than the matrix-vector one, notebook 05). Gain = ``B * t_1 / t_B``."""
    pre, dec = split(records)
    peak, _ = ceilings_of(records)
    one, top = dec[1], dec[max(dec)]
    if not (top.bytes_per_step and top.flops_per_step is not None and one.flops_per_step is not None):
        raise ValueError("its largest batch carries no bytes or FLOPs per step: nothing to predict from")
    t_top = one.step_seconds * top.bytes_per_step / one.bytes_per_step + (top.flops_per_step - one.flops_per_step) / peak
    return top.batch, claims.predicted_batch_gain(top.batch, one.step_seconds, t_top)


class Points(list):
    """:func:`ratio_points`' dicts; ``.left_out`` holds ``(label, reason)`` for every run that
    cannot be placed (no batch-1 prefill and decode, or no ceilings to measure them against)."""

    left_out: list


def ratio_points(machines: dict, *, reference: bool = True) -> Points:
    """Per machine: the measured prefill/decode ratio at batch 1 and the ideal one its own
    ceilings allow (``ridge * dtype_bytes / 2``: :class:`two_speeds.Gap`'s ideal without the
    KV and attention terms). With ``reference``, the reference node's quoted figures too. A run
    that cannot be placed is left out (``.left_out``), never fatal for the others."""
    points = Points()
    points.left_out = []
    for label, records in machines.items():
        try:
            pre, dec = split(records)
        except ValueError as err:
            points.left_out.append((label, str(err)))
            continue
        try:
            peak, bw = ceilings_of(records)
        except ValueError as err:
            points.left_out.append((label, str(err)))
            continue
        b = 2 if pre.dtype in ("bfloat16", "float16") else 4
        points.append({"label": label, "ideal": peak / bw * b / 2,
                       "measured": pre.prefill_tokens_per_s / dec[1].decode_tokens_per_s})
    if reference:
        ref = two_speeds.reference_gap()
        points.append({"label": f"{two_speeds.REFERENCE_NODE['name']} (quoted, reading A, assumed shape)",
                       "ideal": ref.ideal, "measured": ref.measured, "quoted": True})
    return points


def ratio_table(points) -> str:
    width = max(len(p["label"]) for p in points) + 2
    lines = [f"{'machine':<{width}}{'ceilings allow':>15}{'measured':>10}{'measured/allowed':>18}"]
    for p in points:
        lines.append(f"{p['label']:<{width}}{p['ideal']:>14,.1f}x{p['measured']:>9,.1f}x{p['measured'] / p['ideal']:>18.2f}")
    return "\n".join(lines + [f"left out {label}: {why}" for label, why in getattr(points, "left_out", [])])


def classroom_view(machines: dict, batch: int):
    """The overlay with the chosen batch marked, and a readout. ``machines``: ``{label:
    records}`` (one run per label) or a flat list of records (one line per machine id)."""
    if isinstance(machines, dict) and len(machines) > MAX_OVERLAY:   # a big class: the first ones, and say so
        shown = Runs(list(machines.items())[:MAX_OVERLAY])
        shown.skipped, shown.partial = getattr(machines, "skipped", []), []
        fig, text = classroom_view(shown, batch)
        return fig, text + f" (the chart draws {MAX_OVERLAY} of {len(machines)} runs)"
    fig = plots.classroom_plot(machines)
    fig.axes[1].axvline(batch, color="black", lw=1, ls=":")
    if isinstance(machines, dict):
        kind, dec = "run(s)", [(label, r) for label, recs in machines.items() for r in recs
                               if r.phase == "decode" and r.batch == batch]
    else:
        kind, dec = "machine(s)", [(machine_label(r), r) for r in machines if r.phase == "decode" and r.batch == batch]
    if not dec:
        return fig, f"batch size {batch}: no run measured it"
    label, best = max(dec, key=lambda x: x[1].decode_tokens_per_s)
    count = len(dec) if isinstance(machines, dict) else len({machine_key(r) for _, r in dec})
    text = (f"batch size {batch}: {count} {kind} measured it; fastest decode {best.decode_tokens_per_s:,.0f} "
            f"tok/s ({label})")
    skipped = getattr(machines, "skipped", [])
    if skipped:  # the reasons are in classroom_summary(runs)
        names = [str(getattr(p, "name", p)) for p, _ in skipped]
        text += f"; {len(names)} file(s) skipped: {', '.join(names[:5])}" + (", ..." if len(names) > 5 else "")
    return fig, text


# ----------------------------------------------------------------------------- your own model
OWN_MODEL_DEFAULT = "shakespeare_large"   # measured when the learner names no folder of their own


def own_model_folder(folder=None) -> Path:
    """The Hugging Face folder section 4 measures: ``folder``, the one the learner fetched (README,
    "Your own model"), checked readable; or, with none, the lab's trained ``shakespeare_large``
    written as such a folder once (:func:`inference_lab.model.huggingface.save`, into the lab's
    cache), so the section runs offline and in CI through the same loader a fetched folder takes."""
    from inference_lab.base.disk_cache import cache_dir
    from inference_lab.model import huggingface, pretrained

    if folder is not None:
        huggingface.read_config(folder)   # a one-line error naming the file, before anything runs
        return Path(folder).expanduser()
    path = cache_dir("models") / OWN_MODEL_DEFAULT
    if not (path / "config.json").is_file():   # save writes the whole folder or none of it
        huggingface.save(pretrained.load(preset=OWN_MODEL_DEFAULT), path)
    return path


def own_model_sizes(here: Machine, folder) -> tuple[int, tuple]:
    """(prompt length, decode batches) for the folder's probe: the lesson probe's, the prompt cut
    to what the folder's context holds beside the decode steps (8 here)."""
    from inference_lab.model import huggingface

    cfg = huggingface.read_config(folder)
    return min(here.sizes.prompt_len, cfg.max_seq_len - 8), tuple(here.sizes.probe_batches)


def predicted_own_ratio(folder, lesson_records, prompt_len: int) -> float:
    """The prefill/decode ratio at batch 1 the roofline predicts for the folder's model, from its
    config.json alone and the ceilings the lesson's probe measured here (before its own probe runs)."""
    from inference_lab.base.hardware import HardwareSpec
    from inference_lab.model import huggingface

    cfg = huggingface.read_config(folder)
    peak, bandwidth = ceilings_of(lesson_records)
    spec = HardwareSpec(name="here", flops={roofline.flop_dtype(cfg): peak}, bandwidth=bandwidth)
    return (roofline.predicted_prefill_tokens_per_s(cfg, spec, 1, prompt_len)
            / roofline.predicted_decode_tokens_per_s(cfg, spec, 1, prompt_len))


def run_own_probe(here: Machine, folder, results, *, new_tokens: int = 8, repeats: int | None = 3) -> Path:
    """``python -m inference_lab probe --model FOLDER`` at the lesson probe's sizes
    (:func:`own_model_sizes`), its file in ``results`` (kept apart from the classroom's overlay);
    returns the file's path."""
    from inference_lab.measure import probe, probe_args

    prompt_len, batches = own_model_sizes(here, folder)
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    flags = ["--model", str(folder), "--prompt-len", str(prompt_len), "--batch", ",".join(map(str, batches)),
             "--new-tokens", str(new_tokens), "--json", str(results), "--force"]
    flags += ["--repeats", str(repeats)] if repeats is not None else []
    args = probe_args.build_parser().parse_args(flags)
    probe_args.check_args(args)
    path = probe_args.output_path(args)
    print(probe.format_table(probe.run(args, path=path)))
    return path


def own_model_table(lesson_records, own_records) -> str:
    """The lesson's model and the learner's side by side: size, the batch-1 ratio (allowed by the
    ceilings and measured), the knee, batch 1's MBU and the prefill's MFU."""
    rows = []
    for recs in (lesson_records, own_records):
        pre, dec = split(recs)
        peak, bandwidth = ceilings_of(recs)
        b = 2 if pre.dtype in ("bfloat16", "float16") else 4
        knee = roofline.measured_knee(dec.values())
        rows.append((pre.preset, f"{dec[1].bytes_per_step / 1e6:,.0f} MB", f"{peak / bandwidth * b / 2:,.1f}x",
                     f"{pre.prefill_tokens_per_s / dec[1].decode_tokens_per_s:,.1f}x",
                     f"batch {knee}" if knee else f"> {max(dec)}", f"{dec[1].mbu:.0%}", f"{pre.mfu:.0%}"))
    head = ("model", "step bytes", "allowed", "measured", "knee", "MBU (b=1)", "MFU (prefill)")
    widths = [max(len(str(r[i])) for r in (head, *rows)) + 2 for i in range(len(head))]
    return "\n".join("".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in (head, *rows))


def own_model_readout(lesson_records, own_records) -> str:
    """Why the two ratios differ, in this run's numbers: measured = allowed x MFU / MBU, so the
    model that reads its weights nearer the ceiling (MBU) writes nearer what the ceilings allow."""
    parts = []
    for recs in (own_records, lesson_records):
        pre, dec = split(recs)
        parts.append((pre.preset, pre.prefill_tokens_per_s / dec[1].decode_tokens_per_s, pre.mfu, dec[1].mbu))
    (own, r_own, f_own, b_own), (base, r_base, f_base, b_base) = parts
    nearer = own if b_own > b_base else base
    return (f"{own}: {r_own:.1f}x against {base}'s {r_base:.1f}x. MFU / MBU: {f_own:.0%} / {b_own:.0%} = "
            f"{f_own / b_own:.2f} against {f_base:.0%} / {b_base:.0%} = {f_base / b_base:.2f}; {nearer} reads its "
            f"weights nearer the bandwidth ceiling at batch 1, so its decode is nearer what the ceilings allow.")

