#!/usr/bin/env bash
# The GPU check of sciad (issues 34, 46, 52, 53), as one script: install, build the
# cuDSS extension, then its stages, each under its own time limit, and a summary of
# every target the benchmarks marked (bench/gpu_summary.py -> gpu_<device>.md):
#
#   cudss-tests  pytest -m gpu tests/test_cudss.py (cuDSS: values, batches, gradients,
#                "auto", failures, flat memory)
#   host-tests   pytest tests/test_host_budget.py (the host level of memory budgets;
#                its gpu test checks XLA's placement)
#   flagship     examples/inverse_poisson.py with solver="auto" (cuDSS on a GPU)
#   budget       bench/gpu_budget.py (the bar's case with host=, issue 52)
#   amg          bench/gpu_amg.py (device AMG against AMJax, issue 53)
#   elasticity   bench/gpu_elasticity.py (FEAX's cantilever, 349 k and 1 M DOF)
#   sparse       bench/gpu_sparse.py (its --quick sizes; FULL=1: all of them)
#   probe        bench/cudss_probe.py (the factor's diagonal, float32 factors)
#   logdet       bench/gpu_logdet.py (slogdet on the GPU)
#
# By default: cudss-tests, host-tests, budget, amg, elasticity (cuDSS at 346 k and
# 1 M DOF, AMG-CG with ELLPACK products at 346 k) and sparse --quick. From the
# stages' times on an H200 (2026-11-30) that is about 8 minutes, not yet measured as
# one run. Results under $OUT (or bench/results): gpu_check.log, the tests' logs,
# each benchmark's <name>_<device>.md and gpu_<device>.md.
#
#   bench/gpu_check.sh              # on the GPU machine, from the repository root
#   STAGES="host-tests budget amg" bench/gpu_check.sh   # some stages (in this order)
#   FULL=1 bench/gpu_check.sh       # gpu_sparse.py's full sizes (~3 minutes more)
#   SKIP_INSTALL=1 bench/gpu_check.sh   # the environment is ready (sciad importable)
#   WHEELS=/tmp/w bench/gpu_check.sh    # the small wheels are there, not in .whl/
#   TEST_TIMEOUT=200 BENCH_TIMEOUT=300 bench/gpu_check.sh   # seconds (300 / 420)
#   BENCH_ARGS="--budget 3" bench/gpu_check.sh   # more arguments of bench/gpu_sparse.py
#   ELASTICITY_ARGS="--sizes 30" bench/gpu_check.sh   # of bench/gpu_elasticity.py
#   PROBE_SIZES="64" bench/gpu_check.sh   # bench/cudss_probe.py's grids
#   bench/gpu_check.sh --prepare    # HERE, with network: wheels for an offline GPU machine
#
# Installing: with network, `pip install -e '.[cuda,test]'`. Without (the lent GPU
# machines reach nothing), from wheels in .whl/ (`--prepare` downloads them for
# Python 3.12 and CUDA 13, the GPU image's): the small ones travel in .whl/ (carry
# `.whl`), and cuDSS's wheel (161 MB, over one call's 64 MiB) in three parts
# .whl-parts/cudss.part-aa, -ab, -ac (54 MB each), each carried by its own call (carry
# `.whl-parts/cudss.part-aa`, ...) that copies it to the warm machine's /tmp:
#   mkdir -p /tmp/cudss-parts && cp .whl-parts/cudss.part-* /tmp/cudss-parts/
# This script joins /tmp/cudss-parts/* into the wheel (named in .whl/cudss.name).
# Both .whl/ and .whl-parts/ must be git-ignored (`--prepare` adds them to
# .git/info/exclude).
set -uo pipefail

PY=${PYTHON:-python3}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }

if [[ "${1:-}" == "--prepare" ]]; then
  # (run here: a machine with network)
  set -e
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
  grep -qx '/.whl-parts/' "$exclude" 2>/dev/null || echo '/.whl-parts/' >> "$exclude"
  mkdir -p .whl .whl-parts
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  $PY -m pip download --no-deps "${plat[@]}" -d .whl checkpoint_schedules pyamg klujax \
      scikit-fem amjax
  tmp=$(mktemp -d)
  $PY -m pip download --no-deps "${plat[@]}" -d "$tmp" "nvidia-cudss-cu13"
  whl=$(ls "$tmp"/nvidia_cudss_cu13-*.whl)
  (cd .whl-parts && split -n 3 "$whl" cudss.part-)
  basename "$whl" > .whl/cudss.name
  rm -rf "$tmp"
  ls -la .whl .whl-parts
  exit 0
fi

start=$(date +%s)
say "python: $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])')"
if [[ -n "${SKIP_INSTALL:-}" ]]; then
  say "SKIP_INSTALL: using what is installed (and /tmp/site, where an earlier run put wheels)"
  [[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
elif [[ -d "${WHEELS:-.whl}" ]]; then
  W=${WHEELS:-.whl}
  say "installing from $W/ (offline)"
  mkdir -p /tmp/cudss-parts /tmp/whl
  cp .whl-parts/cudss.part-* /tmp/cudss-parts/ 2>/dev/null || true
  # (cuDSS's wheel only once all three parts are there: a partial one would stop the
  # whole install; without it the cuDSS stages fail and the others run)
  if [[ $(ls /tmp/cudss-parts/cudss.part-* 2>/dev/null | wc -l) == 3 ]]; then
    name=$(cat "$W/cudss.name" 2>/dev/null || echo nvidia_cudss_cu13-1.0.0.35-py3-none-manylinux_2_17_x86_64.whl)
    cat /tmp/cudss-parts/cudss.part-* > "/tmp/whl/$name"
  fi
  shopt -s nullglob
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$W"/*.whl /tmp/whl/*.whl 2>&1 | tee -a "$LOG"
  shopt -u nullglob
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  say "pip install -e '.[cuda,test]'"
  $PY -m pip install -q -e ".[cuda,test]" 2>&1 | tail -3 | tee -a "$LOG"
fi
export PYTHONUNBUFFERED=1
# (cuDSS allocates beside JAX's pool: leave it half the device)
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}

say "JAX and the extension"
$PY - <<'EOF' 2>&1 | tee -a "$LOG"
import jax
print("devices:", jax.devices(), "backend:", jax.default_backend())
from sciad.solvers.direct import _cudss_build, _cudss_ffi
print("paths:", _cudss_build.paths())
print("built:", _cudss_build.build())
print("cuDSS version:", _cudss_build.library().sciad_cudss_version())
print("unavailable:", _cudss_ffi.KERNELS.unavailable())
EOF

STAGES=${STAGES:-cudss-tests host-tests budget amg elasticity sparse}
if [[ -n "${FULL:-}" ]]; then QUICK=; else QUICK=${QUICK:-1}; fi
has() { [[ " $STAGES " == *" $1 "* ]]; }
device=$($PY -c 'import jax; print(jax.devices()[0].device_kind.replace(" ", "_"))' 2>/dev/null)
tests_rc=0
logs=()
results=()

if has cudss-tests; then
  say "pytest -m gpu tests/test_cudss.py"
  # (the GPU tests compile with XLA's optimizations: tests/conftest.py)
  SCIAD_TEST_XLA_OPT=1 timeout ${TEST_TIMEOUT:-300} $PY -m pytest -q -m gpu tests/test_cudss.py \
    -p no:cacheprovider -ra 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  rc=${PIPESTATUS[0]}; tests_rc=$(( tests_rc || rc )); logs+=("$OUT/gpu_tests.log")
  say "pytest -m gpu tests/test_cudss.py: exit $rc"
  # (what a failed transposed-solve mode would need: rerun with SCIAD_CUDSS_TRANSPOSE=refactor)
  if grep -q "cudssExecute(SOLVE)" "$OUT/gpu_tests.log"; then
    say "a solve failed in cuDSS: rerunning the GPU tests with SCIAD_CUDSS_TRANSPOSE=refactor"
    SCIAD_CUDSS_TRANSPOSE=refactor timeout 120 $PY -m pytest -q -m gpu tests/test_cudss.py \
      -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_refactor.log" | tail -15
  fi
fi

if has host-tests; then
  say "pytest tests/test_host_budget.py (with its gpu test)"
  SCIAD_TEST_XLA_OPT=1 timeout ${TEST_TIMEOUT:-300} $PY -m pytest -q -m "gpu or not gpu" \
    tests/test_host_budget.py -p no:cacheprovider -ra 2>&1 | tee "$OUT/host_tests.log" | tail -25
  rc=${PIPESTATUS[0]}; tests_rc=$(( tests_rc || rc )); logs+=("$OUT/host_tests.log")
  say "host budget tests: exit $rc"
fi

if has flagship; then
  say "the flagship example with solver='auto' (cuDSS on a GPU; 128 x 128, 30 iterations)"
  timeout 90 $PY examples/inverse_poisson.py --n 128 --maxiter 30 --plot '' --solver auto \
    2>&1 | tee -a "$LOG" | tail -8
  say "flagship example: exit ${PIPESTATUS[0]}"
fi

if has budget; then
  say "bench/gpu_budget.py (the bar's case with host=)"
  timeout ${BUDGET_TIMEOUT:-240} $PY bench/gpu_budget.py --out "$OUT" 2>&1 | tee -a "$LOG" | tail -20
  say "budget: exit ${PIPESTATUS[0]}"
  results+=("$OUT/gpu_budget_$device.md")
fi

if has amg; then
  say "bench/gpu_amg.py (device AMG against AMJax)"
  timeout ${AMG_TIMEOUT:-240} $PY bench/gpu_amg.py --out "$OUT" 2>&1 | tee -a "$LOG" | tail -30
  say "amg: exit ${PIPESTATUS[0]}"
  results+=("$OUT/gpu_amg_$device.md")
fi

if has elasticity; then
  ELASTICITY_ARGS=${ELASTICITY_ARGS:---sizes 30,43 --variants cudss,amg-ell --repeats 2}
  say "bench/gpu_elasticity.py ${ELASTICITY_ARGS}"
  timeout ${ELASTICITY_TIMEOUT:-360} $PY bench/gpu_elasticity.py --out "$OUT" ${ELASTICITY_ARGS} \
    2>&1 | tee -a "$LOG" | tail -30
  say "elasticity: exit ${PIPESTATUS[0]}"
  results+=("$OUT/gpu_elasticity_$device.md")
fi

if has probe; then
  say "bench/cudss_probe.py ${PROBE_SIZES-64 100} (the factor's diagonal; float32 factors)"
  timeout ${PROBE_TIMEOUT:-180} $PY bench/cudss_probe.py ${PROBE_SIZES-64 100} --out "$OUT" \
    2>&1 | tail -45 | tee -a "$LOG"
  say "probe: exit ${PIPESTATUS[0]}"
fi

if has logdet; then
  say "bench/gpu_logdet.py (slogdet, auto and slq, GPU and its CPU)"
  timeout ${LOGDET_TIMEOUT:-150} $PY bench/gpu_logdet.py --write 2>&1 | tail -12 | tee -a "$LOG"
  say "logdet: exit ${PIPESTATUS[0]}"
  cp bench/results/gpu_logdet_*.md "$OUT"/ 2>/dev/null || true
fi

bench_rc=0
if has sparse; then
  say "bench/gpu_sparse.py ${QUICK:+--quick} ${BENCH_ARGS:-}"
  timeout ${BENCH_TIMEOUT:-420} $PY bench/gpu_sparse.py ${QUICK:+--quick} ${BENCH_ARGS:-} 2>&1 \
    | tee -a "$LOG" | tail -60
  bench_rc=${PIPESTATUS[0]}
  cp bench/results/gpu_sparse_*.md "$OUT"/ 2>/dev/null || true
  results+=("$OUT/gpu_sparse_$device.md")
  say "gpu_sparse: exit $bench_rc"
fi

say "summary (bench/gpu_summary.py)"
$PY bench/gpu_summary.py --device "${device//_/ }" --out "$OUT" --tests "${logs[@]}" \
  -- "${results[@]}" 2>&1 | tail -40 | tee -a "$LOG"
say "total $(( $(date +%s) - start )) s"
exit $(( tests_rc != 0 || bench_rc != 0 ))
