"""`"cudss"`: sparse direct solves on an NVIDIA GPU with cuDSS, compiled into
the program through XLA's FFI (`sciad.solvers.direct._cudss_ffi`, C++ in
`csrc/cudss_ffi.cc`, built on first use by `_cudss_build`).

Run on an H100 and an H200 (JAX 0.11.2, CUDA 13, cuDSS 1.0.0): the GPU test
set (`pytest -m gpu`, the gpu-marked tests of tests/test_cudss.py: values,
batches, gradients, "auto" lowering to cuDSS, failures and flat memory)
passes and `bench/gpu_sparse.py` meets issue 34's targets (bench/results/
gpu_sparse_NVIDIA_H100_80GB_HBM3.md, gpu_sparse_NVIDIA_H200.md);
`bench/gpu_check.sh` runs both. On the
CPU the record's rules, batching and factor lifetime are tested through a
host stand-in of the same kernel interface (`StandIn`, KLU's kernels with a
ledger of live handles).

The record is the "klu" one's (`sciad.solvers.direct._klu.HandleSolver`): the
factor is `(handle,)`, a `uint64` the program makes and frees itself (the
`linalg.release` node placed after its last reader; a 0 handle, where the factor leaves
its program or for a single solve, factors and solves in one call); the
kernels it calls are one small object, `kernels` (analyze, factor, solve,
transposed solve, free): on a GPU, `_cudss_ffi.KERNELS`; in tests, a
stand-in (`use_kernels`). What cuDSS does:

- analysis (reordering, symbolic factorization) once per pattern and kept
  (per pooled cuDSS data object: as many as factors were live at once);
  numeric factorization per values; a solve and a transposed solve with the
  same factor (cuDSS's transpose solve mode), so a gradient factors once;
- `assume="spd"`: Cholesky; `"symmetric"`: LDL^T (real matrices; a single
  solve without a kept factor uses LU);
- batches (`sd.vmap`): one kernel call for the batch, in cuDSS's
  uniform-batch mode (one analysis, factorization and solve call for the
  batch; `SCIAD_CUDSS_BATCH=0`: a factor per example);
- a check that fails releases the factors its program made
  (`HandleSolver.release_now`; the handles carry a generation, so a second
  release, or a stale handle, is ignored or refused);
- the checks are the in-program ones of every sparse solver compiled into
  the program (`sciad.primitives._linalg_run`): non-finite values, a zero row
  or column and the structure `assume` claims before factoring; the
  backward error of every solve from one sparse product on the device
  (`product`: XLA's gather and scatter). Only where a measure is off does
  the program call the host, which refines the solution with a SuperLU
  factor, estimates the condition number and judges
  (`_sparse_direct.repair`). A factorization cuDSS reports as failed
  (`CUDSS_DATA_INFO`: a zero pivot, a Cholesky breakdown) is a value, a 0
  handle, that the program judges where it factors: `SingularMatrixError`
  (`NotPositiveDefiniteError` for `assume="spd"`) naming the node and the
  user's line, under `sd.function`, `sd.grad` and the user's own
  `jax.jit(sd.to_jax(f))` alike; a one-call solve of such a matrix is NaN,
  judged as the same breakdown. A pivot cuDSS perturbed instead shows in the
  backward error.

"auto" picks it for every sparse matrix where JAX's default backend is an
NVIDIA GPU and the extra is installed. Without an NVIDIA GPU as JAX's
default backend, without the `[cuda]` extra or without a C++ compiler,
`solver="cudss"` raises `NotSupportedError` saying how to get it, and
"auto" picks a device path instead (`sciad.solvers._linear.ranking`).

```python
x = sd.linalg.solve(A, b, solver="cudss")  # A sparse; JAX on an NVIDIA GPU
```
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import jax
import numpy as np

from ...errors import NotPositiveDefiniteError, NotSupportedError, SingularMatrixError
from .. import _batch_split
from . import _cudss_ffi, _klu_ffi
from ._klu import HandleSolver
from .._host import host_call

_kernels = [_cudss_ffi.KERNELS]


class CuDSS(HandleSolver):
    """Sparse LU / Cholesky / LDL^T by cuDSS, compiled (NVIDIA GPUs only):
    the factor is `(handle,)`, a `uint64` (0: no numeric factor; each solve
    factors). See the module docstring.

    ```python
    x = sd.linalg.solve(A, b, solver="cudss", assume="spd")  # Cholesky
    ```
    """

    name = "cudss"
    nan_on_breakdown = True  # (a one-call solve of a matrix that failed to factor: NaN)
    breakdown = (SingularMatrixError,
                 "solver 'cudss': the matrix is singular: cuDSS's factorization found a zero "
                 "pivot. Check the matrix for a null space (a missing boundary condition, a "
                 "disconnected part).", {"rcond": 0.0})

    def breakdown_for(self, tags):
        if "spd" in tags:  # (cuDSS factored it by Cholesky)
            return (NotPositiveDefiniteError,
                    "solver 'cudss': the matrix declared 'spd' is not positive definite: "
                    "cuDSS's Cholesky factorization broke down. Solve it without "
                    "`assume=\"spd\"` (LU), or check how the matrix is assembled.", {})
        return self.breakdown

    @property
    def kernels(self):
        """The kernels the record calls (`_cudss_ffi.KERNELS`, or a stand-in
        under `use_kernels`)."""
        return _kernels[-1]

    def preference(self, *, matrix, tags, dtype):
        # ("auto"'s choice for a sparse matrix where the program runs on an
        # NVIDIA GPU: 82x SuperLU on the host at 256^2, 153x at 512^2, H100)
        if matrix != "sparse" or not _cudss_ffi.gpu_backend():
            return None
        return 3.0

    def rejects(self, *, matrix, dtype, tags, shown=""):
        why = super().rejects(matrix=matrix, dtype=dtype, tags=tags, shown=shown)
        if why is not None:
            return why
        reason = self.kernels.unavailable()
        if reason is not None:
            return NotSupportedError, (
                f"solver 'cudss' is not available here: {reason}. Use 'splu' (SuperLU on the "
                "host), 'klu' (compiled, CPU) or 'spsolve' instead.")
        return None


@contextlib.contextmanager
def use_kernels(kernels):
    """Makes the "cudss" record call `kernels` (an object with
    `_klu_ffi.HandleKernels`' interface) inside the block: a host stand-in
    in tests (`StandIn()`).

    ```python
    with use_kernels(StandIn()) as k:
        sd.function(f)(d, b)   # f solves with solver="cudss"
        assert k.live() == 0
    ```
    Programs traced inside the block keep the kernels they were traced with."""
    _kernels.append(kernels)
    try:
        yield kernels
    finally:
        _kernels.remove(kernels)


class StandIn(_klu_ffi.KLUKernels):
    """A host stand-in for the cuDSS kernels: KLU's compiled kernels on the CPU
    (the same handle interface, `_klu_ffi.HandleKernels`) with a ledger of
    the handles each program makes and frees (`live()`), to test the "cudss"
    record's rules, batching and factor lifetime without a GPU. It records
    the `assume` each factorization asked for (`assumed`); KLU factors with
    LU whatever it is.

    The ledger counts a handle when it is made, in a host call the handle
    depends on (whatever reads it, a check included, runs after), and
    uncounts it when the program frees it or a failed check releases it
    (`release_now`, which cuDSS's kernels have: here it uncounts the
    handles and frees their KLU objects through the handle table, where it
    is built; a free that follows the release of a handle is not counted
    twice, and frees nothing)."""

    name = "cudss (stand-in: KLU on the host)"

    def __init__(self, transpose: str = "native"):
        self.transpose = transpose
        self._ledger: Counter = Counter()
        self._ledger_lock = threading.Lock()
        self._released: set = set()  # (released by a failed check: a free is not counted)
        self.assumed: list = []

    def _count(self, sign: int, h) -> None:
        with self._ledger_lock:
            for v in np.asarray(h).ravel().tolist():
                if not v:
                    continue
                if sign < 0 and v in self._released:
                    self._released.discard(v)
                    continue
                self._ledger[v] += sign
                if self._ledger[v] == 0:
                    del self._ledger[v]

    def _made(self, h):
        self._count(1, h)
        return (h,)

    def factor(self, pattern, a, assume=None):
        self.assumed.append(assume)
        h = super().factor(pattern, a, assume)
        (h,) = host_call(self._made, (jax.ShapeDtypeStruct(h.shape, h.dtype),), h, effect=True)
        return h

    def release_now(self, handles) -> None:
        with self._ledger_lock:
            for v in np.asarray(handles).ravel().tolist():
                if v and self._ledger.get(v, 0) > 0:
                    self._ledger[v] -= 1
                    if self._ledger[v] == 0:
                        del self._ledger[v]
                    self._released.add(v)
        if _batch_split.handles_available():  # (the KLU objects too: a second release
            self._release_from_host(handles)  # of a handle frees nothing)

    release_now.idempotent = True  # (as cuDSS's)

    def free(self, handle, after=()):
        tok = super().free(handle, after)
        jax.debug.callback(lambda h, t: self._count(-1, h), handle, tok)
        return tok

    def live(self) -> int:
        """Handles made and not freed so far (after `jax.effects_barrier()`)."""
        jax.effects_barrier()
        with self._ledger_lock:
            return sum(v for v in self._ledger.values() if v > 0)
