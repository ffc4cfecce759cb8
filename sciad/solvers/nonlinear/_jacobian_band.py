"""`jac="band"`: the Jacobian on the pattern detected from the body, its
values by one JVP per color (as `jac="sparse"`), where that pattern is a
narrow band (`sciad.solvers.direct._band.Band.of`: a method of lines in one
space dimension, or one after a reverse Cuthill-McKee ordering), factored
by sciad's banded LU compiled into the program (the CPU). Its factor is two
plain arrays, so the chord method keeps it over its iterations: one
factorization per root, where `"klu"` factors at every iteration (KLU's
factor does not outlive its call). The derivatives' solves factor the
Jacobian at the root again, by KLU in the program (`linalg.solve`), or
SuperLU where klujax is not installed.

The replayed implicit stages of the ODE solvers' discrete adjoints take it
where their pattern is a band (`sciad.primitives._ode_replay._stage_jac`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...errors import InvalidOptionError
from ..direct import _band
from . import _jacobian_klu, _nonlinear
from ._jacobian_sparse import SparseJacobian


def usable(pattern, dtype) -> bool:
    """Whether `pattern` (square) is a narrow band that the banded LU
    factors here, for values of `dtype`."""
    return _band.usable(dtype) and _band.Band.of(pattern) is not None


def band_lu(pattern, values, dtype, *, chord: bool = False, start=None) -> _nonlinear.LinearSolve:
    """A `LinearSolve` for Newton: `J(x)` on `pattern` (a narrow band), its
    values from `values(x)` (CSR order), factored by the banded LU in the
    program (a singular matrix gives NaN: a failed step). With `chord`, an
    iteration not asked for a `fresh` factor solves with the factor kept
    from the last that was (at first that of `start`, where given), so the
    iterates are the chord method's."""
    band = _band.Band.of(pattern)

    def solve(x, r, aux, fresh):
        if chord:
            lu = jax.lax.cond(fresh, lambda: band.factor(values(x)), lambda: aux)
        else:
            lu = band.factor(values(x))
        d = band.solve(lu, r).astype(r.dtype)
        return d, jnp.all(jnp.isfinite(d)), lu if chord else aux

    init = 0
    if chord:  # (a factor's arrays: of `start`, or a blank one the first iteration replaces)
        init = band.factor(start if start is not None else jnp.zeros((pattern.nnz,), dtype))
    return _nonlinear.LinearSolve(solve, "banded LU", init, chord=chord,
                                  started=chord and start is not None)


class BandJacobian(SparseJacobian):
    """A sparse Jacobian whose pattern is a narrow band, factored by the
    banded LU in the program (`"band"`; the CPU)."""

    name = "band"
    keeps_factor = False

    @property
    def solver(self) -> str:
        return "klu" if _jacobian_klu.usable() else "splu"

    def linear_solve(self, jacobian, *, pattern, x, uses, chord, start):
        if not usable(pattern, x.dtype):
            raise InvalidOptionError(
                f"jac='band' factors with sciad's banded LU, which needs a narrow band (at "
                f"most {_band.MAX_WIDTH} sub- plus superdiagonals, as it is or after a "
                f"reverse Cuthill-McKee ordering) and the CPU; the root's Jacobian pattern "
                f"({pattern.shape[0]} unknowns, {pattern.nnz} entries) is not one, or the "
                f"banded LU does not run here. Use jac='klu' or jac='sparse'.",
                op="optimize.root")
        return band_lu(pattern, lambda x: jacobian(x)[0], x.dtype, chord=chord, start=start)
