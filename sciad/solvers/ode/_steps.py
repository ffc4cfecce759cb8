"""What sciad's own ODE loops (`_bdf`, `_radau`) share: their progress over
the output times (`Track`: the time, the next output time, the values there,
the step counts, the recorded steps, the status), the step that lands on the
next output time (`propose`), its bookkeeping once a step is taken or
rejected (`advance`), the integration's `Result`, and the mass matrix of `M
dy/dt = f` as both read it (`Mass`). Plain JAX."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

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
    """A loop's progress over its output times `ts`."""

    t: jax.Array        # the time reached (the last accepted step's end)
    i_next: jax.Array   # the next output time's index
    ys: jax.Array       # the state at the output times reached
    accepted: jax.Array
    steps: jax.Array    # attempts
    status: jax.Array   # -1 running, else `Result.status`
    h_last: jax.Array   # the last accepted step's size
    grid: jax.Array     # the accepted steps' times (where recorded; else one)
    states: jax.Array   # and their states (where `dense`; else one)


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
    #: `v -> M^T v` (Radau's discrete adjoint, `_radau_adjoint`)
    apply_t: Callable | None = None


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
                    lambda v: M.T @ v)
    pattern = _ode._with_diagonal(pattern)
    values = jnp.asarray(mass, dtype)
    rows, cols = jnp.asarray(pattern.rows), jnp.asarray(pattern.indices)
    diag = values[jnp.asarray(pattern.diagonal_positions())]

    def apply(v):
        return jnp.zeros((n,), v.dtype).at[rows].add(values * v[cols])

    def derivative(f):
        return jnp.where(diag != 0, f / jnp.where(diag != 0, diag, 1.0), 0.0)

    def apply_t(v):
        return jnp.zeros((n,), v.dtype).at[cols].add(values * v[rows])

    return Mass(apply, derivative, ~jnp.zeros((n,), bool).at[rows].max(values != 0), apply_t)


def inconsistent(mass: Mass | None, f0, y0, rtol: float):
    """Whether `y0` violates the algebraic equations (`f0 = f(t0, y0)` on
    the rows of `mass` without an entry) by more than `rtol`, relative to
    `max(1, |y0|)` (False without a mass matrix)."""
    if mass is None:
        return jnp.asarray(False)
    g = jnp.where(mass.algebraic, jnp.abs(f0), 0.0)
    return ~(jnp.max(g, initial=0.0) <= rtol * jnp.maximum(1.0, jnp.max(jnp.abs(y0))))


def start(t0, y0, ts, max_steps: int, record: bool, dense: bool, failed=False) -> Track:
    """The progress at `t0`; `failed`: status 6 at once (the initial values
    violate the algebraic equations: `inconsistent`)."""
    dtype, n = y0.dtype, y0.shape[0]
    i32 = jnp.int32
    return Track(
        t=t0, i_next=jnp.asarray(1, i32), ys=jnp.zeros((ts.shape[0], n), dtype).at[0].set(y0),
        accepted=jnp.asarray(0, i32), steps=jnp.asarray(0, i32),
        status=jnp.where(failed, 6, -1).astype(i32),
        h_last=jnp.zeros((), dtype),
        grid=jnp.full((max_steps + 1 if record else 1,), ts[-1], dtype).at[0].set(t0),
        states=jnp.zeros((max_steps + 1 if dense else 1, n), dtype).at[0].set(y0))


def propose(tr: Track, ts, h_want, max_step):
    """`(t_new, h, land)`: the next step, `h_want` (at most `max_step`)
    shortened to end on the next output time where it would pass it
    (`land`: it ends there)."""
    t_bound = ts[tr.i_next]
    h_use = jnp.minimum(jnp.minimum(h_want, max_step), t_bound - tr.t)
    land = h_use >= t_bound - tr.t
    t_new = jnp.where(land, t_bound, tr.t + h_use)
    return t_new, t_new - tr.t, land


def advance(tr: Track, ts, *, accept, land, t_new, y_new, h, h_want, max_steps: int,
            record: bool, dense: bool) -> Track:
    """The progress after an attempted step to `t_new` (accepted or not):
    the output time it lands on, the recorded step, the counts, and the
    status: done at the last output time; 2 where the next step `h_want` is
    below `_ode.MIN_STEP_ULPS` spacings of floating-point numbers at the time
    reached (as SciPy's); 1 at `max_steps` attempts."""
    steps = tr.steps + 1
    k = tr.accepted + accept.astype(jnp.int32)
    hit = accept & land
    ys = jax.lax.cond(hit, lambda: tr.ys.at[tr.i_next].set(y_new), lambda: tr.ys)
    kk = jnp.minimum(k, tr.grid.shape[0] - 1)
    grid = tr.grid.at[kk].set(jnp.where(accept & record, t_new, tr.grid[kk]))
    states = tr.states
    if dense:
        states = jax.lax.cond(accept, lambda: states.at[k].set(y_new), lambda: states)
    t = jnp.where(accept, t_new, tr.t)
    spacing = jnp.abs(jnp.nextafter(t, jnp.asarray(jnp.inf, t.dtype)) - t)
    status = jnp.where(hit & (tr.i_next == ts.shape[0] - 1), 0, -1)
    status = jnp.where((status < 0) & (h_want < _ode.MIN_STEP_ULPS * spacing), 2, status)
    status = jnp.where((status < 0) & (steps >= max_steps), 1, status)
    return Track(t=t, i_next=tr.i_next + hit.astype(jnp.int32), ys=ys, accepted=k,
                 steps=steps, status=status.astype(jnp.int32),
                 h_last=jnp.where(accept, h, tr.h_last), grid=grid, states=states)


def finish(tr: Track, ts, y_last, m: int, counts: Counts, record: bool,
           dense: bool, history=None) -> Result:
    """The integration's result from its final progress (`y_last`: the state
    at the time reached): past a failure, the output times not reached are
    infinite (as diffrax's). `history`: the method's record of its accepted
    steps, where it keeps one (BDF's, for its discrete adjoint)."""
    reached = jnp.arange(ts.shape[0]) < tr.i_next
    return Result(ys=jnp.where(reached[:, None], tr.ys, jnp.inf), status=tr.status,
                  accepted=tr.accepted, steps=tr.steps, t_reached=tr.t, h_last=tr.h_last,
                  ymax=jnp.where(tr.accepted > 0, jnp.max(jnp.abs(y_last[:m]), initial=0.0),
                                 jnp.inf),
                  grid=tr.grid if record else None, states=tr.states if dense else None,
                  counts=counts, history=history)


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
