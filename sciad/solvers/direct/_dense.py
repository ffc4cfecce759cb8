"""Helpers of the dense direct solvers (`_lu.py`, `_cholesky.py`): the matrix
1-norm, and LAPACK's 1-norm condition estimate from a factorization, on the
host."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np


def norm1(a):
    """`||a||_1`, the largest column sum of `|a|`."""
    return jnp.max(jnp.sum(jnp.abs(a), axis=0)) if a.size else jnp.zeros((), a.real.dtype)


def rcond_lapack(routine: str, m: np.ndarray, anorm: float, **kw) -> float:
    """On the host: the reciprocal condition estimate `1 / (||A||_1
    ||A^-1||_1)` from the factor `m` and `||A||_1`, by LAPACK's `routine`
    (`"gecon"` from LU's packed factors, `"pocon"` from Cholesky's lower
    triangle: Hager's method as refined by Higham, usually within a factor 3,
    for a few triangular solves, O(n^2)). 0 for a singular matrix."""
    m = np.asarray(m)
    if m.shape[0] == 0:
        return float("inf")
    if not (anorm > 0 and np.isfinite(anorm)):
        return 0.0
    rcond, info = _lapack(routine, m.dtype)(m, anorm, **kw)
    return float(rcond) if info == 0 else float("nan")


@functools.lru_cache(maxsize=None)
def _lapack(routine: str, dtype):
    from scipy.linalg import lapack  # (SciPy's LAPACK wrappers load in ~0.1 s: when first used)

    (con,) = lapack.get_lapack_funcs((routine,), dtype=np.dtype(dtype))
    return con
