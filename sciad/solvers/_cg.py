"""`"cg"`: conjugate gradients (lineax's `CG`) for symmetric positive definite
matrices, its preconditioner (Jacobi, AMG) on the left (CG needs it symmetric). "auto"'s
choice for a matrix-free operator tagged spd."""

from __future__ import annotations

import lineax as lx

from ._iterative import lineax_solve
from ._linear import AbstractIterativeSolver


class CG(AbstractIterativeSolver):
    """Conjugate gradients; the adjoint of a solve with a symmetric matrix is
    the solve itself."""

    name = "cg"
    left_preconditioned = True
    symmetric_adjoint = True

    def preference(self, *, matrix, tags, dtype):
        return 2.0 if matrix == "operator" and "spd" in tags else None

    def krylov(self, op, u, rtol, tol, maxiter, precond):
        return lineax_solve(lx.CG, op, u, rtol, tol, maxiter, precond=precond,
                            tags=(lx.positive_semidefinite_tag, lx.symmetric_tag))
