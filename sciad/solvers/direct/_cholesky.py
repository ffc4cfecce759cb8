"""`"cholesky"`: dense Cholesky (`A = c c^H`, `c` lower triangular), in the
program. "auto"'s choice for a dense matrix tagged spd; it reads one triangle,
and breaks down (`NotPositiveDefiniteError`) where the matrix is not positive
definite."""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ...errors import NotPositiveDefiniteError, ShapeError
from ._dense import rcond_lapack
from .._linear import AbstractDirectSolver


class Cholesky(AbstractDirectSolver):
    """Dense Cholesky: the factor is `(c,)`."""

    name = "cholesky"
    matrices = frozenset({"dense"})
    breakdown = (NotPositiveDefiniteError,
                 "the Cholesky factorization broke down: the matrix is not positive "
                 "definite. Solve with solver='lu' if it is only symmetric.", {})

    def preference(self, *, matrix, tags, dtype):
        return 2.0 if matrix == "dense" and "spd" in tags else None

    def rejects(self, *, matrix, dtype, tags, shown=""):
        why = super().rejects(matrix=matrix, dtype=dtype, tags=tags, shown=shown)
        if why is None and jnp.dtype(dtype).kind == "c" and not {"hermitian", "spd"} & tags:
            return ShapeError, ("a complex Cholesky solve needs a Hermitian positive definite "
                                "matrix (tag it `spd`).")
        return why

    def factor_layout(self, n, dtype, pattern):
        return (((n, n), dtype),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return (jnp.linalg.cholesky(a),)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        (c,) = factor
        if transpose and jnp.iscomplexobj(c):
            # A is Hermitian: A^T = conj(A), so A^T x = b  <=>  A conj(x) = conj(b)
            return jnp.conj(jsl.cho_solve((c, True), jnp.conj(b)))
        return jsl.cho_solve((c, True), b)

    def ok(self, factor):
        # a breakdown: not positive definite
        d = jnp.diagonal(factor[0])
        return jnp.all(jnp.isfinite(d) & (jnp.real(d) > 0))

    def rcond_host(self, m, anorm):
        return rcond_lapack("pocon", m, anorm, uplo="L")

    def factor_flops(self, n, fill):
        return 1.0 / 3.0 * n ** 3
