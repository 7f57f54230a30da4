"""Measurement records and their files: what a sweep or a probe leaves behind.

:class:`PrefillRecord` and :class:`DecodeRecord` are flat dataclasses (the probe schema's
entries plus the machine fields), so they save as one JSON object or CSV row each and plot
the same way wherever they came from: this machine's sweep, or a classroom's probe files.

Every record says which machine measured it (``machine_id``, the random id of
:func:`inference_lab.base.disk_cache.machine_id`; ``machine_name``, chosen by the learner;
``processor``): :func:`machine_key` tells machines apart and :func:`machine_label` names them,
so thirty CPUs that all report the device ``cpu`` stay thirty machines.

Files are written whole or not at all (:func:`save_records` replaces the old file in one
rename) and read defensively (:func:`load_records` skips a damaged file with its reason
instead of failing the whole folder; :mod:`inference_lab.measure.schema` says what is valid).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

from inference_lab.analytic import costs
from inference_lab.base.config import ModelConfig
from inference_lab.base.hardware import HardwareSpec, dtype_key
from inference_lab.measure import schema
from pallas_kernels.files import atomic_write, atomic_write_text


@dataclasses.dataclass
class PrefillRecord:
    """One prefill measurement: ``batch`` prompts of ``prompt_len`` tokens in one pass."""

    device: str
    backend: str
    kernels: str
    preset: str
    dtype: str
    batch: int
    prompt_len: int
    seconds: float                 # median time of the pass
    prefill_tokens_per_s: float    # batch * prompt_len / seconds
    flops: float | None            # costs.prefill_cost(...).flops (per device under tp)
    bytes: float | None            # costs.prefill_cost(...).bytes
    mfu: float | None              # flops / seconds / measured matmul peak
    phase: str = "prefill"
    repeats: int = 0
    spread: float | None = None    # upper over lower quartile of the repeats (1.0: all alike; None: unknown)
    machine_id: str | None = None    # the measuring machine (None: unknown, e.g. an old file)
    machine_name: str | None = None
    processor: str | None = None


@dataclasses.dataclass
class DecodeRecord:
    """One decode measurement: ``batch`` rows, each starting with ``context`` cached tokens."""

    device: str
    backend: str
    kernels: str
    preset: str
    dtype: str
    batch: int
    context: int
    step_seconds: float            # median loop time / steps
    decode_tokens_per_s: float     # batch / step_seconds (every row counts)
    bytes_per_step: float | None   # costs.decode_cost bytes, averaged over the steps (per device under tp)
    flops_per_step: float | None
    mbu: float | None              # bytes_per_step / step_seconds / measured bandwidth
    mfu: float | None
    phase: str = "decode"
    steps: int = 0
    repeats: int = 0
    spread: float | None = None    # upper over lower quartile of the repeats (1.0: all alike; None: unknown)
    machine_id: str | None = None
    machine_name: str | None = None
    processor: str | None = None


RECORD_TYPES = {"prefill": PrefillRecord, "decode": DecodeRecord}
IDENTITY_FIELDS = ("device", "backend", "kernels", "preset", "dtype", "machine_id", "machine_name", "processor")


# ----------------------------------------------------------------------------- building records
def prefill_record(identity: dict, cfg, *, batch: int, prompt_len: int, seconds: float, tp: int = 1,
                   spec=None, mfu=None, repeats: int = 0, spread=None) -> PrefillRecord:
    """The one way a prefill measurement becomes a record, for a sweep and for a probe file alike.

    ``identity``: the :data:`IDENTITY_FIELDS` (who measured, on what). FLOPs and bytes come from
    :func:`inference_lab.analytic.costs.prefill_cost` (per device under ``tp``); MFU is against
    ``spec``'s matmul peak, or ``mfu`` as given when there is no spec; ``cfg=None`` (a preset
    this lab does not know) leaves FLOPs and bytes unknown."""
    cost = costs.prefill_cost(cfg, batch, prompt_len, tp=tp) if cfg is not None else None
    if spec is not None:
        mfu = cost.flops / seconds / spec.peak_flops(cfg.dtype) if cost is not None else None
    return PrefillRecord(**{k: identity.get(k) for k in IDENTITY_FIELDS}, batch=batch, prompt_len=prompt_len,
                         seconds=seconds, prefill_tokens_per_s=batch * prompt_len / seconds,
                         flops=cost.flops if cost else None, bytes=cost.bytes if cost else None, mfu=mfu,
                         repeats=repeats, spread=spread)


def decode_record(identity: dict, cfg, *, batch: int, context: int, steps: int, step_seconds: float, tp: int = 1,
                  spec=None, mbu=None, mfu=None, bytes_per_step=None, repeats: int = 0, spread=None) -> DecodeRecord:
    """The one way a decode measurement (``steps`` steps from ``context`` cached tokens, one
    timed loop) becomes a record. Its bytes and FLOPs per step are
    :func:`inference_lab.analytic.costs.decode_loop_cost` (the mean over the loop's steps, per
    device under ``tp``); MBU and MFU are against ``spec`` (``mbu``/``mfu`` as given when there
    is no spec). ``cfg=None`` keeps ``bytes_per_step`` as given and the FLOPs unknown."""
    if cfg is not None:
        cost = costs.decode_loop_cost(cfg, batch, context, steps, tp=tp)
        bytes_per_step, flops = cost.bytes, cost.flops
    else:
        flops = None
    if spec is not None:
        mbu = bytes_per_step / step_seconds / spec.bandwidth if bytes_per_step is not None else None
        mfu = flops / step_seconds / spec.peak_flops(cfg.dtype) if flops is not None else None
    return DecodeRecord(**{k: identity.get(k) for k in IDENTITY_FIELDS}, batch=batch, context=context,
                        step_seconds=step_seconds, decode_tokens_per_s=batch / step_seconds,
                        bytes_per_step=bytes_per_step, flops_per_step=flops, mbu=mbu, mfu=mfu, steps=steps,
                        repeats=repeats, spread=spread)


_TEXT_FIELDS = {"device", "backend", "kernels", "preset", "dtype", "phase", "machine_id", "machine_name", "processor"}
_INT_FIELDS = {"batch", "prompt_len", "context", "steps", "repeats"}


class LoadedRecords(list):
    """A list of records; ``.skipped`` lists ``(path, reason)`` for every file not loaded and
    ``.partial`` the paths of probe runs that did not finish (``"complete": false``: interrupted,
    or a batch that did not fit), loaded for what they measured."""

    def __init__(self, records=(), skipped=(), partial=()):
        super().__init__(records)
        self.skipped = list(skipped)
        self.partial = list(partial)


# ----------------------------------------------------------------------------- machines
def machine_key(rec):
    """What tells one machine's records from another's: its id; for records without one
    (old probe files, hand-made records), its name and device."""
    mid = getattr(rec, "machine_id", None)
    if mid:
        return mid
    return (getattr(rec, "machine_name", None), str(getattr(rec, "device", "?")))


def machine_label(rec) -> str:
    """A machine's name on a chart: the learner's name for it, else its processor or device,
    then its id (``"Ana's laptop #3f9a2c1b"``, ``"AMD Ryzen 7 5800X #0b41d2e7"``)."""
    base = (getattr(rec, "machine_name", None) or getattr(rec, "processor", None)
            or str(getattr(rec, "device", "?")))
    base = " ".join(str(base).split())
    base = base if len(base) <= 40 else base[:39] + "…"
    mid = getattr(rec, "machine_id", None)
    return f"{base} #{mid}" if mid else base


# ----------------------------------------------------------------------------- saving
def _flat(rec) -> dict:
    if not isinstance(rec, (PrefillRecord, DecodeRecord)):
        raise ValueError(f"save_records takes PrefillRecord and DecodeRecord objects (from a sweep or "
                         f"load_records), got a {type(rec).__name__}; build records with prefill_record() or "
                         "decode_record()")
    return dataclasses.asdict(rec)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")   # what a spreadsheet runs as a formula


def _cell(value):
    """A text cell that a spreadsheet would run as a formula (a machine named ``=HYPERLINK(...)``)
    is written with a leading apostrophe, which spreadsheets show as text; :func:`_typed` takes it
    off again, so the name reads back as it was."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _csv_fields() -> list[str]:
    fields = []
    for cls in (PrefillRecord, DecodeRecord):
        for f in dataclasses.fields(cls):
            if f.name not in fields:
                fields.append(f.name)
    return fields


def save_records(records, path) -> Path:
    """Write records to ``path``: ``.json`` (a list of flat objects) or ``.csv`` (one row each).

    The file is replaced whole or not at all: the rows go to a temporary file in the same
    folder, which then replaces ``path`` (a full disk or an interrupt leaves the old file as
    it was). Non-finite numbers (NaN, infinity) are refused before anything is written.
    """
    path = Path(path)
    rows = [_flat(r) for r in records]
    if path.suffix == ".json":
        try:
            text = json.dumps(rows, indent=1, allow_nan=False)
        except ValueError:
            raise ValueError(f"records hold a NaN or infinite number; save_records writes finite numbers only "
                             f"(path={str(path)!r} not written)") from None
        atomic_write_text(path, text)
    elif path.suffix == ".csv":
        fields = _csv_fields()

        def write(fh):
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for row in rows:
                w.writerow({k: ("" if v is None else _cell(v)) for k, v in row.items()})

        atomic_write(path, write)
    else:
        raise ValueError(f"path={str(path)!r}: save_records writes .json or .csv")
    return path


# ----------------------------------------------------------------------------- loading
def _typed(name: str, v):
    """A CSV cell (always a string) as the value the field holds."""
    if v == "" or v is None:
        return None
    if name in _TEXT_FIELDS or name not in _NUMBER_FIELDS:   # unknown columns are dropped later
        if isinstance(v, str) and v.startswith("'") and v[1:].startswith(FORMULA_STARTS):
            return v[1:]                                        # the apostrophe _cell added
        return v
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{name}={v[:20]!r} is not a number") from None
    if name in _INT_FIELDS and x.is_integer() and abs(x) < 2**53:
        return int(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{name}={v[:20]!r} is not a finite number")
    return x


def _from_row(row: dict, where: str = "", *, from_csv: bool = False):
    if not isinstance(row, dict):
        raise ValueError(f"{where}is {type(row).__name__}, not a record object")
    if from_csv:
        try:
            row = {k: _typed(k, v) for k, v in row.items() if isinstance(k, str)}
        except ValueError as err:
            raise ValueError(f"{where}{err}") from None
    phase = row.get("phase") or ("prefill" if row.get("prompt_len") is not None and row.get("context") is None
                                 else "decode")
    cls = RECORD_TYPES.get(phase) if isinstance(phase, str) else None
    if cls is None:
        raise ValueError(f"{where}phase={str(phase)[:20]!r}: expected 'prefill' or 'decode'")
    names = {f.name for f in dataclasses.fields(cls)}
    # A CSV row has every column of both record types; keep this type's, drop empty defaults.
    kwargs = {k: v for k, v in row.items() if k in names and not (from_csv and v is None and k not in _NO_DEFAULT[cls])}
    kwargs["phase"] = phase
    schema.validate_row(phase, kwargs, where)
    if phase == "prefill":
        _check_rate(where, "prefill_tokens_per_s", kwargs["prefill_tokens_per_s"],
                    kwargs["batch"] * kwargs["prompt_len"], kwargs["seconds"])
    else:
        _check_rate(where, "decode_tokens_per_s", kwargs["decode_tokens_per_s"], kwargs["batch"],
                    kwargs["step_seconds"])
    return cls(**{k: int(v) if k in _INT_FIELDS and v is not None else v for k, v in kwargs.items()})


_NUMBER_FIELDS = {f.name for cls in (PrefillRecord, DecodeRecord) for f in dataclasses.fields(cls)} - _TEXT_FIELDS
_NO_DEFAULT = {cls: {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
               for cls in (PrefillRecord, DecodeRecord)}


RATE_TOLERANCE = 0.02   # a written rate must agree with its own counts and seconds to 2%


def _check_rate(where: str, name: str, written: float, tokens: float, seconds: float) -> None:
    """A file's tokens/s must be what its own batch, lengths and seconds say (1e17 tok/s from a
    0.1 s step of batch 1 is an edited file, not a measurement)."""
    implied = tokens / seconds
    if abs(written - implied) > RATE_TOLERANCE * implied:
        raise ValueError(f"{where}{name}={written:.4g} disagrees with its own counts and seconds "
                         f"({implied:.4g}); the file was edited or is damaged")


def _check_probe_fields(data: dict, cfg) -> None:
    """What the schema cannot say: one entry per decode batch, rates that agree with their own
    counts, contexts the preset can hold, a run that finished."""
    batches = [d["batch"] for d in data["decode"]]
    if len(set(batches)) != len(batches):
        raise ValueError(f"decode lists batch {next(b for b in batches if batches.count(b) > 1)} twice")
    pf = data["prefill"]
    _check_rate("prefill: ", "prefill_tokens_per_s", pf["prefill_tokens_per_s"], pf["batch"] * pf["prompt_len"],
                pf["seconds"])
    for i, d in enumerate(data["decode"]):
        _check_rate(f"decode/{i}: ", "decode_tokens_per_s", d["decode_tokens_per_s"], d["batch"], d["step_seconds"])
        if cfg is not None and d["context"] > cfg.max_seq_len:
            raise ValueError(f"decode/{i}: context {d['context']} is past the {cfg.name} preset's max_seq_len "
                             f"{cfg.max_seq_len}")


def _from_probe(data: dict, path: Path) -> list:
    """A probe JSON (schema_version 1 or 2) -> one PrefillRecord + its DecodeRecords, through the
    same builders a sweep uses (tensor parallelism included)."""
    version = schema.validate_probe(data)
    if version >= 2:
        m = data["machine"]
        who = {"machine_id": m["id"], "machine_name": m["name"], "processor": m["processor"]}
        c = data["ceilings"]   # what the file's MFU and MBU were measured against
        spec = HardwareSpec(name=data["device"], flops={dtype_key(data["model"]["dtype"]): c["matmul_flops_per_s"]},
                            bandwidth=c["bandwidth_bytes_per_s"])
    else:  # no identity: the file stands for one machine (a class renames its copies)
        who = {"machine_id": None, "machine_name": path.stem, "processor": None}
        spec = None   # version 1 did not say what its ceilings were: its MFU and MBU are kept as written
    identity = dict(who, device=data["device"], backend=data["backend"], kernels=data["kernels"],
                    preset=data["model"]["preset"], dtype=data["model"]["dtype"])
    shape = data["model"].get("shape")   # newer files: the model's own shape (a Hugging Face folder's too)
    try:
        if shape is None:
            cfg = ModelConfig.preset(identity["preset"], dtype=identity["dtype"])
        else:
            cfg = ModelConfig(name=identity["preset"], dtype=identity["dtype"], **shape)
        tp = data["tp"]
        costs.weight_bytes(cfg, tp=tp)   # a tp this preset cannot be split by: as an unknown preset
    except (ValueError, TypeError):
        cfg, tp = None, 1   # a model this lab cannot size: no FLOPs, the measured figures still load
    if cfg is None and spec is not None:
        spec = None         # nothing to divide by the ceilings: keep the file's MFU and MBU
    _check_probe_fields(data, cfg)
    pf = data["prefill"]
    recs = [prefill_record(identity, cfg, batch=pf["batch"], prompt_len=pf["prompt_len"], seconds=pf["seconds"],
                           tp=tp, spec=spec, mfu=pf.get("mfu"), spread=pf.get("spread"))]
    steps = data["new_tokens"]
    for d in data["decode"]:
        recs.append(decode_record(identity, cfg, batch=d["batch"], context=d["context"], steps=steps,
                                  step_seconds=d["step_seconds"], tp=tp, spec=spec, mbu=d.get("mbu"),
                                  mfu=d.get("mfu"), bytes_per_step=d["bytes_per_step"], spread=d.get("spread")))
    return recs


def _load_file(path: Path, partial: list) -> list:
    """The records in one file, or a one-line ValueError saying why there are none (a probe run
    that did not finish is added to ``partial``)."""
    if path.suffix.lower() == ".csv":
        text = _read_text(path)
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if not reader.fieldnames:
            raise ValueError("is a CSV file without a header row")
        return [_from_row(row, f"row {i + 2}: ", from_csv=True) for i, row in enumerate(reader)]
    data = schema.read_json(path)
    if isinstance(data, dict) and "schema_version" in data:
        records = _from_probe(data, path)
        if data.get("complete") is False:
            partial.append(path)
        return records
    if isinstance(data, list):
        if len(data) > 100_000:
            raise ValueError(f"holds {len(data):,} records; a records file holds fewer than 100,000")
        return [_from_row(row, f"record {i}: ") for i, row in enumerate(data)]
    if isinstance(data, dict):
        raise ValueError("is a JSON object without schema_version: not a probe result")
    raise ValueError(f"holds a JSON {type(data).__name__}, neither a probe result nor a list of records")


def _read_text(path: Path) -> str:
    """A CSV file's text, under the same bounds as a JSON file's."""
    if not path.is_file():
        raise ValueError("is not a regular file")
    with path.open("rb") as fh:
        raw = fh.read(schema.MAX_FILE_BYTES + 1)
    if len(raw) > schema.MAX_FILE_BYTES:
        raise ValueError(f"is over {schema.MAX_FILE_BYTES:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"is not UTF-8 text (byte {err.start})") from None


def _reason(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_records(folder_or_file) -> LoadedRecords:
    """Records from a ``.json``/``.csv`` file written by :func:`save_records`, a probe JSON,
    or every such file in a folder (sorted by name: e.g. a classroom's probe results).

    A folder never fails because of one file: each file that cannot be read whole (not
    JSON, truncated, not a probe result, a value out of range...) is left out, and
    ``result.skipped`` lists ``(path, reason)`` for it. A single file that cannot be read
    raises a ``ValueError`` naming it and the reason; so does a path that does not exist.
    """
    path = Path(folder_or_file)
    if path.is_dir():
        try:
            files = sorted(p for p in path.iterdir()
                           if p.suffix.lower() in (".json", ".csv") and not p.name.startswith("."))
        except OSError as err:   # a folder this user may not list
            raise ValueError(f"{path} cannot be listed ({err.strerror or err}); check its permissions") from None
    elif path.exists() or path.is_symlink():   # a broken or looping link is said to be one, below
        files = [path]
    else:
        raise ValueError(f"folder_or_file={str(path)!r} does not exist")
    result = LoadedRecords()
    for f in files:
        try:
            result.extend(_load_file(f, result.partial))
        except (ValueError, OSError, RecursionError, csv.Error) as err:
            if len(files) == 1 and f == path:
                raise ValueError(f"{path} {_reason(err)}") from None
            result.skipped.append((f, _reason(err)))
    return result
