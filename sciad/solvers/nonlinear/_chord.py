"""`"chord"`: Newton keeping the Jacobian's factorization while each iteration
at least halves `||F||_inf`, factoring again when one does not; it may be
started with a given matrix (`jac0`)."""

from __future__ import annotations

from . import _nonlinear
from ._root_methods import AbstractRootMethod


class Chord(AbstractRootMethod):
    """The chord method: needs a Jacobian form that factors."""

    name = "chord"
    chord = True
    takes_jac0 = True

    def describe(self, jac):
        return f"the chord method ({jac} Jacobian)"

    def run(self, F, x, *, linear, tol, atol, maxiter, memory, at_floor):
        return _nonlinear.newton(F, x, linear, tol=tol, atol=atol, maxiter=maxiter,
                                 at_floor=at_floor)
