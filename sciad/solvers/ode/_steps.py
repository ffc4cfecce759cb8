"""What sciad's own ODE loops (`_bdf`, `_radau`, `_esdirk`) share: their progress over
the output times (`Track`: the time, the next output time, the step counts,
the status), what they write down (`Record`: the values at the output times,
the recorded steps), the step that lands on the next output time
(`propose`), its bookkeeping once a step is taken or rejected (`advance`,
`written`), the loop that runs the step apart from its record (`run`), the
integration's `Result`, and the mass matrix of `M dy/dt = f` as both read it
(`Mass`). Plain JAX."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _zeros
from . import _ode


class Counts(NamedTuple):
    """What an integration did, as SciPy counts it: field evaluations,
    Jacobian evaluations, factorizations."""

    nfev: jax.Array
    njev: jax.Array
    nlu: jax.Array


class Result(NamedTuple):
    ys: jax.Array           # the state at the output times (inf past a failure)
    status: jax.Array       # 0 success, 1 step limit, 2 step too small, 6 inconsistent
    accepted: jax.Array     # accepted steps
    steps: jax.Array        # attempts (accepted and rejected)
    t_reached: jax.Array    # the last accepted step's time
    h_last: jax.Array       # the last accepted step's size
    ymax: jax.Array         # max |y[:m]| there
    grid: jax.Array | None  # the accepted steps' times (max_steps + 1), padded
    states: jax.Array | None  # their states (max_steps + 1, n), padded with zeros
    counts: Counts
    history: jax.Array | None = None  # a method's own record of each accepted step


class Track(NamedTuple):
    """A loop's progress over its output times `ts` (small: what its step
    reads; what it writes down is its `Record`)."""

    t: jax.Array        # the time reached (the last accepted step's end)
    i_next: jax.Array   # the next output time's index
    accepted: jax.Array
    steps: jax.Array    # attempts
    status: jax.Array   # -1 running, else `Result.status`
    h_last: jax.Array   # the last accepted step's size


class Record(NamedTuple):
    """What a loop writes down, outside its step (`run`): the state at the
    output times reached, and where kept, each accepted step's time, state
    and the method's own row (BDF's history)."""

    ys: jax.Array       # (len(ts), n)
    grid: jax.Array     # (max_steps + 1,) where recorded; else (1,)
    states: jax.Array   # (max_steps + 1, n) where `dense`; else (1, n)
    rows: jax.Array     # (max_steps + 1, width) where the method keeps rows; else (1, 1)


class Taken(NamedTuple):
    """An attempted step as its loop's `Record` reads it."""

    accept: jax.Array   # accepted
    hit: jax.Array      # accepted, on the output time `i`
    i: jax.Array        # the output time it aimed at
    k: jax.Array        # the accepted steps after it (its place in the record)
    t: jax.Array        # its end
    y: jax.Array        # the state there
    row: jax.Array      # the method's row of it (`Record.rows`; (1,) where none)


class Mass(NamedTuple):
    """A mass matrix `M` as the loops read it."""

    #: `v -> M v`
    apply: Callable
    #: `f -> dy/dt` where `M dy/dt = f`, for the first step's predictor and
    #: size: the least-squares solution of least norm with a dense `M` (0 on
    #: the algebraic variables); `f / diag(M)` (0 where the diagonal is)
    #: with a sparse one, exact where `M` is diagonal (the predictor only
    #: sets the first step's size: the steps solve `M dy/dt = f` itself)
    derivative: Callable
    #: the rows without an entry: the algebraic equations (bool, `(n,)`)
    algebraic: jax.Array
    #: `v -> M^T v` (the discrete adjoints, `_radau_adjoint`, `_bdf_adjoint`)
    apply_t: Callable | None = None
    #: `derivative`'s transpose (BDF's discrete adjoint, `_bdf_adjoint`)
    derivative_t: Callable | None = None


def mass_of(mass, jac: str, pattern, n: int, dtype) -> Mass | None:
    """The `Mass` of `mass`: None (the identity: None), a dense `(n, n)`
    matrix, or (`jac="sparse"`) its values on `pattern` (with its
    diagonal)."""
    if mass is None:
        return None
    if jac != "sparse":
        M = jnp.asarray(mass, dtype)
        pinv = jnp.linalg.pinv(M)
        return Mass(lambda v: M @ v, lambda f: pinv @ f, jnp.all(M == 0, axis=1),
                    lambda v: M.T @ v, lambda v: pinv.T @ v)
    pattern = _ode._with_diagonal(pattern)
    values = jnp.asarray(mass, dtype)
    rows, cols = jnp.asarray(pattern.row_index()), jnp.asarray(pattern.indices)
    diag = values[jnp.asarray(pattern.diagonal_positions())]

    def apply(v):
        return jnp.zeros((n,), v.dtype).at[rows].add(values * v[cols])

    def derivative(f):
        return jnp.where(diag != 0, f / jnp.where(diag != 0, diag, 1.0), 0.0)

    def apply_t(v):
        return jnp.zeros((n,), v.dtype).at[cols].add(values * v[rows])

    # (`derivative` is diagonal: its own transpose)
    return Mass(apply, derivative, ~jnp.zeros((n,), bool).at[rows].max(values != 0), apply_t,
                derivative)


def inconsistent(mass: Mass | None, f0, y0, rtol: float):
    """Whether `y0` violates the algebraic equations (`f0 = f(t0, y0)` on
    the rows of `mass` without an entry) by more than `rtol`, relative to
    `max(1, |y0|)` (False without a mass matrix)."""
    if mass is None:
        return jnp.asarray(False)
    g = jnp.where(mass.algebraic, jnp.abs(f0), 0.0)
    return ~(jnp.max(g, initial=0.0) <= rtol * jnp.maximum(1.0, jnp.max(jnp.abs(y0))))


def start(t0, ts, failed=False) -> Track:
    """The progress at `t0`; `failed`: status 6 at once (the initial values
    violate the algebraic equations: `inconsistent`)."""
    i32 = jnp.int32
    return Track(t=t0, i_next=jnp.asarray(1, i32), accepted=jnp.asarray(0, i32),
                 steps=jnp.asarray(0, i32), status=jnp.where(failed, 6, -1).astype(i32),
                 h_last=jnp.zeros((), ts.dtype))


def blank(t0, y0, ts, max_steps: int, record: bool, dense: bool, width: int = 0) -> Record:
    """The record at `t0`: `width` columns of the method's rows (none: 0)."""
    dtype, n = y0.dtype, y0.shape[0]
    kept = max_steps + 1
    # (the large blank arrays are `_zeros.zeros`, whose pages cost only the
    # rows written: zeroing 67 MB of states, 2,048 a step and 4,097 steps
    # kept, took 14 ms where a Brusselator's gradient writes 240 rows; all
    # behind a barrier: where y0 is a constant of the program, XLA folded
    # `zeros.at[0].set(y0)` into a constant as large as the record, then
    # copied it into the loop's buffer at every call)
    zeros = _zeros.zeros
    ys, grid, states, rows = jax.lax.optimization_barrier((
        zeros((ts.shape[0], n), dtype), jnp.full((kept if record else 1,), ts[-1], dtype),
        zeros((kept if dense else 1, n), dtype), zeros((kept, width) if width else (1, 1), dtype)))
    return Record(ys=ys.at[0].set(y0), grid=grid.at[0].set(t0), states=states.at[0].set(y0),
                  rows=rows)


def propose(tr: Track, ts, h_want, max_step):
    """`(t_new, h, land)`: the next step, `h_want` (at most `max_step`)
    shortened to end on the next output time where it would pass it
    (`land`: it ends there)."""
    t_bound = ts[tr.i_next]
    h_use = jnp.minimum(jnp.minimum(h_want, max_step), t_bound - tr.t)
    land = h_use >= t_bound - tr.t
    t_new = jnp.where(land, t_bound, tr.t + h_use)
    return t_new, t_new - tr.t, land


def advance(tr: Track, ts, *, accept, land, t_new, y_new, h, h_want,
            max_steps: int, row=None) -> tuple[Track, Taken]:
    """The progress after an attempted step to `t_new` (accepted or not),
    and the step as the record reads it (`row`: the method's own row of it):
    the output time it lands on, the counts, and the status: done at the
    last output time; 2 where the next step `h_want` is below
    `_ode.MIN_STEP_ULPS` spacings of floating-point numbers at the time
    reached (as SciPy's); 1 at `max_steps` attempts."""
    steps = tr.steps + 1
    k = tr.accepted + accept.astype(jnp.int32)
    hit = accept & land
    t = jnp.where(accept, t_new, tr.t)
    spacing = jnp.abs(jnp.nextafter(t, jnp.asarray(jnp.inf, t.dtype)) - t)
    status = jnp.where(hit & (tr.i_next == ts.shape[0] - 1), 0, -1)
    status = jnp.where((status < 0) & (h_want < _ode.MIN_STEP_ULPS * spacing), 2, status)
    status = jnp.where((status < 0) & (steps >= max_steps), 1, status)
    row = jnp.zeros((1,), y_new.dtype) if row is None else row
    return (Track(t=t, i_next=tr.i_next + hit.astype(jnp.int32), accepted=k, steps=steps,
                  status=status.astype(jnp.int32), h_last=jnp.where(accept, h, tr.h_last)),
            Taken(accept=accept, hit=hit, i=tr.i_next, k=k, t=t_new, y=y_new, row=row))


def written(rec: Record, tk: Taken, record: bool, dense: bool) -> Record:
    """`rec` with the attempted step `tk` written down where it counts (each
    array updated in place: one dynamic-update-slice each)."""
    def put(a, i, value, where):
        i = jnp.minimum(i, a.shape[0] - 1)
        return a.at[i].set(jnp.where(where, value, a[i]))

    ys = put(rec.ys, tk.i, tk.y, tk.hit)
    grid = put(rec.grid, tk.k, tk.t, tk.accept) if record else rec.grid
    states = put(rec.states, tk.k, tk.y, tk.accept) if dense else rec.states
    rows = put(rec.rows, tk.k, tk.row, tk.accept) if rec.rows.shape[0] > 1 else rec.rows
    return Record(ys, grid, states, rows)


def run(attempt: Callable, s0, rec0: Record, y0, *, record: bool, dense: bool):
    """`(state, record)` at the end of a loop of `attempt(state) -> (state,
    Taken)` from `s0` while `state.tr.status < 0`, each attempt written down
    in `rec0` (`written`) after it.

    Why the step is a loop of its own (run once), holding nothing of the
    record:
    XLA's CPU runtime runs a loop body's operations one after another on the
    calling thread only where every buffer they touch is at most 512 bytes
    (or they are at most 8); else it schedules them on its thread pool by
    their dependencies, which costs microseconds a step in hand-offs between
    threads. A small problem's step is a few microseconds of work: with the
    record's arrays in the same body, Robertson's 3-state BDF took 2.8x
    longer. Here the step's own operations are a sequence of their own with
    the step's small arrays, and the loop's body is the step and the
    record's few updates. (A loop run once, not a `lax.cond`: under
    `jax.vmap` a cond becomes a select of both branches, whose batching a
    kept KLU factor's swap, a custom-batched call, cannot enter; a batched
    loop runs the attempt for every example, as the loop around it did.)"""
    n = y0.shape[0]

    def idle(s):  # (a row of `rec0.rows`' width: (1,) where none is kept, as `advance`'s)
        zero = jnp.zeros((), jnp.int32)
        return s, Taken(accept=jnp.asarray(False), hit=jnp.asarray(False), i=zero, k=zero,
                        t=s.tr.t, y=jnp.zeros((n,), y0.dtype),
                        row=jnp.zeros(rec0.rows.shape[1:], y0.dtype))

    def step(c):
        return (jnp.asarray(False), *attempt(c[1]))

    def body(c):
        s, rec = c
        _, s, tk = jax.lax.while_loop(lambda c: c[0], step, (s.tr.status < 0, *idle(s)))
        return s, written(rec, tk, record, dense)

    return jax.lax.while_loop(lambda c: c[0].tr.status < 0, body, (s0, rec0))


#: the most multiply-adds a matrix product inside a loop's step is written
#: out for (`product`), rather than left to XLA's CPU backend, which calls
#: a matrix library for it
SMALL_PRODUCT = 4096


def product(A, B):
    """`A @ B` (`(k, l)` by `(l, ...)`). Small (`k l m` at most
    `SMALL_PRODUCT`), as a broadcast product and a sum: operations XLA fuses
    into the loop around them. A matrix library's call is an operation a
    loop compiled as one function (`sciad.config.loops_policy`) cannot
    hold: one in a BDF adjoint's step left its loop dispatched operation by
    operation, 3-4 us a step on a few states. Larger, as `A @ B`."""
    k, l = A.shape
    m = int(np.prod(B.shape[1:], dtype=np.int64))
    if k * l * m > SMALL_PRODUCT:
        return (A @ B.reshape(l, m)).reshape((k,) + B.shape[1:])
    terms = A.reshape((k, l) + (1,) * (B.ndim - 1)) * B[None]
    return jnp.sum(terms, axis=1)


def finish(tr: Track, rec: Record, ts, y_last, m: int, counts: Counts, record: bool,
           dense: bool) -> Result:
    """The integration's result from its final progress and record
    (`y_last`: the state at the time reached): past a failure, the output
    times not reached are infinite (as diffrax's). `Result.history`: the
    method's rows, where it keeps them (BDF's, for its discrete adjoint)."""
    reached = jnp.arange(ts.shape[0]) < tr.i_next
    return Result(ys=jnp.where(reached[:, None], rec.ys, jnp.inf), status=tr.status,
                  accepted=tr.accepted, steps=tr.steps, t_reached=tr.t, h_last=tr.h_last,
                  ymax=jnp.where(tr.accepted > 0, jnp.max(jnp.abs(y_last[:m]), initial=0.0),
                                 jnp.inf),
                  grid=rec.grid if record else None, states=rec.states if dense else None,
                  counts=counts, history=rec.rows if rec.rows.shape[0] > 1 else None)


def newton_tolerance(rtol: float, eps: float) -> float:
    """A loop's simplified Newton tolerance, in units of the error scale
    `atol + rtol |y|` (SciPy's BDF's and Radau's)."""
    return max(10 * eps / rtol, min(0.03, rtol ** 0.5))


def newton_verdict(k, size, rate, finite, *, tol: float, maxiter: int, floor=0.0):
    """`(failed, converged)` of a simplified Newton iteration after its
    iteration `k` (from 0), whose correction has the scaled size `size`,
    `rate` times the last one's (RADAU5's test, as SciPy's BDF and Radau
    judge theirs): failed where the rate is 1 or more, too slow to reach
    `tol` within `maxiter` iterations, or a value is not finite (`finite`:
    the field's values were); converged where the correction is predicted
    below `tol`, or is at most `floor` (0: exactly zero; a rounding floor:
    nothing more to gain), which no rate fails."""
    at_floor = size <= floor
    failed = (k > 0) & ((rate >= 1) | (rate ** (maxiter - k) / (1 - rate) * size > tol)) \
        & ~at_floor
    failed = failed | ~finite | ~jnp.isfinite(size)
    return failed, ~failed & (at_floor | ((k > 0) & (rate / (1 - rate) * size < tol)))


def values_finite(values, m: int):
    """Whether the field's `values` (its last axis the state's `n`) are all
    finite, for `newton_verdict`, where an iteration's correction size reads
    only the first `m < n` elements (a sensitivity system's primal); else
    True, without a reduction over them: where the size reads every
    element, a value that is not finite makes it so through the solve
    (`0 * inf` is NaN too), and the verdict fails a size that is not."""
    if m < values.shape[-1]:
        return jnp.all(jnp.isfinite(values))
    return jnp.asarray(True)


def refactored(linear, lu, J, c, need):
    """A loop's iteration-matrix factorization for `(J, c)` where `need`,
    else `lu`: `linear.factor` in a `lax.cond`, or `linear.refactor` where
    the linear algebra has one (a kept KLU factor's swap, `_kept_klu`: then
    `need` must be False for an example a batched loop has finished, whose
    body `jax.vmap` still runs)."""
    if linear.refactor is not None:
        return linear.refactor(lu, J, c, need)
    return jax.lax.cond(need, lambda: linear.factor(J, c), lambda: lu)


def released(linear, lu, after):
    """An int32 zero computed after the loop's last factorization `lu` is
    freed, once every array in `after` is (where the linear algebra frees
    one, `linear.release`): added to the status the result is judged by."""
    if linear.release is None:
        return jnp.zeros((), jnp.int32)
    return linear.release(lu, after)
