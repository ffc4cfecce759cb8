"""BDF's discrete derivatives: the reverse pass (the discrete adjoint,
`bdf_vjp`) and the forward pass (`bdf_jvp`, the same linearisation
transposed) of the accepted steps of
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

The reverse pass is one `ode.bdf_adjoint` node (`bdf_vjp`), lowered to one
JAX loop down the recorded steps (`sciad.solvers.ode._bdf_adjoint`) that
factors each step's own matrix where that is cheap (a narrow band, a small
dense matrix) and else keeps a factorization over steps to precondition
an iteration on the exact one. Its reference, the same pass in sciad ops
(`_in_ops`: each step's transposed system formed at its result, the field's
Jacobian by batched or colored JVPs on the forward pass's pattern, and
solved by a `linalg.solve` node), gives the node its derivative rules
(second order), as Radau's nodes have theirs. The forward pass (`bdf_jvp`)
stays in sciad ops.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _ops as ops
from ..errors import ConvergenceError, NonFiniteError
from ..graph import Param, Primitive, Site, TensorType, Zero, is_zero
from ..graph._cost import Cost, _si
from ..graph._autodiff import jvp_eval, type_of, vjp_eval
from ..graph._trace import trace_flat
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode import _bdf_adjoint
from ..solvers.ode._bdf import HISTORY
from ..solvers.ode._radau_adjoint import NONFINITE
from ..solvers._coloring import coloring
from ._jacobian import Structure, dense_jacobian, emit
from ._checks import check, tie
from ._linalg import solve
from ._ode_adjoint import (_flat_cotangents, _unflatten_cotangents, _wanted,
                           down_the_steps, up_the_steps)
from ._ode_field import field_at, mass_in_ops, summed
from ._ode_radau_adjoint import _STEPS_PARAMS, _def_rules, _field_of, bind_adjoint
from ._ode_replay import RESCALED, ROWS, bdf_psi_weights, bdf_rescaled, bdf_start, bdf_updated



def _iteration_matrix(residual: Callable, y, pattern):
    """The Jacobian of `residual` (one flat array in, one out) at `y`: dense
    (batched JVPs) or sparse on `pattern` (colored JVPs)."""
    graph, _, _, captured = trace_flat(residual, (y,), closure=True, name="bdf_newton")
    args = [y] + list(captured)
    if pattern is None:
        return dense_jacobian(graph, args, 0)
    return emit(graph, args, 0, Structure(pattern, coloring(pattern), False))


class _Steps:
    """What BDF's discrete derivatives read of the steps a node took (its
    `outs`: an `OdeintOutputs` with `states` and `history`), in sciad ops:
    both passes, forward and reverse, linearise step `k` (from `grid[k]` to
    `grid[k + 1]`) alike (`at`)."""

    def __init__(self, primals, outs, params):
        *self.consts, self.y0, self.ts = primals
        self.grid, self.states, self.history = outs.grid, outs.states, outs.history
        self.graph = params["body"]
        self.n, self.dtype = self.y0.shape[0], type_of(self.y0).dtype
        self.mass = mass_in_ops(self.consts, params.get("mass"), params.get("mass_pattern"),
                                self.n, self.dtype)
        self.pattern = params.get("pattern") if sparse_jacobian(params.get("jac", "dense")) \
            else None
        self.rows = ops.arange(ROWS)

    def at(self, k):
        """Step `k`: `(q, R, t, c, g, y, s, A)`, its order, the rescaling of
        the differences before it, its time and `c = h / alpha_q`, the
        weights `g` of `psi = g D` (`bdf_psi_weights`), its result `y`, the
        rows' scaling `s` (None: none) and the iteration matrix `A = S (M -
        c J)` at `(t, y)`."""
        record = self.history[k + 1]
        q = ops.astype(record[0], np.int32)
        R = ops.reshape(record[1:], (RESCALED, RESCALED))
        t = self.grid[k + 1]
        g, aq = bdf_psi_weights(q, self.dtype)
        c = (t - self.grid[k]) / aq
        y = self.states[k + 1]
        s = self.mass.scale(c)
        graph, consts, mass = self.graph, self.consts, self.mass

        def residual(z):
            r = mass.apply(z) - c * field_at(graph, consts, t, z)
            return r if s is None else s * r

        return q, R, t, c, g, y, s, _iteration_matrix(residual, y, self.pattern)


def bdf_jvp(primals, tangents, outs, params):
    """The tangents of the states at every step, `(max_steps + 1, N)`, and at
    the output times, `(len(ts), N)`, by the discrete forward sensitivity of
    the BDF steps taken (the transpose of `bdf_vjp`'s pass, on the same
    steps: see the module docstring): `tangents`, those of `(*consts, y0)`
    (`Zero`s where none). Step `k` maps the differences' tangent `dD` by

        dD' = R dD,  dy_pred = sum_{i <= q} dD'_i,  dpsi = sum_i g_i dD'_i,
        (M - c J) dd = c (J dy_pred + (df/dconsts) dconsts) - M dpsi,

    then the step's own update of the differences."""
    st = _Steps(primals, outs, params)
    *dconsts, dy0 = tangents
    consts, graph, rows, mass = st.consts, st.graph, st.rows, st.mass
    zeros_t = Zero(type_of(st.ts[0]).update())

    def field_jvp(t, y, dy):
        """`J dy + (df/dconsts) dconsts` at `(t, y)`."""
        _, dfs = jvp_eval(graph, [*consts, t, y], [*dconsts, zeros_t, dy])
        dfs = [d for d in dfs if not is_zero(d)]
        return summed(dfs) if dfs else ops.zeros((st.n,), st.dtype)

    def step(k, D):  # the tangent pass of step k
        q, _, t, c, g, y, s, A = st.at(k)
        _, D = bdf_rescaled(D, st.history[k + 1])
        dy_pred = ops.sum(ops.where(rows[:, None] <= q, D, 0.0), axis=0)
        b = c * field_jvp(t, y, dy_pred) - mass.apply(ops.matmul(g, D))
        return bdf_updated(D, solve(A, b if s is None else s * b, estimate=False), q)

    # the first differences [y0, P f(t0, y0), 0, ...] (h0 is in the first R),
    # their tangents
    D0 = bdf_start(dy0, field_jvp(st.ts[0], st.y0, dy0), mass)
    return up_the_steps(step, D0, lambda D: D[0], outs, params["max_steps"])


def _in_ops(primals, outs, ct, params, wanted, ct_states=None) -> list:
    """Cotangents of `(*consts, y0)` (None for the consts not `wanted`) by
    the discrete adjoint of the BDF steps taken (see the module docstring),
    in sciad ops: `ode.bdf_adjoint`'s reference. `outs`: the `ode.odeint`
    node's outputs (an `OdeintOutputs`, with `states` and `history`); `ct`:
    the cotangent of `ys`; `ct_states`: of the states at every step, or
    None."""
    st = _Steps(primals, outs, params)
    consts, y0, ts, graph, rows, mass = st.consts, st.y0, st.ts, st.graph, st.rows, st.mass
    n, dtype, marks = st.n, st.dtype, outs.marks
    ctypes = [type_of(c) for c in consts]
    m = len(consts)
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
        q, R, t, c, g, y, s, A = st.at(k)
        # the cumulative sums D_i += D_{i+1} (i = q, ..., 0), transposed
        L = ops.where(rows[:, None] <= q + 1, ops.cumsum(L, axis=0), L)
        top = L[q + 2]
        lam_d = L[q + 1] + top
        L = ops.where(rows[:, None] == q + 1, -top[None],
                      ops.where(rows[:, None] == q + 2, 0.0, L))
        # mu = (M - c J)^-T lam_d at the step's result (rows scaled as the
        # forward pass's: S (M - c J), S = 1 / c on the algebraic rows)
        # (checked by its backward error, in the program: no condition
        # estimate, a host call, per step)
        mu = solve(A.T if st.pattern is not None else ops.transpose(A), lam_d, estimate=False)
        mu = mu if s is None else s * mu
        ybar, cbar = field_vjp(t, y, c * mu)
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


# ---------------------------------------------------------------------------
# the reverse pass as one node

bdf_adjoint_p = Primitive("ode.bdf_adjoint", multiple_results=True, runtime_checks=True,
                          params=dict(_STEPS_PARAMS, wanted=tuple[bool, ...],
                                      states_ct=Param(bool, default=False)))
bdf_adjoint_p.__doc__ = """The discrete adjoint of the steps an `ode.odeint`
node with `solver="bdf"` took, one node, lowered to one JAX loop down the
recorded steps (`sciad.solvers.ode._bdf_adjoint.adjoint`) that keeps an
iteration-matrix factorization over steps and solves each step's transposed
system by the iteration it preconditions. Operands `(*consts, grid, marks,
states, history, ct[, ct_states])` (the field's consts, the node's recorded
step times, output marks, states and history, the cotangents of the states
at the output times and, with `states_ct`, at every step); outputs the
cotangents of the consts flagged `wanted`, then that of the initial state.
`body`, `rtol`, `atol`, `max_steps`, `jac`, `pattern`, `mass`,
`mass_pattern`: the `ode.odeint` node's. Its derivative rules are those of
the same pass in sciad ops (`_in_ops`: each step's matrix formed and
solved by a `linalg.solve` node). `directions`: the cotangents (and the
outputs) have a leading axis of directions, all solved with the same
factorizations (`jacrev`, `vmap` of a VJP)."""


def _split(args, wanted, states_ct):
    k = len(wanted)
    consts, rest = list(args[:k]), list(args[k:])
    grid, marks, states, history, ct = rest[:5]
    return consts, grid, marks, states, history, ct, rest[5] if states_ct else None


@bdf_adjoint_p.def_abstract_eval
def _shape(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
           mass_pattern=None, wanted, states_ct=False, directions=False):
    consts, grid, marks, states, history, ct, ct_states = _split(args, wanted, states_ct)
    lead = ct.shape[:1] if directions else ()
    if len(consts) != len(body.inputs) - 2 or not isinstance(states, TensorType) \
            or states.ndim != 2 or ct.shape != lead + (marks.shape[0], states.shape[1]) \
            or grid.shape != (states.shape[0],) \
            or history.shape != (states.shape[0], HISTORY) or (
                ct_states is not None and ct_states.shape != lead + states.shape):
        raise ValueError("ode.bdf_adjoint: operands (*consts, grid, marks, states, history, "
                         "ct[, ct_states]) do not match each other or the field's body")
    return [TensorType(lead + c.shape, c.dtype) for c, w in zip(consts, wanted) if w] + \
        [TensorType(lead + (states.shape[1],), states.dtype)]


def judge_bdf_adjoint(site, *, status, t):
    """Raises the error of a reverse pass that stopped at the step to `t`:
    `NonFiniteError` where the field's derivative there was not finite,
    `ConvergenceError` where its transposed iteration matrix could not be
    solved."""
    status = int(status)
    if status == 0:
        return
    where = f"the step to t = {float(t):.6g}"
    if status == NONFINITE:
        site.fail(NonFiniteError,
                  f"the discrete adjoint of BDF's steps met values that are not finite at "
                  f"{where}: the vector field's derivative (its Jacobian, or its VJP) is NaN "
                  f"or infinite at the step's result, though the forward solve, which "
                  f"evaluates the field there, succeeded. Make the field differentiable where "
                  f"the solution goes (a square root or division at 0 has no derivative).")
    site.fail(ConvergenceError,
              f"the discrete adjoint of BDF's steps could not solve the transposed iteration "
              f"matrix (M - c J)^T of {where}, even with the Jacobian at the step's result "
              f"factored afresh: the matrix is singular or too ill-conditioned there. Use "
              f"adjoint='interpolated' (the continuous adjoint) for this solve, or a smaller "
              f"rtol, whose steps are shorter.")


@bdf_adjoint_p.def_impl
def _impl(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
          mass_pattern=None, wanted, states_ct=False, directions=False, site=None):
    consts, grid, marks, states, history, ct, ct_states = _split(args, wanted, states_ct)
    field, kind, mvals = _field_of(body, consts, wanted, jac, mass, mass_pattern, pattern,
                                   states.shape[1], site)
    idx = [i for i, w in enumerate(wanted) if w]
    if not directions:
        ct, ct_states = ct[None], None if ct_states is None else ct_states[None]
    cbar, ybar, status, t_failed, _ = _bdf_adjoint.adjoint(
        field, tuple(consts[i] for i in idx), grid, marks, states, history, ct, ct_states,
        jac=kind, pattern=pattern, mass=mvals)
    token = check(judge_bdf_adjoint, site or Site("ode.bdf_adjoint"), when=status != 0,
                  status=status, t=t_failed)
    outs = [*cbar, ybar]
    return tuple(tie(outs if directions else [o[0] for o in outs], token))


def bdf_vjp(primals, outs, ct, params, ct_states=None) -> list:
    """Cotangents of an `ode.odeint` node's `(*consts, y0)` (None for the
    consts not wanted: `_ode_adjoint._wanted`) by the discrete adjoint of its
    BDF steps, one `ode.bdf_adjoint` node: `outs`, the node's outputs (an
    `OdeintOutputs` with `states` and `history`); `ct`, `ct_states`: as
    `Adjoint.vjp`'s."""
    consts = primals[:-2]
    return bind_adjoint(bdf_adjoint_p, consts,
                        [outs.grid, outs.marks, outs.states, outs.history], ct, ct_states,
                        params, _wanted(consts, params))


def reference(*args, **params):
    """`ode.bdf_adjoint`'s outputs computed in sciad ops (`_in_ops`), whose
    derivatives are the node's."""
    from ._ode import OdeintOutputs

    wanted, states_ct = params["wanted"], params.get("states_ct", False)
    consts, grid, marks, states, history, ct, ct_states = _split(args, wanted, states_ct)
    outs = OdeintOutputs(None, None, None, grid=grid, marks=marks, states=states,
                         history=history)
    bars = _in_ops([*consts, states[0], grid[marks]], outs, ct, params, list(wanted),
                   ct_states)
    return [b for b, w in zip(bars, wanted) if w] + [bars[-1]]


def _adjoint_linear(args, params) -> list:
    k = len(params["wanted"]) + 4  # (ct, after the consts, grid, marks, states and history)
    return [k, k + 1] if params.get("states_ct", False) else [k]


_def_rules(bdf_adjoint_p, reference, _adjoint_linear)


def _cost(node, body_cost):
    # per step (their number is known only when it runs): about three
    # iterations of the transposed system, each a VJP of the field and a
    # solve, and the step's own VJP
    F = body_cost(node.params["body"])
    n = node.outputs[-1].type.shape[-1]
    per = 4.0 * (F.flops + 10.0 * n)
    return Cost(per, F.peak, f"per step ({_si(per)})")


bdf_adjoint_p.def_cost(_cost)
