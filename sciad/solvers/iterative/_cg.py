"""`"cg"`: conjugate gradients (lineax's `CG`) for symmetric positive definite
matrices, its preconditioner (Jacobi, AMG) on the left (CG needs it symmetric). "auto"'s
choice for a matrix-free operator tagged spd, and for a sparse spd matrix (with AMG)
where the program runs on an accelerator and no direct solver there applies."""

from __future__ import annotations

from ._iterative import lineax_solve
from .._linear import AbstractIterativeSolver, backend


class CG(AbstractIterativeSolver):
    """Conjugate gradients; the adjoint of a solve with a symmetric matrix is
    the solve itself."""

    name = "cg"
    left_preconditioned = True
    symmetric_adjoint = True
    # (CG breaks down on an indefinite or nonsymmetric matrix, or with a
    # preconditioner that is not spd: the residual check catches it)
    convergence_hint = (" CG needs a symmetric positive definite matrix (and preconditioner): "
                        "for an indefinite or nonsymmetric one use solver='gmres'.")

    def preference(self, *, matrix, tags, dtype):
        if "spd" not in tags:
            return None
        if matrix == "operator":
            return 2.0
        # (a sparse matrix where the program runs on an accelerator and no
        # direct solver there applies: preconditioned by AMG, `linalg.solve`)
        return 1.0 if matrix == "sparse" and backend() != "cpu" else None

    def krylov(self, op, u, rtol, tol, maxiter, precond):
        import lineax as lx  # (where a solve is traced: see `lineax_solve`)

        return lineax_solve(lx.CG, op, u, rtol, tol, maxiter, spd=True, precond=precond)
