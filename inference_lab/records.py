"""Measurement records and their files: what a sweep or a probe leaves behind.

:class:`PrefillRecord` and :class:`DecodeRecord` are flat dataclasses (the probe schema's
entries plus the machine fields), so they save as one JSON object or CSV row each and plot
the same way wherever they came from: this machine's sweep, or a classroom's probe files.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from inference_lab import roofline
from inference_lab.config import ModelConfig


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
    flops: float | None            # roofline.prefill_cost(...).flops (per device under tp)
    bytes: float | None            # roofline.prefill_cost(...).bytes
    mfu: float | None              # flops / seconds / measured matmul peak
    phase: str = "prefill"
    repeats: int = 0


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
    bytes_per_step: float | None   # roofline.decode_cost bytes, averaged over the steps (per device under tp)
    flops_per_step: float | None
    mbu: float | None              # bytes_per_step / step_seconds / measured bandwidth
    mfu: float | None
    phase: str = "decode"
    steps: int = 0
    repeats: int = 0


RECORD_TYPES = {"prefill": PrefillRecord, "decode": DecodeRecord}


def _flat(rec) -> dict:
    return dataclasses.asdict(rec)


def save_records(records, path) -> Path:
    """Write records to ``path``: ``.json`` (a list of flat objects) or ``.csv`` (one row each)."""
    path = Path(path)
    rows = [_flat(r) for r in records]
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif path.suffix == ".csv":
        fields = []
        for cls in (PrefillRecord, DecodeRecord):
            for f in dataclasses.fields(cls):
                if f.name not in fields:
                    fields.append(f.name)
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for row in rows:
                w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    else:
        raise ValueError(f"path={str(path)!r}: save_records writes .json or .csv")
    return path


def _from_row(row: dict):
    phase = row.get("phase") or ("prefill" if "prompt_len" in row and "context" not in row else "decode")
    cls = RECORD_TYPES.get(phase)
    if cls is None:
        raise ValueError(f"record with phase={phase!r}: expected 'prefill' or 'decode'")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in row:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"a {phase} record lacks the field {f.name!r}")
            continue
        v = row[f.name]
        if v == "" or v is None:
            v = None
        elif isinstance(v, str) and f.name not in ("device", "backend", "kernels", "preset", "dtype", "phase"):
            v = float(v)
            if v.is_integer() and f.name in ("batch", "prompt_len", "context", "steps", "repeats"):
                v = int(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def _from_probe(data: dict) -> list:
    """A probe JSON (schema_version 1) -> one PrefillRecord + its DecodeRecords."""
    machine = {"device": data["device"], "backend": data["backend"], "kernels": data["kernels"],
               "preset": data["model"]["preset"], "dtype": data["model"]["dtype"]}
    try:
        cfg = ModelConfig.preset(machine["preset"], dtype=machine["dtype"])
    except ValueError:
        cfg = None
    pf = data["prefill"]
    cost = roofline.prefill_cost(cfg, pf["batch"], pf["prompt_len"]) if cfg else None
    recs = [PrefillRecord(**machine, batch=pf["batch"], prompt_len=pf["prompt_len"], seconds=pf["seconds"],
                          prefill_tokens_per_s=pf["prefill_tokens_per_s"],
                          flops=cost.flops if cost else None, bytes=cost.bytes if cost else None,
                          mfu=pf.get("mfu"))]
    for d in data["decode"]:
        steps = data.get("new_tokens") or 1
        flops = (sum(roofline.decode_cost(cfg, d["batch"], d["context"] + i).flops for i in range(steps)) / steps
                 if cfg else None)
        recs.append(DecodeRecord(**machine, batch=d["batch"], context=d["context"], step_seconds=d["step_seconds"],
                                 decode_tokens_per_s=d["decode_tokens_per_s"], bytes_per_step=d["bytes_per_step"],
                                 flops_per_step=flops, mbu=d.get("mbu"), mfu=d.get("mfu"), steps=steps))
    return recs


def _load_file(path: Path) -> list:
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            return [_from_row(row) for row in csv.DictReader(fh)]
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "schema_version" in data:
        if data["schema_version"] != 1:
            raise ValueError(f"{path}: probe schema_version {data['schema_version']} is not 1")
        return _from_probe(data)
    if isinstance(data, list):
        return [_from_row(row) for row in data]
    raise ValueError(f"{path}: neither a probe JSON nor a list of records")


def load_records(folder_or_file) -> list:
    """Records from a ``.json``/``.csv`` file written by :func:`save_records`, a probe JSON,
    or every such file in a folder (sorted by name: e.g. a classroom's probe results)."""
    path = Path(folder_or_file)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".csv"))
    elif path.exists():
        files = [path]
    else:
        raise ValueError(f"folder_or_file={str(path)!r} does not exist")
    records = []
    for f in files:
        records.extend(_load_file(f))
    return records
