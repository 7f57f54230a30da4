"""``GET /metrics``: the server's state and its requests' latencies in the Prometheus text format,
through ``prometheus-client`` (the library vLLM's server uses), under **vLLM's metric names**, so
a dashboard or a ``curl | grep`` written for vLLM reads this server too:

====================================== ========= ===============================================
name                                   type      what
====================================== ========= ===============================================
``vllm:num_requests_running``          gauge     requests with a slot (prefilling or decoding)
``vllm:num_requests_waiting``          gauge     requests queued for a slot (or for blocks)
``vllm:kv_cache_usage_perc``           gauge     fraction of the KV cache's blocks held, 0..1
                                                 (contiguous slots: the fraction of slots held)
``vllm:num_preemptions_total``         counter   requests preempted (their blocks taken back)
``vllm:prefix_cache_queries_total``    counter   prompt tokens looked up in the prefix cache
``vllm:prefix_cache_hits_total``       counter   of those, tokens found (not prefilled again)
``vllm:prompt_tokens_total``           counter   prompt tokens of the requests that got a first token
``vllm:generation_tokens_total``       counter   tokens generated (every choice's)
``vllm:request_success_total``         counter   requests finished, label ``finished_reason``
                                                 (``stop``: a stop token or string; ``length``)
``vllm:spec_decode_num_drafts_total``  counter   speculative decoding: rows given guesses
``vllm:spec_decode_num_draft_tokens_total`` counter guesses checked
``vllm:spec_decode_num_accepted_tokens_total`` counter guesses kept
``vllm:time_to_first_token_seconds``   histogram arrival at the server -> first token
``vllm:inter_token_latency_seconds``   histogram every gap between two tokens of a request
``vllm:e2e_request_latency_seconds``   histogram arrival -> last token
``vllm:request_queue_time_seconds``    histogram arrival -> its first slot (waiting in the queue)
``vllm:request_prefill_time_seconds``  histogram its first slot -> first token (the prompt's prefill)
``vllm:request_decode_time_seconds``   histogram first token -> last token
====================================== ========= ===============================================

Every series carries the label ``model_name``. The gauges and counters are read from the engine's
``stats()`` when Prometheus scrapes (a collector: nothing is kept twice); the histograms are
observed as each token's event passes through the API, stamped with the engine's own clock
(``TokenEvent.time``). The buckets reach down to a millisecond: a CPU engine's inter-token gaps
are a few milliseconds, where vLLM's GPU-sized buckets would put every token in the first one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
GAP_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.5, 0.75, 1.0, 2.5, 5.0)


class _EngineState:
    """A collector: the engine's counts, read from ``backend.stats()`` at each scrape."""

    def __init__(self, backend, model_name: str):
        self.backend, self.model_name = backend, model_name

    def collect(self):
        stats = self.backend.stats()
        kv = stats.get("kv_cache") or {}
        label = [self.model_name]

        def one(family, value):
            family.add_metric(label, float(value))
            return family

        yield one(GaugeMetricFamily("vllm:num_requests_running", "Requests with a slot (prefilling or decoding).",
                                    labels=["model_name"]), stats.get("active", 0))
        yield one(GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for a slot or for KV blocks.",
                                    labels=["model_name"]), stats.get("waiting", 0))
        if kv.get("layout") == "paged":
            usage = kv["kv_cache_usage"]
        else:
            usage = stats.get("active", 0) / max(stats.get("slots", 1), 1)
        yield one(GaugeMetricFamily("vllm:kv_cache_usage_perc",
                                    "Fraction of the KV cache held by requests, 0..1 (blocks; contiguous: slots).",
                                    labels=["model_name"]), usage)
        yield one(CounterMetricFamily("vllm:num_preemptions", "Requests preempted (blocks taken back, recomputed).",
                                      labels=["model_name"]), stats.get("preemptions", 0))
        yield one(CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      labels=["model_name"]), kv.get("prefix_cache_queries", 0))
        yield one(CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                      labels=["model_name"]), kv.get("prefix_cache_hits", 0))
        spec = stats.get("speculative") or {}
        for name, key, doc in (("vllm:spec_decode_num_drafts", "drafts", "Rows given guesses to check."),
                               ("vllm:spec_decode_num_draft_tokens", "proposed", "Guesses checked."),
                               ("vllm:spec_decode_num_accepted_tokens", "accepted", "Guesses kept.")):
            yield one(CounterMetricFamily(name, doc, labels=["model_name"]), spec.get(key, 0))


class ServingMetrics:
    """The registry of one server: the engine's state, and the latency histograms its requests fill."""

    def __init__(self, backend, model_name: str):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineState(backend, model_name))

        def histogram(name, doc, buckets):
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry).labels(model_name)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between two tokens of a request.", GAP_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to the request's first slot.",
                               LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "First slot to first token.", LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", "First token to last token.", LATENCY_BUCKETS)

        def counter(name, doc, labels=()):
            return Counter(name, doc, ["model_name", *labels], registry=self.registry)

        self.model_name = model_name
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of requests that got a first token.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.success = counter("vllm:request_success", "Requests finished, by finish reason.", ["finished_reason"])
        self.first_times: dict = {}   # each open request's first token's time (its decode time starts there)

    def token(self, arrival: float, previous: float | None, event, prompt_len: int) -> None:
        """Observe one token's event (``arrival``: when the request reached the server; ``previous``:
        the request's last token's time, None for its first; ``prompt_len``: its prompt's tokens),
        on the engine's clock."""
        self.generation_tokens.labels(self.model_name).inc()
        if previous is None:
            self.ttft.observe(event.time - arrival)
            self.prompt_tokens.labels(self.model_name).inc(prompt_len)
            if event.scheduled is not None:
                self.queue.observe(max(event.scheduled - arrival, 0.0))
                self.prefill.observe(max(event.time - event.scheduled, 0.0))
            self.first_times[event.rid] = event.time
        else:
            self.itl.observe(event.time - previous)
        if event.finish in ("length", "stop"):
            self.end(event.rid, event.finish, event.time, arrival)

    def end(self, rid: str, reason: str | None, at: float, arrival: float) -> None:
        """Request ``rid`` ended at ``at``: ``reason`` "length"/"stop" (a stop string the API found
        counts as "stop"), or None for a cancel or a failure (counted nowhere)."""
        first = self.first_times.pop(rid, None)
        if reason is None:
            return
        self.e2e.observe(at - arrival)
        self.decode.observe(at - (at if first is None else first))
        self.success.labels(self.model_name, reason).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)


def parse(text: str) -> dict:
    """``{name: value}`` of a ``/metrics`` page, histogram buckets left out, a series with several
    label sets summed over them (``vllm:request_success_total``: every finish reason):
    ``parse(page)["vllm:num_preemptions_total"]``."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and 'le="' not in line:
            series, value = line.rsplit(" ", 1)
            name = series.split("{")[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out
