#!/usr/bin/env bash
# One prepared run on a GPU machine (at most ~8 minutes): the GPU-marked tests, the kernel
# benchmark and the probe on the base and llama3_8b shapes with a batch sweep to 256.
# Runs with the machine's own python3 (jax + flax, nothing installable) and PYTHONPATH=.:
#   make gpu-check           or   PYTHONPATH=. bash scripts/gpu_check.sh
# Results go under $OUT (default ./gpu-results), at most 8 files: run.log (every step's output),
# gpu_tests.xml, bench.json, probe_base.json, probe_llama3_8b.json, summary.txt.
# The summary table is printed last. Exit code 1 if any step failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-.}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
PY="${PY:-python3}"
QUICK="${QUICK:-0}"              # QUICK=1: tests and the base probe only (a rerun in a short lease)
BASE="${GPU_CHECK_BASE:-base}"   # presets, overridable to rehearse the script on a CPU with "tiny"
BIG="${GPU_CHECK_BIG:-llama3_8b}"
BATCHES="${GPU_CHECK_BATCHES:-1,8,64,256}"
LOG="$OUT/run.log"
: > "$LOG"

status=()
failed=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, append to run.log, keep the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s" | tee -a "$LOG"
  [ "$rc" -ne 0 ] && failed=1
  status+=("$(printf '%-12s rc=%-4s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}

step env       20  "$PY" -m inference_lab env
step gpu_tests 130 "$PY" -m pytest -m gpu tests -q -p no:cacheprovider -rs --junitxml="$OUT/gpu_tests.xml"
if [ "$QUICK" != "1" ]; then
  step bench   150 "$PY" -m pallas_kernels.bench --json "$OUT/bench.json" --force
fi
step probe_base 80 "$PY" -m inference_lab probe --preset "$BASE" --prompt-len 512 --batch "$BATCHES" \
  --new-tokens 16 --repeats 3 --json "$OUT/probe_base.json" --force
if [ "$QUICK" != "1" ]; then
  step probe_8b 100 "$PY" -m inference_lab probe --preset "$BIG" --prompt-len 512 --batch "$BATCHES" \
    --new-tokens 16 --repeats 3 --json "$OUT/probe_llama3_8b.json" --force
fi

{
  echo
  echo "=== steps (full output in $LOG)"
  for line in "${status[@]}"; do echo "$line"; done
  "$PY" scripts/gpu_summary.py "$OUT"
} | tee "$OUT/summary.txt"
exit "$failed"
