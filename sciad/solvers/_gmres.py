"""`"gmres"`: restarted GMRES (lineax's `GMRES`) for general matrices, its
preconditioner (Jacobi, AMG) on the right (so that the residual it tests is the true
one). "auto"'s choice for a matrix-free operator not tagged spd."""

from __future__ import annotations

import lineax as lx

from ._iterative import lineax_solve
from ._linear import AbstractIterativeSolver


class GMRES(AbstractIterativeSolver):
    """GMRES; the adjoint of a solve with a symmetric matrix is the solve
    itself."""

    name = "gmres"
    symmetric_adjoint = True

    def preference(self, *, matrix, tags, dtype):
        return 1.0 if matrix == "operator" else None

    def krylov(self, op, u, rtol, tol, maxiter, precond):
        return lineax_solve(lx.GMRES, op, u, rtol, tol, maxiter)
