"""`"bicgstab"`: BiCGStab for general matrices (`sciad.solvers.iterative._iterative.bicgstab`,
written here for its breakdowns), its preconditioner (Jacobi, AMG) on the right."""

from __future__ import annotations

from ._iterative import bicgstab
from .._linear import AbstractIterativeSolver


class BiCGStab(AbstractIterativeSolver):
    """BiCGStab; the adjoint of a solve with a symmetric matrix is the solve
    itself."""

    name = "bicgstab"
    symmetric_adjoint = True

    def krylov(self, op, u, rtol, tol, maxiter, precond):
        return bicgstab(op, u, tol, maxiter)
