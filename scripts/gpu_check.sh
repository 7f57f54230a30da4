#!/usr/bin/env bash
# One prepared run on a GPU machine: the GPU-marked tests, the kernel benchmarks and the probe.
# Runs with the machine's own python3 (jax + flax, nothing installable) and PYTHONPATH=.:
#   make gpu-check           or   PYTHONPATH=. bash scripts/gpu_check.sh
# Full results go under $OUT (default ./gpu-results); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-.}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
PY="${PY:-python3}"
QUICK="${QUICK:-0}"   # QUICK=1: only the fastest parts (a rerun inside a short lease)

status=()
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, remember the exit code
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  status+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}

step env        "$PY" -m inference_lab env
step gpu_tests  "$PY" -m pytest -m gpu tests -q -p no:cacheprovider -x --junitxml="$OUT/gpu_tests.xml"
step bench      "$PY" -m pallas_kernels.bench --json "$OUT/bench.json" --force
step probe_base "$PY" -m inference_lab probe --preset base --prompt-len 2048 --batch 1,8,64,256 --new-tokens 32 --json "$OUT/probe_base.json" --force
if [ "$QUICK" != "1" ]; then
  step probe_8b "$PY" -m inference_lab probe --preset llama3_8b --prompt-len 512 --batch 1,8,64 --new-tokens 32 --json "$OUT/probe_llama3_8b.json" --force
fi

echo
echo "=== summary (logs and JSON in $OUT)"
for line in "${status[@]}"; do echo "$line"; done
"$PY" - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
bench = out / "bench.json"
if bench.exists():
    rows = json.loads(bench.read_text()).get("rows", [])
    print(f"{'kernel':<18}{'shape':<34}{'impl':<24}{'figure':>14}{'% ceiling':>11}")
    for r in rows:
        if "error" in r:
            fig, pct = "unavailable", ""
        elif r.get("bound") == "memory":
            fig, pct = f"{r['tbps']:.3f} TB/s", f"{r['pct_bandwidth']:.0f}%"
        else:
            fig, pct = f"{r['tflops']:.1f} TFLOP/s", f"{r['pct_matmul_peak']:.0f}%"
        print(f"{r['kernel']:<18}{r['shape'][:33]:<34}{r['impl'][:23]:<24}{fig:>14}{pct:>11}")
for probe in sorted(out.glob("probe_*.json")):
    p = json.loads(probe.read_text())
    pre = p["prefill"]
    print(f"{probe.stem}: prefill {pre['prefill_tokens_per_s']:.0f} tok/s (MFU {pre['mfu']}), "
          + ", ".join(f"decode b{d['batch']} {d['decode_tokens_per_s']:.0f} tok/s MBU {d['mbu']}" for d in p["decode"])
          + (f", ratio {p['ratio']:.1f}" if p.get("ratio") else ", ratio -")
          + ("" if p.get("complete", True) else " (PARTIAL)"))
PYEOF
