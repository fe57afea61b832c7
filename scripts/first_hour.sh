#!/usr/bin/env bash
# The first hour on a GPU node (docs/gpu-nodes.md, "The first hour on a GPU node"): the preflight, the four GPU
# environments from their locks, one ReMax step of each framework on the gpu1 profile (one GPU, a ~0.5B policy) and
# the report. Run from the repository root with the harness's venv active, after setting policy.path in
# workflows/config/gpu1.yaml. `--dry-run` prints the commands instead of running them.
# Never run on a GPU yet: no GPU was at hand where it was written (tests/test_gpu_locks.py checks its dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-workflows/config/gpu1.yaml}
OUT=${OUT:-results/first-hour}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1

step() {  # step NAME COMMAND...: run it, its output in $OUT/NAME.log; stop at the first failure, naming the log
  local name=$1; shift
  echo "== $name: $*"
  [ "$DRY" = 1 ] && return 0
  mkdir -p "$OUT"
  if ! "$@" >"$OUT/$name.log" 2>&1; then
    echo "first_hour: $name failed; its output: $OUT/$name.log (last lines below)" >&2
    tail -n 20 "$OUT/$name.log" >&2
    exit 1
  fi
}

step preflight remax-bench preflight --config "$CONFIG" --out "$OUT/preflight.md"
for env in verl openrlhf dschat trl; do
  step "env-$env" remax-bench env "$env"
done
# One step per framework, seed 1 (the reference backend too): the gpu1 profile with remax.steps 1, no warm-up, as a
# second config file (Snakemake's --config reads `remax={steps: 1}` with YAML's base loader: "1" a string, which the
# schema refuses).
mkdir -p "$OUT"
printf 'remax: {steps: 1, warmup_steps: 0}\nseeds: [1]\n' >"$OUT/one-step.yaml"
step runs snakemake --cores all --configfile "$CONFIG" "$OUT/one-step.yaml"
echo "first_hour: done; the report: results/report/index.html, the logs under $OUT"
