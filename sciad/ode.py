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
  of those steps with checkpointing (BDF's: from the states and orders its
  loop records), the exact gradient of the computed solution, consistent
  with forward mode to rounding. The continuous
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
import math
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from . import _cache, numpy as snp
from . import optimize
from ._compile import _split_args, cached, compiled_call
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
from .primitives._schedules import MemoryBudget, Segments
from .primitives._ode import STATUS, SOLVERS, OdeintOutputs, odeint_p
from .primitives._ode_adjoint import ADJOINTS, INTERPOLATED
from .primitives._ode_events import event_guard_p
from .primitives._ode_field import field_body, part_of, with_mass_entries
from .primitives._ode_interp import hermite_at
from .primitives._stop_gradient import stop_gradient
from .solvers.ode._ode_steppers import takers_of_mass

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
            + ("Times must increase, or all decrease (backwards in time)." if op == _OP else
               "Integrating backwards in time: substitute s = -t."), op=op)


def _odeint_inline(f, y0, ts, args, *, solver, rtol, atol, adjoint, max_steps, dt0, adaptive,
                   jac, checkpoints, throw, op, every_step: bool = False, dtmax=None,
                   reached: bool = False, count: bool = False, mass=None,
                   dae_init: str = "check"):
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
    if isinstance(checkpoints, MemoryBudget):
        checkpoints = _budgeted(checkpoints, sum(sizes) * dtype.itemsize, max_steps, solver,
                                adjoint, op)

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
        if mass is not None:  # (the mass matrix's operand: taken, not read)
            ls = ls[:-1]
        y, a = unflatten(y), rebuild(ls)
        if not isinstance(f, tuple):
            out = flat_value(f, t, y, a, "f")
            return [snp.zeros_like(out), out] if imex else [out]
        parts = [flat_value(fn, t, y, a, name) for fn, name in zip(f, ("f[0]", "f[1]"))]
        return parts if imex else [parts[0] + parts[1]]

    scalar = type_of(snp.zeros((), dtype))
    n = sum(sizes)
    held_mass = []  # (the mass matrix's operand and its pattern, where given)
    if mass is not None:
        held_mass = list(_mass_operand(mass, n, dtype, solver, op))
    graph, consts, _ = trace_body(field, [type_of(v) for v in vals] +
                                  [type_of(m) for m in held_mass[:1]] +
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
    if dtmax is not None:
        params["dtmax"] = float(dtmax)
    if pattern is not None:
        params["pattern"] = pattern
    if isinstance(checkpoints, Segments):  # (a budget's, its snapshots on disk)
        params["checkpoints"], params["disk"] = checkpoints.snapshots, checkpoints.directory
    elif checkpoints is not None:
        params["checkpoints"] = int(checkpoints)
    if count:
        params["count"] = True
    operands = list(consts) + list(vals)
    if mass is not None:
        values, mass_pattern = held_mass
        if pattern is not None:  # (the Newton matrices hold the mass's entries too)
            params["pattern"] = with_mass_entries(pattern, mass_pattern)
            if SOLVERS[solver].lowering == "radau" and np.any(
                    mass_pattern.rows != np.asarray(mass_pattern.indices)):
                raise NotSupportedError(
                    "Radau with sparse iteration matrices takes a diagonal mass matrix (its "
                    "complex system's off-diagonal blocks hold it on their diagonal); use "
                    "solver='bdf', or jac='dense'.", op=op)
        params["mass"] = len(operands)
        if mass_pattern is not None:
            params["mass_pattern"] = mass_pattern
        operands.append(values)
        if dae_init == "solve":
            flat0 = _consistent(field, operands, flat0, ts, mass, op)
        elif dae_init != "check":
            raise InvalidOptionError(f"`dae_init` must be 'check' or 'solve', got "
                                     f"{plain(dae_init)}.", op=op)
    outs = OdeintOutputs.of(odeint_p.bind(*operands, flat0, ts, **params), params)
    ys, status, nsteps = outs.ys, outs.status, outs.steps
    work = (outs.work,) if count else ()  # (nfev, njev, nlu), last where asked for
    if every_step:  # (the interpolated adjoint's node: its step grid and states)
        grid, states = outs.grid, outs.states
        return (unflatten(ys, type_of(ts).shape), status, nsteps, grid,
                unflatten(states, type_of(grid).shape)) + work
    if reached:  # (and the time of the last accepted step: the end of ts on success)
        return (unflatten(ys, type_of(ts).shape), status, nsteps,
                snp.take(outs.grid, nsteps)) + work
    return (unflatten(ys, type_of(ts).shape), status, nsteps) + work


class _Mass:
    """A constant mass matrix (`odeint(mass=...)`), held as its pattern and
    values (float64), compared and hashed by content (it keys compiled programs)."""

    def __init__(self, matrix, op: str):
        import scipy.sparse as sp

        if isinstance(matrix, Tracer):
            raise NotSupportedError(
                "the mass matrix must be a constant (a NumPy array or a SciPy sparse "
                "matrix), not a traced value: its derivative is not formed.", op=op)
        m = sp.csr_matrix(matrix) if sp.issparse(matrix) else \
            sp.csr_matrix(np.asarray(matrix))
        if m.ndim != 2 or m.shape[0] != m.shape[1] or m.dtype.kind not in "fiub":
            raise ShapeError(f"the mass matrix must be a real square matrix, got "
                             f"{m.dtype} of shape {m.shape}.", op=op)
        m = sp.csr_matrix(m, dtype=np.float64)
        if not np.all(np.isfinite(m.data)):
            raise InvalidOptionError("the mass matrix must be finite.", op=op)
        m.eliminate_zeros()
        m.sum_duplicates()
        m.sort_indices()
        from .graph._types import Pattern

        self.values = m.data
        self.pattern = Pattern(m.shape, m.indptr, m.indices)
        self._key = (self.pattern, m.data.tobytes())

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Mass) and self._key == other._key

    def __repr__(self):
        return f"_Mass({self.pattern.shape}, nnz={self.pattern.nnz})"


def _dae_options(kw: dict, op: str) -> dict:
    """`mass` (as a `_Mass`) and `dae_init` among odeint's options `kw`,
    where given, for a solve that calls `_odeint_inline` itself."""
    if kw.get("mass") is None:
        return {}
    mass = kw["mass"]
    return {"mass": mass if isinstance(mass, _Mass) else _Mass(mass, op),
            "dae_init": kw.get("dae_init", "check")}


def _mass_operand(mass: _Mass, n: int, dtype, solver: str, op: str):
    """`(values, pattern)`: the mass matrix's entries as the node's operand,
    on its own pattern (checked: `(n, n)`, for BDF)."""
    if not SOLVERS[solver].takes_mass:
        raise NotSupportedError(
            f"a mass matrix (M dy/dt = f) is for the solvers {takers_of_mass()} (solve_ivp's "
            f"method='BDF' or 'Radau'); got {solver!r}, which does not take one: use one of "
            f"those.", op=op)
    if mass.pattern.shape != (n, n):
        raise ShapeError(f"the mass matrix must be ({n}, {n}), the flat state's size, got "
                         f"{mass.pattern.shape}.", op=op)
    return snp.asarray(mass.values.astype(dtype)), mass.pattern


def _consistent(field, vals, flat0, ts, mass: _Mass, op: str):
    """`flat0` with its algebraic variables (the mass matrix's columns
    without an entry) solved from the algebraic equations (its rows without
    one) at `ts[0]`, the differential ones held (`dae_init="solve"`): one
    `optimize.root` node, so derivatives of the result flow through the
    implicit function theorem."""
    from .optimize import root

    # (the algebraic equations and variables of a semi-explicit DAE)
    rows, cols = mass.pattern.empty_lines()
    if rows.size == 0:
        return flat0
    if rows.size != cols.size:
        raise InvalidOptionError(
            f"dae_init='solve' solves the algebraic equations (the {rows.size} rows of the "
            f"mass matrix without an entry) for the algebraic variables (its {cols.size} "
            "columns without one): their numbers must match (a semi-explicit index-1 DAE).",
            op=op)

    def g(z, t0, y, *ls):
        return field(*ls, t0, y.at[cols].set(z))[0][rows]

    z = root(g, flat0[cols], args=(ts[0], flat0, *vals)).x
    # (z put in place by a gather, which a constant y0 in a traced program,
    # a NumPy array, takes too)
    where = np.full(flat0.shape[0], cols.size)
    where[cols] = np.arange(cols.size)
    placed = snp.concatenate([z, snp.zeros((1,), type_of(z).dtype)])[where]
    return snp.where(where < cols.size, placed, flat0)


#: the smallest `rtol` an error estimate can meet: SciPy's, 100 eps of float64
MIN_RTOL = 100 * float(np.finfo(np.float64).eps)


def _budgeted(budget: MemoryBudget, state_bytes: int, max_steps: int, solver: str,
              adjoint: str, op: str):
    """`checkpoints` for a memory budget on the states reverse mode keeps:
    None (every step's state recorded) where `max_steps + 1` states fit;
    else, for the discrete adjoint, the snapshots of its replay (`Segments`:
    `s + ceil(max_steps / s) + 1` carries: states, BDF's differences of
    `ROWS` states) that fit, or with the budget's `disk`, where none fit,
    `Segments(s, directory)` (the snapshots on disk, a segment's carries in
    RAM). The interpolated adjoint reads the state at every step: a budget
    that does not hold them is refused, as is one that holds no replay's
    carries."""
    from .primitives._ode_replay import ROWS, SNAPSHOT_BYTES
    from .primitives._while import budget_schedule

    n = budget.carries(state_bytes, op)
    every = max_steps + 1
    if adjoint == "backsolve":  # (one state, whatever the steps)
        return None
    if every <= n and (every * state_bytes <= SNAPSHOT_BYTES
                       or not SOLVERS[solver].replayable):
        # (recorded by the forward pass, as without a budget: BDF's and
        # Radau's own reverse passes read them, where they fit)
        return None
    if adjoint == INTERPOLATED.name:
        raise InvalidOptionError(
            f"the interpolated adjoint reads the state at every step (max_steps + 1 = "
            f"{every} states of {_cache.si(state_bytes)}, {_cache.si(every * state_bytes)}), "
            f"and a memory budget of {_cache.si(budget.ram)} holds {n} of them: raise the "
            "budget, lower `max_steps`, or use the checkpointed adjoint (whose snapshots a "
            "budget's `disk=` can hold).", op=op)
    what = "states"
    if SOLVERS[solver].lowering == "bdf":  # (its replay's carry: its differences)
        state_bytes *= ROWS
        n = budget.carries(state_bytes, op)
        what = f"carries (BDF's differences, {ROWS} states each)"
    schedule = budget_schedule(budget, state_bytes, max_steps, op, only_segments=True)
    if not isinstance(schedule, Segments):
        need = 2 * math.isqrt(max_steps) + 3
        raise InvalidOptionError(
            f"the checkpointed adjoint replays each output interval's steps storing "
            f"s + ceil(max_steps / s) + 1 {what} (about 2 sqrt(max_steps) = "
            f"{need - 1} for max_steps = {max_steps}), and a memory budget of "
            f"{_cache.si(budget.ram)} holds {n} of {_cache.si(state_bytes)}: give at "
            f"least ram={need * state_bytes} ({_cache.si(need * state_bytes)}), or lower "
            "`max_steps`" + ("" if budget.disk else ", or give the budget `disk=` (a "
                                                    "directory for the snapshots)") + ".", op=op)
    return schedule if schedule.directory else schedule.snapshots


def _check_options(solver, rtol, atol, adjoint, max_steps, dt0, adaptive, checkpoints, op,
                   dtmax=None):
    """The options, checked: `(solver, adaptive, rtol)`, the solver's name in
    lower case and `rtol` raised to `MIN_RTOL` (with a warning) as SciPy's
    `solve_ivp` does."""
    if not isinstance(solver, str) or solver.lower() not in SOLVERS:
        raise InvalidOptionError(f"unknown solver {plain(solver)}; one of "
                                 f"{', '.join(SOLVERS)}.", op=op)
    solver = solver.lower()
    if adjoint is not None and adjoint not in ADJOINTS:
        raise InvalidOptionError(f"`adjoint` must be None or one of {tuple(ADJOINTS)}, got "
                                 f"{plain(adjoint)}.", op=op)
    if adjoint is not None and not SOLVERS[solver].discrete \
            and not ADJOINTS[adjoint].continuous:
        raise InvalidOptionError(
            f"adjoint={adjoint!r} differentiates the steps taken, which {solver!r}'s steps "
            f"do not give: use adjoint='interpolated' or 'backsolve'.", op=op)
    if not SOLVERS[solver].replayable and not adaptive:
        raise InvalidOptionError(f"{solver!r} chooses its own steps and orders: constant "
                                 f"steps (adaptive=False) are for the Runge-Kutta methods.",
                                 op=op)
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
    if dtmax is not None and not (isinstance(dtmax, (int, float)) and dtmax > 0):
        raise InvalidOptionError(f"`dtmax` must be None or a step size > 0, got "
                                 f"{plain(dtmax)}.", op=op)
    fixed = not SOLVERS[solver].error_estimate  # (constant steps only)
    if (not adaptive or fixed) and dt0 is None:
        raise InvalidOptionError(f"constant steps (adaptive=False, or the {solver} solver, "
                                 f"which has no error estimate) need `dt0`.", op=op)
    if isinstance(checkpoints, MemoryBudget):  # (resolved once the state's size is known)
        return solver, bool(adaptive) and not fixed, float(rtol)
    if checkpoints is not None and (not isinstance(checkpoints, (int, np.integer))
                                    or checkpoints < 1):
        raise InvalidOptionError(f"`checkpoints` must be None, an int >= 1 or "
                                 f"`sd.MemoryBudget(ram=...)`, got {plain(checkpoints)}.", op=op)
    return solver, bool(adaptive) and not fixed, float(rtol)


class ODEResult(NamedTuple):
    """What `odeint(..., throw=False)` returns: `ys` (as for `throw=True`;
    not finite at the output times past a failure), `status` (0 on success;
    see `sciad.primitives._ode.STATUS`), `steps`, the accepted steps, and
    `t_reached`, the time the integration reached (`ts[-1]` on success,
    where it stopped on a failure). Traced values inside a trace, arrays
    outside."""

    ys: Any
    status: Any
    steps: Any
    t_reached: Any = None
    #: the work as SciPy counts it: the field's evaluations, Jacobians and
    #: factorizations (from the stages and accepted steps of a method
    #: diffrax steps; as they happen for BDF and Radau)
    nfev: Any = None
    njev: Any = None
    nlu: Any = None

    @property
    def success(self):
        return self.status == 0


@api_boundary
def odeint(f: Callable, y0, ts, args=(), *, solver: str = "tsit5", rtol: float = 1e-6,
           atol: float = 1e-9, adjoint: str | None = None, max_steps: int = 4096,
           dt0: float | None = None, adaptive: bool = True, jac: str | None = None,
           checkpoints: int | None = None, throw: bool = True, dtmax: float | None = None,
           mass=None, dae_init: str = "check"):
    """Solves `dy/dt = f(t, y, args)` from `y(ts[0]) = y0`; returns `y` at `ts`.

    **Arguments:**

    - `f`: the vector field `f(t, y, args)`, written with sciad ops, returning a
      pytree like `y`; or a pair `(f_nonstiff, f_stiff)` of such functions,
      whose sum is the field. The IMEX solvers step the first part
      explicitly and the second implicitly (their Newton systems hold only
      its Jacobian); other solvers step the sum. An IMEX solver given one
      function treats all of it as stiff.
    - `y0`: the initial state, a pytree of real float arrays.
    - `ts`: the output times, strictly increasing, or strictly decreasing
      (concrete times: backwards in time, as `s = -t`); `ts[0]` is the
      initial time. Concrete times are checked when traced; traced ones (to
      differentiate with respect to them) when the program runs.
    - `args`: passed to `f` (a pytree of arrays; static objects allowed).
    - `solver`: explicit `"tsit5"` (the default), `"dopri5"`, `"dopri8"`,
      `"bosh3"`, `"heun"`, `"euler"` (constant steps only); stiff
      (ESDIRK): `"kvaerno3"`, `"kvaerno4"`, `"kvaerno5"`,
      `"implicit_euler"`; IMEX (additive Runge-Kutta, for a stiff part such
      as diffusion beside a non-stiff one such as reactions or advection):
      `"kencarp3"`, `"kencarp4"`, `"kencarp5"`. The continuous adjoints
      integrate an IMEX problem's summed field with the Kvaerno method of
      the same order. Multistep: `"bdf"`, variable-order (1-5),
      variable-step backward differentiation (NDF, as SciPy's `BDF` and
      MATLAB's `ode15s`), its iteration matrix `I - c df/dy` factored once
      and reused over steps (dense, or sparse as `jac` says), for stiff
      problems over long spans. Fully implicit: `"radau"`, Radau IIA of
      order 5 (Hairer and Wanner's RADAU5, SciPy's `Radau`), its three
      stages solved together through one real and one complex
      factorization per step size, for stiff problems at tight
      tolerances.
    - `rtol`, `atol`: the local error tolerances of the step-size control.
    - `adjoint`: reverse mode (None: the default, `"checkpoint"`, for
      every solver):
        - `"checkpoint"` (the default): the discrete
          adjoint of the steps
          taken, the exact gradient of the computed solution (to rounding;
          to the Newton tolerance for implicit solvers), consistent with
          forward mode. Where the states at every step fit in 64 MiB
          (`max_steps + 1` states; `checkpoints=None`), the forward pass
          records them and the reverse pass re-runs each step once from its
          state for its linearisation. Otherwise the steps are re-run on the
          recorded step grid, and their reverse pass stores states as
          `checkpoints` says. For `"bdf"`, the forward pass records every
          step's state, order and step size changes (always: `checkpoints`
          is refused), and the reverse pass solves each step's transposed
          iteration matrix `(M - c df/dy)^T` at the step's result, a DAE's
          included. For `"radau"` (every step's state recorded), each step
          is re-run from its state, its three stages solved together by one
          root node (a DAE's included; its sparse Newton steps by KLU in
          the program on the CPU), whose reverse pass is the step's.
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
      graph, values by colored JVPs; the factorization kept over steps of
      the same size, for up to 20 steps: the step-size controller holds the
      step where it would grow it by less than 1.2x; factored by SuperLU on
      the host, or, for `"bdf"` and `"radau"` on the CPU, by KLU compiled
      into the program, its factor kept in the loop) or None (dense up to 64
      states or above a fifth of fill, else sparse). A
      stage's chord iterations stop as RADAU5's do, by their contraction
      rate.
    - `checkpoints`: the states the checkpointed reverse pass stores evenly
      over the steps of each output interval, re-running the steps between
      them (`sd.Segments`). None: every step's state, recorded by the
      forward pass, where they fit in 64 MiB; else as many as 64 MiB
      holds, at least about sqrt(max_steps). `sd.MemoryBudget(ram=...)`:
      every step's state where `max_steps + 1` of them fit in `ram`, else
      the most snapshots whose replay (`s + ceil(max_steps / s) + 1`
      states) fits, or with `disk=`, where none fits, those snapshots on
      disk (a segment's states in RAM); the interpolated adjoint, which
      reads every step's state, refuses a budget that does not hold them.
      For `"bdf"` and `"radau"`, whose own reverse passes read every
      step's state, None keeps every step's state whatever its size; an
      int or a budget that does not hold them replays the steps on the
      recorded grid from snapshots instead (each step's implicit equation
      an `optimize.root` node, solved to 1e-3 rtol: the gradient is the
      stored pass's to that tolerance, several times slower); BDF's
      snapshots are its differences, 8 states each, and its forward pass
      then records only each step's order and step size changes (37
      numbers a step).
    - `dtmax`: the largest step the step-size control takes (None:
      unbounded); SciPy's `max_step`. The derivative rules replay the
      steps taken, so they follow it too.
    - `mass`: a constant mass matrix `M` (a NumPy array or a SciPy sparse
      matrix, `(n, n)` for the flat state's `n` elements; None: the
      identity): solves `M dy/dt = f(t, y, args)`, for `solver="bdf"`,
      `"radau"` (with `jac="sparse"`, Radau takes a diagonal `M`) and the
      ESDIRK methods `"kvaerno3"`, `"kvaerno4"`, `"kvaerno5"` (then stepped
      by sciad's own loop, adaptive steps only). A
      singular `M` makes a differential-algebraic system: its rows without
      an entry are algebraic equations `0 = f_i`, which `y0` must satisfy
      to `rtol` (relative to `max(1, |y0|)`; else `InvalidOptionError` when
      the program runs), and its columns without an entry the algebraic
      variables (a semi-explicit index-1 DAE). Forward mode differentiates
      it (the sensitivities with the same `M`), and so does reverse mode
      with `adjoint="checkpoint"` (the discrete adjoint; BDF's default); the
      continuous adjoints are refused.
      `M` has no derivative.
    - `dae_init`: `"check"` (the default: inconsistent initial values are
      an error) or `"solve"`: the algebraic variables of `y0` are solved
      from the algebraic equations at `ts[0]` first (an `optimize.root`
      node, so the result's derivatives include theirs).
    - `throw`: raise `sciad.errors.ConvergenceError` when the integration
      fails (the step limit, a collapsed step size, a non-finite state),
      naming the time reached, the last step size and a diagnosis. With
      `throw=False`, an `ODEResult(ys, status, steps, t_reached)` is
      returned instead (`t_reached`: where a failed integration stopped; and
      the counters `nfev`, `njev`, `nlu`).

    **Returns:**

    `y` at `ts`: a pytree like `y0` whose arrays have a leading axis of
    `len(ts)`; or an `ODEResult` with `throw=False`.

    **Example:**

    ```python
    import numpy as np, sciad as sd

    decay = lambda t, y, k: -k * y
    sd.ode.odeint(decay, np.ones(1), np.array([0.0, 1.0]), 0.5)   # [[1.] [0.60653069]]
    sd.grad(lambda k: sd.ode.odeint(decay, np.ones(1), np.array([0.0, 1.0]), k)[-1, 0])(0.5)
    # -0.6065302949634307
    ```
    """
    op = _OP
    f = _check_field(f, op)
    solver, adaptive, rtol = _check_options(solver, rtol, atol, adjoint, max_steps, dt0,
                                            adaptive, checkpoints, op, dtmax)
    backward = _decreasing(ts)
    if backward:  # backwards: forwards in s = -t, dy/ds = -f(-s, y, args)
        f = tuple(map(_reversed, f)) if isinstance(f, tuple) else _reversed(f)
        ts = -np.asarray(ts)
    _check_times(ts, op)
    adjoint = adjoint or SOLVERS[solver].default_adjoint
    kw = dict(solver=solver, rtol=rtol, atol=atol, adjoint=adjoint, max_steps=int(max_steps),
              dt0=dt0, adaptive=adaptive, jac=jac, checkpoints=checkpoints, throw=throw, op=op,
              dtmax=dtmax)
    kw.update(_dae_options({"mass": mass, "dae_init": dae_init}, op))
    sign = -1.0 if backward else 1.0
    if _in_trace((y0, ts, args)):
        if throw:
            return _odeint_inline(f, y0, ts, args, **kw)[0]
        ys, status, steps, reached, work = _odeint_inline(f, y0, ts, args, reached=True,
                                                          count=True, **kw)
        return ODEResult(ys, status, steps, sign * reached, work[0], work[1], work[2])
    return _odeint_eager(f, y0, ts, args, kw, sign)


def _ivp_encode(y, *, complex_: bool, big):
    """`solve_ivp`'s state as odeint integrates it: `[Re y, Im y]` for a
    complex one, in float64, over `big` (the scale of an array `atol`)."""
    z = snp.concatenate([snp.real(y), snp.imag(y)], axis=-1) if complex_ else y
    z = snp.astype(z, np.float64)
    return z / big if big is not None else z


def _ivp_decode(z, *, n: int, complex_: bool, big):
    z = z * big if big is not None else z
    return z[..., :n] + 1j * z[..., n:] if complex_ else z


def _ivp_codec(n: int, complex_: bool, big):
    """`(encode, decode)`: `solve_ivp`'s state to odeint's (`_ivp_encode`)
    and back."""
    return (functools.partial(_ivp_encode, complex_=complex_, big=big),
            functools.partial(_ivp_decode, n=n, complex_=complex_, big=big))


def _ivp_field(fun, backward: bool, complex_: bool, n: int, big):
    """SciPy's `fun` as odeint's field, in the integration's variable (`s =
    -t` backwards) and state (`_ivp_encode`): one function per `fun` and
    form, kept while `fun` lives, so that an eager `solve_ivp` called again
    with the same `fun` finds its compiled program (a new closure per call
    compiled again every time: 0.7-1.5 s a call)."""
    form = None if big is None else (big.dtype.str, big.shape, big.tobytes())
    encode, decode = _ivp_codec(n, complex_, big)

    def build(fref):
        def field(s, z, a):
            t = -s if backward else s
            dy = snp.asarray(fref()(t, decode(z), *a))
            dz = encode(snp.astype(dy, np.complex128) if complex_
                        else snp.astype(dy, np.float64))
            return -dz if backward else dz

        field.__name__ = getattr(fun, "__name__", "fun")
        return field

    return cached(fun, ("solve_ivp field", backward, complex_, n, form), build)


def _decreasing(ts) -> bool:
    """Concrete output times that decrease strictly: a backward solve."""
    if isinstance(ts, Tracer):
        return False
    arr = np.asarray(ts)
    return (arr.ndim == 1 and arr.shape[0] >= 2 and arr.dtype.kind in "fiu"
            and bool(np.all(np.diff(arr.astype(np.float64)) < 0)))


def _reversed(f):
    """The field in `s = -t`: `dy/ds = -f(-s, y, args)`."""
    def backwards(s, y, args):
        return _tree.tree_map(lambda v: -snp.asarray(v), f(-s, y, args),
                              is_leaf=lambda v: isinstance(v, Tracer))

    backwards.__name__ = getattr(f, "__name__", "f")
    return backwards


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


def _odeint_eager(f, y0, ts, args, kw, sign: float = 1.0):
    throw = kw["throw"]
    out = _compiled_call(
        lambda f, y0, ts, args: _odeint_inline(f, y0, ts, args, reached=not throw,
                                               count=not throw, **kw), f,
        (y0, np.asarray(ts)), args, (_OP, tuple(sorted(kw.items()))), "odeint")
    if throw:
        return out[0]
    ys, status, steps, reached, work = out
    return ODEResult(ys, int(status), int(steps), sign * float(reached),
                     *(int(w) for w in np.asarray(work)))


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
                 adjoint: str | None = None, max_steps: int = 4096, dt0: float | None = None,
                 jac: str | None = None, checkpoints: int | None = None,
                 dtmax: float | None = None) -> Event:
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
                                            True, checkpoints, op, dtmax)
    if not any(isinstance(t, Tracer) for t in t_span):
        _check_times(np.asarray([float(t) for t in t_span]), op)
    adjoint = adjoint or SOLVERS[solver].default_adjoint
    kw = dict(solver=solver, rtol=rtol, atol=atol, adjoint=adjoint, max_steps=int(max_steps),
              dt0=dt0, adaptive=adaptive, jac=jac, checkpoints=checkpoints, throw=True, op=op,
              dtmax=dtmax)
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
    if kw.get("mass") is not None:
        raise NotSupportedError(
            "an event with a mass matrix (a DAE) inside a transformation, or odeint_event "
            "with one: the event is located and differentiated along `f` as dy/dt, which a "
            "DAE's algebraic equations are not. Call solve_ivp outside the transformation, "
            "which locates the event along the solution.", op=op)
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
SCIPY_METHODS = {"RK45": "dopri5", "RK23": "bosh3", "DOP853": "dopri8", "Radau": "radau",
                 "BDF": "bdf"}
#: SciPy's methods sciad does not run, each with what to use instead
SCIPY_REFUSED = {"LSODA": (
    "LSODA switches between a non-stiff Adams method and BDF as it detects stiffness, "
    "which sciad does not do (it has no Adams method): use method='BDF' (or 'Radau') for a "
    "stiff problem and 'RK45' (or 'DOP853') for a non-stiff one")}
#: SciPy's `message` for each `status`
SCIPY_MESSAGES = {0: "The solver successfully reached the end of the integration interval.",
                  1: "A termination event occurred.", -1: "Integration step failed."}
#: the options solve_ivp takes besides odeint's own, SciPy's names
_SCIPY_OPTIONS = ("first_step", "max_step", "jac", "jac_sparsity", "vectorized", "min_step",
                  "lband", "uband")


class IVPResult(NamedTuple):
    """`solve_ivp`'s result, with SciPy's field names and meanings: `t`,
    `y` (states along the last axis: `(n, len(t))`), `success`, `status`
    (SciPy's: 0 the end of `t_span` was reached, 1 a terminal event
    occurred, -1 the integration failed), `message` (SciPy's, with
    sciad's diagnosis of a failure), `sol` (an `OdeSolution` with
    `dense_output=True`, else None), `t_events` and `y_events` (per event
    function, its times and states; None without `events`), and the
    counters `nfev`, `njev` and `nlu`: for BDF and Radau, every evaluation
    of the field, of its Jacobian and every factorization, as SciPy counts
    them;
    for the Runge-Kutta methods, the stage evaluations of the field in the
    accepted steps (rejected steps and Newton iterations are not counted)
    and, for the implicit ones, one Jacobian and one factorization per
    accepted step (0 for the explicit ones)."""

    t: Any
    y: Any
    success: Any
    status: Any
    message: str
    sol: Any = None
    t_events: Any = None
    y_events: Any = None
    nfev: Any = 0
    njev: Any = 0
    nlu: Any = 0
    #: the time the integration reached (not SciPy's: its `t` stops there,
    #: which a traced program's static shapes cannot do): `t_span[1]` on
    #: success, the terminal event's time, or where it failed
    t_reached: Any = None


class OdeSolution:
    """`solve_ivp(..., dense_output=True).sol`: the solution at any time of
    the span, `sol(t)` for a scalar `t` (shape `(n,)`) or a 1-d array of
    times (shape `(n, len(t))`), as SciPy's `OdeSolution`. Each call
    integrates from `t_span[0]` to the times asked for with the solve's
    options (one integration for all of them), so `sol(t)` is the solver's
    solution there rather than an interpolant, and it has derivatives in
    `y0`, `args` and `t` (traced times) through `odeint`'s rules. Times
    past `t_span[1]` continue the integration (SciPy extrapolates); times
    before `t_span[0]` are refused. `t_min`, `t_max`: the span's ends,
    ordered.

    ```python
    res = sd.ode.solve_ivp(lambda t, y: [-y[0]], (0.0, 2.0), [1.0], dense_output=True)
    res.sol(1.0)                 # [0.3679]: e^-1
    res.sol([0.5, 1.5]).shape    # (1, 2)
    ```
    """

    def __init__(self, solve, y0, t0, t1, sign: float):
        self._solve, self._y0, self._t0, self._sign = solve, y0, t0, sign
        self.t_min, self.t_max = (t0, t1) if sign > 0 else (t1, t0)
        self.t_span = (t0, t1)

    def __call__(self, t):
        op = "ode.solve_ivp.sol"
        sign, t0 = self._sign, self._t0
        if self._solve is None:  # (a zero-length span: y0 at every time, as SciPy's)
            return _constant_at(self._y0, t, op)
        if isinstance(t, Tracer) or isinstance(t0, Tracer):
            tt = snp.astype(snp.asarray(t), np.float64)
            s0 = snp.reshape(snp.asarray(t0, np.float64) * sign, (1,))

            def one(ti):  # (a time equal to t0 fails when the program runs: not increasing)
                return self._solve(snp.concatenate([s0, snp.reshape(ti * sign, (1,))]))[-1]

            if len(type_of(tt).shape) == 0:
                return one(tt)
            if len(type_of(tt).shape) != 1:
                raise ShapeError(f"`t` must be a scalar or a 1-d array of times, got "
                                 f"{type_of(tt)}.", op=op)
            return snp.transpose(vmap(one)(tt))
        arr = np.asarray(t, np.float64)
        if arr.ndim > 1:
            raise ShapeError(f"`t` must be a scalar or a 1-d array of times, got shape "
                             f"{arr.shape}.", op=op)
        s, s0 = sign * arr.reshape(-1), sign * float(t0)
        if not np.all(s >= s0):  # (NaN too)
            raise ShapeError(f"`sol(t)` needs times from t_span[0] = {float(t0):g} on, in the "
                             f"direction of the span, got {plain(arr)}: sciad integrates "
                             f"from t_span[0] (SciPy extrapolates backwards).", op=op)
        grid = np.unique(np.concatenate([[s0], s]))
        rows = np.searchsorted(grid, s)
        if grid.size == 1:
            ys = snp.reshape(snp.asarray(self._y0), (1, -1))
        else:
            ys = self._solve(grid)
        out = ys[rows[0]] if arr.ndim == 0 else snp.transpose(ys[rows])
        return out if isinstance(out, Tracer) else np.asarray(out)


def _constant_at(y0, t, op: str):
    """`y0` at the times `t` (a scalar: `(n,)`; a 1-d array: `(n, len(t))`):
    SciPy's `ConstantDenseOutput`, a zero-length span's dense output."""
    if isinstance(t, Tracer) or isinstance(y0, Tracer):
        tt = snp.asarray(t)
        if len(type_of(tt).shape) == 0:
            return snp.asarray(y0)
        return snp.stack([snp.asarray(y0)] * type_of(tt).shape[0], axis=1)
    arr = np.asarray(t, np.float64)
    if arr.ndim > 1:
        raise ShapeError(f"`t` must be a scalar or a 1-d array of times, got shape "
                         f"{arr.shape}.", op=op)
    y = np.asarray(y0)
    return y.copy() if arr.ndim == 0 else np.repeat(y[:, None], arr.size, axis=1)


def _ivp_args(args, op: str) -> tuple:
    """SciPy's rule: `args` unpacks into `fun(t, y, *args)` (a list or an
    array too, element by element)."""
    if args is None:
        return ()
    try:
        return tuple(args)
    except TypeError:
        raise DTypeError(f"Supplied 'args' cannot be unpacked into fun's extra arguments, "
                         f"`fun(t, y, *args)`, as SciPy's, got {args!r}: pass "
                         f"args=({args!r},).", op=op) from None


def _ivp_state(y0, op: str):
    """SciPy's rule: `y0` a 1-d array of real or complex numbers, as float64
    or complex128 (a list of numbers or of traced scalars is one), finite
    where it is concrete (ValueError, as SciPy's)."""
    if isinstance(y0, Tracer) or any(isinstance(v, Tracer) for v in _tree.tree_leaves(y0)):
        y = snp.asarray(y0)
        shape, kind = tuple(y.shape), y.dtype.kind
    else:
        y = np.asarray(y0)
        shape, kind = y.shape, y.dtype.kind
    if kind not in "biufc":
        raise DTypeError(f"`y0` must hold real or complex numbers, got an array of "
                         f"{y.dtype}.", op=op)
    if len(shape) != 1:
        raise ShapeError(f"`y0` must be 1-dimensional, as SciPy's, got shape {shape}: for a "
                         "scalar pass [y0]; for a state of any shape or a pytree use "
                         "`sd.ode.odeint`.", op=op)
    dtype = np.complex128 if kind == "c" else np.float64
    if isinstance(y, np.ndarray):
        if not np.all(np.isfinite(y)):
            raise ShapeError(f"All components of the initial state `y0` must be finite, got "
                             f"{y!r}.", op=op)
        return y.astype(dtype)
    return snp.astype(y, dtype)


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


def _ivp_method(method, op: str) -> str:
    """sciad's solver for SciPy's method: a name (SciPy's or sciad's) or
    one of SciPy's `OdeSolver` classes (`scipy.integrate.RK45`, ...)."""
    name = method.__name__ if isinstance(method, type) else method
    if isinstance(name, str) and name in SCIPY_REFUSED:
        raise NotSupportedError(f"method={name!r}: {SCIPY_REFUSED[name]}.", op=op)
    if isinstance(method, type):
        name = method.__name__
        if name in SCIPY_METHODS and method.__module__.startswith("scipy.integrate"):
            return SCIPY_METHODS[name]
        raise NotSupportedError(
            f"the method class {method.__module__}.{name} is not one of SciPy's "
            f"({', '.join(SCIPY_METHODS)}): sciad steps with its own integrators, not a "
            f"user's OdeSolver; pass one of {list(SCIPY_METHODS)} or sciad's solvers "
            f"{list(SOLVERS)}.", op=op)
    if method in SCIPY_METHODS:
        return SCIPY_METHODS[method]
    if isinstance(method, str) and method.lower() in SOLVERS:
        return method.lower()
    raise InvalidOptionError(f"unknown method {method!r}; one of {list(SCIPY_METHODS)} (or "
                             f"SciPy's classes of those names) or {list(SOLVERS)}.", op=op)


def _ivp_tolerances(rtol, atol, n: int, op: str):
    """SciPy's `rtol` and `atol`, scalars or arrays of `n`: `(rtol, atol,
    scale)`, scalars, with `scale` the per-component scaling (None: none)
    that makes odeint's scalar `atol` the given array: the state is
    integrated as `y / scale`, whose error test `|e_i| <= atol + rtol
    |y_i / scale_i|` is `|e_i| scale_i <= atol_i + rtol |y_i|`."""
    r, a = np.asarray(rtol, np.float64), np.asarray(atol, np.float64)
    for name, v in (("rtol", r), ("atol", a)):
        if v.ndim > 1 or (v.ndim == 1 and v.shape != (n,)):
            raise ShapeError(f"`{name}` must be a scalar or an array of shape ({n},), as "
                             f"SciPy's, got shape {v.shape}.", op=op)
    if r.ndim == 1:
        # (odeint's error test has one relative tolerance: the smallest, so
        # every component is at least as accurate as asked; SciPy's warning
        # where one is below 100 eps, which it raises)
        if np.any(r < MIN_RTOL):
            Site(op, user_source()).warn(
                SciadWarning, f"At least one element of `rtol` is too small (below 100 eps): "
                f"raised to {MIN_RTOL:.2e}, as SciPy's `np.maximum(rtol, 100 * EPS)`.")
        r = max(float(r.min()), MIN_RTOL) if r.size else 1e-3
    if a.ndim == 0:
        return float(r), float(a), None
    if not np.all(a >= 0):  # (NaN too)
        raise InvalidOptionError(f"`atol` must be >= 0, got {plain(a)}.", op=op)
    if np.all(a == a[0]):
        return float(r), float(a[0]), None
    if np.any(a == 0):
        raise NotSupportedError(
            f"`atol` as an array with zeros beside positive values ({plain(a)}) is not "
            f"supported (it is a scaling of the state); pass small positive values instead of "
            f"0.", op=op)
    top = float(a.max())
    return float(r), top, a / top


def _ivp_event(event, i: int, op: str):
    """An event function's `(terminal count or 0, direction)`, SciPy's
    attributes."""
    if not callable(event):
        raise DTypeError(f"`events[{i}]` must be a function event(t, y, *args), got "
                         f"{type(event).__name__}.", op=op)
    terminal = getattr(event, "terminal", False)
    if terminal is None:  # (SciPy's: not terminal)
        terminal = False
    if isinstance(terminal, (bool, np.bool_)):
        count = 1 if terminal else 0
    elif isinstance(terminal, (int, np.integer)) and terminal >= 0:
        count = int(terminal)
    else:
        raise InvalidOptionError(f"The `terminal` attribute of each event must be a boolean or "
                                 f"a non-negative integer, as SciPy's; `events[{i}].terminal` "
                                 f"is {terminal!r}.", op=op)
    direction = float(getattr(event, "direction", 0.0))
    return count, (1 if direction > 0 else -1 if direction < 0 else 0)


#: the regula falsi (Illinois) iterations locating a non-traced event along
#: the solution (each an integration over part of a step)
IVP_EVENT_ITERATIONS = 60


def _illinois(phi, a: float, b: float, ga: float, gb: float) -> float:
    """The root of `phi` on `[a, b]` (`ga`, `gb` of opposite signs or one
    zero): regula falsi with Illinois' halving, to the bracket's rounding."""
    if ga == 0:
        return a
    side = 0
    for _ in range(IVP_EVENT_ITERATIONS):
        if gb == 0 or abs(b - a) <= 4 * np.finfo(np.float64).eps * max(abs(a), abs(b), 1.0):
            break
        t = (a * gb - b * ga) / (gb - ga) if gb != ga else 0.5 * (a + b)
        if not a < t < b:
            t = 0.5 * (a + b)
        gt = phi(t)
        if gt * ga > 0:
            a, ga = t, gt
            gb = 0.5 * gb if side == 1 else gb
            side = 1
        else:
            b, gb = t, gt
            ga = 0.5 * ga if side == -1 else ga
            side = -1
    return b if abs(gb) <= abs(ga) else a


@api_boundary
def solve_ivp(fun: Callable, t_span, y0, method="RK45", t_eval=None, dense_output=False,
              events=None, vectorized=False, args=None, rtol=1e-3, atol=1e-6,
              **options) -> IVPResult:
    """`scipy.integrate.solve_ivp` on `odeint`, with SciPy's arguments,
    rules and result (`IVPResult`):

    - `fun(t, y, *args)` returning an array or a list (`args` unpacked, a
      list or an array too; a non-iterable is a TypeError, as SciPy's);
    - `t_span = (t0, t1)`, backwards too (`t1 < t0`), or of zero length
      (the result is `y0` at `t0`), or without end (`t1 = inf` or `-inf`, in
      an eager call with a terminal event, which ends it, as SciPy's);
    - `y0` a 1-d array or list of numbers, real (float64) or complex
      (complex128: its real and imaginary parts are integrated as a real
      state of twice the size); finite (else ValueError);
    - `method`: SciPy's names or classes (`"RK45"` / `scipy.integrate.RK45`
      is Dormand-Prince 5(4), `"DOP853"` an 8th-order Dormand-Prince,
      `"RK23"` Bogacki-Shampine; the stiff `"BDF"` and `"Radau"` are
      SciPy's methods, sciad's `"bdf"` (variable order 1-5) and `"radau"`
      (Radau IIA, order 5), their `nfev`, `njev` and `nlu` counted as
      SciPy's; `"LSODA"`, whose stiffness switching sciad does not have,
      is refused with what to use instead), or sciad's solvers;
    - `t_eval` within `t_span`, sorted in its direction (default: the two
      ends of `t_span`, as sciad's outputs have a static size; SciPy returns
      its steps);
    - `dense_output=True`: `sol`, an `OdeSolution` (`sol(t)` differentiable);
    - `events`: a function `event(t, y, *args)` or a list of them, with
      SciPy's `terminal` (bool or a count) and `direction` attributes:
      `t_events`, `y_events`, and `status=1` at a terminal event, where the
      integration stops (`t_eval` is cut there). Outside a transformation
      every crossing is found on the solver's steps and located along the
      solution; inside one (`sd.grad`, `sd.function`, ...) the event count must
      be static, so only one terminal event is taken, located and
      differentiated as `odeint_event` does (no crossing there raises
      `ConvergenceError` when the program runs, where SciPy returns status
      0);
    - `vectorized`: accepted (sciad calls `fun` on 1-d states only, which a
      vectorized `fun` takes);
    - `rtol`, `atol` (SciPy's defaults), scalars or arrays of `n` (`atol`
      per component; `rtol` as an array must be uniform);
    - `options`: `first_step`, `max_step` (SciPy's), `jac` (an array or
      `jac(t, y, *args)`, or "dense"/"sparse") and `jac_sparsity` for the
      implicit methods: their Newton matrices use the exact Jacobian of
      `fun`, which sciad derives from its graph (a given `jac` is checked
      for shape only; `jac_sparsity` selects the sparse Newton solve, whose
      pattern is detected); `min_step`, `lband`, `uband` are refused by
      name. odeint's own options (`adjoint`, `max_steps`, `checkpoints`,
      `mass` and `dae_init` for a DAE with `method="BDF"` or `"Radau"` or
      sciad's `"kvaerno3"` to `"kvaerno5"`,
      ...) pass
      through.

    Steps: called outside a trace without `max_steps`, it takes the steps
    the span needs, as SciPy's: a solve that reaches odeint's limit (4,096)
    runs again with 8 times as many, up to 2**21 (each limit compiles once).
    In a traced program the limit is `max_steps` (4,096 unless given). As
    SciPy's, a step below ten spacings of floating-point numbers at its
    time ends the integration ("Required step size is less than spacing
    between numbers": a blow-up, a singular field).

    Never raises on a failed integration: `success`, `status` and `message`
    say so. Outside a trace, as SciPy's, `t` and `y` then stop where it
    failed (the output times reached; without `t_eval`, the time reached
    and its state) and the message names that time (and `max_steps` at a
    step limit); in a traced program, whose shapes are static, `t_reached`
    is the time it reached and `y` is NaN at the times past it.

    ```python
    res = sd.ode.solve_ivp(lambda t, y, k: [-k * y[0], y[0]], (0.0, 2.0), [1.0, 0.0],
                           t_eval=[1.0, 2.0], args=(0.5,), rtol=1e-8)
    res.y      # [[0.6065 0.3679] [0.7869 1.2642]]: exp(-t / 2), 2 (1 - exp(-t / 2))
    res.status, res.message   # 0 'The solver successfully reached the end of ...'
    hit = lambda t, y, k: y[0] - 0.5
    hit.terminal = True
    sd.ode.solve_ivp(lambda t, y, k: [-k * y[0], y[0]], (0.0, 2.0), [1.0, 0.0],
                     args=(0.5,), events=hit).t_events    # [array([1.3863])]: 2 ln 2
    ```
    """
    op = "ode.solve_ivp"
    solver = _ivp_method(method, op)
    if isinstance(t_span, Tracer) or len(t_span) != 2:
        raise ShapeError(f"`t_span` must be a pair (t0, t1), got {t_span!r}.", op=op)
    if events is not None and not isinstance(events, (list, tuple)):
        events = [events]
    if _unbounded(t_span) and np.size(y0) != 0:  # (an empty state: nothing to integrate)
        return _ivp_unbounded(fun, t_span, y0, events, args, op, method=method, t_eval=t_eval,
                              dense_output=dense_output, vectorized=vectorized, rtol=rtol,
                              atol=atol, **options)
    refused = {"min_step": "nothing: sciad's step-size control has no floor but `max_steps`",
               "lband": "jac_sparsity (the banded pattern) or nothing: the pattern of `fun` "
                        "is detected", "uband": "jac_sparsity, or nothing: the pattern of "
                        "`fun` is detected"}
    for name in refused:
        if options.get(name) is not None:
            raise NotSupportedError(f"SciPy's `{name}` has no counterpart in solve_ivp; use "
                                    f"{refused[name]}.", op=op)
        options.pop(name, None)
    args, y0 = _ivp_args(args, op), _ivp_state(y0, op)
    n = int(y0.shape[0])
    complex_ = y0.dtype.kind == "c"
    implicit = SOLVERS[solver].implicit
    rtol, atol, scale = _ivp_tolerances(rtol, atol, n, op)
    jac = options.pop("jac", None)
    sparsity = options.pop("jac_sparsity", None)
    if jac is not None and not isinstance(jac, str):
        if not callable(jac):
            shape = np.shape(jac)
            if shape != (n, n):
                raise ShapeError(f"`jac` must have shape ({n}, {n}), got {shape}.", op=op)
        jac = None  # (the exact Jacobian of fun, from its graph)
    if sparsity is not None:
        shape = np.shape(sparsity)
        if shape != (n, n):
            raise ShapeError(f"`jac_sparsity` must have shape ({n}, {n}), got {shape}.",
                             op=op)
        jac = "sparse" if implicit else jac
    if jac is not None and implicit:
        options["jac"] = jac
    if "first_step" in options:
        first = options.pop("first_step")
        if first is not None:
            if not (isinstance(first, (int, float)) and first > 0):
                raise InvalidOptionError(f"`first_step` must be positive, got {plain(first)}.",
                                         op=op)
            options["dt0"] = float(first)
    max_step = options.pop("max_step", np.inf)
    if not (isinstance(max_step, (int, float)) and max_step > 0):
        raise InvalidOptionError(f"`max_step` must be positive, got {plain(max_step)}.", op=op)
    if np.isfinite(max_step):
        options["dtmax"] = float(max_step)
    del vectorized  # (fun is traced on a 1-d state: a vectorized fun takes it)
    specs = [_ivp_event(e, i, op) for i, e in enumerate(events or [])]
    t0, t1 = t_span
    concrete = not isinstance(t0, Tracer) and not isinstance(t1, Tracer)
    # backwards (SciPy's t1 < t0) is forwards in s = -t: dy/ds = -fun(-s, y)
    backward = concrete and float(t1) < float(t0)
    sign = -1.0 if backward else 1.0
    if n == 0 and concrete and not _in_trace((y0, args)):
        # (no state: nothing to integrate; SciPy's empty solution, over any
        # span, an infinite one too)
        te = np.array([float(t0), float(t1)]) if t_eval is None else \
            np.asarray(t_eval, np.float64).reshape(-1)
        return _ivp_unmoved(te, np.zeros((0, te.size), y0.dtype), y0, t_span, sign,
                            dense_output, specs)

    # the state odeint integrates: [Re y, Im y] for a complex one, over `scale`
    big = None if scale is None else (np.concatenate([scale, scale]) if complex_ else scale)
    encode, decode = _ivp_codec(n, complex_, big)
    field = _ivp_field(fun, backward, complex_, n, big)
    z0 = encode(y0)
    opts = dict(solver=solver, rtol=rtol, atol=atol, **options)

    # (`_fun`: `field` holds `fun` weakly (`_ivp_field`); `sol`, which calls
    # `solve` after this call returns, keeps it alive)
    def solve(ss, z_start=None, throw=True, _fun=fun):  # y at the times ss (increasing)
        out = odeint(field, z0 if z_start is None else z_start, ss, args, throw=throw,
                     **opts)
        return (decode(out), None) if throw else (decode(out.ys), out)

    sol_of = lambda: OdeSolution(lambda ss: solve(ss)[0], y0, t0, t1, sign)  # noqa: E731

    if concrete and float(t0) == float(t1):  # zero length: y0 at t0
        # (SciPy's t: [t0, t1], the start and the one "step")
        te = np.array([float(t0)] * 2) if t_eval is None else np.asarray(t_eval, np.float64)
        if te.ndim != 1 or not np.all(te == float(t0)):
            raise ShapeError(f"values in `t_eval` are not within `t_span` ({t0}, {t1}), as "
                             f"SciPy requires, got {t_eval!r}.", op=op)
        y = snp.stack([y0] * te.size, axis=1) if isinstance(y0, Tracer) else \
            np.repeat(y0[:, None], te.size, axis=1)
        return _ivp_unmoved(te, y, y0, t_span, sign, dense_output, specs)
    ts, rows, t = _ivp_times(t0, t1, t_eval, backward, op)
    traced = _in_trace((y0, t_span, args)) or isinstance(t, Tracer)
    if specs and traced:
        return _ivp_traced_event(events, specs, field, z0, ts, args, t0, t_eval, decode,
                                 sign, opts, sol_of if dense_output else None, op)
    # (eager, with events: one program gives the values at `ts`, the status
    # and every step's state, which the events are found on; compiling the
    # plain solve as well doubled the first call's time)
    stepped = bool(specs) and not traced

    def run():
        if not stepped:
            ys, res = solve(ts, throw=False)
            return ys, res, None
        ys, res, every = _ivp_steps(field, z0, ts, args, opts, op, values=True)
        return decode(ys), res, every

    ys, res, every = run()
    code = res.status
    limit = int(opts.get("max_steps", 4096))
    width = 8 * (2 * n if complex_ else n)  # (bytes of a state odeint integrates)
    if not traced and "max_steps" not in options:
        # as SciPy's, take the steps the span needs: the step limit grows
        # (each new limit compiles once), up to MAX_EAGER_STEPS (and, with
        # events, whose steps' states are kept, STEP_STATES_BYTES)
        while int(code) == 1 and limit * STEP_GROWTH <= MAX_EAGER_STEPS and (
                not specs or (limit * STEP_GROWTH + 1) * width <= STEP_STATES_BYTES):
            limit *= STEP_GROWTH
            opts["max_steps"] = limit
            ys, res, every = run()
            code = res.status
    reached = None  # (a failed eager solve: the time it reached, and its last state)
    if not traced and int(code) in (1, 2, 3, 5) and (limit + 1) * width <= STEP_STATES_BYTES:
        grid, states = every if every is not None else _ivp_steps(field, z0, ts, args, opts,
                                                                  op)
        ok = np.all(np.isfinite(states), axis=1)
        last = int(np.flatnonzero(ok)[-1]) if ok.any() else 0
        reached = (sign * float(grid[last]), np.asarray(decode(states[last])))
    t_events = y_events = stop = None
    status_ok = 0
    if specs:
        t_events, y_events, stop = _ivp_events(events, specs, every, decode, z0, args,
                                               sign, solve)
        if stop is not None and int(code) == 0:  # a terminal event: cut there
            t_stop, y_stop = stop
            status_ok = 1
            if t_eval is None:
                t = np.array([float(t0), t_stop])
                ys = snp.stack([ys[0], snp.asarray(y_stop)]) if isinstance(ys, Tracer) \
                    else np.stack([np.asarray(ys)[0], y_stop])
                rows = slice(None)
            else:
                keep = sign * np.asarray(t) <= sign * t_stop
                t = np.asarray(t)[keep]
                idx = np.arange(np.asarray(ys).shape[0])[rows][keep]
                ys, rows = np.asarray(ys)[idx], slice(None)
    t_reached = None
    if isinstance(code, Tracer):
        status = snp.where(code == 0, status_ok, -1)
        message = (f"see `success` (known when it runs); in a traced program the "
                   f"integration takes at most max_steps = {limit} steps (pass `max_steps` "
                   f"for more); where it fails, `t_reached` is the time it reached and `y` "
                   f"is NaN at the times past it")
        if getattr(res, "t_reached", None) is not None:  # (the integration's variable)
            past = snp.asarray(ts)[:, None] > res.t_reached
            ys = snp.where(past, np.nan, ys)
            t_reached = sign * res.t_reached
    else:
        status = status_ok if int(code) == 0 else -1
        message = SCIPY_MESSAGES[status] if status >= 0 else \
            _ivp_failure(int(code), limit, None if reached is None else reached[0])
    if reached is not None:  # (SciPy's: the times reached, and the last one's state)
        t_hit, y_hit = reached
        if t_eval is None:
            t, ys, rows = np.array([float(t0), t_hit]), np.stack([np.asarray(ys)[0], y_hit]), \
                slice(None)
        else:
            keep = sign * np.asarray(t) <= sign * t_hit
            idx = np.arange(np.asarray(ys).shape[0])[rows][keep]
            t, ys, rows = np.asarray(t)[keep], np.asarray(ys)[idx], slice(None)
    ys = ys[rows]
    y = snp.transpose(ys) if isinstance(ys, Tracer) else np.asarray(ys).T
    t = t if isinstance(t, Tracer) else np.asarray(t, np.float64)
    if t_reached is None:  # (eager: where it failed, the terminal event, or the end)
        t_reached = reached[0] if reached is not None else \
            stop[0] if specs and stop is not None and int(code) == 0 else t1
    return IVPResult(t, y, res.success, status, message, sol_of() if dense_output else None,
                     t_events, y_events, res.nfev, res.njev, res.nlu, t_reached)


#: how much an unbounded span's horizon grows each time no terminal event
#: occurred within it (`_ivp_unbounded`), and the largest horizon tried
HORIZON_GROWTH, MAX_HORIZON = 16.0, 1e300


def _unbounded(t_span) -> bool:
    """Whether `t_span` is a concrete `(t0, +-inf)` with `t0` finite."""
    try:
        t0, t1 = (float(t) for t in t_span)
    except (TypeError, ValueError):  # (traced, or not numbers: checked later)
        return False
    return np.isfinite(t0) and np.isinf(t1)


def _ivp_unbounded(fun, t_span, y0, events, args, op: str, **kw) -> IVPResult:
    """`solve_ivp` over `(t0, inf)` (or `(t0, -inf)`), as SciPy's: it ends at
    a terminal event, which it needs (sciad's programs integrate over a
    finite span). The integration runs over finite spans that grow by
    `HORIZON_GROWTH` (from the larger of 1, |t0| and the farthest `t_eval`)
    until a terminal event occurs or it fails; each span's solve starts
    again from `y0` (an eager call: the program for the span compiles once,
    and the last span's work is most of the whole)."""
    t0, t1 = (float(t) for t in t_span)
    if not any(getattr(e, "terminal", False) for e in events or ()):
        raise InvalidOptionError(
            f"`t_span` = ({t0:g}, {t1:g}) has no end, so the integration needs a terminal "
            "event to stop it (`event.terminal = True`), as SciPy's does; give one, or a "
            "finite end.", op=op)
    if _in_trace((y0, args)):
        raise NotSupportedError(
            f"`t_span` = ({t0:g}, {t1:g}) has no end: inside a transformation (sd.grad, "
            "sd.function, ...) the span must be finite, since a program's steps are bounded; "
            "give a finite end past the terminal event.", op=op)
    sign = 1.0 if t1 > 0 else -1.0  # (`events`: a list, or None)
    te = kw.get("t_eval")
    far = 0.0 if te is None else float(np.max(np.abs(np.asarray(te, np.float64) - t0),
                                              initial=0.0))
    horizon = max(1.0, abs(t0), far)
    while True:
        res = solve_ivp(fun, (t0, t0 + sign * horizon), y0, events=events, args=args, **kw)
        if res.status != 0 or horizon * HORIZON_GROWTH > MAX_HORIZON:
            return res
        horizon *= HORIZON_GROWTH


def _ivp_unmoved(t, y, y0, t_span, sign: float, dense_output: bool, specs) -> IVPResult:
    """The result of an integration with nothing to do (a zero-length span,
    an empty state): `y0` at the times `t` (`y`), SciPy's constant dense
    output, no events, no evaluations."""
    return IVPResult(t, y, True, 0, SCIPY_MESSAGES[0],
                     OdeSolution(None, y0, *t_span, sign) if dense_output else None,
                     [np.zeros(0)] * len(specs) if specs else None,
                     [np.zeros((0,))] * len(specs) if specs else None, 0, 0, 0,
                     t_span[1] if np.size(y0) == 0 else t[-1])


def _ivp_failure(code: int, limit: int, t_reached) -> str:
    """SciPy's message of a failed integration, with what sciad knows."""
    at = "" if t_reached is None else f" at t = {t_reached:.6g}"
    if code == 2:  # (SciPy's own words for a step below its floor)
        return f"Required step size is less than spacing between numbers{at}."
    if code == 1:
        return (f"{SCIPY_MESSAGES[-1]} (the step limit, max_steps = {limit}, was "
                f"reached{at}; pass a larger `max_steps`)")
    return f"{SCIPY_MESSAGES[-1]} ({STATUS[code]}{at})"


def _ivp_steps(field, z0, ts, args, opts, op, values: bool = False):
    """The accepted steps of a concrete solve: their times (in the
    integration's variable) and states, `(steps + 1,)` and `(steps + 1,
    n)`, from the solve's start to where it ended (the end of the span, or
    where it failed). Holds `max_steps + 1` states while it runs. With
    `values`: `(ys at ts, ODEResult, (times, states))`, the same program's
    values at the times `ts`, and its status and work as odeint's result
    gives them."""
    kw = dict(opts)
    solver, adaptive, rtol = _check_options(
        kw.pop("solver"), kw.pop("rtol"), kw.pop("atol", 1e-9), kw.get("adjoint"),
        kw.get("max_steps", 4096), kw.get("dt0"), True, kw.get("checkpoints"), op,
        kw.get("dtmax"))
    inner = dict(solver=solver, rtol=rtol, atol=opts["atol"],
                 adjoint=INTERPOLATED.name, max_steps=int(kw.get("max_steps", 4096)),
                 dt0=kw.get("dt0"), adaptive=adaptive, jac=kw.get("jac"), checkpoints=None,
                 throw=False, op=op, dtmax=kw.get("dtmax"), **_dae_options(kw, op))
    ys, status, nsteps, grid, states, work = _compiled_call(
        lambda f, z0, ts, a: _odeint_inline(f, z0, ts, a, every_step=True, count=True,
                                            **inner),
        field, (z0, np.asarray(ts, np.float64)), args,
        (op, "steps", tuple(sorted(inner.items()))), "solve_ivp_steps")
    k = int(nsteps) + 1
    every = (np.asarray(grid)[:k], np.asarray(states)[:k])
    if not values:
        return every
    ys = np.asarray(ys)
    return ys, ODEResult(ys, int(status), int(nsteps), float(every[0][-1]),
                         *(int(w) for w in np.asarray(work))), every


#: an eager `solve_ivp` that reaches its step limit (`max_steps` not given)
#: runs again with this many times the steps, up to `MAX_EAGER_STEPS`: as
#: SciPy's, it takes the steps the span needs
STEP_GROWTH = 8
MAX_EAGER_STEPS = 2 ** 21
#: the most memory the states of every step may take where a failed eager
#: `solve_ivp` finds the time it reached and its last state (or its events)
STEP_STATES_BYTES = 256 * 2 ** 20


def _ivp_events(events, specs, every, decode, z0, args, sign, solve):
    """Every crossing of the event functions along a concrete solution:
    `(t_events, y_events, stop)`, `stop` the terminal event's `(t, y)` or
    None. Crossings are detected on the solver's steps (SciPy's rule: `g`
    changes sign, or reaches zero, over a step) and located by regula
    falsi on the event function along the solution (re-integrated from the
    step's start), in time order, up to the terminal event. `every`: the
    solve's steps, `(times, states)` (`_ivp_steps`)."""
    grid, states = every
    ys = np.asarray(decode(states))

    def g(i, s, y):
        return float(np.real(np.asarray(events[i](sign * s, y, *args))))

    found = []  # (s, event index, y)
    for i, (_, direction) in enumerate(specs):
        gs = np.array([g(i, s, y) for s, y in zip(grid, ys)])
        up = (gs[:-1] <= 0) & (gs[1:] >= 0)
        down = (gs[:-1] >= 0) & (gs[1:] <= 0)
        # (SciPy's direction is along the integration, backwards too)
        hit = {1: up, -1: down, 0: up | down}[direction] \
            & ~((gs[:-1] == 0) & (gs[1:] == 0))
        for j in np.flatnonzero(hit):
            if gs[j] == 0 and j > 0:  # (found as the previous step's end)
                continue
            a, b = float(grid[j]), float(grid[j + 1])
            za = np.asarray(states[j])

            def phi(s, i=i, a=a, za=za):
                y = np.asarray(solve(np.array([a, s]), za)[0])[-1]
                return g(i, s, y)

            s_ev = _illinois(phi, a, b, float(gs[j]), float(gs[j + 1]))
            y_ev = ys[j] if s_ev == a else np.asarray(solve(np.array([a, s_ev]), za)[0])[-1]
            found.append((s_ev, i, y_ev))
    found.sort(key=lambda e: e[0])
    left = [c for c, _ in specs]
    t_events, y_events = [[] for _ in specs], [[] for _ in specs]
    stop = None
    for s_ev, i, y_ev in found:
        t_events[i].append(sign * s_ev)
        y_events[i].append(y_ev)
        if left[i] > 0:
            left[i] -= 1
            if left[i] == 0:
                stop = (sign * s_ev, y_ev)
                break
    n = z0.shape[0] // 2 if decode(np.zeros((1, z0.shape[0]))).dtype.kind == "c" else \
        z0.shape[0]
    # (as SciPy's: an event that never occurred has y_events of shape (0,))
    return ([np.asarray(t, np.float64) for t in t_events],
            [np.asarray(y).reshape(-1, n) if y else np.zeros((0,)) for y in y_events], stop)


def _ivp_traced_event(events, specs, field, z0, ts, args, t0, t_eval, decode, sign, opts,
                      sol_of, op):
    """An event inside a transformation: one terminal event, located and
    differentiated by `odeint_event`'s machinery."""
    if len(specs) != 1 or specs[0][0] != 1:
        raise NotSupportedError(
            "inside a transformation (sd.grad, sd.function, ...) solve_ivp takes one terminal "
            "event (`event.terminal = True`): the number of non-terminal crossings is not "
            "static. Call solve_ivp outside the transformation for every crossing, or make "
            "the event terminal.", op=op)
    if t_eval is not None:
        raise NotSupportedError(
            "`t_eval` with an event inside a transformation: which times precede the event "
            "is not static. Use dense_output=True and evaluate `sol(t)` at times before the "
            "event instead.", op=op)
    (event,), ((_, direction),) = events, specs
    kw = dict(opts)
    solver, adaptive, rtol = _check_options(
        kw.pop("solver"), kw.pop("rtol"), kw.pop("atol"), kw.get("adjoint"),
        kw.get("max_steps", 4096), kw.get("dt0"), True, kw.get("checkpoints"), op,
        kw.get("dtmax"))
    inner = dict(solver=solver, rtol=rtol, atol=opts["atol"],
                 adjoint=kw.get("adjoint") or SOLVERS[solver].default_adjoint,
                 max_steps=int(kw.get("max_steps", 4096)), dt0=kw.get("dt0"),
                 adaptive=adaptive, jac=kw.get("jac"), checkpoints=kw.get("checkpoints"),
                 throw=True, op=op, dtmax=kw.get("dtmax"), **_dae_options(kw, op))

    def g(s, z, a):
        return snp.real(snp.asarray(event(sign * s, decode(z), *a)))

    span = snp.astype(snp.asarray(ts), np.float64)
    s_ev, z_ev = _event_inline(field, z0, (span[0], span[-1]), g, args,
                               direction, inner)
    t_ev = sign * s_ev
    y_ev = decode(z_ev)
    y0 = decode(z0)
    t = snp.stack([snp.asarray(t0, np.float64), t_ev])
    y = snp.stack([y0, y_ev], axis=1)
    return IVPResult(t, y, True, 1, SCIPY_MESSAGES[1], sol_of() if sol_of else None,
                     [snp.reshape(t_ev, (1,))], [snp.reshape(y_ev, (1, -1))], 0, 0, 0, t_ev)
