"""The serving engine's benchmark figures (docs/benchmarks.md, "The serving engine"):

1. the batching lesson, served: tokens/s of 8 concurrent streams on an 8-slot server against one
   stream alone (on the same server, and on a 1-slot server: the best one stream gets);
2. what the server adds to a token's latency: TPOT of one streamed request through HTTP against
   the same request given to the same engine in-process (drive_engine), at batch 1 (1 slot).

    .venv/bin/python scripts/serving_bench.py [--preset shakespeare_large] [--tokens 64] [--repeats 3]

Prints medians over the repeats and the processor. No GPU needed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from inference_lab.analytic.workload import Requests
from inference_lab.base import hardware
from inference_lab.serving.load import bench_serve, drive_engine
from inference_lab.serving.models import load_model
from inference_lab.serving.engine import Engine
from inference_lab.serving.server import ServerProcess


def streams(n: int, tokens: int, prompt: int = 32) -> Requests:
    return Requests(np.zeros(n), np.full(n, prompt), np.full(n, tokens))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="shakespeare_large")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(hardware.processor_summary())
    rows = {}
    model = load_model(args.preset)
    engine = Engine(model, policy="chunked", n_slots=1)   # the same engine as a 1-slot server, no HTTP
    engine.warmup()
    engine.start()
    for slots in (1, 8):
        with ServerProcess("--slots", str(slots), policy="chunked", preset=args.preset) as server:
            for n in sorted({1, slots}):
                bench_serve(server.base_url, streams(n, args.tokens), model=args.preset)   # warm-up run
                rows[(slots, n, "http")] = []
                for _ in range(args.repeats):
                    rows[(slots, n, "http")].append(
                        bench_serve(server.base_url, streams(n, args.tokens), model=args.preset).trace().summary())
                    if (slots, n) == (1, 1):   # interleaved: the machine's drift hits both alike
                        rows.setdefault((1, 1, "in-process"), []).append(
                            drive_engine(engine, streams(1, args.tokens)).summary())
    engine.stop()

    def med(key, field):
        return statistics.median(r[field] for r in rows[key])

    print(f"\n{args.preset}, {args.tokens} output tokens per stream, medians of {args.repeats} runs")
    for key in rows:
        print(f"  {key[0]} slot(s), {key[1]} stream(s), {key[2]:10s}: {med(key, 'output_tokens_per_s'):7.1f} tok/s, "
              f"TPOT p50 {med(key, 'tpot_p50_ms'):6.2f} ms, TTFT p50 {med(key, 'ttft_p50_ms'):6.1f} ms")
    eight = med((8, 8, "http"), "output_tokens_per_s")
    print(f"8 streams / 1 stream on the 8-slot server: x{eight / med((8, 1, 'http'), 'output_tokens_per_s'):.2f}; "
          f"/ 1 stream on a 1-slot server: x{eight / med((1, 1, 'http'), 'output_tokens_per_s'):.2f} (target >= 4)")
    pairs = [h["tpot_p50_ms"] / e["tpot_p50_ms"] - 1 for h, e in zip(rows[(1, 1, "http")], rows[(1, 1, "in-process")])]
    print(f"server overhead per token at batch 1 (TPOT p50, HTTP vs in-process, run by run): median "
          f"{100 * statistics.median(pairs):+.1f}%, range {100 * min(pairs):+.1f}% .. {100 * max(pairs):+.1f}% "
          "(target < 10%)")


if __name__ == "__main__":
    main()
