"""`"anderson"`: Anderson-accelerated fixed-point iteration
(`sciad.solvers.nonlinear._nonlinear.anderson`) of depth `memory` on `x = G(x)`."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractRootMethod


class Anderson(AbstractRootMethod):
    """Anderson acceleration; no Jacobian in the loop (only in the derivatives)."""

    name = "anderson"
    kind = "fixed_point"
    uses_jacobian = False

    def describe(self, jac):
        return "the Anderson-accelerated fixed-point iteration"

    def maxiter_advice(self, maxiter):
        return (f"Raise `maxiter` (it is {maxiter}); a fixed-point iteration converges only "
                "linearly, at the rate of the map's contraction.")

    def run(self, F, x, *, linear, tol, atol, maxiter, memory, at_floor):
        # the map G(x) = F(x) + x (the node's flat residual is G(x) - x)
        return _nonlinear.anderson(lambda x: F(x) + x, x, memory=memory, tol=tol, atol=atol,
                                   maxiter=maxiter, at_floor=at_floor)
