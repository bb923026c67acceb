#!/usr/bin/env bash
# The prepared GPU check (issue 19): one run on a CUDA host with no network.
#
#   bench/gpu_check.sh [--dry-run] [--quick] [--skip-install] [--wheels DIR] [--budget SECONDS]
#
# On the GPU machine (the tree sent with bench/gpu_wheels carried, see README.md "GPUs"):
#   1. installs what the image lacks from bench/gpu_wheels/ only (`make gpu-wheels` fills it
#      here: inferd's wire dependencies, tritonclient, pytest-asyncio, perf_analyzer's wheel);
#   2. runs `python -m bench --scenario gpu` (bench/scenarios/gpu.py), which runs the GPU
#      test subset (pytest -m gpu), builds the test models, measures them with perf_analyzer
#      and raw torch, does the CUDA shared memory round trip and scrapes the nv_gpu_* metrics,
#      and writes bench/results/gpu.json and bench/RESULTS.md;
#   3. copies the results and logs to $OUT (the device machine's return folder) when it is set.
# --dry-run (any host, no GPU, installs nothing): checks the wheel folder against
# bench/gpu_requirements.txt and runs the scenario's dry run (models built and checked here).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

WHEELS=bench/gpu_wheels
DRY=0 QUICK="" INSTALL=1 BUDGET=270
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --quick) QUICK=--quick ;;
    --skip-install) INSTALL=0 ;;
    --wheels) shift; WHEELS=${1:?--wheels needs a folder} ;;
    --budget) shift; BUDGET=${1:?--budget needs seconds} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$BUDGET" in ''|*[!0-9]*) echo "gpu_check.sh: --budget must be whole seconds, got '$BUDGET'" >&2; exit 2 ;; esac

PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export INFERD_GPU_BUDGET_S=$BUDGET

wheel_report() {
  # Each pinned wheel of bench/gpu_wheels.txt: present in $WHEELS or missing.
  local missing=0 name file
  while read -r line; do
    name=${line%%==*}; [ -z "$name" ] || [ "${name#\#}" != "$name" ] && continue
    file=$(ls "$WHEELS"/$(echo "$name" | tr '-' '_' )-"${line##*==}"-*.whl 2>/dev/null | head -1 || true)
    if [ -n "$file" ]; then echo "wheel ok: $(basename "$file")"; else echo "wheel missing: $line"; missing=1; fi
  done < bench/gpu_wheels.txt
  return $missing
}

if [ "$DRY" = 1 ]; then
  wheel_report || echo "(run 'make gpu-wheels' before sending the tree to the GPU machine)"
  exec "$PY" -m bench.scenarios.gpu --dry-run
fi

if [ "$INSTALL" = 1 ]; then
  wheel_report >/dev/null || { wheel_report; echo "gpu_check.sh: wheels missing in $WHEELS" >&2; exit 3; }
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-cache-dir -r bench/gpu_requirements.txt
fi

PA=$(command -v perf_analyzer || true)
if [ -z "$PA" ]; then  # the wheel's console script, where pip put it (the venv's bin may not be on PATH)
  PA=$("$PY" -c 'import os, sysconfig; p = os.path.join(sysconfig.get_path("scripts"), "perf_analyzer"); print(p if os.path.exists(p) else "")')
fi
if [ -n "$PA" ] && ! "$PA" --version >/dev/null 2>&1 && [ -x "$WHEELS/palibs/ld-linux-x86-64.so.2" ]; then
  # An older glibc than the wheel's 2.38: run it with the carried loader and libraries.
  BIN=$("$PY" -c 'import perf_analyzer, os; print(os.path.join(os.path.dirname(perf_analyzer.__file__), "bin", "perf_analyzer"))')
  PA=$PWD/bench/out/perf_analyzer_wrapped
  mkdir -p bench/out
  printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$PWD/$WHEELS/palibs/ld-linux-x86-64.so.2" \
    "$PWD/$WHEELS/palibs" "$BIN" > "$PA"
  chmod +x "$PA"
fi
[ -n "$PA" ] || { echo "gpu_check.sh: perf_analyzer is not installed (perf-analyzer wheel)" >&2; exit 3; }
export INFERD_PERF_ANALYZER=$PA
echo "perf_analyzer: $("$PA" --version 2>&1 | head -1 || echo 'does not run')"

status=0
rm -f bench/out/inferd_gpu.log bench/out/gpu_tests.xml bench/results/gpu.json  # nothing stale goes back
timeout $((BUDGET + 60)) "$PY" -m bench.bench --scenario gpu $QUICK || status=$?

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  for f in bench/results/gpu.json bench/RESULTS.md bench/out/inferd_gpu.log bench/out/gpu_tests.xml; do
    [ -f "$f" ] && cp "$f" "$OUT/" || true
  done
fi
exit $status
