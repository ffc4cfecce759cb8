"""`jac="klu"`: the Jacobian on the pattern detected from the body, its values
by one JVP per color (as `jac="sparse"`), factored and solved by KLU compiled
into the program (the CPU), one call per Newton iteration: no host call and
no factorization kept. The derivatives' solves factor the Jacobian at the
root again (KLU, in the program: `linalg.solve`).

Where a root's Newton iterations are many small host calls (`"sparse"`'s
SuperLU: one each), this is the faster choice on the CPU: the replayed
stages of an ESDIRK method's discrete adjoint take it, and Radau's where its
reverse pass is differentiated again (`sciad.primitives._ode_replay`).
"""

from __future__ import annotations

import jax.numpy as jnp

from ...errors import InvalidOptionError
from ..direct import _klu_ffi
from ..direct._klu import _on_cpu
from . import _nonlinear
from ._jacobian_sparse import SparseJacobian


def usable() -> bool:
    """Whether KLU's compiled kernels run here (klujax installed, the CPU)."""
    return _klu_ffi.available() and _on_cpu()


def klu_lu(pattern, values, dtype, *, chord: bool = False, start=None):
    """A `LinearSolve` for Newton: `J(x)` on `pattern`, its values from
    `values(x)` (CSR order), factored and solved in one KLU call per
    iteration (a singular matrix gives NaN: a failed step). With `chord`, an
    iteration not asked for a `fresh` factor solves with the values last
    factored (factored again: no factor outlives its call), at first those
    of `start` where given, so the iterates are the chord method's."""
    kernels = _klu_ffi.KERNELS
    none = jnp.zeros((), jnp.uint64)

    def solve(x, r, aux, fresh):
        data = jnp.where(fresh, values(x), aux) if chord else values(x)
        d = kernels.solve(pattern, none, data, r, False)
        return d, jnp.all(jnp.isfinite(d)), data if chord else aux

    init = (start if start is not None else jnp.zeros((pattern.nnz,), dtype)) if chord else 0
    return _nonlinear.LinearSolve(solve, "KLU", init, chord=chord, started=start is not None)


class KLUJacobian(SparseJacobian):
    """A sparse Jacobian, KLU in the program (`"klu"`; the CPU): `"sparse"`'s
    Jacobian and costs, another factorization."""

    name = "klu"
    keeps_factor = False
    solver = "klu"

    def linear_solve(self, jacobian, *, pattern, x, uses, chord, start):
        if not usable():
            raise InvalidOptionError(
                "jac='klu' factors with KLU compiled into the program, which runs on the CPU "
                "with klujax installed; use jac='sparse' (SuperLU on the host) instead.",
                op="optimize.root")
        return klu_lu(pattern, lambda x: jacobian(x)[0], x.dtype, chord=chord, start=start)
