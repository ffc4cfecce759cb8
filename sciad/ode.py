"""Ordinary differential equations as differentiable nodes.

```python
import numpy as np
import sciad as sd
import sciad.numpy as snp
import sciad.ode

def lotka_volterra(t, y, theta):
    prey, pred = y[0], y[1]
    a, b, c, d = theta[0], theta[1], theta[2], theta[3]
    return snp.stack([a * prey - b * prey * pred, -c * pred + d * prey * pred])

ts = np.linspace(0.0, 10.0, 21)
theta = np.array([1.5, 1.0, 3.0, 1.0])

def loss(theta):
    ys = sd.ode.odeint(lotka_volterra, np.array([1.0, 1.0]), ts, theta)
    return snp.sum(ys[-1] ** 2)

sd.grad(loss)(theta)       # the discrete adjoint of the steps taken
sd.hvp(loss, theta, v)     # second order: forward over reverse
```

`odeint` is one `ode.odeint` node holding the vector field's graph. diffrax
takes the steps (explicit Runge-Kutta methods, and ESDIRK methods for stiff
problems whose Newton systems use the Jacobian's sparsity detected from the
graph), controls the step size and detects failure; sciad owns the
derivative rules (see `sciad.primitives._ode`):

- forward mode is an `odeint` node on the forward-sensitivity system, which
  takes the primal's steps;
- reverse mode is, by default (`adjoint="checkpoint"`), the discrete adjoint
  of those steps with checkpointing: the exact gradient of the computed
  solution, consistent with forward mode to rounding. The continuous
  adjoints solve the adjoint equation backwards, against the interpolated
  forward solution (`"interpolated"`) or with the state integrated backwards
  too (`"backsolve"`, memory of one state, but accurate only to the
  solver's tolerance and unstable for stiff or dissipative problems).

Derivatives flow to `y0`, `args` and the times `ts` (the initial time
included). `odeint_event` integrates up to a terminal event, whose time is
differentiated by the implicit function theorem (a root node of the event
function along the solution).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from . import numpy as snp
from . import optimize
from ._compile import _split_args, compiled_call
from .primitives._newton_systems import newton_jacobian
from ._traceback import api_boundary
from ._transforms import _in_trace, jvp, vmap
from .errors import (DTypeError, InvalidOptionError, NotSupportedError, SciadWarning,
                     ShapeError, plain)
from .graph import Site, Tracer
from .graph._autodiff import type_of
from .graph._body import trace_body
from .graph._source import user_source
from .primitives._scan import fori_loop
from .primitives._ode import STATUS, SOLVERS, OdeintOutputs, odeint_p
from .primitives._ode_adjoint import ADJOINTS, INTERPOLATED
from .primitives._ode_events import event_guard_p
from .primitives._ode_field import field_body, part_of
from .primitives._ode_interp import hermite_at
from .primitives._stop_gradient import stop_gradient

__all__ = ["odeint", "odeint_event", "solve_ivp", "Event", "ODEResult", "SOLVERS"]

_tree = jax.tree_util
_OP = "ode.odeint"


def _check_times(ts, op: str):
    """Trace-time checks of concrete output times."""
    if isinstance(ts, Tracer):
        t = type_of(ts)
        if len(t.shape) != 1 or t.shape[0] < 2:
            raise ShapeError(f"`ts` must be a 1-d array of at least 2 times, got {t}.", op=op)
        return
    arr = np.asarray(ts)
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ShapeError(f"`ts` must be a 1-d array of at least 2 times (ts[0] is the "
                         f"initial time), got shape {arr.shape}.", op=op)
    if arr.dtype.kind not in "fiu":
        raise DTypeError(f"`ts` must hold real times, got dtype {arr.dtype}.", op=op)
    if not np.all(np.isfinite(arr)):
        raise InvalidOptionError(f"`ts` must hold finite times, got {plain(arr)}.", op=op)
    steps = np.diff(arr.astype(np.float64))
    if not np.all(steps > 0):
        i = int(np.argmax(~(steps > 0)))
        what = "t1 <= t0" if arr.shape[0] == 2 else "the times are not strictly increasing"
        raise InvalidOptionError(
            f"{what}: ts[{i}] = {plain(arr[i])}, ts[{i + 1}] = {plain(arr[i + 1])}. "
            f"Integrating backwards in time: substitute s = -t.", op=op)


def _odeint_inline(f, y0, ts, args, *, solver, rtol, atol, adjoint, max_steps, dt0, adaptive,
                   jac, checkpoints, throw, op, every_step: bool = False):
    leaves, ytree = _tree.tree_flatten(y0, is_leaf=lambda v: isinstance(v, Tracer))
    if not leaves:
        raise ShapeError("`y0` has no arrays.", op=op)
    leaves = [snp.asarray(v) for v in leaves]
    kinds = {type_of(v).dtype.kind for v in leaves}
    if not kinds <= set("fiub"):
        raise DTypeError(f"`y0` must hold real float arrays, got "
                         f"{', '.join(type_of(v).str_short() for v in leaves)}.", op=op)
    dtype = np.result_type(*[type_of(v).dtype for v in leaves])
    if dtype.kind != "f":
        dtype = type_of(snp.asarray(0.0)).dtype
    leaves = [snp.astype(v, dtype) for v in leaves]
    shapes = [type_of(v).shape for v in leaves]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    flat0 = snp.concatenate([snp.reshape(v, (-1,)) for v in leaves]) if len(leaves) > 1 \
        else snp.reshape(leaves[0], (-1,))
    ts = snp.astype(snp.asarray(ts), dtype)

    def unflatten(y, lead=()):  # a flat state (`lead` leading axes) as y0's pytree
        parts, k = [], 0
        for shape, size in zip(shapes, sizes):
            parts.append(snp.reshape(y[..., k:k + size], tuple(lead) + tuple(shape)))
            k += size
        return _tree.tree_unflatten(ytree, parts)

    values, _, rebuild = _split_args(args)
    vals = [snp.asarray(a) for a in values]

    def flat_value(fn, t, y, a, name):  # fn(t, y, a), checked, as a flat state
        out = fn(t, y, a)
        outs, otree = _tree.tree_flatten(out, is_leaf=lambda v: isinstance(v, Tracer))
        if otree != ytree:
            raise ShapeError(f"`{name}` must return a pytree like y0 ({ytree}), got "
                             f"{otree}.", op=op)
        outs = [snp.asarray(o) for o in outs]
        for o, shape in zip(outs, shapes):
            if type_of(o).shape != shape:
                raise ShapeError(f"`{name}` must return arrays of y0's shapes {shapes}, got "
                                 f"{[type_of(o).shape for o in outs]}.", op=op)
        outs = [snp.reshape(snp.astype(o, dtype), (-1,)) for o in outs]
        return snp.concatenate(outs) if len(outs) > 1 else outs[0]

    imex = SOLVERS[solver].imex

    def field(*a):  # [dy/dt], or an IMEX solver's [non-stiff part, stiff part]
        *ls, t, y = a
        y, a = unflatten(y), rebuild(ls)
        if not isinstance(f, tuple):
            out = flat_value(f, t, y, a, "f")
            return [snp.zeros_like(out), out] if imex else [out]
        parts = [flat_value(fn, t, y, a, name) for fn, name in zip(f, ("f[0]", "f[1]"))]
        return parts if imex else [parts[0] + parts[1]]

    scalar = type_of(snp.zeros((), dtype))
    graph, consts, _ = trace_body(field, [type_of(v) for v in vals] +
                                  [scalar, type_of(flat0)],
                                  name=getattr(f, "__name__", "f"))
    if jac not in (None, "dense", "sparse"):
        raise InvalidOptionError(f"`jac` must be None, 'dense' or 'sparse', got {jac!r}.",
                                 op=op)
    pattern = None
    if not SOLVERS[solver].implicit:  # explicit: no Newton systems
        jac = "dense"
    else:  # Newton matrices I - h gamma df/dy (of an IMEX field's stiff part)
        jac, pattern = newton_jacobian(part_of(graph, -1), jac, identity=True)
    params = dict(body=field_body(graph), solver=solver, rtol=float(rtol), atol=float(atol),
                  max_steps=int(max_steps), adaptive=bool(adaptive), jac=jac,
                  adjoint=adjoint, throw=bool(throw))
    if dt0 is not None:
        params["dt0"] = float(dt0)
    if pattern is not None:
        params["pattern"] = pattern
    if checkpoints is not None:
        params["checkpoints"] = int(checkpoints)
    outs = OdeintOutputs.of(odeint_p.bind(*consts, *vals, flat0, ts, **params))
    ys, status, nsteps = outs.ys, outs.status, outs.steps
    if every_step:  # (the interpolated adjoint's node: its step grid and states)
        grid, states = outs.grid, outs.states
        return (unflatten(ys, type_of(ts).shape), status, nsteps, grid,
                unflatten(states, type_of(grid).shape))
    return unflatten(ys, type_of(ts).shape), status, nsteps


#: the smallest `rtol` an error estimate can meet: SciPy's, 100 eps of float64
MIN_RTOL = 100 * float(np.finfo(np.float64).eps)


def _check_options(solver, rtol, atol, adjoint, max_steps, dt0, adaptive, checkpoints, op):
    """The options, checked: `(solver, adaptive, rtol)`, the solver's name in
    lower case and `rtol` raised to `MIN_RTOL` (with a warning) as SciPy's
    `solve_ivp` does."""
    if not isinstance(solver, str) or solver.lower() not in SOLVERS:
        raise InvalidOptionError(f"unknown solver {plain(solver)}; one of "
                                 f"{', '.join(SOLVERS)}.", op=op)
    solver = solver.lower()
    if adjoint not in ADJOINTS:
        raise InvalidOptionError(f"`adjoint` must be one of {tuple(ADJOINTS)}, got "
                                 f"{plain(adjoint)}.", op=op)
    if not (isinstance(rtol, (int, float)) and rtol > 0 and isinstance(atol, (int, float))
            and atol >= 0):
        raise InvalidOptionError(f"needs rtol > 0 and atol >= 0, got rtol={plain(rtol)}, "
                                 f"atol={plain(atol)}.", op=op)
    if rtol < MIN_RTOL:
        Site(op, user_source()).warn(
            SciadWarning, f"rtol={float(rtol):g} is below 100 eps ({MIN_RTOL:.2e}), under "
            f"the rounding errors of the error estimate: it is raised to {MIN_RTOL:.2e}, "
            "as SciPy's solve_ivp does.")
        rtol = MIN_RTOL
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise InvalidOptionError(f"`max_steps` must be an int >= 1, got {plain(max_steps)}.",
                                 op=op)
    if dt0 is not None and not (isinstance(dt0, (int, float)) and np.isfinite(dt0)
                                and dt0 > 0):
        raise InvalidOptionError(f"`dt0` must be None or a step size > 0, got "
                                 f"{plain(dt0)}.", op=op)
    fixed = not SOLVERS[solver].error_estimate  # (constant steps only)
    if (not adaptive or fixed) and dt0 is None:
        raise InvalidOptionError(f"constant steps (adaptive=False, or the {solver} solver, "
                                 f"which has no error estimate) need `dt0`.", op=op)
    if checkpoints is not None and (not isinstance(checkpoints, (int, np.integer))
                                    or checkpoints < 1):
        raise InvalidOptionError(f"`checkpoints` must be None or an int >= 1, got "
                                 f"{plain(checkpoints)}.", op=op)
    return solver, bool(adaptive) and not fixed, float(rtol)


class ODEResult(NamedTuple):
    """What `odeint(..., throw=False)` returns: `ys` (as for `throw=True`),
    `status` (0 on success; see `sciad.primitives._ode.STATUS`) and `steps`,
    the accepted steps. Traced values inside a trace, arrays outside."""

    ys: Any
    status: Any
    steps: Any

    @property
    def success(self):
        return self.status == 0


@api_boundary
def odeint(f: Callable, y0, ts, args=(), *, solver: str = "tsit5", rtol: float = 1e-6,
           atol: float = 1e-9, adjoint: str = "checkpoint", max_steps: int = 4096,
           dt0: float | None = None, adaptive: bool = True, jac: str | None = None,
           checkpoints: int | None = None, throw: bool = True):
    """Solves `dy/dt = f(t, y, args)` from `y(ts[0]) = y0`; returns `y` at `ts`.

    **Arguments:**

    - `f`: the vector field `f(t, y, args)`, written with sciad ops, returning a
      pytree like `y`; or a pair `(f_nonstiff, f_stiff)` of such functions,
      whose sum is the field. The IMEX solvers step the first part
      explicitly and the second implicitly (their Newton systems hold only
      its Jacobian); other solvers step the sum. An IMEX solver given one
      function treats all of it as stiff.
    - `y0`: the initial state, a pytree of real float arrays.
    - `ts`: the output times, strictly increasing; `ts[0]` is the initial
      time. Concrete times are checked when traced; traced ones (to
      differentiate with respect to them) when the program runs.
    - `args`: passed to `f` (a pytree of arrays; static objects allowed).
    - `solver`: explicit `"tsit5"` (the default), `"dopri5"`, `"dopri8"`,
      `"bosh3"`, `"heun"`, `"euler"` (constant steps only); stiff
      (ESDIRK): `"kvaerno3"`, `"kvaerno4"`, `"kvaerno5"`,
      `"implicit_euler"`; IMEX (additive Runge-Kutta, for a stiff part such
      as diffusion beside a non-stiff one such as reactions or advection):
      `"kencarp3"`, `"kencarp4"`, `"kencarp5"`. The continuous adjoints
      integrate an IMEX problem's summed field with the Kvaerno method of
      the same order.
    - `rtol`, `atol`: the local error tolerances of the step-size control.
    - `adjoint`: reverse mode:
        - `"checkpoint"` (the default): the discrete adjoint of the steps
          taken, the exact gradient of the computed solution (to rounding;
          to the Newton tolerance for implicit solvers), consistent with
          forward mode. Where the states at every step fit in 64 MiB
          (`max_steps + 1` states; `checkpoints=None`), the forward pass
          records them and the reverse pass re-runs each step once from its
          state for its linearisation. Otherwise the steps are re-run on the
          recorded step grid, and their reverse pass stores states as
          `checkpoints` says.
        - `"interpolated"`: the continuous adjoint equation solved backwards
          against the forward solution interpolated (cubic Hermite) from
          its states at every step, which the forward pass stores
          (`max_steps + 1` states). Stable for stiff problems; accurate to
          the tolerance and the interpolation.
        - `"backsolve"`: the continuous adjoint solved backwards together
          with the state. Memory of one state, but accurate only to the
          tolerance, and unstable where integrating the state backwards is
          (stiff or dissipative problems): an approximation, never the
          default.
    - `max_steps`: the most steps (accepted and rejected); reaching it is an
      error. It also bounds the checkpointed reverse pass's loop.
    - `dt0`: the initial step (None: chosen automatically), or the step of
      constant stepping (`adaptive=False`).
    - `jac`: the Newton matrix `I - h gamma df/dy` of implicit solvers:
      `"dense"`, `"sparse"` (the pattern of `df/dy` detected from `f`'s
      graph, values by colored JVPs, factored by SuperLU, the factorization
      kept over steps of the same size, for up to 20 steps: the step-size
      controller holds the step where it would grow it by less than 1.2x) or
      None (dense up to 64 states or above a fifth of fill, else sparse). A
      stage's chord iterations stop as RADAU5's do, by their contraction
      rate.
    - `checkpoints`: the states the checkpointed reverse pass stores evenly
      over the steps of each output interval, re-running the steps between
      them (`sd.Segments`). None: every step's state, recorded by the
      forward pass, where they fit in 64 MiB; else as many as 64 MiB
      holds, at least about sqrt(max_steps).
    - `throw`: raise `sciad.errors.ConvergenceError` when the integration
      fails (the step limit, a collapsed step size, a non-finite state),
      naming the time reached, the last step size and a diagnosis. With
      `throw=False`, an `ODEResult(ys, status, steps)` is returned instead.

    **Returns:**

    `y` at `ts`: a pytree like `y0` whose arrays have a leading axis of
    `len(ts)`; or an `ODEResult` with `throw=False`.
    """
    op = _OP
    f = _check_field(f, op)
    solver, adaptive, rtol = _check_options(solver, rtol, atol, adjoint, max_steps, dt0,
                                            adaptive, checkpoints, op)
    _check_times(ts, op)
    kw = dict(solver=solver, rtol=rtol, atol=atol, adjoint=adjoint, max_steps=int(max_steps),
              dt0=dt0, adaptive=adaptive, jac=jac, checkpoints=checkpoints, throw=throw, op=op)
    if _in_trace((y0, ts, args)):
        ys, status, steps = _odeint_inline(f, y0, ts, args, **kw)
        return ys if throw else ODEResult(ys, status, steps)
    return _odeint_eager(f, y0, ts, args, kw)


def _compiled_call(inline, f, leading: tuple, args, key: tuple, name: str):
    """`compiled_call` of `inline(f, *leading, args)` for a field
    `f` that may be a pair: compiled once per first part and second, the
    second held by the cache entry (through `inline`'s closure), so that its
    id in the key is not reused meanwhile."""
    if not isinstance(f, tuple):
        return compiled_call(inline, f, leading, args, key=key, name=name)
    first, second = f
    return compiled_call(lambda g, *a: inline((g, second), *a), first, leading, args,
                         key=key + (id(second),), name=name)


def _odeint_eager(f, y0, ts, args, kw):
    ys, status, steps = _compiled_call(
        lambda f, y0, ts, args: _odeint_inline(f, y0, ts, args, **kw), f, (y0, np.asarray(ts)),
        args, (_OP, tuple(sorted(kw.items()))), "odeint")
    return ys if kw["throw"] else ODEResult(ys, int(status), int(steps))


class Event(NamedTuple):
    """What `odeint_event` returns: the event's time `t` and the state `y`
    there (a pytree like `y0`)."""

    t: Any
    y: Any


#: the regula falsi (Illinois) iterations that locate an event on the
#: interpolant of the step where it lies (each halves the bracket at worst;
#: Illinois converges superlinearly)
EVENT_ITERATIONS = 40


def _check_field(f, op):
    if isinstance(f, list):
        f = tuple(f)
    if not (callable(f) or (isinstance(f, tuple) and len(f) == 2
                            and all(callable(g) for g in f))):
        what = (f"a {len(f)}-tuple of {', '.join(type(g).__name__ for g in f)}"
                if isinstance(f, tuple) else type(f).__name__)
        raise DTypeError(f"`f` must be a function, or a pair of functions (its non-stiff "
                         f"and stiff parts, for the IMEX solvers), got {what}.", op=op)
    return f


@api_boundary
def odeint_event(f: Callable, y0, t_span, event: Callable, args=(), *, direction: int = 0,
                 solver: str = "tsit5", rtol: float = 1e-6, atol: float = 1e-9,
                 adjoint: str = "checkpoint", max_steps: int = 4096, dt0: float | None = None,
                 jac: str | None = None, checkpoints: int | None = None) -> Event:
    """Integrates `dy/dt = f(t, y, args)` from `y(t_span[0]) = y0` up to a
    terminal event: the first time `t*` in `(t0, t1]` where `event(t, y,
    args)` (a scalar) crosses zero; returns `Event(t*, y(t*))`.

    **Arguments:** `f`, `y0`, `args` and the solver options as for `odeint`;
    `t_span = (t0, t1)`; `event(t, y, args)`, written with sciad ops,
    returning a scalar; `direction`: +1 for upward crossings only, -1 for
    downward ones, 0 for either.

    The event is located on the solution's steps: the first step whose end
    crosses, then the root of the event function along the step's cubic
    Hermite interpolant. The span is integrated to its end to find it, so
    the field must be integrable past the event. No crossing raises
    `ConvergenceError` ("no event") when the program runs.

    **Derivatives:** `t*` is the root of `phi(t) = event(t, y(t), args)`,
    differentiated by the implicit function theorem (an `optimize.root`
    node at `t*`): `dt*/dtheta = -(dphi/dtheta) / (dphi/dt)`, with `dphi/dt =
    d event/dt + grad_y event . f(t*, y*)` and `dphi/dtheta` through the ODE's
    own derivative rules (`adjoint`), so `t*` and `y(t*) = odeint(..., [t0,
    t*])` have derivatives in `y0`, `args` and the span, at every order. At a
    grazing event (`dphi/dt = 0`) the event time has no derivative.
    """
    op = "ode.odeint_event"
    f = _check_field(f, op)
    if not callable(event):
        raise DTypeError(f"`event` must be a function event(t, y, args), got "
                         f"{type(event).__name__}.", op=op)
    if direction not in (-1, 0, 1):
        raise InvalidOptionError(f"`direction` must be -1, 0 or 1, got {plain(direction)}.",
                                 op=op)
    if not isinstance(t_span, Tracer) and len(t_span) != 2:
        raise ShapeError(f"`t_span` must be (t0, t1), got {t_span!r}.", op=op)
    solver, adaptive, rtol = _check_options(solver, rtol, atol, adjoint, max_steps, dt0,
                                            True, checkpoints, op)
    if not any(isinstance(t, Tracer) for t in t_span):
        _check_times(np.asarray([float(t) for t in t_span]), op)
    kw = dict(solver=solver, rtol=rtol, atol=atol, adjoint=adjoint, max_steps=int(max_steps),
              dt0=dt0, adaptive=adaptive, jac=jac, checkpoints=checkpoints, throw=True, op=op)
    if _in_trace((y0, t_span, args)):
        return _event_inline(f, y0, t_span, event, args, direction, kw)
    t, y = _compiled_call(  # (the cache entry holds `event`: its id is in the key)
        lambda f, y0, span, args: tuple(_event_inline(f, y0, span, event, args, direction,
                                                      kw)),
        f, (y0, np.asarray(t_span, np.float64)), args,
        (op, direction, id(event), tuple(sorted(kw.items()))), "odeint_event")
    return Event(t, y)


def _event_inline(f, y0, t_span, event, args, direction: int, kw) -> Event:
    op = kw["op"]
    span = snp.stack([snp.asarray(t) for t in t_span]) if not isinstance(t_span, Tracer) \
        else t_span
    t0 = span[0]

    def g(t, y):  # the event function, checked: a real scalar
        out = snp.asarray(event(t, y, args))
        if type_of(out).size != 1 or type_of(out).dtype.kind not in "fiu":
            raise ShapeError(f"`event` must return a real scalar, got "
                             f"{type_of(out).str_short()}.", op=op)
        return snp.reshape(snp.astype(out, type_of(t).dtype), ())

    def at(t, y):  # the field (its parts summed)
        if isinstance(f, tuple):
            return _tree.tree_map(lambda a, b: a + b, f[0](t, y, args), f[1](t, y, args))
        return f(t, y, args)

    # where: the first step whose end crosses zero (the detection solve is
    # not differentiated)
    _, _, nsteps, grid, states = _odeint_inline(
        f, y0, span, args, every_step=True, **{**kw, "adjoint": INTERPOLATED.name,
                                                 "checkpoints": None})
    grid = stop_gradient(grid)
    states = _tree.tree_map(stop_gradient, states)
    gs = vmap(g)(grid, states)
    prev, cur = gs[:-1], gs[1:]
    up, down = (prev < 0) & (cur >= 0), (prev > 0) & (cur <= 0)
    cross = {1: up, -1: down, 0: up | down}[direction]
    cross = cross & (snp.arange(1, grid.shape[0]) <= nsteps)
    found = snp.any(cross)
    i = snp.argmax(cross)
    ta, tb = grid[i], grid[i + 1]
    ya, yb = (_tree.tree_map(lambda s: s[j], states) for j in (i, i + 1))
    fa, fb = at(ta, ya), at(tb, yb)
    h = tb - ta

    def interpolant(t):  # the step's cubic Hermite interpolant at t
        return _tree.tree_map(functools.partial(hermite_at, (t - ta) / h, h), ya, yb, fa, fb)

    def illinois(_, c):  # regula falsi with Illinois' halving, on [a, b]
        a, b, ga, gb, side = c
        t = snp.where(gb != ga, (a * gb - b * ga) / (gb - ga), 0.5 * (a + b))
        gt = g(t, interpolant(t))
        left = gt * ga > 0  # the root lies in [t, b]
        a, ga_new = snp.where(left, t, a), snp.where(left, gt, ga)
        b, gb_new = snp.where(left, b, t), snp.where(left, gb, gt)
        # the end kept twice in a row has its value halved
        gb_new = snp.where(left & (side == 1), 0.5 * gb_new, gb_new)
        ga_new = snp.where(~left & (side == -1), 0.5 * ga_new, ga_new)
        return a, b, ga_new, gb_new, snp.where(left, 1, -1)

    a, b, ga, gb, _ = fori_loop(0, EVENT_ITERATIONS, illinois,
                                (ta, tb, prev[i], cur[i], snp.asarray(0)))
    t_star = snp.where(snp.abs(ga) < snp.abs(gb), a, b)
    t_star = stop_gradient(snp.where(found, t_star, span[1]))

    def phi(t):  # the event function along the solution: t* is its root
        ys, _, _ = _odeint_inline(f, y0, snp.stack([t0, t]), args, **kw)
        return g(t, _tree.tree_map(lambda v: v[-1], ys))

    # one Newton step on phi itself: the interpolant's root is accurate to
    # the interpolation (O(h^4)), this one to the solver's tolerance
    value, slope = jvp(phi, (t_star,), (snp.ones_like(t_star),))
    newton = t_star - value / slope
    t_star = stop_gradient(snp.where(snp.isfinite(newton) & (newton > ta) & (newton <= tb),
                                     newton, t_star))
    # (the root node takes no iteration, atol=inf: it gives t* the implicit
    # function theorem's derivatives, at every order)
    t_ev = optimize.root(phi, t_star, jac="dense", atol=float("inf")).x
    t_ev = event_guard_p.bind(found, stop_gradient(span), t_ev, direction=direction)
    ys, _, _ = _odeint_inline(f, y0, snp.stack([t0, t_ev]), args, **kw)
    return Event(t_ev, _tree.tree_map(lambda v: v[-1], ys))


#: SciPy's method names -> sciad's solvers
SCIPY_METHODS = {"RK45": "dopri5", "RK23": "bosh3", "DOP853": "dopri8", "Radau": "kvaerno5",
                 "BDF": "kvaerno5", "LSODA": "kvaerno5"}


class IVPResult(NamedTuple):
    """`solve_ivp`'s result, with SciPy's field names and meanings: `t`,
    `y` (states along the last axis: `(n, len(t))`), `success`, `status`
    (SciPy's: 0 the end of `t_span` was reached, -1 the integration
    failed), `message` (what failed: sciad's diagnosis)."""

    t: Any
    y: Any
    success: Any
    status: Any
    message: str


def _ivp_args(args, op: str) -> tuple:
    """SciPy's rule: `args` unpacks into `fun(t, y, *args)` (a list or an
    array too, element by element)."""
    if args is None:
        return ()
    try:
        return tuple(args)
    except TypeError:
        raise DTypeError(f"`args` must unpack into fun's extra arguments, `fun(t, y, *args)`, "
                         f"as SciPy's, got {args!r}: pass args=({args!r},).", op=op) from None


def _ivp_state(y0, op: str):
    """SciPy's rule: `y0` a 1-d array of real numbers, as float64 (a list
    of numbers or of traced scalars is one), finite where it is concrete."""
    if isinstance(y0, Tracer) or any(isinstance(v, Tracer) for v in _tree.tree_leaves(y0)):
        y = snp.asarray(y0)
        shape, kind = tuple(y.shape), y.dtype.kind
    else:
        y = np.asarray(y0)
        shape, kind = y.shape, y.dtype.kind
    if kind == "c":
        raise DTypeError("complex `y0` is not supported: integrate its real and imaginary "
                         "parts as separate states.", op=op)
    if kind not in "biuf":
        raise DTypeError(f"`y0` must hold real numbers, got an array of {y.dtype}.", op=op)
    if len(shape) != 1:
        raise ShapeError(f"`y0` must be 1-dimensional, as SciPy's, got shape {shape}: for a "
                         "scalar pass [y0]; for a state of any shape or a pytree use "
                         "`sd.ode.odeint`.", op=op)
    if isinstance(y, np.ndarray):
        if not np.all(np.isfinite(y)):
            raise ShapeError(f"all components of `y0` must be finite, got {y!r}.", op=op)
        return y.astype(np.float64)
    return snp.astype(y, np.float64)


def _ivp_times(t0, t1, t_eval, backward: bool, op: str):
    """odeint's output times for SciPy's `t_span` and `t_eval` (in the
    integration's direction, so negated backwards), the rows of its output
    that SciPy returns, and SciPy's `t`."""
    traced = isinstance(t0, Tracer) or isinstance(t1, Tracer)
    sign = -1.0 if backward else 1.0
    if t_eval is None:
        ends = snp.stack([snp.asarray(t0, np.float64), snp.asarray(t1, np.float64)]) \
            if traced else np.array([t0, t1], np.float64)
        return ends * sign, slice(None), ends
    if isinstance(t_eval, Tracer):
        if len(type_of(t_eval).shape) != 1:
            raise ShapeError(f"`t_eval` must be 1-dimensional, got {type_of(t_eval)}.", op=op)
        # (its first time must follow t0: checked when the program runs)
        first = snp.reshape(snp.asarray(t0, np.float64), (1,))
        return snp.concatenate([first, snp.asarray(t_eval, np.float64)]), slice(1, None), \
            t_eval
    te = np.asarray(t_eval, np.float64)
    if te.ndim != 1:
        raise ShapeError(f"`t_eval` must be 1-dimensional, got shape {te.shape}.", op=op)
    if not traced:
        lo, hi = min(float(t0), float(t1)), max(float(t0), float(t1))
        if not np.all((te >= lo) & (te <= hi)):
            raise ShapeError(f"values in `t_eval` are not within `t_span` ({t0}, {t1}), as "
                             f"SciPy requires, got {te!r}.", op=op)
        if not np.all(np.diff(te) * sign > 0):
            raise ShapeError(f"values in `t_eval` must be strictly {'de' if backward else 'in'}"
                             f"creasing (the direction of `t_span`), got {te!r}.", op=op)
    if traced or te.size == 0 or te[0] != float(t0):
        ts, rows = snp.concatenate([snp.reshape(snp.asarray(t0, np.float64), (1,)), te]) \
            if traced else np.concatenate([[float(t0)], te]), slice(1, None)
    else:
        ts, rows = te, slice(None)
    if ts.shape[0] < 2:  # t_eval is [] or [t0]: odeint still needs an interval
        ts, rows = np.array([float(t0), float(t1)]), slice(0, te.size)
    return ts * sign, rows, te


@api_boundary
def solve_ivp(fun: Callable, t_span, y0, method: str = "RK45", t_eval=None, args=(),
              rtol: float = 1e-3, atol: float = 1e-6, **options) -> IVPResult:
    """`scipy.integrate.solve_ivp`'s interface to `odeint`, with SciPy's
    rules for its inputs and outputs: `fun(t, y, *args)` returning an array
    or a list (`args` unpacked, a list or an array too), `y0` a 1-d array
    or a list of numbers (as float64), `t_span` backwards too (`t1 < t0`),
    `t_eval` within `t_span` and sorted in its direction (default: the two
    ends of `t_span`, as sciad's outputs have a static size; SciPy returns
    the solver's steps), and the result's `y` of shape `(n, len(t))`,
    `status` 0 or -1. SciPy's method names (`"RK45"` is Dormand-Prince
    5(4), `"DOP853"` an 8th-order Dormand-Prince, `"RK23"`
    Bogacki-Shampine; the stiff `"Radau"`, `"BDF"` and `"LSODA"` map to the
    ESDIRK method `"kvaerno5"`) or sciad's, SciPy's default tolerances.
    `options` go to `odeint` (`adjoint`, `max_steps`, `jac`, `first_step` as
    `dt0`, ...); SciPy's `events`, `dense_output` and `vectorized` are
    refused, naming what to use (`odeint_event` for a terminal event).
    Never raises on a failed integration: `success`, `status` and `message`
    say so (and `y` is not finite past the failure).

    ```python
    res = sd.ode.solve_ivp(lambda t, y, k: [-k * y[0], y[0]], (0.0, 2.0), [1.0, 0.0],
                           t_eval=[1.0, 2.0], args=(0.5,), rtol=1e-8)
    res.y      # [[0.6065 0.3679] [0.7869 1.2642]]: exp(-t / 2), 2 (1 - exp(-t / 2))
    res.status, res.message                                   # 0 'success'
    sd.ode.solve_ivp(lambda t, y: [-y[0]], (1.0, 0.0), [1.0], t_eval=[0.5, 0.0]).y
    # [[1.6487 2.7183]]: backwards, e^(1 - t)
    ```
    """
    op = "ode.solve_ivp"
    if method in SCIPY_METHODS:
        solver = SCIPY_METHODS[method]
    elif isinstance(method, str) and method.lower() in SOLVERS:
        solver = method.lower()
    else:
        raise InvalidOptionError(f"unknown method {method!r}; one of {list(SCIPY_METHODS)} "
                                 f"or {list(SOLVERS)}.", op=op)
    if len(t_span) != 2:
        raise ShapeError(f"`t_span` must be (t0, t1), got {t_span!r}.", op=op)
    if "first_step" in options:
        options["dt0"] = options.pop("first_step")
    instead = {"events": "sd.ode.odeint_event (a terminal event, its time differentiable)",
               "dense_output": "t_eval (the outputs' times are static)",
               "vectorized": "nothing: the field is traced once, not called per column"}
    refused = sorted(set(options) & set(instead))
    if refused:
        raise NotSupportedError(f"SciPy's `{refused[0]}` has no counterpart in solve_ivp; use "
                                f"{instead[refused[0]]}.", op=op)
    args, y0 = _ivp_args(args, op), _ivp_state(y0, op)
    t0, t1 = t_span
    # backwards (SciPy's t1 < t0) is forwards in s = -t: dy/ds = -fun(-s, y)
    backward = not isinstance(t0, Tracer) and not isinstance(t1, Tracer) and \
        float(t1) < float(t0)
    ts, rows, t = _ivp_times(t0, t1, t_eval, backward, op)

    def field(t, y, a):  # SciPy's: whatever `fun` returns, as a float64 array
        dy = snp.astype(snp.asarray(fun(-t if backward else t, y, *a)), np.float64)
        return -dy if backward else dy

    res = odeint(field, y0, ts, args, solver=solver, rtol=rtol, atol=atol, throw=False,
                 **options)
    code = res.status
    if isinstance(code, Tracer):
        status, message = snp.where(code == 0, 0, -1), "see `success` (known when it runs)"
    else:
        status, message = (0 if int(code) == 0 else -1), STATUS[int(code)]
    ys = res.ys[rows]
    y = snp.transpose(ys) if isinstance(ys, Tracer) else np.asarray(ys).T
    return IVPResult(t if isinstance(t, Tracer) else np.asarray(t, np.float64), y,
                     res.success, status, message)
