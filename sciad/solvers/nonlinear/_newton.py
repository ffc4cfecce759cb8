"""`"newton"`: Newton's method with a backtracking line search
(`sciad.solvers.nonlinear._nonlinear.newton`), factoring the Jacobian at every iterate."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractRootMethod


class Newton(AbstractRootMethod):
    """Newton's method; the Jacobian's form is the node's `jac`."""

    name = "newton"

    def describe(self, jac):
        return f"Newton's method ({jac} Jacobian)"

    def run(self, F, x, *, linear, tol, atol, maxiter, memory, at_floor):
        return _nonlinear.newton(F, x, linear, tol=tol, atol=atol, maxiter=maxiter,
                                 at_floor=at_floor)
