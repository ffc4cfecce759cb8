"""`"hybr"` and `"lm"`: globalized Newton methods that survive a singular
Jacobian (`sciad.solvers.nonlinear._nonlinear.trust_region`), SciPy's names:
Powell's dogleg in a trust region (SciPy's default `hybr`, MINPACK's
`hybrd`) and Levenberg-Marquardt (SciPy's `lm`). Both step with the dense
Jacobian (the node's `jac="dense"`), which the derivatives at the root
factor too."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractRootMethod


class _TrustRegion(AbstractRootMethod):
    jac = "dense"
    step: str
    #: SciPy's `hybr` and `lm` flatten `x0` (MINPACK's vectors): so does
    #: `sd.optimize.root` for them, and the root comes back 1-D
    flattens_x0 = True

    #: SciPy's default budget of evaluations of `fun`, per unknown plus one
    #: (`maxfev`: 200 (n + 1) for hybr, 100 (n + 1) for lm); an iteration
    #: evaluates `fun` once, rejected or not
    evaluations: int

    def default_maxiter(self, n):
        return self.evaluations * (n + 1)

    def maxiter_advice(self, maxiter):
        return (f"Raise `maxiter` (it is {maxiter}; rejected steps count as iterations), "
                "start closer to the root, or loosen `tol`.")

    def run(self, F, x, *, linear, tol, atol, maxiter, memory, at_floor):
        return _nonlinear.trust_region(F, x, linear.matrix, step=self.step, tol=tol,
                                       atol=atol, maxiter=maxiter, at_floor=at_floor)


class Hybr(_TrustRegion):
    """Powell's dogleg (a trust region), SciPy's `root(method="hybr")`."""

    name = "hybr"
    step = "dogleg"
    evaluations = 200

    def describe(self, jac):
        return "Powell's dogleg method (hybr, dense Jacobian)"


class LevenbergMarquardt(_TrustRegion):
    """Levenberg-Marquardt, SciPy's `root(method="lm")`."""

    name = "lm"
    step = "lm"
    evaluations = 100

    def describe(self, jac):
        return "Levenberg-Marquardt (lm, dense Jacobian)"
