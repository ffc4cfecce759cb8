"""The steps an `ode.odeint` node took, re-run in sciad ops: one step of a
stepper's Runge-Kutta tableau (`rk_step`, an implicit stage an
`optimize.root` node), one of Radau IIA (`radau_step`, its three stages one
`optimize.root` node), one of BDF from its record of the step (`bdf_step`,
its correction one `optimize.root` node), a step as a graph (`step_graph`)
and the whole solve replayed on its recorded step grid (`replay_steps`),
whose reverse passes are the discrete (checkpointed) adjoint."""

from __future__ import annotations

import functools

import numpy as np

from .. import _ops as ops
from ..graph import Graph
from ..graph._autodiff import type_of
from ..graph._body import inline, trace_body
from ..solvers.nonlinear import _jacobian_band, _jacobian_klu
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode import _radau
from ..solvers.ode._bdf import ALPHA, GAMMA, MAX_ORDER
from ..solvers.ode._ode_steppers import STEPPERS, tableau
from ._schedules import Segments
from ._scan import scan
from ._ode_field import field_at, mass_in_ops, part_of
from ._ode_interp import hermite_at
from ._jacobian import colored_jacobian
from ._root import root_node
from ._sparse import gather
from ._stop_gradient import stop_gradient
from ._while import bounded_while_loop

#: the replayed implicit stages' Newton tolerance on the residual scaled by
#: `|y| + atol/rtol`: this fraction of the ODE's rtol (Newton converges
#: quadratically, so the stages are then solved far below the local error
#: the steps were accepted with), floored at this many eps; and a stage
#: that stalls at its measured floor of rounding errors has converged
#: (`optimize.root`'s `at_floor`), since that floor grows with `h` times the
#: field's Jacobian (stiffness) and can lie above any fixed tolerance
STAGE_RTOL = 1e-3
STAGE_FLOOR_EPS = 100.0


def _chord_start(J):
    """The `start` of a stage's root node: the values of `J`, a sparse
    Jacobian of the stage's residual on its detected pattern, as the chord
    method's first matrix (without derivative)."""
    def start(jac, pattern, tx):
        assert type_of(J).pattern == pattern, "a stage's chord matrix is on its pattern"
        return stop_gradient(ops.astype(gather(J), tx.dtype))

    return start


#: a replayed stage's sparse Newton systems of at most this many unknowns
#: are factored by KLU at every chord iteration (`_stage_jac`)
KLU_EVERY_ITERATION = 2048


def _stage_jac(jac: str, J=None) -> str:
    """The Jacobian form a replayed implicit stage's root takes for the ODE's
    `jac` (`J`: the stage's first chord matrix, sparse, where made).

    A narrow band (a method of lines in one dimension gives one) is
    factored by sciad's banded LU in the program (`"band"`), once per
    chord solve, its factor kept over the iterations. Another sparse one
    is factored by KLU in the program (`"klu"`) where that is cheap (at
    most `KLU_EVERY_ITERATION` unknowns): KLU in the program factors at
    every chord iteration, which is still faster than a SuperLU host call
    per iteration (25-30% off the 1,024-state Brusselator's Radau and
    Kvaerno5 gradients). Elsewhere (a 2-D stencil's fill) the root factors
    once with SuperLU and keeps its factor for its iterations and its
    derivative (`"sparse"`): 7.2 -> 2.1 s for Kvaerno5's gradient of
    SUNDIALS' idaHeat2D at 10,000 unknowns, where KLU factored the stages'
    matrix about three times a stage. Without KLU (klujax not installed, or
    not the CPU) that is the form of every sparse stage: the band's and
    KLU's derivatives would solve by SuperLU on the host once a stage, where
    `"sparse"` shares one factorization a step."""
    if jac != "sparse" or not _jacobian_klu.usable():
        return jac
    pattern = None if J is None else type_of(J).pattern
    if pattern is not None and _jacobian_band.usable(pattern, type_of(J).dtype):
        return "band"
    if pattern is None or pattern.shape[0] <= KLU_EVERY_ITERATION:
        return "klu"
    return "sparse"


def rk_step(graph: Graph, consts, solver: str, t, h, y, jac: str, rtol: float, atol: float,
            y_next=None):
    """One step of the Runge-Kutta method of the stepper named `solver` from
    `(t, y)` with step `h`, in sciad ops: an implicit stage is an
    `optimize.root` node (`root_node`), its chord matrix colored JVPs
    (`colored_jacobian`). An IMEX method's stages weigh the slopes of the
    field's parts by their own tableaus, and solve for the stiff part only.
    `y_next`, the step's result where known (a recorded state), starts each
    implicit stage's iterations from the cubic Hermite interpolant between
    `y` and it."""
    c, As, b = tableau(STEPPERS[solver])
    stiff = part_of(graph, -1)

    def stage(z, yi, hg, ti, w):
        return (z - yi - hg * field_at(stiff, consts, ti, z)) * w

    # each equation scaled by the step's state's magnitude (floored by
    # atol/rtol), as the step-size control measures errors
    w = stop_gradient(1.0 / (ops.abs(y) + max(atol / rtol, 1e-300)))
    eps = float(np.finfo(type_of(y).dtype).eps)
    jac0 = {}  # h gamma -> the stages' first chord matrix (sparse)
    guesses = []  # with y_next: the field at the step's ends
    ks = []  # per stage: the slopes of the field's parts
    for i in range(len(b)):
        yi = y
        for j in range(i):
            for A, k in zip(As, ks[j]):
                if A[i, j] != 0.0:
                    yi = yi + (h * float(A[i, j])) * k
        ti = t + float(c[i]) * h
        gamma = float(As[-1][i, i])
        if gamma == 0.0:
            ks.append(inline(graph, [*consts, ti, yi]))
            continue
        if sparse_jacobian(jac) and gamma not in jac0:
            # one matrix, at the step's start, for all the stages' chord
            # iterations: the stages share its factorization (one per step,
            # not one per stage), and their derivatives' transposed solves
            # refine with it against the Jacobian at their roots
            ys = stop_gradient(y)
            jac0[gamma] = colored_jacobian(stage, ys, ys, h * gamma, t, w)
        if y_next is not None:  # the first Newton iterate: interpolated
            if not guesses:
                guesses.append(stop_gradient(field_at(graph, consts, t, y)))
                guesses.append(stop_gradient(field_at(graph, consts, t + h, y_next)))
            z0 = hermite_at(float(c[i]), h, stop_gradient(y), stop_gradient(y_next), *guesses)
        else:  # the previous stage's stiff slope carried over (an explicit
            # Euler predictor for a first stage)
            k0 = ks[-1][-1] if ks else field_at(stiff, consts, t, y)
            z0 = yi + (h * gamma) * k0
        start = jac0.get(gamma)
        z = root_node(stage, z0, [yi, h * gamma, ti, w], name="stage", kind="root",
                      method="chord", jac=_stage_jac(jac, start), tol=1e-12,
                      atol=max(STAGE_RTOL * rtol, STAGE_FLOOR_EPS * eps), maxiter=50,
                      memory=0, throw=True, op="optimize.root", at_floor=True, estimate=False,
                      start=None if start is None else _chord_start(start)).x
        ks.append(inline(graph, [*consts, ti, z]))
    out = y
    for i, bi in enumerate(b):
        for k in ks[i] if bi != 0.0 else ():
            out = out + (h * float(bi)) * k
    return out


def esdirk_mass_step(graph: Graph, consts, solver: str, t, h, y, jac: str, rtol: float,
                     atol: float, y_next, mass):
    """One step of the stiffly accurate ESDIRK method of the stepper named
    `solver` on `M dy/dt = f` (`mass`, a `MassOps`), in sciad ops, as
    `sciad.solvers.ode._esdirk` steps it: each implicit stage an
    `optimize.root` node for

        M (Y_i - y) - h sum_{j<i} a_ij F_j - h gamma f(t + c_i h, Y_i) = 0,

    `F_j` the field at the stages (the first stage `y` itself), each
    equation scaled as `rk_step` scales its stages (the algebraic ones also
    by `1 / (h gamma)`, as the forward pass scales them); the result is the
    last stage. `y_next`, the recorded result (or None), starts the stages on
    the line to it."""
    c, As, b = tableau(STEPPERS[solver])
    A = As[-1]
    w = stop_gradient(1.0 / (ops.abs(y) + max(atol / rtol, 1e-300)))
    eps = float(np.finfo(type_of(y).dtype).eps)

    def stage(z, y, known, hg, ti, scale):
        return (mass.apply(z - y) - known - hg * field_at(graph, consts, ti, z)) * scale

    hg = h * float(A[1, 1])  # (one diagonal: the stages share it, and the rows' scaling)
    rows = mass.scale(hg)
    scale = w if rows is None else w * rows
    F = [field_at(graph, consts, t, y)]
    z, J0, start = y, None, None
    for i in range(1, len(b)):
        ti = t + float(c[i]) * h
        known = ops.zeros_like(y)
        for j in range(i):
            if A[i, j] != 0.0:
                known = known + (h * float(A[i, j])) * F[j]
        if y_next is not None:
            z0 = stop_gradient(y) + float(c[i]) * stop_gradient(y_next - y)
        else:  # (the previous stage's increment carried over, as the forward's)
            z0 = y + (float(c[i]) / float(c[max(i - 1, 1)])) * (z - y) if i > 1 else y
        if sparse_jacobian(jac) and start is None:
            # (one matrix for all the stages' chord iterations, at the step's
            # start: they share one diagonal)
            ys = stop_gradient(y)
            J0 = colored_jacobian(stage, ys, ys, stop_gradient(known), stop_gradient(hg),
                                  stop_gradient(ti), stop_gradient(scale))
            start = _chord_start(J0)
        z = root_node(stage, z0, [y, known, hg, ti, scale], name="stage", kind="root",
                      method="chord" if start is not None else "newton",
                      jac=_stage_jac(jac, J0), tol=1e-12,
                      atol=max(STAGE_RTOL * rtol, STAGE_FLOOR_EPS * eps), maxiter=50,
                      memory=0, throw=True, op="optimize.root", at_floor=True, estimate=False,
                      start=start).x
        F.append(field_at(graph, consts, ti, z))
    return z


def radau_step(graph: Graph, consts, t, h, y, jac: str, rtol: float, atol: float, y_next,
               mass=None):
    """One step of Radau IIA (order 5) from `(t, y)` with step `h`, in sciad
    ops: its stage increments `Z` (`3 n` of them) solved together by one
    `optimize.root` node,

        M Z_i = h sum_j a_ij f(t + c_j h, y + Z_j),

    each equation scaled as `rk_step` scales its stages (a DAE's algebraic
    ones also by `1 / h`, as the forward pass scales them), and the result
    `y + Z_3` (the method is stiffly accurate). `y_next`, the recorded
    result, starts the iteration (the stages on the cubic Hermite
    interpolant to it; on the line to it with a mass matrix, whose `f` is
    not `dy/dt`); None (a replay that has not recorded it): zero stages.
    `mass`: a `MassOps`, or None."""
    n = type_of(y).shape[0]
    A, C = _radau.A, _radau.C
    w = stop_gradient(1.0 / (ops.abs(y) + max(atol / rtol, 1e-300)))
    eps = float(np.finfo(type_of(y).dtype).eps)

    def stages(z, y, h, t, w):
        Z = [z[i * n:(i + 1) * n] for i in range(3)]
        F = [field_at(graph, consts, t + float(C[j]) * h, y + Z[j]) for j in range(3)]
        scale = w if mass is None else w * mass.scale(h)
        out = []
        for i in range(3):
            r = Z[i] if mass is None else mass.apply(Z[i])
            for j in range(3):
                r = r - (h * float(A[i, j])) * F[j]
            out.append(r * scale)
        return ops.concatenate(out)

    y0 = stop_gradient(y)
    if y_next is None:  # (a replay from a snapshot: zero increments, as RADAU5's first step)
        z0 = ops.zeros((3 * n,), type_of(y).dtype)
    elif mass is None:
        y1 = stop_gradient(y_next)
        f0 = stop_gradient(field_at(graph, consts, t, y))
        f1 = stop_gradient(field_at(graph, consts, t + h, y_next))
        z0 = ops.concatenate([hermite_at(float(c), h, y0, y1, f0, f1) - y0 for c in C])
    else:
        z0 = ops.concatenate([float(c) * (stop_gradient(y_next) - y0) for c in C])
    J0 = start = None
    if sparse_jacobian(jac):
        J0 = colored_jacobian(stages, stop_gradient(z0), y0, stop_gradient(h), stop_gradient(t), w)
        start = _chord_start(J0)
    z = root_node(stages, z0, [y, h, t, w], name="radau_stages",
                  kind="root", method="chord" if start is not None else "newton",
                  jac=_stage_jac(jac, J0), tol=1e-12,
                  atol=max(STAGE_RTOL * rtol, STAGE_FLOOR_EPS * eps), maxiter=50, memory=0,
                  throw=True, op="optimize.root", at_floor=True, estimate=False,
                  start=start).x
    return y + z[2 * n:]


#: the rows of BDF's differences `D` (orders up to `MAX_ORDER`, and two more)
ROWS = MAX_ORDER + 3
#: the rows a step size change rescales
RESCALED = MAX_ORDER + 1


def bdf_start(y0, f0, mass):
    """BDF's first differences `[y0, P f0, 0, ...]`, `f0 = f(t0, y0)` (`P`:
    the mass matrix's pseudo-inverse; the first step's record scales row 1
    by `h0`), or their tangents (`f0`: the field's)."""
    rows = ops.arange(ROWS)[:, None]
    f0 = mass.start(f0)
    return ops.where(rows == 0, y0[None], ops.where(rows == 1, f0[None],
                                                    ops.zeros((ROWS,) + y0.shape, f0.dtype)))


def bdf_rescaled(D, record):
    """`(q, D')`: the order of the step BDF's `record` (its history row) is
    of, and the differences `D` after the previous accepted step rescaled
    to the step's size (`D' = R D`, the rows past `MAX_ORDER` kept)."""
    R = ops.reshape(record[1:], (RESCALED, RESCALED))
    return ops.astype(record[0], np.int32), ops.concatenate([ops.matmul(R, D[:RESCALED]),
                                                             D[RESCALED:]])


def bdf_updated(D, d, q):
    """The differences after a step of order `q` from `D` (rescaled) with the
    correction `d`: `D_{q+2} = d - D_{q+1}`, `D_{q+1} = d`, then `D_i +=
    D_{i+1}` down from `i = q` (the state `D_0 = y_pred + d`)."""
    rows = ops.arange(ROWS)[:, None]
    D = ops.where(rows == q + 2, (d - D[q + 1])[None], ops.where(rows == q + 1, d[None], D))
    inside = ops.where(rows <= q + 1, D, 0.0)
    tail = ops.sum(inside, axis=0)[None] - ops.cumsum(inside, axis=0) + inside
    return ops.where(rows <= q + 1, tail, D)


def bdf_psi_weights(q, dtype):
    """`(g, alpha_q)`: `psi = g D`, `g_i = gamma_i / alpha_q` for `1 <= i <= q`."""
    rows = ops.arange(ROWS)
    gamma = ops.asarray(np.concatenate([GAMMA, np.zeros(ROWS - GAMMA.size)]).astype(dtype))
    aq = ops.take(ops.asarray(ALPHA.astype(dtype)), q)
    return ops.where((rows >= 1) & (rows <= q), gamma, 0.0) / aq, aq


def bdf_step(graph: Graph, consts, D, record, t, h, jac: str, rtol: float, atol: float,
             mass):
    """One accepted BDF step from `t` to `t + h`, re-run in sciad ops from
    the differences `D` after the previous one and the step's `record` (its
    order and rescaling, `_bdf.HISTORY`): the prediction `y_pred = sum_{i <=
    q} D'_i`, then the correction `d` of

        M (d + psi) = c f(t + h, y_pred + d),   c = h / alpha_q,

    one `optimize.root` node from `d = 0` (as the forward pass's Newton
    iteration starts), each equation scaled as `rk_step` scales its stages
    (a DAE's algebraic ones by `1 / c`, as the forward pass scales them).
    Returns the differences after the step (`bdf_updated`); its state is
    their first row. `mass`: a `MassOps`."""
    q, D = bdf_rescaled(D, record)
    n, dtype = type_of(D).shape[1], type_of(D).dtype
    g, aq = bdf_psi_weights(q, dtype)
    y_pred = ops.sum(ops.where(ops.arange(ROWS)[:, None] <= q, D, 0.0), axis=0)
    psi, c, t1 = ops.matmul(g, D), h / aq, t + h
    w = stop_gradient(1.0 / (ops.abs(y_pred) + max(atol / rtol, 1e-300)))
    eps = float(np.finfo(dtype).eps)

    def residual(d, y_pred, psi, c, t1, w):
        r = mass.apply(d + psi) - c * field_at(graph, consts, t1, y_pred + d)
        s = mass.scale(c)
        return (r if s is None else s * r) * w

    d0 = ops.zeros((n,), dtype)
    J0 = start = None
    if sparse_jacobian(jac):
        J0 = colored_jacobian(residual, d0, stop_gradient(y_pred), stop_gradient(psi),
                              stop_gradient(c), stop_gradient(t1), w)
        start = _chord_start(J0)
    d = root_node(residual, d0, [y_pred, psi, c, t1, w], name="bdf_correction",
                  kind="root", method="chord" if start is not None else "newton",
                  jac=_stage_jac(jac, J0), tol=1e-12,
                  atol=max(STAGE_RTOL * rtol, STAGE_FLOOR_EPS * eps), maxiter=50, memory=0,
                  throw=True, op="optimize.root", at_floor=True, estimate=False,
                  start=start).x
    return bdf_updated(D, d, q)


#: the memory the checkpointed reverse pass may fill with stored states
#: (its number of snapshots is chosen so, between sqrt(max_steps) and
#: max_steps: a small system stores every step and replays each once)
SNAPSHOT_BYTES = 64 * 2 ** 20


def snapshots_for(max_steps: int, n: int, itemsize: int) -> int:
    """The default snapshots of the replay's reverse pass: as many as
    `SNAPSHOT_BYTES` holds, at least about sqrt(max_steps)."""
    low = max(1, int(np.ceil(np.sqrt(max_steps))))
    return int(min(max_steps, max(low, SNAPSHOT_BYTES // max(n * itemsize, 1))))


def replay_steps(graph: Graph, solver: str, jac: str, max_steps: int, snapshots: int, grid,
                 marks, rtol: float, atol: float, disk: str | None = None,
                 mass: int | None = None, mass_pattern=None, history=None):
    """`(*consts, y0) -> ys`: the steps the forward solve took, re-run on its
    grid: a scan over the output intervals, each a `while` loop of the steps
    from one output time to the next (whose reverse pass stores
    `snapshots` carries, on disk in the directory `disk` where given). The
    carry is the state, or BDF's differences (`ROWS` times its size), its
    steps re-run from its `history` (`bdf_step`). `mass`, `mass_pattern`:
    the node's params (its mass matrix among the consts)."""
    lowering = STEPPERS[solver].lowering

    def replay(*a):
        *consts, y0 = a
        n, dtype = type_of(y0).shape[0], type_of(y0).dtype
        M = mass_in_ops(consts, mass, mass_pattern, n, dtype)

        def one(k, c):  # step k, from grid[k] to grid[k + 1], on the carry c
            t = grid[k]
            h = grid[k + 1] - t
            if lowering == "bdf":
                return bdf_step(graph, consts, c, history[k + 1], t, h, jac, rtol, atol, M)
            if lowering == "radau":
                return radau_step(graph, consts, t, h, c, jac, rtol, atol, None,
                                  None if mass is None else M)
            if mass is not None:
                return esdirk_mass_step(graph, consts, solver, t, h, c, jac, rtol, atol, None,
                                        M)
            return rk_step(graph, consts, solver, t, h, c, jac, rtol, atol)

        def state(c):
            return c[0] if lowering == "bdf" else c

        def interval(c, x):
            lo, hi = x

            def step(s):
                k, c = s
                return k + 1, one(k, c)

            _, c = bounded_while_loop(lambda s: s[0] < hi, step, (lo, c), max_steps=max_steps,
                                      checkpoints=Segments(snapshots, disk))
            return c, state(c)

        c0 = y0 if lowering != "bdf" else \
            bdf_start(y0, field_at(graph, consts, grid[0], y0), M)
        _, ys = scan(interval, c0, (marks[:-1], marks[1:]))
        return ops.concatenate([y0[None], ys])

    return replay


@functools.lru_cache(maxsize=128)
def step_graph(graph: Graph, solver: str, jac: str, rtol: float, atol: float,
               mass: int | None = None, mass_pattern=None) -> Graph:
    """`(*consts, t, h, y, y_next) -> (y after one step of `solver`,)`
    (`rk_step`, `esdirk_mass_step` or `radau_step`; `y_next`, the recorded
    result, only starts the implicit stages' iterations). `mass`,
    `mass_pattern`: the node's params (its mass matrix, among the consts)."""
    *ctypes, ttype, ytype = graph.in_types
    m = len(ctypes)

    def step(*a):
        consts = list(a[:m])
        M = None if mass is None else \
            mass_in_ops(consts, mass, mass_pattern, ytype.shape[0], ytype.dtype)
        if STEPPERS[solver].lowering == "radau":
            return radau_step(graph, consts, a[m], a[m + 1], a[m + 2], jac, rtol, atol,
                              a[m + 3], M)
        if M is not None:
            return esdirk_mass_step(graph, consts, solver, a[m], a[m + 1], a[m + 2], jac, rtol,
                                    atol, a[m + 3], M)
        return rk_step(graph, consts, solver, a[m], a[m + 1], a[m + 2], jac, rtol, atol,
                       y_next=a[m + 3])

    g, closed, _ = trace_body(step, list(ctypes) + [ttype, ttype, ytype, ytype],
                              name="rk_step")
    assert not closed
    return g
