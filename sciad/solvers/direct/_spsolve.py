"""`"spsolve"`: `jax.experimental.sparse.linalg.spsolve` (cuSOLVER on NVIDIA
GPUs), in the program. It keeps no factor: the "factor" is the matrix's
values, and every solve factors again; it is checked in the program, and its
condition estimate factors with SuperLU on the host."""

from __future__ import annotations

from . import _sparse_direct
from .._linear import AbstractDirectSolver


class SpSolve(AbstractDirectSolver):
    """Sparse LU by `spsolve`: the factor is `(values,)`."""

    name = "spsolve"
    matrices = frozenset({"sparse"})
    sparse = True

    def factor_layout(self, n, dtype, pattern):
        return (((pattern.nnz,), dtype),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return (a,)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        return _sparse_direct.spsolve(pattern, factor[0], b, transpose)

    def rcond(self, factor, a, *, pattern=None):
        return _sparse_direct.rcond_unfactored(pattern, a)

    def factor_flops(self, n, fill):
        return fill.flops
