"""The checks of a sparse direct solve in one compiled pass each: sciad's
`csrc/sparse_checks.cc`, two FFI handlers built on first use with the system
compiler (`sciad.solvers._build`), for float64 matrices on the CPU.

What a solve made in the program (klu, cholmod, spsolve) measures before
its matrix is factored (finite values, symmetry and a positive diagonal for
a claim, a zero row or column) and after each solve (backward error,
relative residual, the right-hand side's size) were XLA gathers, scatters
and reductions, several passes over the values each: 0.57 ms for the matrix
measures of a 4,096-unknown 2-D matrix, more than CHOLMOD's solve of it.
Here each is one pass in C++ (`bench/cholmod_peer.py` shows the effect).

Where the extension cannot be built (no compiler), or for another dtype
(float32, complex), or on another device, `available(...)` is False and the
callers (`sciad.primitives._linalg_run`) measure with XLA as before: the
two give the same measures, up to the order of sums.

```python
m = matrix_measures(pattern, a, symmetric=True, diagonal=True)   # dict of scalars
eta, rel, bnorm, all_nan = solve_measures(pattern, a, x, b, transpose=False)
```
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from .. import _cache
from . import _batch_split, _build
from ._indices import cached_index, pattern_cols, pattern_diagonal, pattern_transpose

SOURCE = Path(__file__).with_name("csrc") / "sparse_checks.cc"
WHAT = "sciad's sparse checks"
def _setup(lib) -> None:
    for name in ("sciad_matrix_measures", "sciad_solve_measures"):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)),
                                    platform="cpu")


_LIBRARY = _build.Library(SOURCE, "checks", "libsciad_checks.so", WHAT, _setup)


def library():
    """The loaded extension (built on first use), or None where it cannot be
    built or loaded here."""
    return _LIBRARY.get()


def available(dtype) -> bool:
    """Whether a matrix of `dtype` is measured here: float64, on the CPU, with
    the extension built."""
    if np.dtype(dtype) != np.float64:
        return False
    return _build.on_cpu() and library() is not None


def _csr(pattern):
    """The pattern's CSR arrays as the kernels read them: the cached int32
    index arrays every other reader of the pattern shares (one constant
    each in a program; `sciad.solvers._indices`)."""
    return (cached_index(pattern, "indptr", lambda: pattern.indptr), pattern_cols(pattern))


def _diagonal(pattern):
    """Each row's diagonal position, -1 where none is stored (the shared
    clamped array where every row stores one)."""
    if (pattern.diagonal_positions() >= 0).all():
        return pattern_diagonal(pattern)
    return cached_index(pattern, "diagonal or none", pattern.diagonal_positions)


def _matrix_fn(pattern, symmetric: bool, diagonal: bool):
    """The kernel's call for `pattern`, kept with its index arrays in the
    analysis cache (made again with them after a clear)."""
    return _cache.cached(pattern, "sparse checks", ("matrix", symmetric, diagonal),
                         lambda: _make_matrix_fn(pattern, symmetric, diagonal), nbytes=0)


def _make_matrix_fn(pattern, symmetric: bool, diagonal: bool):
    indptr, indices = _csr(pattern)
    tpos = pattern_transpose(pattern) if symmetric else np.zeros(0, np.int32)
    diag = _diagonal(pattern) if diagonal else np.zeros(0, np.int32)

    @custom_vmap
    def f(a):  # a: (L, nnz) -> (L, 5)
        return jax.ffi.ffi_call("sciad_matrix_measures",
                                jax.ShapeDtypeStruct((a.shape[0], 5), jnp.float64))(
            indptr, indices, a, tpos, diag)

    @f.def_vmap
    def _rule(axis_size, in_batched, a):
        (af,) = _batch_split.fold(axis_size, in_batched, [a])
        return f(af).reshape(axis_size, -1, 5), True

    return f


def matrix_measures(pattern, a, *, symmetric: bool, diagonal: bool) -> dict:
    """`nonfinite`, `asymmetry` (where `symmetric`), `min_diagonal` (where
    `diagonal`) and `zero_line` of the float64 matrix with values `a`
    (`(nnz,)`) on the square `pattern`, as `_linalg_run` measures them."""
    m = _matrix_fn(pattern, bool(symmetric), bool(diagonal))(a[None])[0]
    out = dict(nonfinite=m[0] > 0)
    if symmetric:
        out["asymmetry"] = m[1] / jnp.where(m[2] > 0, m[2], 1.0)
    if diagonal:
        out["min_diagonal"] = m[3]
    out["zero_line"] = m[4] > 0
    return out


def _solve_fn(pattern, transpose: bool):
    return _cache.cached(pattern, "sparse checks", ("solve", transpose),
                         lambda: _make_solve_fn(pattern, transpose), nbytes=0)


def _make_solve_fn(pattern, transpose: bool):
    indptr, indices = _csr(pattern)

    @custom_vmap
    def f(a, x, b):  # a: (L, nnz), x, b: (L, n, k) -> (L, 4)
        return jax.ffi.ffi_call("sciad_solve_measures",
                                jax.ShapeDtypeStruct((a.shape[0], 4), jnp.float64))(
            indptr, indices, a, x, b, transpose=transpose)

    @f.def_vmap
    def _rule(axis_size, in_batched, a, x, b):
        return f(*_batch_split.fold(axis_size, in_batched, [a, x, b])).reshape(
            axis_size, -1, 4), True

    return f


def solve_measures(pattern, a, x, b, *, transpose: bool):
    """`(backward error, relative residual, max |b|, all NaN)` of `x` for
    `op(A) x = b` (the worst column of a 2-D `b`), float64, as
    `_linalg_run._measures`; `all NaN`: whether every entry of `x` is NaN."""
    vec = x.ndim == 1
    xx, bb = (x[:, None], b[:, None]) if vec else (x, b)
    m = _solve_fn(pattern, bool(transpose))(a[None], xx[None], bb[None])[0]
    return m[0], m[1], m[2], m[3] > 0
