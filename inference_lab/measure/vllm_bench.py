"""Read a real engine's serving benchmark: the result file of ``vllm bench serve --save-result``.

The format is the one ``vllm/benchmarks/serve.py`` writes on vLLM's main branch (read in
November 2026); its metric names are those of the ``BenchmarkMetrics`` of vLLM 0.10 and 0.11 and
of the older ``benchmarks/benchmark_serving.py``. One run is one JSON
object; ``--append-result`` puts several in one file, one after the other; a folder of them is
read in name order (vLLM's ``*.pytorch.json`` side files are skipped).

Fields read (everything else is ignored):

* run: ``date``, ``backend``, ``label``, ``model_id``, ``num_prompts``, ``request_rate``
  (a number or ``"inf"``), ``max_concurrency``, ``duration`` (s), ``completed``, ``failed``,
  ``total_input_tokens``, ``total_output_tokens``, ``request_throughput`` (req/s),
  ``output_throughput`` (tok/s), ``request_goodput`` (req/s, ``null`` without ``--goodput``);
* aggregates, in ms, for each metric ``ttft``, ``tpot``, ``itl``, ``e2el`` that
  ``--percentile-metrics`` selected (default ``ttft,tpot,itl``): ``mean_<m>_ms``,
  ``median_<m>_ms``, and ``p<q>_<m>_ms`` for each of ``--metric-percentiles`` (default 99);
* per request, only with ``--save-detailed``: ``input_lens``, ``output_lens`` (0 for a failed
  request), ``ttfts`` (s), ``itls`` (a list of gaps in s per request), and where present
  ``start_times`` (s, send times), ``latencies`` (s, E2E) and ``errors`` (``""`` when fine).

With the per-request lists the run becomes a :class:`~inference_lab.analytic.serving_metrics.ServingTrace`
and every metric is recomputed the simulator's way (vLLM's definitions: TPOT = (E2E - TTFT) /
(output tokens - 1); ITL = every streamed gap, pooled), so goodput can be asked of any SLO
afterwards. Without them, the aggregates are used as written. Recomputing is preferred also
because the 0.6-era ``benchmarks/benchmark_serving.py`` stored ``mean_e2el_ms`` and
``median_e2el_ms`` in each other's place.

Layouts read (``tests/fixtures/vllm/`` has one file per layout, written by hand from the writer's
code): the 0.6-era script; vLLM 0.7-0.9's, whose goodput key is ``"request_goodput:"`` (with the
colon); the current ``vllm/benchmarks/serve.py`` (``request_goodput``, ``failed``, ``start_times``,
``latencies``); ``--append-result`` files; a ``vllm bench sweep`` folder, whose ``summary.json``
(a list of the runs again) is skipped so no run counts twice. A run in which every request failed
reports no latency (NaN), not the 0.0 ms placeholders vLLM writes for it.

Every field is gated: a file that is not UTF-8, nested too deeply, holds NaN or infinity, a bool or
a string where a number belongs (an aggregate included), a negative time, rate or count, a
fractional count, a key written twice in one object, or a per-request list of the wrong type is
refused in one line naming the file and the field. In a folder such a file, a FIFO
or a folder named ``*.json`` is listed in ``.skipped`` (:class:`BenchRuns`) and the rest still load.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from inference_lab.analytic.serving_metrics import LATENCY_METRICS, SLO, ServingTrace
from inference_lab.analytic.workload import Requests
from inference_lab.measure.schema import unique_keys

__all__ = ["BenchRun", "BenchRuns", "load_vllm_bench", "VLLM_METRIC_NAMES"]

VLLM_METRIC_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
"""Our metric name -> vLLM's (vLLM calls end-to-end latency E2EL)."""

_REQUIRED = ("duration", "completed")


@dataclasses.dataclass
class BenchRun:
    """One ``vllm bench serve`` run: what the file says, and the per-request trace if saved."""

    path: str
    label: str
    model_id: str | None
    date: str | None
    request_rate: float
    max_concurrency: int | None
    num_prompts: int | None
    duration: float
    completed: int
    failed: int
    total_input_tokens: int | None
    total_output_tokens: int | None
    request_throughput: float | None
    output_throughput: float | None
    request_goodput: float | None
    stats: dict  # {"ttft": {"mean": ms, "median": ms, "p99": ms, ...}, ...} as written
    trace: ServingTrace | None

    def summary(self, slo: SLO | None = None) -> dict:
        """A row with the keys of ``SimResult.summary()`` (plus ``rate``, ``model_id``,
        ``source``), so a real run sits in the same tables and plots as the simulator's.

        With the per-request lists every metric is recomputed and ``slo`` gives goodput;
        without them the file's aggregates are used (missing percentiles are NaN) and goodput
        is vLLM's own ``request_goodput``, if it was run with ``--goodput``.
        """
        if self.trace is not None:
            row = self.trace.with_slo(slo).summary()
        else:
            if slo is not None:
                raise ValueError(f"{self.path}: the run was saved without --save-detailed; goodput for a "
                                 "new SLO needs the per-request lists")
            row = {"mode": self.label, "requests": self.completed + self.failed, "completed": self.completed,
                   "duration_s": self.duration}
            for name in LATENCY_METRICS:
                got = self.stats.get(name, {})
                row[f"{name}_mean_ms"] = got.get("mean", math.nan)
                for q in (50, 90, 99):
                    row[f"{name}_p{q}_ms"] = got.get("median" if q == 50 else f"p{q}", math.nan)
            row["request_throughput"] = self.request_throughput
            row["output_tokens_per_s"] = self.output_throughput
            row["input_tokens_per_s"] = (self.total_input_tokens / self.duration
                                         if self.total_input_tokens is not None else None)
            tpot = row["tpot_p50_ms"]
            row["user_tokens_per_s_p50"] = 1e3 / tpot if tpot and tpot > 0 else math.nan
            row["slo"] = None
            row["goodput_rps"] = self.request_goodput
            row["slo_attainment"] = None
            if self.request_goodput is not None:
                row["slo"] = "vLLM --goodput (its targets are not saved in the file)"
        row.update(mode=self.label, rate=self.request_rate, model_id=self.model_id, source="vllm bench serve")
        return row


def _number(data, key, path, kind=float, default=None):
    """A run-level number as ``kind`` (a finite float >= 0, or a whole number >= 0), ``default``
    where absent or null; ``"inf"`` (vLLM's unlimited request rate) is infinity. A bool, a string,
    NaN, infinity, a negative number or a fraction where a count belongs is refused in one line
    naming the file and the field (every number vLLM writes here is a time, a rate or a count)."""
    v = data.get(key)
    if v is None:
        return default
    if v == "inf" and key == "request_rate":
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{path}: field {key!r}={str(v)[:30]!r} is not a finite number")
    if v < 0:
        raise ValueError(f"{path}: field {key!r}={v!r} is negative; a time, rate or count is >= 0")
    if kind is int:
        if v != int(v):
            raise ValueError(f"{path}: field {key!r}={v!r} must be a whole number >= 0")
        return int(v)
    return float(v)


def _stats(data, path) -> dict:
    """The aggregates (``mean_``, ``median_``, ``std_``, ``p<q>_<metric>_ms``): each a time in ms,
    a finite number >= 0, or the file is refused naming the field (never dropped as NaN)."""
    out = {}
    for ours, theirs in VLLM_METRIC_NAMES.items():
        got = {}
        for key, value in data.items():
            if not key.endswith(f"_{theirs}_ms"):
                continue
            head = key[: -len(f"_{theirs}_ms")]
            if head in ("mean", "median", "std") or (head.startswith("p") and head[1:].replace(".", "", 1).isdigit()):
                if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                        or value < 0):
                    raise ValueError(f"{path}: field {key!r}={str(value)[:30]!r} is not a time in ms (a finite "
                                     "number >= 0)")
                got[head] = float(value)
        if got:
            out[ours] = got
    return out


def _trace(data, label, duration, path) -> ServingTrace | None:
    keys = ("input_lens", "output_lens", "ttfts", "itls")
    if not all(k in data for k in keys):
        return None
    if not all(isinstance(data[k], list) for k in keys):
        raise ValueError(f"{path}: input_lens, output_lens, ttfts and itls must be lists, one entry per request")
    n = len(data["ttfts"])
    if n == 0:
        return None
    if any(len(data[k]) != n for k in keys):
        raise ValueError(f"{path}: input_lens, output_lens, ttfts and itls must have one entry per request")
    _check_list(path, "input_lens", data["input_lens"], count=True)
    _check_list(path, "output_lens", data["output_lens"], count=True)
    _check_list(path, "ttfts", data["ttfts"], optional=True)
    for name in ("start_times", "latencies"):
        if name in data:
            _check_list(path, name, data[name], optional=True)
    for i, gaps in enumerate(data["itls"]):
        if gaps is not None:
            if not isinstance(gaps, list):
                raise ValueError(f"{path}: itls[{i}] is {type(gaps).__name__}, not a list of gaps in seconds")
            _check_list(path, f"itls[{i}]", gaps)
    out_len = np.asarray(data["output_lens"], dtype=np.int64)
    ok = out_len > 0
    if "errors" in data and len(data["errors"]) == n:
        ok &= np.array([not e for e in data["errors"]])
    if "start_times" in data and len(data["start_times"]) == n:
        arrival = np.asarray(data["start_times"], dtype=np.float64)
        arrival = arrival - arrival.min()
    else:
        arrival = np.zeros(n)  # send times unknown: latencies are measured from each send anyway
    ttft = np.asarray([t or 0.0 for t in data["ttfts"]], dtype=np.float64)
    gaps = [np.asarray(g or [], dtype=np.float64) for g in data["itls"]]
    first = arrival + ttft
    if "latencies" in data and len(data["latencies"]) == n:
        finish = arrival + np.asarray([t or 0.0 for t in data["latencies"]], dtype=np.float64)
    else:
        finish = first + np.array([g.sum() for g in gaps])
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gaps])]).astype(np.int64)
    values = np.concatenate(gaps) if offsets[-1] else np.empty(0)
    reqs = Requests(arrival, np.asarray(data["input_lens"], dtype=np.int64), np.maximum(out_len, 1))
    return ServingTrace(mode=label, requests=reqs, first_token=first, finish=finish, itl_values=values,
                        itl_offsets=offsets, ok=ok, duration=duration)


def _check_list(path, name, values, *, count=False, optional=False) -> None:
    """Every entry a finite number >= 0 (a whole one for a count; ``None`` allowed where vLLM
    writes it for a failed request)."""
    if not isinstance(values, list):
        raise ValueError(f"{path}: {name} is {type(values).__name__}, not a list")
    for i, v in enumerate(values):
        if v is None and optional:
            continue
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                or (count and v != int(v))):
            raise ValueError(f"{path}: {name}[{i}]={str(v)[:20]!r} is not a {'count' if count else 'time'} "
                             "(a finite number >= 0)")


def _run(data: dict, path: str) -> BenchRun:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a vllm bench serve result (expected a JSON object)")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{path}: not a vllm bench serve result: no {', '.join(map(repr, missing))} field "
                         "(save one with `vllm bench serve ... --save-result --save-detailed`)")
    label = data.get("label") or data.get("backend") or "vllm"
    duration = _number(data, "duration", path)
    if not duration or duration <= 0:
        raise ValueError(f"{path}: duration={data['duration']!r} must be a positive number of seconds")
    completed = _number(data, "completed", path, int)
    # vLLM 0.7-0.9's writer spelled the key "request_goodput:" (with the colon)
    if "request_goodput" not in data and "request_goodput:" in data:
        data = dict(data, request_goodput=data["request_goodput:"])
    if completed == 0:
        # every request failed: vLLM writes 0.0 for every latency (a mean of nothing), which is no latency
        stats, trace = {}, None
    else:
        stats = _stats(data, path)
        trace = _trace(data, label, duration, path)
    if trace is None and not stats and completed != 0:
        raise ValueError(f"{path}: neither per-request lists (--save-detailed) nor mean_/median_/p99_*_ms "
                         "aggregates: nothing to read")
    return BenchRun(
        path=path, label=str(label), model_id=data.get("model_id"), date=data.get("date"),
        request_rate=_number(data, "request_rate", path, default=math.inf),
        max_concurrency=_number(data, "max_concurrency", path, int), num_prompts=_number(data, "num_prompts", path, int),
        duration=duration, completed=completed, failed=_number(data, "failed", path, int, 0),
        total_input_tokens=_number(data, "total_input_tokens", path, int),
        total_output_tokens=_number(data, "total_output_tokens", path, int),
        request_throughput=_number(data, "request_throughput", path),
        output_throughput=_number(data, "output_throughput", path),
        request_goodput=_number(data, "request_goodput", path), stats=stats, trace=trace)


MAX_FILE_BYTES = 1 << 30   # a detailed run of 100,000 requests is a few hundred MB


def _no_constant(name):
    raise ValueError(f"the number {name} (only finite numbers are read)")


def _read(path: Path) -> str:
    """A result file's text: a regular file (a FIFO or a folder named ``*.json`` would hang or
    fail), of bounded size, UTF-8 with or without a byte-order mark."""
    if not path.is_file():
        raise ValueError(f"{path}: is not a regular file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path}: is {size:,} bytes, more than a result file holds")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: is not UTF-8 text (byte {err.start}): not a vllm bench serve result") from None


def _objects(text: str, path: str) -> list:
    """One JSON object, or several one after the other (``--append-result``)."""
    # a key twice in one object (which value would count?) is refused, as the probe's reader does
    decoder, pos, out = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=unique_keys), 0, []
    text = text.strip()
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
        except RecursionError:
            raise ValueError(f"{path}: nested too deeply to be a vllm bench serve result") from None
        except ValueError as e:
            raise ValueError(f"{path}: not a vllm bench serve result: {e}") from None
        out.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


class BenchRuns(list):
    """The runs read; ``.skipped`` holds ``(path, reason)`` for each file of a folder that is not
    a result (a ``vllm bench sweep`` summary, a damaged file, a FIFO...), never fatal for the others."""

    def __init__(self, runs=(), skipped=()):
        super().__init__(runs)
        self.skipped = list(skipped)


def _file_runs(f: Path) -> list:
    objects = _objects(_read(f), str(f))
    if len(objects) == 1 and isinstance(objects[0], list):
        if objects[0] and all(isinstance(o, dict) and "duration" in o for o in objects[0]):
            raise ValueError(f"{f}: is a vllm bench sweep summary (a list of the runs, which are read "
                             "from their own files: not counted twice)")
        raise ValueError(f"{f}: holds a JSON list, not a vllm bench serve result")
    return [_run(obj, str(f)) for obj in objects]


def load_vllm_bench(path) -> BenchRuns:
    """Every run in a ``vllm bench serve --save-result`` file, or in every such file of a folder
    (name order; vLLM's ``*.pytorch.json`` side files left out). A single file that cannot be read
    raises a one-line ``ValueError``; in a folder it is listed in ``.skipped`` instead."""
    path = Path(path)
    if path.is_dir():
        try:
            files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".json"
                           and not p.name.lower().endswith(".pytorch.json") and not p.name.startswith("."))
        except OSError as err:   # a folder this user may not list
            raise ValueError(f"{path} cannot be listed ({err.strerror or err}); check its permissions") from None
    elif path.exists() or path.is_symlink():
        files = [path]
    else:
        raise ValueError(f"path={str(path)!r} does not exist")
    runs = BenchRuns()
    for f in files:
        try:
            runs.extend(_file_runs(f))
        except ValueError as err:
            if f == path:
                raise
            runs.skipped.append((f, str(err).removeprefix(f"{f}: ")))
    if not runs:
        why = "; ".join(f"{p.name}: {r}" for p, r in runs.skipped[:3])
        raise ValueError(f"{path}: no vllm bench serve results in it" + (f" ({why})" if why else ""))
    return runs
