#!/usr/bin/env bash
# One prepared run on a GPU machine, at most 5 minutes (QUICK=1: at most 2): the GPU-marked tests,
# the kernel benchmark and the probe on the base and llama3_8b shapes with a batch sweep to 256;
# then, in whatever time is left, the plain-JAX twin beside the lab (base, then llama3_8b).
# Runs with the machine's own python3 (jax + flax, nothing installable) and PYTHONPATH=.:
#   make gpu-check           or   PYTHONPATH=. bash scripts/gpu_check.sh      (QUICK=1 for a rerun)
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
PROMPT="${GPU_CHECK_PROMPT_LEN:-512}"
export PY OUT
LOG="$OUT/run.log"
: > "$LOG"

# The time plan, in seconds: each step's limit in a full run and in a QUICK=1 run (0: skipped).
# Both columns add up to the promise above (tests/test_gpu_check_script.py checks the sums). A step
# that ends early leaves its time to the twin at the end, which runs only on what is left.
PLAN="
env          15  10
gpu_tests    80  50
bench        75   0
probe_base   60  60
probe_8b     70   0
"
BUDGET=$(awk -v q="$QUICK" 'NF == 3 { s += (q == "1" ? $3 : $2) } END { print s }' <<< "$PLAN")
limit_of() { awk -v n="$1" -v q="$QUICK" '$1 == n { print (q == "1" ? $3 : $2) }' <<< "$PLAN"; }

status=()
failed=0
step() {  # step NAME COMMAND...: run within its planned limit, append to run.log, keep the exit code
  local name=$1; shift
  local limit; limit=$(limit_of "$name")
  [ -n "$limit" ] || limit=$((BUDGET - SECONDS))       # a step outside the plan: what is left
  if [ "$limit" -le 5 ]; then
    status+=("$(printf '%-12s skipped (%s)' "$name" "$([ "$limit" -eq 0 ] && echo "not in this plan" \
      || echo "no time left of the ${BUDGET}s plan")")")
    return
  fi
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s" | tee -a "$LOG"
  [ "$rc" -ne 0 ] && failed=1
  status+=("$(printf '%-12s rc=%-4s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}

# The GPU tests in three processes at once: most of their time is compiling on the host's CPUs
# (16 cores on the H200 machine), and the GPU is shared (no process may grab 75% of its memory).
gpu_tests() {
  local pids=() rc=0 i=0
  for group in "tests/test_kernels.py" "tests/test_mosaic_kernels.py tests/test_quantization.py" \
               "tests/test_generation.py tests/test_model.py tests/test_engine_loop.py"; do
    # shellcheck disable=SC2086
    XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest -m gpu $group -q -p no:cacheprovider -rs \
      --junitxml="$OUT/gpu_tests.$i.xml" > "$OUT/gpu_tests.$i.log" 2>&1 &
    pids+=($!); i=$((i + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for log in "$OUT"/gpu_tests.*.log; do cat "$log"; rm -f "$log"; done
  "$PY" scripts/gpu_summary.py --merge-junit "$OUT/gpu_tests.xml" "$OUT"/gpu_tests.*.xml && rm -f "$OUT"/gpu_tests.*.xml
  return $rc
}
export -f gpu_tests

step env        "$PY" -m inference_lab env
step gpu_tests  bash -c gpu_tests
step bench      "$PY" -m pallas_kernels.bench --quick --json "$OUT/bench.json" --force
step probe_base "$PY" -m inference_lab probe --preset "$BASE" --prompt-len "$PROMPT" --batch "$BATCHES" \
  --new-tokens 16 --repeats 3 --json "$OUT/probe_base.json" --force
step probe_8b   "$PY" -m inference_lab probe --preset "$BIG" --prompt-len "$PROMPT" --batch "$BATCHES" \
  --new-tokens 16 --repeats 3 --json "$OUT/probe_llama3_8b.json" --force
if [ "$QUICK" != "1" ]; then
  step twin_base "$PY" scripts/plain_jax_twin.py --preset "$BASE" --prompt-len "$PROMPT" --repeats 5
  step twin_8b   "$PY" scripts/plain_jax_twin.py --preset "$BIG" --prompt-len "$PROMPT" --repeats 5
fi

# A test step stopped by its limit leaves its groups' logs and reports: into run.log and one report.
for log in "$OUT"/gpu_tests.*.log; do [ -e "$log" ] && { cat "$log" >> "$LOG"; rm -f "$log"; }; done
parts=("$OUT"/gpu_tests.*.xml)
[ -e "${parts[0]}" ] && "$PY" scripts/gpu_summary.py --merge-junit "$OUT/gpu_tests.xml" "${parts[@]}" && rm -f "${parts[@]}"

{
  echo
  echo "=== steps (full output in $LOG; plan ${BUDGET}s, took ${SECONDS}s)"
  for line in "${status[@]}"; do echo "$line"; done
  "$PY" scripts/gpu_summary.py "$OUT"
} | tee "$OUT/summary.txt"
exit "$failed"
