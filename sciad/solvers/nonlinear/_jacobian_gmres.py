"""`jac="gmres"`: matrix-free, the Jacobian's products by JVPs of the body,
solved by GMRES (`sciad.solvers.nonlinear._nonlinear.gmres`): inexact Newton steps to
`STEP_RTOL`, the derivatives' solves to `DERIVATIVE_RTOL` (tight)."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractNewtonJacobian

#: relative tolerance of Newton-Krylov's steps (inexact Newton)
STEP_RTOL = 1e-6
#: relative tolerance of the derivatives' solves (which need it tight)
DERIVATIVE_RTOL = 1e-12


class GMRESJacobian(AbstractNewtonJacobian):
    """A matrix-free Jacobian, GMRES (`"gmres"`)."""

    name = "gmres"
    matrix_free = True
    solver = "gmres"
    derivative_rtol = DERIVATIVE_RTOL

    def linear_solve(self, jacobian, *, pattern, x, uses, chord, start):
        return _nonlinear.gmres(lambda x, v: jacobian(x, v)[0], STEP_RTOL)

    def step_flops(self, n, jvp_flops, colors, factor_flops, solve_flops):
        return 20 * (jvp_flops + 10.0 * n)  # a Krylov solve of JVPs, counted as 20
