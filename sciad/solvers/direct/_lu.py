"""`"lu"`: dense LU with partial pivoting (`jax.scipy.linalg`), in the program.
"auto"'s choice for a dense matrix that is not tagged spd."""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from ._dense import rcond_lapack
from .._linear import AbstractDirectSolver


class LU(AbstractDirectSolver):
    """Dense LU: the factor is `(lu, piv)`, LAPACK's packed factors."""

    name = "lu"
    matrices = frozenset({"dense"})

    def preference(self, *, matrix, tags, dtype):
        return 1.0 if matrix == "dense" else None

    def factor_layout(self, n, dtype, pattern):
        return (((n, n), dtype), ((n,), np.int32))

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        lu, piv = jsl.lu_factor(a)
        return (lu, piv)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        return jsl.lu_solve(tuple(factor), b, trans=1 if transpose else 0)

    def ok(self, factor):
        # a zero or non-finite pivot: a singular matrix
        d = jnp.diagonal(factor[0])
        return jnp.all(jnp.isfinite(d) & (d != 0))

    def rcond_host(self, m, anorm):
        return rcond_lapack("gecon", m, anorm, norm="1")

    def factor_flops(self, n, fill):
        return 2.0 / 3.0 * n ** 3
