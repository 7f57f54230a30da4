"""Speculative decoding on this machine: the benchmark behind notebook 08's figures.

    .venv/bin/python scripts/speculation_bench.py [--new-tokens 96] [--repeats 7] [--ks 1,2,3,4,6,8]

Prints, for the shipped pair (target ``shakespeare_large``, draft ``shakespeare``): the verify
step of ``k + 1`` tokens against a one-token step (measured, and on the roofline), each draft's
acceptance rate on the eight held-out prompts, and, at batch 1 on each held-out prompt in turn,
plain greedy decode's tokens/s beside every draft at every ``k``: the speed-up measured, and
predicted before it from the measured steps and from the roofline. Every speculative run's text
is checked against plain decode's. docs/benchmarks.md keeps the table; with more repeats and all
eight prompts it is steadier than the notebook's one-prompt grid.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import jax

from inference_lab.base import hardware
from inference_lab.lessons import speculative_decoding as lesson


def _ks(text: str) -> tuple:
    return tuple(int(x) for x in text.split(","))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=lesson.NEW_TOKENS)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ks", type=_ks, default=(1, 2, 3, 4, 6, 8))
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts timed, one after another (1-8)")
    args = ap.parse_args(argv)
    import flax

    spec = hardware.measure_ceilings("float32", verbose=False)
    target, draft_model = lesson.trained_pair()
    print(f"device {jax.devices()[0].device_kind}; {hardware.processor_summary()}")
    print(f"python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}")
    print(f"ceilings: {spec.peak_flops('float32') / 1e9:,.1f} GFLOP/s, read {spec.bandwidth / 1e9:,.1f} GB/s, "
          f"overhead {spec.overhead_s * 1e6:,.1f} us")
    print(lesson.where_the_weights_live(target.cfg))

    verifies = lesson.verify_steps(target, args.ks)
    print("\nverify steps, batch 1, 128 cached tokens:")
    print(lesson.verify_table(verifies, lesson.predicted_ratios(target.cfg, spec, args.ks)))

    drafts = lesson.drafts(target, draft_model)
    accepted = lesson.acceptance_runs(target, drafts)
    print("\nacceptance on the 8 held-out prompts (k = 4, one ragged batch):")
    print(lesson.acceptance_table(accepted))
    acceptance = {n: r.acceptance_rate for n, r in accepted.items()}
    unguessed = {n: r.unguessed_per_token for n, r in accepted.items()}   # rounds with no guess: plain steps
    draft_step = lesson.draft_step_seconds(draft_model)
    draft_loop = lesson.plain_step(draft_model).step_seconds
    plain_step = lesson.plain_step(target).step_seconds
    print(f"plain decode's step in its compiled loop {plain_step * 1e3:.2f} ms; as a call of its own "
          f"{verifies[0].seconds * 1e3:.2f} ms; the draft model's step as a call {draft_step * 1e3:.2f} ms, "
          f"in its loop {draft_loop * 1e3:.2f} ms")
    predicted = lesson.predicted_from_steps(verifies, plain_step, draft_step, args.ks, acceptance,
                                            draft_loop_s=draft_loop, unguessed=unguessed)
    roof = lesson.predicted_speedups(target.cfg, draft_model.cfg, spec, args.ks, acceptance, unguessed)

    timed = {n: d for n, d in drafts.items() if n != "the target itself"}
    speedups, plain_rates = {}, []
    for i in range(min(max(args.prompts, 1), len(lesson.prompts()))):
        grid = lesson.speedup_grid(target, timed, args.ks, prompt=i, repeats=args.repeats,
                                   new_tokens=args.new_tokens)
        plain_rates.append(grid.plain.tokens_per_s)
        for key in grid.runs:
            speedups.setdefault(key, []).append(grid.speedup(*key))
    print(f"\nbatch 1, {args.new_tokens} new tokens, each of {len(plain_rates)} held-out prompts: plain decode "
          f"{statistics.median(plain_rates):,.1f} tok/s (median over prompts); speed-up, median over prompts "
          "[min-max] (predicted from the measured steps / from the roofline):")
    print(f"{'k':>3}" + "".join(f"{n:>34}" for n in timed))
    for k in args.ks:
        cells = []
        for n in timed:
            s = speedups[(n, k)]
            cells.append(f"x{statistics.median(s):.2f} [{min(s):.2f}-{max(s):.2f}] "
                         f"({predicted[(n, k)]:.2f}/{roof[(n, k)]:.2f})")
        print(f"{k:>3}" + "".join(f"{c:>34}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
