#!/usr/bin/env bash
# The GPU check of sciad's "cudss" solver (issues 34, 46), as one script: install,
# build the extension, run the GPU test set (`pytest -m gpu`), the flagship with
# "auto", the cuDSS probe (bench/cudss_probe.py), slogdet on the GPU
# (bench/gpu_logdet.py) and the benchmark (bench/gpu_sparse.py). About 6 minutes
# with QUICK=1 on an H200; results under $OUT (or bench/results): gpu_tests.log,
# gpu_sparse_<device>.md, cudss_probe_<device>.md, gpu_logdet_<device>.md, gpu_check.log.
#
#   bench/gpu_check.sh              # on the GPU machine, from the repository root
#   QUICK=1 bench/gpu_check.sh      # the benchmark's --quick sizes (~3 minutes less)
#   SKIP_INSTALL=1 bench/gpu_check.sh   # the environment is ready (sciad importable)
#   WHEELS=/tmp/w bench/gpu_check.sh    # the small wheels are there, not in .whl/
#   TEST_TIMEOUT=200 BENCH_TIMEOUT=300 bench/gpu_check.sh   # seconds (300 / 420)
#   BENCH_ARGS="--budget 3" bench/gpu_check.sh   # more arguments of bench/gpu_sparse.py
#   PROBE_SIZES="64" bench/gpu_check.sh   # bench/cudss_probe.py's grids ("": none)
#   NO_LOGDET=1 bench/gpu_check.sh      # without bench/gpu_logdet.py
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
      scikit-fem
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
  say "SKIP_INSTALL: using what is installed"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
elif [[ -d "${WHEELS:-.whl}" ]]; then
  W=${WHEELS:-.whl}
  say "installing from $W/ (offline)"
  mkdir -p /tmp/cudss-parts /tmp/whl
  cp .whl-parts/cudss.part-* /tmp/cudss-parts/ 2>/dev/null || true
  if ls /tmp/cudss-parts/cudss.part-* >/dev/null 2>&1; then
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

say "pytest -m gpu"
# (the GPU tests compile with XLA's optimizations: tests/conftest.py)
export SCIAD_TEST_XLA_OPT=1
timeout ${TEST_TIMEOUT:-300} $PY -m pytest -q -m gpu tests/test_cudss.py -p no:cacheprovider -ra 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}
say "pytest -m gpu: exit $tests_rc"

# (what a failed transposed-solve mode would need: rerun with SCIAD_CUDSS_TRANSPOSE=refactor)
if grep -q "cudssExecute(SOLVE)" "$OUT/gpu_tests.log"; then
  say "a solve failed in cuDSS: rerunning the GPU tests with SCIAD_CUDSS_TRANSPOSE=refactor"
  SCIAD_CUDSS_TRANSPOSE=refactor timeout 120 $PY -m pytest -q -m gpu tests/test_cudss.py \
    -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_refactor.log" | tail -15
fi

say "the flagship example with solver='auto' (cuDSS on a GPU; 128 x 128, 30 iterations)"
timeout 90 $PY examples/inverse_poisson.py --n 128 --maxiter 30 --plot '' --solver auto \
  2>&1 | tee -a "$LOG" | tail -8
say "flagship example: exit ${PIPESTATUS[0]}"

if [[ -n "${PROBE_SIZES-64 100}" ]]; then
  say "bench/cudss_probe.py ${PROBE_SIZES-64 100} (the factor's diagonal; float32 factors)"
  timeout ${PROBE_TIMEOUT:-180} $PY bench/cudss_probe.py ${PROBE_SIZES-64 100} --out "$OUT" \
    2>&1 | tail -45 | tee -a "$LOG"
  say "probe: exit ${PIPESTATUS[0]}"
fi

if [[ -z "${NO_LOGDET:-}" ]]; then
  say "bench/gpu_logdet.py (slogdet, auto and slq, GPU and its CPU)"
  timeout ${LOGDET_TIMEOUT:-150} $PY bench/gpu_logdet.py --write 2>&1 | tail -12 | tee -a "$LOG"
  say "logdet: exit ${PIPESTATUS[0]}"
  cp bench/results/gpu_logdet_*.md "$OUT"/ 2>/dev/null || true
fi

say "bench/gpu_sparse.py ${QUICK:+--quick} ${BENCH_ARGS:-}"
timeout ${BENCH_TIMEOUT:-420} $PY bench/gpu_sparse.py ${QUICK:+--quick} ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG" | tail -60
bench_rc=${PIPESTATUS[0]}
cp bench/results/gpu_sparse_*.md "$OUT"/ 2>/dev/null || true
say "benchmark: exit $bench_rc; total $(( $(date +%s) - start )) s"
exit $(( tests_rc != 0 || bench_rc != 0 ))
