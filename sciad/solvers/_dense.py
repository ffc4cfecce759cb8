"""Dense LU and Cholesky factorizations and solves (jax.scipy.linalg).

A factor is a tuple of arrays: `(lu, piv)` for LU, `(c,)` for Cholesky
(lower triangular, `A = c c^H`). `solve(factor, b, transpose)` solves
`A x = b` or `A^T x = b` (plain transpose, never conjugated).
"""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl


def lu_factor(a):
    lu, piv = jsl.lu_factor(a)
    return (lu, piv)


def lu_solve(factor, b, transpose: bool):
    return jsl.lu_solve(factor, b, trans=1 if transpose else 0)


def lu_ok(factor):
    """False where a pivot is zero or not finite (a singular matrix)."""
    d = jnp.diagonal(factor[0])
    return jnp.all(jnp.isfinite(d) & (d != 0))


def cholesky_factor(a):
    return (jnp.linalg.cholesky(a),)


def cholesky_solve(factor, b, transpose: bool):
    (c,) = factor
    if transpose and jnp.iscomplexobj(c):
        # A is Hermitian: A^T = conj(A), so A^T x = b  <=>  A conj(x) = conj(b)
        return jnp.conj(jsl.cho_solve((c, True), jnp.conj(b)))
    return jsl.cho_solve((c, True), b)


def cholesky_ok(factor):
    """False where the factorization broke down (not positive definite)."""
    d = jnp.diagonal(factor[0])
    return jnp.all(jnp.isfinite(d) & (jnp.real(d) > 0))


FACTOR = {"lu": lu_factor, "cholesky": cholesky_factor}
SOLVE = {"lu": lu_solve, "cholesky": cholesky_solve}
OK = {"lu": lu_ok, "cholesky": cholesky_ok}
