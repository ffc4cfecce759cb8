"""`jac="sparse"`: the Jacobian on the pattern detected from the body, its
values by one JVP per color, factored by SuperLU on the host
(`sciad.solvers.nonlinear._nonlinear.sparse_lu`); the node keeps the last factorization
for the derivatives' solves."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractNewtonJacobian


class SparseJacobian(AbstractNewtonJacobian):
    """A sparse Jacobian, SuperLU (`"splu"`)."""

    name = "sparse"
    sparse = True
    keeps_factor = True
    solver = "splu"

    def linear_solve(self, jacobian, *, pattern, x, uses, chord, start):
        return _nonlinear.sparse_lu(pattern, lambda x: jacobian(x)[0], x.dtype,
                                    keep=uses != 0, uses=uses, chord=chord, start=start)

    def step_flops(self, n, jvp_flops, colors, factor_flops, solve_flops):
        return colors * jvp_flops + factor_flops + solve_flops

    def temp_bytes(self, n, factor_bytes):
        return factor_bytes
