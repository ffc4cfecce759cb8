"""Dense LU and Cholesky factorizations and solves (jax.scipy.linalg), and the
1-norm condition estimate from a factorization (LAPACK, on the host).

A factor is a tuple of arrays: `(lu, piv)` for LU, `(c,)` for Cholesky
(lower triangular, `A = c c^H`). `solve(method, factor, b, transpose)` solves
`A x = b` or `A^T x = b` (plain transpose, never conjugated).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

METHODS = ("lu", "cholesky")


def factor(method: str, a) -> tuple:
    if method == "lu":
        lu, piv = jsl.lu_factor(a)
        return (lu, piv)
    return (jnp.linalg.cholesky(a),)


def solve(method: str, factor: tuple, b, transpose: bool):
    if method == "lu":
        return jsl.lu_solve(factor, b, trans=1 if transpose else 0)
    (c,) = factor
    if transpose and jnp.iscomplexobj(c):
        # A is Hermitian: A^T = conj(A), so A^T x = b  <=>  A conj(x) = conj(b)
        return jnp.conj(jsl.cho_solve((c, True), jnp.conj(b)))
    return jsl.cho_solve((c, True), b)


def ok(method: str, factor: tuple):
    """False where the factorization failed: a zero or non-finite pivot (LU,
    a singular matrix) or a breakdown (Cholesky, not positive definite)."""
    d = jnp.diagonal(factor[0])
    if method == "lu":
        return jnp.all(jnp.isfinite(d) & (d != 0))
    return jnp.all(jnp.isfinite(d) & (jnp.real(d) > 0))


def norm1(a):
    """`||a||_1`, the largest column sum of `|a|`."""
    return jnp.max(jnp.sum(jnp.abs(a), axis=0)) if a.size else jnp.zeros((), a.real.dtype)


def rcond_host(method: str, m: np.ndarray, anorm: float) -> float:
    """On the host: the reciprocal condition estimate `1 / (||A||_1
    ||A^-1||_1)` from the factor `m` (`lu`'s packed factors, or Cholesky's
    lower triangle) and `||A||_1`, by LAPACK's `xGECON` / `xPOCON` (Hager's
    method as refined by Higham: usually within a factor 3, for a few
    triangular solves, O(n^2)). 0 for a singular matrix."""
    m = np.asarray(m)
    if m.shape[0] == 0:
        return float("inf")
    if not (anorm > 0 and np.isfinite(anorm)):
        return 0.0
    con = _lapack_con(method, m.dtype)
    if method == "lu":
        rcond, info = con(m, anorm, norm="1")
    else:
        rcond, info = con(m, anorm, uplo="L")
    return float(rcond) if info == 0 else float("nan")


@functools.lru_cache(maxsize=None)
def _lapack_con(method: str, dtype):
    from scipy.linalg import lapack

    (con,) = lapack.get_lapack_funcs(("gecon" if method == "lu" else "pocon",),
                                     dtype=np.dtype(dtype))
    return con
