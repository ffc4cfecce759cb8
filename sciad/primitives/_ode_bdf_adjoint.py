"""BDF's discrete adjoint: the reverse pass of the accepted steps of
`sciad.solvers.ode._bdf`, in sciad ops, linearised at the states the
forward pass records (`states`), from its record of each step (`history`:
the step's order and the rescaling of the differences since the previous
accepted step).

A step of order `q` and size `h` (`c = h / alpha_q`) from the differences
`D'` (rescaled from the previous step's: `D' = R D`, rows past
`MAX_ORDER` kept) takes

    y_pred = sum_{i <= q} D'_i,   psi = sum_{1 <= i <= q} gamma_i D'_i / alpha_q,
    M (d + psi) = c f(t, y_pred + d)      (solved for d),
    D_{q+2} = d - D'_{q+1},  D_{q+1} = d,  then D_i += D_{i+1} for i = q, ..., 0,

so the new differences `D` are linear in `D'` and `d`, and `d` depends on
them and on `f`'s consts through the implicit equation only, at the step's
result `y = y_pred + d`. The reverse pass of a step maps the cotangent `L`
of `D` to that of the previous differences: the cumulative sums
transposed, then `lambda_d` (the rows `q + 1`, `q + 2`) through the
transposed iteration matrix at the result,

    (M - c J)^T mu = lambda_d,    J = df/dy (t, y),

whose `mu` gives `y_pred` the cotangent `c J^T mu`, `psi` the cotangent
`-M^T mu`, and `f`'s consts `c (df/dconsts)^T mu` (one VJP of the field),
and finally `R^T`. The step sizes and orders are held, as the Runge-Kutta
methods' discrete adjoint holds their step grid: this is the exact
derivative of the computed solution on its steps (to the Newton tolerance),
consistent with forward mode, and the same for a DAE (a singular `M`,
whose algebraic rows are scaled by `1 / c` as the forward pass scales
them). The first differences are `diag(1, h0) [y0, P f(t0, y0)]` (`P`:
the mass matrix's pseudo-inverse, `h0` in the first step's `R`).

Each step's transposed system is formed at its result (the field's
Jacobian by batched or colored JVPs on the forward pass's pattern) and
solved by a `linalg.solve` node: the pass is made of sciad nodes, so its
own derivatives (second order) are theirs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _ops as ops
from ..graph._autodiff import type_of, vjp_eval
from ..graph._trace import trace_flat
from ..graph import is_zero
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode._bdf import ALPHA, GAMMA, MAX_ORDER
from ..solvers._coloring import coloring
from ._jacobian import Structure, dense_jacobian, emit
from ._linalg import solve
from ._ode_adjoint import (_flat_cotangents, _unflatten_cotangents, _wanted,
                           down_the_steps)
from ._ode_field import field_at, mass_in_ops

#: the rows of the differences `D` (orders up to `MAX_ORDER`, and two more)
ROWS = MAX_ORDER + 3
#: the rows a step size change rescales
RESCALED = MAX_ORDER + 1


def _iteration_matrix(residual: Callable, y, pattern):
    """The Jacobian of `residual` (one flat array in, one out) at `y`: dense
    (batched JVPs) or sparse on `pattern` (colored JVPs)."""
    graph, _, _, captured = trace_flat(residual, (y,), closure=True, name="bdf_newton")
    args = [y] + list(captured)
    if pattern is None:
        return dense_jacobian(graph, args, 0)
    return emit(graph, args, 0, Structure(pattern, coloring(pattern), False))


def bdf_vjp(primals, outs, ct, params, ct_states=None) -> list:
    """Cotangents of `(*consts, y0)` by the discrete adjoint of the BDF steps
    taken (see the module docstring); `outs`: the node's outputs (an
    `OdeintOutputs`, with `states` and `history`); `ct`: the cotangent of
    `ys`; `ct_states`: of the states at every step, or None."""
    *consts, y0, ts = primals
    grid, marks, states, history = outs.grid, outs.marks, outs.states, outs.history
    graph = params["body"]
    n, dtype = y0.shape[0], type_of(y0).dtype
    ctypes = [type_of(c) for c in consts]
    wanted = _wanted(consts, params)
    m = len(consts)
    mass = mass_in_ops(consts, params.get("mass"), params.get("mass_pattern"), n, dtype)
    pattern = params.get("pattern") if sparse_jacobian(params.get("jac", "dense")) else None
    alpha = ops.asarray(ALPHA.astype(dtype))
    gamma = ops.asarray(np.concatenate([GAMMA, np.zeros(ROWS - GAMMA.size)]).astype(dtype))
    rows = ops.arange(ROWS)
    zeros_n = ops.zeros((n,), dtype)

    def field_vjp(t, y, v):
        """`(J^T v, (df/dconsts)^T v)` at `(t, y)` (the latter flat, wanted)."""
        _, pull = vjp_eval(graph, [*consts, t, y])
        bars = pull([v])
        return (zeros_n if is_zero(bars[-1]) else bars[-1],
                _flat_cotangents(bars[:m], ctypes, wanted, dtype))

    def back(k, L, acc):  # the reverse pass of step k, from grid[k] to grid[k + 1]
        if ct_states is not None:
            L = L + ops.where(rows[:, None] == 0, ct_states[k + 1][None], 0.0)
        record = history[k + 1]
        q = ops.astype(record[0], np.int32)
        R = ops.reshape(record[1:], (RESCALED, RESCALED))
        t = grid[k + 1]
        aq = ops.take(alpha, q)
        c = (t - grid[k]) / aq
        y = states[k + 1]
        # the cumulative sums D_i += D_{i+1} (i = q, ..., 0), transposed
        L = ops.where(rows[:, None] <= q + 1, ops.cumsum(L, axis=0), L)
        top = L[q + 2]
        lam_d = L[q + 1] + top
        L = ops.where(rows[:, None] == q + 1, -top[None],
                      ops.where(rows[:, None] == q + 2, 0.0, L))
        # mu = (M - c J)^-T lam_d at the step's result (rows scaled as the
        # forward pass's: S (M - c J), S = 1 / c on the algebraic rows)
        s = mass.scale(c)

        def residual(z):
            r = mass.apply(z) - c * field_at(graph, consts, t, z)
            return r if s is None else s * r

        A = _iteration_matrix(residual, y, pattern)
        # (checked by its backward error, in the program: no condition
        # estimate, a host call, per step)
        mu = solve(A.T if pattern is not None else ops.transpose(A), lam_d, estimate=False)
        mu = mu if s is None else s * mu
        ybar, cbar = field_vjp(t, y, c * mu)
        g = ops.where((rows >= 1) & (rows <= q), gamma, 0.0) / aq
        L = L + ops.where(rows[:, None] <= q, ybar[None], 0.0) \
            - g[:, None] * mass.apply_T(mu)[None]
        L = ops.concatenate([ops.matmul(ops.transpose(R), L[:RESCALED]), L[RESCALED:]])
        return L, (acc + ops.concatenate(cbar)) if cbar else acc

    def at_output(L, c):  # the cotangent of an output time's state, on D's first row
        return L + ops.where(rows[:, None] == 0, c[None], 0.0)

    T = ts.shape[0]
    size = sum(t.size for t, w in zip(ctypes, wanted) if w)
    L, acc = down_the_steps(back, at_output, at_output(ops.zeros((ROWS, n), dtype), ct[T - 1]),
                            ops.zeros((size,), dtype), ct, marks, params["max_steps"])
    # the first differences [y0, P f(t0, y0), 0, ...]
    ybar0, cbar0 = field_vjp(ts[0], y0, mass.start_T(L[1]))
    ybar0 = ybar0 + L[0]
    if ct_states is not None:
        ybar0 = ybar0 + ct_states[0]
    if cbar0:
        acc = acc + ops.concatenate(cbar0)
    return _unflatten_cotangents(acc, consts, wanted) + [ybar0]
