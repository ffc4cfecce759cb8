"""Krylov solvers through lineax: CG, GMRES and BiCGStab on a matrix-free
`matvec`, with an optional Jacobi (diagonal) preconditioner.

`solve` returns `(x, converged, relative_residual, steps)`; it never raises.
A matrix of right-hand sides is solved column by column (`jax.vmap`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import lineax as lx

METHODS = ("cg", "gmres", "bicgstab")


def _solver(method: str, rtol: float, atol: float, maxiter: int | None):
    if method == "cg":
        return lx.CG(rtol=rtol, atol=atol, max_steps=maxiter)
    if method == "gmres":
        return lx.GMRES(rtol=rtol, atol=atol, max_steps=maxiter)
    if method == "bicgstab":
        return lx.BiCGStab(rtol=rtol, atol=atol, max_steps=maxiter)
    raise ValueError(f"unknown iterative method {method!r}")


def _solve_vector(matvec: Callable, b, method: str, rtol: float, atol: float,
                  maxiter: int | None, inv_diag):
    """Converged means `||A x - b||_2 <= rtol ||b||_2 + atol` (SciPy's test).

    lineax tests elementwise, `|r_i| <= atol + rtol |b_i|` (and the same for
    the last step against `x`), which a right-hand side with near-zero
    entries (a localized source) may never meet. Its `atol` is therefore set
    to `rtol ||b|| / sqrt(n) + atol`: meeting that elementwise test implies
    the 2-norm one."""
    struct = jax.ShapeDtypeStruct(b.shape, b.dtype)
    bnorm = jnp.linalg.norm(b)
    lx_atol = rtol * bnorm / jnp.sqrt(max(b.size, 1)) + atol
    tags = (lx.positive_semidefinite_tag, lx.symmetric_tag) if method == "cg" else ()
    op = lx.FunctionLinearOperator(matvec, struct, tags=tags)
    options = {}
    if inv_diag is not None:
        options["preconditioner"] = lx.DiagonalLinearOperator(inv_diag) if method != "cg" \
            else lx.TaggedLinearOperator(lx.DiagonalLinearOperator(inv_diag),
                                         lx.positive_semidefinite_tag)
    sol = lx.linear_solve(op, b, _solver(method, rtol, lx_atol, maxiter), options=options,
                          throw=False)
    x = sol.value
    rnorm = jnp.linalg.norm(matvec(x) - b)
    rel = rnorm / jnp.where(bnorm > 0, bnorm, 1.0)
    ok = jnp.all(jnp.isfinite(x)) & (rnorm <= rtol * bnorm + atol)
    return x, ok, rel, sol.stats["num_steps"]


def solve(matvec: Callable, b, *, method: str, rtol: float, atol: float,
          maxiter: int | None, inv_diag=None):
    """Solves `matvec(x) = b` for `b` of shape `(n,)` or `(n, k)`."""
    if b.ndim == 1:
        return _solve_vector(matvec, b, method, rtol, atol, maxiter, inv_diag)
    cols = jax.vmap(lambda col: _solve_vector(matvec, col, method, rtol, atol, maxiter,
                                              inv_diag), in_axes=1, out_axes=(1, 0, 0, 0))
    x, ok, rel, steps = cols(b)
    return x, jnp.all(ok), jnp.max(rel), jnp.max(steps)
