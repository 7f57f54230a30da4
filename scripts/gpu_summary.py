"""The short table `scripts/gpu_check.sh` prints last: benchmark rows and probe results.

Usage: python scripts/gpu_summary.py OUT_FOLDER   (reads bench.json and probe_*.json there)
       python scripts/gpu_summary.py --merge-junit OUT.xml PART.xml...   (the test groups' reports as one)
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def bench_lines(result: dict) -> list[str]:
    meta = result.get("meta", {})
    lines = [f"bench: {meta.get('device', '?')}, jax {meta.get('jax', '?')}, kernels {meta.get('kernel_mode', '?')}"]
    check = meta.get("timing_check")
    if check:
        lines.append(f"timing check: x{check['ratio']:.2f} in one program against one call at a time "
                     f"({check['nbytes'] / 2**20:,.0f} MiB weight); the loop costs {check['loop_cost_s'] * 1e6:.1f} us a call")
    lines.append(f"{'kernel':<17}{'shape':<36}{'impl':<24}{'figure':>15}{'of ceiling':>11}")
    for r in result.get("rows", []):
        if "error" in r:
            fig, pct = ("FAILED" if r.get("ours") else "unavailable"), ""
        elif r.get("bound") == "memory":
            fig, pct = f"{r['tbps']:.3f} TB/s", f"{r['pct_bandwidth']:.0f}%"
        else:
            fig, pct = f"{r['tflops']:.1f} TFLOP/s", f"{r['pct_matmul_peak']:.0f}%"
        lines.append(f"{r['kernel']:<17}{r['shape'][:35]:<36}{r['impl'][:23]:<24}{fig:>15}{pct:>11}")
    return lines


def probe_lines(name: str, p: dict) -> list[str]:
    pre = p["prefill"]
    ratio = "-" if p.get("ratio") is None else f"{p['ratio']:,.1f}x"
    partial = "" if p.get("complete", True) else "  (PARTIAL: " + "; ".join(
        f"batch {s['batch']}: {s['reason']}" for s in p.get("skipped", [])) + ")"
    lines = [f"{name}: {p['device']}, kernels {p['kernels']}, {p['model']['preset']} {p['model']['dtype']}: "
             f"prefill {pre['prompt_len']} tokens {pre['prefill_tokens_per_s']:,.0f} tok/s (MFU {_pct(pre['mfu'])}"
             f"{_compiled(pre)}); prefill/decode at batch 1: {ratio}{partial}"]
    for d in p["decode"]:
        lines.append(f"  decode batch {d['batch']:>4}: {d['decode_tokens_per_s']:>10,.0f} tok/s  "
                     f"{d['step_seconds'] * 1e3:8.3f} ms/step  MBU {_pct(d['mbu']):>4}  MFU {_pct(d['mfu']):>4}"
                     f"{_compiled(d)}")
    return lines


def _compiled(point: dict) -> str:
    seconds = point.get("compile_seconds")
    return "" if seconds is None else f", compiled in {seconds:,.1f} s"


def merge_junit(out: Path, parts: list[Path]) -> None:
    """The test groups' JUnit reports (run side by side) as one ``<testsuites>`` file."""
    merged = ET.Element("testsuites")
    for part in parts:
        root = ET.parse(part).getroot()
        merged.extend(root if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)


def summary(out: Path) -> str:
    lines = []
    bench = out / "bench.json"
    if bench.exists():
        lines += bench_lines(json.loads(bench.read_text()))
    for probe in sorted(out.glob("probe_*.json")):
        lines += probe_lines(probe.stem, json.loads(probe.read_text()))
    return "\n".join(lines) if lines else "(no bench.json or probe_*.json: see run.log)"


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--merge-junit":
        merge_junit(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    elif len(sys.argv) == 2:
        print(summary(Path(sys.argv[1])))
    else:
        sys.exit("usage: python scripts/gpu_summary.py OUT_FOLDER | --merge-junit OUT.xml PART.xml...")
