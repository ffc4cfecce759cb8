"""`jac="dense"`: the Jacobian by forward mode (one batched JVP), LU-factored
in the program (`sciad.solvers.nonlinear._nonlinear.dense_lu`)."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractNewtonJacobian


class DenseJacobian(AbstractNewtonJacobian):
    """A dense Jacobian, LU (`"lu"`)."""

    name = "dense"
    solver = "lu"

    def linear_solve(self, jacobian, *, pattern, x, uses, chord, start):
        return _nonlinear.dense_lu(lambda x: jacobian(x)[0], x.shape[0], x.dtype, chord=chord,
                                   start=start)

    def step_flops(self, n, jvp_flops, colors, factor_flops, solve_flops):
        return n * jvp_flops + factor_flops + solve_flops

    def temp_bytes(self, n, factor_bytes):
        return 8 * n * n
