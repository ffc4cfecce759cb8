"""`"gmres"`: restarted GMRES (lineax's `GMRES`) for general matrices, its
preconditioner (Jacobi, AMG) on the right (so that the residual it tests is the true
one). "auto"'s choice for a matrix-free operator not tagged spd, and for a sparse matrix
not tagged spd where the program runs on an accelerator and no direct solver there
applies."""

from __future__ import annotations

from ._iterative import lineax_solve
from .._linear import AbstractIterativeSolver, backend


class GMRES(AbstractIterativeSolver):
    """GMRES; the adjoint of a solve with a symmetric matrix is the solve
    itself."""

    name = "gmres"
    symmetric_adjoint = True

    def preference(self, *, matrix, tags, dtype):
        if matrix == "operator":
            return 1.0
        # (a sparse matrix where the program runs on an accelerator and no
        # direct solver there applies)
        return 0.5 if matrix == "sparse" and backend() != "cpu" else None

    def krylov(self, op, u, rtol, tol, maxiter, precond):
        import lineax as lx  # (where a solve is traced: see `lineax_solve`)

        return lineax_solve(lx.GMRES, op, u, rtol, tol, maxiter)
