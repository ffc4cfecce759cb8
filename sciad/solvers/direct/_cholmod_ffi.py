"""`"cholmod"`, compiled: CHOLMOD's sparse Cholesky (SuiteSparse) called
through XLA's FFI, with no Python on the per-call path: sparsax's kernels
(its `sparsax_cpp` extension, on the package index, BSD-3 with SuiteSparse
bundled) registered under sciad's names, as klujax's are for `"klu"`.

`pip install "sciad[cholmod]"` installs sparsax where it has wheels (Linux
on x86-64); elsewhere the extra installs cvxopt, and `"cholmod"` is its
host record (`sciad.solvers.direct._cholmod`). CHOLMOD's supernodal module is
GPL-licensed, so either is an optional extra of this Apache-2.0 library.

How it runs:

- One kernel: `sciad_cholmod_solve_batched_f64` (sparsax's batched solve),
  `L` matrices of one pattern and their right-hand sides in one call, given
  the pattern's entries with `row <= column`, the triangle CHOLMOD reads
  (the matrix is checked symmetric first; given every entry, sparsax's copy
  of the matrix held the lower triangle too: 300-400 MB at a million
  unknowns).
- No factor in the program: the factor value is the matrix's values (as
  `"spsolve"`'s). CHOLMOD's symbolic analysis is kept by sparsax per
  pattern (reported and cleared with sciad's analysis cache,
  `sd.config.analysis_cache_info()`), and its numeric factor per pattern
  for the last values it factored: a solve of those values (a gradient's
  adjoint solve after its forward one, the solves of one `factor` node)
  solves with it and does not factor again. So a value and gradient factors
  once, and nothing is made by the program or left for it to free: no
  handle, nothing to release on a failed check.
- A batch: `jax.vmap` folds its axes into the kernel's leading one
  (`custom_vmap`); the kernel factors each matrix in turn. (sparsax's cache
  serializes its calls, so the batch splitter gives no second thread; it
  still judges failures item by item.)
- Failure: a matrix that is not positive definite fails the kernel's
  factorization. Through sciad's batch splitter (`_batch_split`, `SOFT`) the
  failed item's solution is NaN and the call succeeds, for the program to
  judge (`nan_on_breakdown`): `NotPositiveDefiniteError` naming the node and the
  user's line. Without the splitter (no compiler) the kernel's error stops
  the program and `sciad.errors` turns its text into the same class.

Measured against sparsax's own `solve` on the same problems
(`bench/cholmod_peer.py`, value and gradient of the 2-D inverse-Poisson
misfit, each call on new values): 0.93-0.98x from 4,096 to 65,536 unknowns
and on a vmapped batch of 64 (earlier runs 0.96-1.05x: at parity; the
factorization is the time, and sciad's checks of the matrix and of each
solve are one compiled pass each, `sciad.solvers._sparse_checks`). Against
KLU on spd matrices (value and gradient, ms, this 2-core CPU): 2-D 5-point,
256 unknowns 0.16 / 0.29, 1,024: 0.51 / 0.80, 2,304: 1.4 / 2.6; 1-D
tridiagonal, 50: 0.081 / 0.094, 1,000: 0.28 / 0.37, 100,000: 18.9 / 24.3.
But a batch (`sd.vmap`) of gradients factors each matrix twice here
(CHOLMOD's cache holds one numeric factor per pattern: the adjoint batch
factors again) and on one thread (sparsax's calls hold one lock), where KLU
holds each factor for its adjoint and splits the batch over the cores: 256
gradients of 1,024 unknowns took 1.4-1.6x a Python loop of single ones with
CHOLMOD, against 0.8x with KLU (`bench/batch.py`). So "auto" keeps the host
record's rule (`CholmodChoice`): CHOLMOD from `OVER_KLU` unknowns with more
than 3 entries a row, KLU below, where batches of small systems are common.
Held factors for a batch (sparsax's factor tokens) are the way to lift that.

```python
A = sd.sparse.csr_matrix((vals, indices, indptr), shape=(n, n), tags={"spd"})
x = sd.linalg.solve(A, b, solver="cholmod")   # pip install "sciad[cholmod]"
```
"""

from __future__ import annotations

import functools
import importlib.util

import jax
import numpy as np
from jax.custom_batching import custom_vmap

from ... import _cache
from ...errors import InvalidOptionError, NotPositiveDefiniteError, register_kernel_error
from .. import _batch_split, _build
from . import _klu_ffi, _sparse_direct
from ._cholmod import CholmodChoice
from ._klu import _on_cpu
from .._indices import (cached_index, pattern_cols, pattern_matmul, pattern_rows,
                        take_static)
from .._linear import AbstractDirectSolver

#: the text of the FFI error a failed factorization raises (without the splitter)
FACTOR_FAILED = "sparsax: matrix is not positive definite"
TARGET = "sciad_cholmod_solve_batched_f64"
#: (sparsax's `MODE_A`: solve with A itself)
MODE_A = 0
#: measured cost per stored entry (ns) of one item of a batch (a 2-D 5-point
#: matrix of 1,024 unknowns: 0.25 ms a factorization and solve)
FACTOR_NS_PER_ENTRY = 50

register_kernel_error(
    FACTOR_FAILED, NotPositiveDefiniteError,
    "solver 'cholmod': CHOLMOD's Cholesky factorization broke down: the matrix is not "
    "positive definite. Solve with solver='splu' if it is only symmetric.",
    op="linalg.solve")



def installed() -> bool:
    """Whether sparsax's compiled extension is installed (found, not imported:
    `sciad/solvers/__init__.py` asks at import)."""
    return importlib.util.find_spec("sparsax_cpp") is not None


def available() -> bool:
    """Whether sparsax's compiled extension can be imported."""
    return _build.importable("sparsax_cpp")


@_build.once
def _register() -> None:
    import sparsax_cpp
    capsule = sparsax_cpp.solve_batched_f64_capsule()
    jax.ffi.register_ffi_target(TARGET, capsule, platform="cpu")
    jax.ffi.register_ffi_target(LOGDET_TARGET, sparsax_cpp.logdet_f64_capsule(), platform="cpu")
    jax.ffi.register_ffi_target(SELINV_TARGET, sparsax_cpp.selinv_f64_capsule(), platform="cpu")
    if _batch_split.library() is not None:
        _batch_split.set_inner(TARGET, capsule)
    # (sparsax keeps CHOLMOD's analyses and last numeric factor per pattern
    # itself: reported and cleared with sciad's analysis cache)
    _cache.register_external(
        "cholmod (sparsax)", lambda: {"entries": int(sparsax_cpp.cache_size()),
                                      "bytes": None}, sparsax_cpp.clear_cache)


def _solve_fn(pattern):
    """The kernel's call for `pattern`, kept in the analysis cache."""
    return _cache.cached(pattern, "cholmod calls", None, lambda: _make_solve_fn(pattern),
                         nbytes=0)  # (it reads the pattern's index arrays, counted there)


def _upper(pattern):
    """`(positions, rows, cols)` of the pattern's entries with `row <=
    column` (the triangle CHOLMOD reads: the kernels are given those
    alone), cached `(k, 1)` index arrays made once from one mask; None
    where every entry is upper."""
    def make():
        rows = pattern.row_index()
        keep = np.flatnonzero(rows <= pattern.indices)
        if keep.size == pattern.nnz:
            return None
        return (cached_index(pattern, "cholmod upper", lambda: keep),
                cached_index(pattern, "cholmod upper rows", lambda: rows[keep]),
                cached_index(pattern, "cholmod upper cols", lambda: pattern.indices[keep]))

    return _cache.cached(pattern, "index arrays", "cholmod triangle", make, nbytes=0)


def _mirror(pattern):
    """For each entry of `pattern`, the place among the upper triangle's
    (`_upper`) of its own or its mirror's, a cached index array: a selected
    inverse's values on the whole pattern (an spd matrix's pattern is
    symmetric: `sparse` refuses the tag otherwise)."""
    def make():
        upper = pattern.row_index() <= pattern.indices
        place = np.full(pattern.nnz, -1, np.int64)
        place[upper] = np.arange(int(upper.sum()))
        perm = pattern.transposed()[1]  # (entry k's mirror is entry perm[k])
        mirror = np.where(upper, place, place[perm])
        assert mirror.min(initial=0) >= 0, "an spd matrix's pattern is symmetric"
        return cached_index(pattern, "cholmod mirror", lambda: mirror)

    return _cache.cached(pattern, "index arrays", "cholmod mirror map", make, nbytes=0)


def _indices(pattern):
    """The rows and columns of the pattern's upper triangle (`_upper`) as the
    kernels read them, `(k,)` int32, in a program being traced: cached
    `(k, 1)` index arrays (`sciad.solvers._indices`; the pattern's own where
    every entry is upper, which its products and gathers read too) reshaped
    in the program, so every program of the pattern reads one pair of device
    arrays (NumPy arrays here became a new pair of constants in each
    program: at a million unknowns, 144 MiB a program, and 144 MiB more on
    the host)."""
    upper = _upper(pattern)
    if upper is None:
        return pattern_rows(pattern).reshape(-1), pattern_cols(pattern).reshape(-1)
    return upper[1].reshape(-1), upper[2].reshape(-1)


def _upper_values(pattern, a):
    """The values `a` (on `pattern`) of the upper triangle the kernels are
    given: a gather in the program (10^7 entries in a few milliseconds,
    against CHOLMOD's copy of the lower triangle it would skip: 300-400 MB
    at a million unknowns)."""
    upper = _upper(pattern)
    return a if upper is None else take_static(a, upper[0])


def _make_solve_fn(pattern):
    n = pattern.shape[0]

    @custom_vmap
    def f(ax, b):  # ax: (L, nnz), b: (L, n, k) -> x like b
        return _batch_split.split_call(
            TARGET, (*_indices(pattern), ax, b), jax.ShapeDtypeStruct(b.shape, b.dtype),
            batched=(2, 3), threads=1, handles=(-1, _batch_split.SOFT),
            mode=np.int64(MODE_A))

    @f.def_vmap
    def _rule(axis_size, in_batched, ax, b):
        axf, bf = _batch_split.fold(axis_size, in_batched, [ax, b])
        return f(axf, bf).reshape((axis_size, -1, n, b.shape[-1])), True

    return f


def solve(pattern, a, b):
    """`A x = b` for the symmetric positive definite matrix with values `a`
    on `pattern` (its upper triangle read), `b` of shape `(n,)` or `(n, k)`,
    in float64 (cast back to `b`'s dtype); NaN where the factorization broke
    down and the splitter is built (else the call fails)."""
    if pattern.shape[0] == 0:
        return b
    _register()
    out = np.result_type(a.dtype, b.dtype)
    ax = _upper_values(pattern, a.astype(np.float64))  # (the triangle CHOLMOD reads)
    bb = b.astype(np.float64)
    vec = bb.ndim == 1
    bb = bb[:, None] if vec else bb
    if bb.shape[1] == 0:
        return b
    x = _solve_fn(pattern)(ax[None], bb[None])[0]  # (one thread: no split policy)
    return (x[:, 0] if vec else x).astype(out)


class CompiledCholmod(CholmodChoice, AbstractDirectSolver):
    """Sparse Cholesky by CHOLMOD, compiled (sparsax's kernels, CPU only),
    for a real sparse matrix tagged (or assumed) spd: the factor is
    `(values,)`, and CHOLMOD's cache keeps the numeric factor of the last
    values factored (see the module docstring).

    ```python
    A = sd.sparse.coo_matrix((vals, (rows, cols)), shape=(n, n), tags={"spd"})
    x = sd.linalg.solve(A, b, solver="cholmod")   # pip install "sciad[cholmod]"
    ```
    """

    matrices = frozenset({"sparse"})
    sparse = True
    where = "device"
    nan_on_breakdown = True  # (the splitter's mark of a failed item: see `solve`)
    needs = ("sparsax's compiled CHOLMOD (`pip install \"sciad[cholmod]\"`, which installs "
             "sparsax on Linux x86-64)")

    def available(self) -> bool:
        return available() and _on_cpu()

    def rejects(self, *, matrix, dtype, tags, shown=""):
        why = super().rejects(matrix=matrix, dtype=dtype, tags=tags, shown=shown)
        if why is not None and available() and not _on_cpu():  # (installed: the device)
            return InvalidOptionError, (
                f"solver 'cholmod' runs on the CPU only, and JAX's default backend is "
                f"{jax.default_backend()!r}; use 'cudss' (NVIDIA GPUs, the [cuda] extra), "
                "'cg' with preconditioner='amg', or 'splu' (SuperLU on the host).")
        return why

    def factor_layout(self, n, dtype, pattern):
        return (((pattern.nnz,), dtype),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return (a,)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        # (A is symmetric: its transpose is itself)
        return solve(pattern, factor[0], b)

    def product(self, pattern):
        if _klu_ffi.available():  # (a compiled product: no gather or scatter to compile)
            return functools.partial(_klu_ffi.dot, pattern)
        return functools.partial(pattern_matmul, pattern)

    def rcond(self, factor, a, *, pattern=None):
        return _sparse_direct.rcond_unfactored(pattern, a.astype(np.float64)).astype(a.dtype)


# ---------------------------------------------------------------------------
# log-determinants and selected inverses (`sd.linalg.slogdet`,
# `sd.linalg.selected_inverse` of an spd matrix): sparsax's kernels, given
# the pattern's upper triangle as the solves give it, so that they read
# CHOLMOD's factor from the same per-pattern cache (a solve, its adjoint, a
# log-determinant and its gradient of one matrix factor it once; given other
# entries, they would factor again); the selected inverse's lower entries
# are their mirrors' (`_mirror`)

LOGDET_TARGET = "sciad_cholmod_logdet_f64"
SELINV_TARGET = "sciad_cholmod_selinv_f64"


def _read_factor(target: str, result, pattern, a):
    """Sparsax's kernel `target` (registered by `_register`) on the spd
    matrix with values `a` on `pattern`, given as the solves give it."""
    _register()
    call = jax.ffi.ffi_call(target, result, vmap_method="sequential")
    return call(*_indices(pattern), _upper_values(pattern, a.astype(np.float64)),
                n=np.int64(pattern.shape[0]))


def logdet(pattern, a):
    """`log det A` of the spd matrix with values `a` on `pattern` (float64;
    CHOLMOD reads its upper triangle). A matrix that is not positive
    definite stops the program (`NotPositiveDefiniteError`)."""
    if pattern.shape[0] == 0:
        return jax.numpy.zeros((), np.float64)
    return _read_factor(LOGDET_TARGET, jax.ShapeDtypeStruct((), np.float64), pattern, a)


def selinv(pattern, a):
    """`(A^-1)` at each entry of `pattern`, for the spd matrix with values `a`
    (Takahashi's recurrence on CHOLMOD's factor, sparsax's kernel)."""
    if pattern.shape[0] == 0:
        return a.astype(np.float64)
    upper = _upper(pattern)
    if upper is None:
        return _read_factor(SELINV_TARGET, jax.ShapeDtypeStruct((pattern.nnz,), np.float64),
                            pattern, a)
    values = _read_factor(SELINV_TARGET, jax.ShapeDtypeStruct((upper[0].shape[0],),
                                                              np.float64), pattern, a)
    return take_static(values, _mirror(pattern))
