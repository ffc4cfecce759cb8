"""`ode.odeint`: an initial value problem as one node, with sciad-owned
derivative rules.

The node holds the vector field as a closed body (its `body` param)
`(*consts, t, y) -> (dy/dt,)` on a flat state `y` of `N` elements, and its
operands are `(*consts, y0, ts)`. For the IMEX steppers (the KenCarp
methods: `Stepper.imex`) the body has two outputs, the non-stiff and the
stiff part of `dy/dt`, whose sum is the field: the first is stepped
explicitly, the second implicitly. It lowers to `diffrax.diffeqsolve`
(diffrax steps, controls the step size and detects failure), with the steps
clipped to land on every output time. Its outputs (`OdeintOutputs`, by
name) are

- `ys`: the state at `ts`, `(len(ts), N)`;
- `status` (0 success, see `STATUS`) and `steps`, the number of accepted
  steps;
- `grid`: the accepted step times (`max_steps + 1` of them, padded with the
  final time), and `marks`: for each output time, the number of steps taken
  to reach it (a step lands on each). The derivative rules read them; they
  carry no derivative.
- `states` (where the adjoint asks for them, `Adjoint.records_states`): the
  state at every step, `(max_steps + 1, N)`, padded with zeros.
- `history` (BDF's, where its discrete adjoint differentiates it, with
  the states or, with `checkpoints`, without them: the replay re-runs the
  steps from it): each accepted step's order and rescaling of the
  differences (`sciad.solvers.ode._bdf.HISTORY` columns). `recorded`
  says which of them a node's params give.

The module holds the node and its rules; the parts they are built from live
beside it, one idea each:

- `sciad.solvers.ode._ode_steppers`: the steppers, one record per Runge-Kutta
  method (its diffrax class, explicit or implicit, order, tableau), and
  diffrax's solver for one (plain JAX);
- `_ode_field`: the vector field evaluated in sciad ops, its parts, and the
  params of the derived systems;
- `_ode_replay`: a step of a tableau, of Radau IIA or of BDF in sciad ops
  (`rk_step`, `radau_step`, `bdf_step`) and the steps taken re-run on
  their grid;
- `_ode_interp`: the cubic Hermite interpolant between steps;
- `_ode_adjoint`: the reverse modes, one record per adjoint strategy;
- `_ode_events`: the guard of a terminal event (`ode.event_guard`).

Rules, each made of sciad nodes, so every order of differentiation holds:

- JVP: one `odeint` node on the forward-sensitivity system `(y, dy)`, with
  `dy' = (df/dy) dy + (df/dconsts) dconsts` from the JVP of the body. Its
  error control reads only the `y` part (`error_size`), so it takes the
  steps the primal takes, to rounding: the tangent is the derivative of the
  computed solution on its step grid, to the Newton tolerance. A node that
  records its states (a reverse pass reads them: the JVP of a VJP, second
  order) is differentiated on its own steps instead, so the states'
  tangents lie on the states' grid even where the two are computed in
  separate programs (`sd.to_jax`): the node itself, then the discrete
  forward sensitivity of its recorded steps (`_stepwise_jvp`: each
  Runge-Kutta or Radau step's JVP from its stored state, BDF's steps from
  its `history`), the transpose of the discrete adjoint. Tangents of the
  times: `dy(t_i) += f(t_i, y_i) dt_i`, and `dy0 -= f(t0, y0) dt0` for the
  initial time.
- VJP: the node's `adjoint` record's (`_ode_adjoint.ADJOINTS`):
  "checkpoint" (the default), the discrete adjoint of the steps taken,
  exact for the computed solution and consistent with the JVP; or
  "interpolated" / "backsolve", the continuous adjoint, accurate to the
  solver's tolerance only. The cotangents of the times are formed here, for
  any adjoint.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import (ConvergenceError, DTypeError, InvalidOptionError, NotSupportedError,
                      ShapeError)
from ..graph import Graph, Param, Primitive, Site, TensorType, Tracer, Zero, is_zero, lower
from ..graph._autodiff import jvp_eval, jvp_primal, needs_ct, type_of, vjp_transpose
from ..graph._body import Body, trace_body
from ..graph._serialize import graph_param_v1, register_v1_migration
from ..graph._cost import Cost, _si
from ..graph._sparsity import dense_all
from ..graph._types import Pattern
from ..solvers.ode import _bdf, _esdirk, _radau
from ..solvers.ode._ode import floored, holding
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode._ode_steppers import (STEPPERS, STIFF_PID, diffrax_solver, error_weights,
                                         tableau, takers_of_mass)
from ._checks import check, tie
from ._map import map_rule
from ._ode_adjoint import ADJOINTS, CHECKPOINT, stored_jvp
from ._ode_field import (ADJOINT_BODY, augmented_pattern, derived_params, field_at,
                         field_body, fields_at, part_of, with_mass_entries)
from ._root import root_guard_p

SOLVERS = STEPPERS
"""The ODE methods by name (`odeint`'s `solver`): each a record of the
stepper (explicit or implicit, its order, its tableau); `sd.ode.SOLVERS`."""
JACOBIANS = ("dense", "sparse")
STATUS = {
    0: "success",
    1: "the step limit (max_steps) was reached",
    2: "the step size fell below its minimum",
    3: "the state became NaN or infinite",
    4: "the output times are not increasing",
    5: "the solver failed (an implicit step's Newton iteration or linear solve)",
    6: "the initial values violate the algebraic equations (the zero rows of the mass "
       "matrix)",
}

odeint_p = Primitive("ode.odeint", multiple_results=True, runtime_checks=True, params={
    "body": Body, "solver": str, "rtol": float, "atol": float, "max_steps": int,
    "dt0": Param((float, None), default=None), "adaptive": Param(bool, default=True),
    "error_size": Param((int, None), default=None),
    "jac": Param(str, default="dense"), "pattern": Param((Pattern, None), default=None),
    "adjoint": Param(str, default=CHECKPOINT.name),
    "checkpoints": Param((int, None), default=None), "disk": Param((str, None), default=None),
    "throw": Param(bool, default=True),
    "record": Param(bool, default=True), "states": Param(bool, default=True),
    "dtmax": Param((float, None), default=None),
    "count": Param(bool, default=False), "mass": Param((int, None), default=None),
    "mass_pattern": Param((Pattern, None), default=None)})
#: `body`: the vector field `(*consts, t, y) -> (dy/dt,)` on a flat `y`;
#: `error_size`: the step-size control reads only the first `error_size`
#: elements of the state (None: all; the sensitivity systems of the JVP set
#: it to the primal's size); `jac` and `pattern`: how the Newton systems of
#: an implicit solver are formed and solved (sparse: the pattern of
#: `df/dy` detected from `body`, values by colored JVPs, SuperLU);
#: `solver`: a stepper's name (`sciad.solvers.ode._ode_steppers.STEPPERS`);
#: `adjoint`, `checkpoints`: the reverse mode (an adjoint strategy's name,
#: `sciad.primitives._ode_adjoint.ADJOINTS`; see the module docstring;
#: `checkpoints` is the number of states the checkpointed one stores evenly
#: over each output interval's steps, `sd.Segments`; None: `snapshots_for`;
#: `disk`: a directory where those states go, a `MemoryBudget`'s);
#: `record`: the node outputs its step grid (and states): set False by `dce`
#: where nothing reads them (a solve that is not differentiated), which
#: spares the loop its recording; `states`: set False by `dce` where the
#: grid is read (`odeint(throw=False)`'s time reached) but not the states,
#: which spares the loop its largest record; `dtmax`: the largest step the step-size
#: control takes (None: unbounded; SciPy's `max_step`); `count`: the node
#: outputs its work as SciPy counts it (`work`, last); `mass`: the index
#: among the operands of the constant mass matrix `M` of `M dy/dt = f`
#: (None: the identity), dense `(N, N)` or, with `mass_pattern`, its values
#: on that pattern; the body takes it among its consts and ignores it. A
#: state of `k N` elements (a sensitivity system) has the mass `I_k (x) M`


class OdeintOutputs(NamedTuple):
    """The outputs of an `ode.odeint` node, by name (its rules read them so,
    never by position). The node has the first three, then `grid` and
    `marks` where it records its steps (`record`), then `states` where its
    adjoint asks for them (`Adjoint.records_states`); the absent ones are
    None. The same layout names a list of the outputs' tangents or
    cotangents."""

    #: the state at the output times, `(len(ts), N)`
    ys: Any
    #: 0 on success, see `STATUS` (int32)
    status: Any
    #: the number of accepted steps (int32)
    steps: Any
    #: the accepted step times (`max_steps + 1`, padded with the final time)
    grid: Any = None
    #: per output time, the number of steps taken to reach it (int32)
    marks: Any = None
    #: the state at every step, `(max_steps + 1, N)`, padded with zeros
    states: Any = None
    #: BDF's record of its accepted steps, for its discrete adjoint
    #: (`(max_steps + 1, _bdf.HISTORY)`; with `states`)
    history: Any = None
    #: where the node counts its work (`count`): `(nfev, njev, nlu)` (int32),
    #: the field's evaluations, Jacobians and factorizations, as SciPy
    #: counts them (from the stages and accepted steps of a method diffrax
    #: steps; as they happen for BDF and Radau)
    work: Any = None

    @classmethod
    def of(cls, outs, params: dict) -> "OdeintOutputs":
        """The named layout of the outputs of a node with `params` (or of a
        list of their tangents or cotangents): three, then `grid` and
        `marks`, `states` and `history` where it records them
        (`recorded`), then `work` where it counts."""
        outs = list(outs)
        grid, states, history = recorded(params)
        names = ["ys", "status", "steps"] + ["grid", "marks"] * grid + ["states"] * states \
            + ["history"] * history + ["work"] * bool(params.get("count", False))
        assert len(outs) == len(names), "an ode.odeint node's outputs match its params"
        return cls(**dict(zip(names, outs)))

    def present(self) -> list:
        """The outputs the node has, in its order (the absent ones, None,
        left out)."""
        return [o for o in self if o is not None]


@odeint_p.def_abstract_eval
def _odeint_shape(*args, body, solver, rtol, atol, max_steps, dt0=None, adaptive=True,
                  error_size=None, jac="dense", pattern=None, adjoint=CHECKPOINT.name,
                  checkpoints=None, disk=None, throw=True, record=True, states=True, dtmax=None,
                  count=False, mass=None, mass_pattern=None):
    op = "ode.odeint"
    *consts, y0, ts = args
    if solver not in SOLVERS:
        raise InvalidOptionError(f"unknown solver {solver!r}; one of {sorted(SOLVERS)}.",
                                 op=op)
    if adjoint not in ADJOINTS or jac not in JACOBIANS:
        raise InvalidOptionError(f"`adjoint` must be one of {tuple(ADJOINTS)} and `jac` one of "
                                 f"{JACOBIANS}, got {adjoint!r} and {jac!r}.", op=op)
    if not isinstance(y0, TensorType) or y0.dtype.kind != "f" or len(y0.shape) != 1:
        raise DTypeError(f"`y0` must be a flat real float array, got {y0}.", op=op)
    if not isinstance(ts, TensorType) or len(ts.shape) != 1 or ts.shape[0] < 2 \
            or ts.dtype != y0.dtype:
        raise ShapeError(f"`ts` must be a 1-d array of at least 2 times of y0's dtype "
                         f"({y0.dtype}), got {ts}.", op=op)
    n = y0.shape[0]
    scalar = TensorType((), y0.dtype)
    if tuple(body.in_types) != tuple(consts) + (scalar, y0):
        raise ShapeError("the vector field's graph does not take the node's operands.", op=op)
    outs = body.out_types
    parts = STEPPERS[solver].parts
    if len(outs) != parts or any(o != y0 for o in outs):
        what = "two arrays (its non-stiff and stiff parts)" if parts == 2 else "one array"
        raise ShapeError(f"the vector field of {solver} must return {what} like y ({y0}), "
                         f"got {', '.join(map(str, outs))}.", op=op)
    if not (rtol > 0 and atol >= 0) or max_steps < 1 or (dt0 is not None and not dt0 > 0):
        raise InvalidOptionError(f"needs rtol > 0, atol >= 0, max_steps >= 1 and dt0 > 0, "
                                 f"got rtol={rtol}, atol={atol}, max_steps={max_steps}, "
                                 f"dt0={dt0}.", op=op)
    if not adaptive and dt0 is None:
        raise InvalidOptionError("constant steps (adaptive=False) need `dt0`.", op=op)
    stepper = STEPPERS[solver]
    if not stepper.discrete and not ADJOINTS[adjoint].continuous:
        raise InvalidOptionError(
            f"adjoint={adjoint!r} differentiates the steps taken, which {solver}'s steps "
            f"do not give: use adjoint='interpolated' or 'backsolve'.", op=op)
    if not stepper.replayable and not adaptive:
        raise InvalidOptionError(f"{solver} chooses its steps and orders: constant steps "
                                 "(adaptive=False) are for the Runge-Kutta methods.", op=op)
    if mass is not None:
        if not stepper.takes_mass:
            raise NotSupportedError(f"a mass matrix is for the solvers {takers_of_mass()}; "
                                    f"got {solver}.", op=op)
        if not adaptive:
            raise InvalidOptionError("a mass matrix is stepped with adaptive steps: "
                                     "constant steps (adaptive=False) are for an ODE.", op=op)
        if not 0 <= mass < len(consts):
            raise ShapeError(f"`mass` must index one of the {len(consts)} consts, got {mass}.",
                             op=op)
        m_type, size = consts[mass], (mass_pattern.shape[0] if mass_pattern is not None
                                      else (consts[mass].shape or (0,))[0])
        want = (mass_pattern.nnz,) if mass_pattern is not None else (size, size)
        if not isinstance(m_type, TensorType) or m_type.shape != want \
                or m_type.dtype != y0.dtype or size < 1 or n % size:
            raise ShapeError(f"the mass matrix must be {want} of y0's dtype, its size "
                             f"dividing y0's ({n}), got {m_type}.", op=op)
    if dtmax is not None and not dtmax > 0:
        raise InvalidOptionError(f"`dtmax` must be a step size > 0, got {dtmax}.", op=op)
    if sparse_jacobian(jac) and (pattern is None or pattern.shape != (n, n)):
        raise ShapeError(f"a sparse Jacobian needs an ({n}, {n}) pattern, got {pattern!r}.",
                         op=op)
    i32 = np.dtype(np.int32)
    outs = OdeintOutputs(ys=TensorType((ts.shape[0], n), y0.dtype), status=TensorType((), i32),
                         steps=TensorType((), i32))
    grid, states, history = recorded(dict(
        body=body, solver=solver, max_steps=max_steps, error_size=error_size,
        adjoint=adjoint, checkpoints=checkpoints, record=record, states=states))
    if grid:
        outs = outs._replace(grid=TensorType((max_steps + 1,), y0.dtype),
                             marks=TensorType((ts.shape[0],), i32))
    if states:
        outs = outs._replace(states=TensorType((max_steps + 1, n), y0.dtype))
    if history:
        outs = outs._replace(history=TensorType((max_steps + 1, _bdf.HISTORY), y0.dtype))
    if count:
        outs = outs._replace(work=TensorType((3,), i32))
    return tuple(outs.present())


def _records_states(stepper, adjoint: str, checkpoints, max_steps: int, m: int,
                    itemsize: int) -> bool:
    """Whether a node that records its steps outputs its `states` (its
    adjoint asks for them; `m`: the primal's size)."""
    return ADJOINTS[adjoint].records_states(checkpoints, max_steps, m, itemsize,
                                            stepper.replayable)


def recorded(params: dict) -> tuple[bool, bool, bool]:
    """What a node with `params` records of its steps: `(grid, states,
    history)`, whether it outputs its step grid (and marks), its state at
    every step (its adjoint asks for them, `Adjoint.records_states`), and
    BDF's record of its accepted steps (its orders and step size changes),
    which BDF's discrete derivatives read: with the states, or in their
    place where the checkpointed adjoint replays the steps from it."""
    if not params.get("record", True):
        return False, False, False
    if not params.get("states", True):  # (`dce`: the grid read, nothing else)
        return True, False, False
    stepper = STEPPERS[params["solver"]]
    adjoint = params.get("adjoint", CHECKPOINT.name)
    y = params["body"].in_types[-1]
    states = _records_states(stepper, adjoint, params.get("checkpoints"), params["max_steps"],
                             params.get("error_size") or y.shape[0], y.dtype.itemsize)
    history = stepper.lowering == "bdf" and (states or adjoint == CHECKPOINT.name)
    return True, states, history


#: an integration stopped by `max_steps` is diagnosed stiff (with an
#: explicit solver) where at least this fraction of its steps were rejected,
#: as at an explicit method's stability limit (measured: about 22% for Van
#: der Pol at mu = 1000 and Robertson with tsit5, under 6% for Lotka-Volterra
#: at any tolerance)
STIFF_REJECTED = 0.1
#: and its tolerance is near rounding below this many eps
TIGHT_RTOL_EPS = 1e4


def judge_ode(site, *, status, t_reached, h_last, steps, accepted, ymax, y0max, t0, t1,
              solver, max_steps, rtol=None, reverse=False):
    """Raises the `ConvergenceError` of a failed integration, with a
    diagnosis (`reverse`: the reverse pass's adjoint system, a continuous
    adjoint's)."""
    status = int(status)
    if status == 0:
        return
    t, h = float(t_reached), float(h_last)
    steps, accepted, ymax, y0max = int(steps), int(accepted), float(ymax), float(y0max)
    t0, t1 = float(t0), float(t1)
    implicit = STEPPERS[solver].implicit
    where = (f"at t = {t:.6g} (integrating from {t0:.6g} to {t1:.6g}), "
             f"after {steps} steps ({accepted} accepted), the last accepted step size "
             f"{h:.3e}, max |y| = {ymax:.3e}")
    if status == 4:
        site.fail(InvalidOptionError,
                  "the output times `ts` must be finite and strictly increasing "
                  f"(from {float(t0):.6g} to {float(t1):.6g}).")
    if status == 6:
        site.fail(InvalidOptionError,
                  "the initial values violate the algebraic equations (the rows of the mass "
                  "matrix without an entry) by more than rtol: give a y0 that satisfies "
                  "them, or pass dae_init='solve' to solve them for the algebraic variables "
                  "(the columns of the mass matrix without an entry).")
    # a collapsed step: at the rounding floor of t, or a millionth of the
    # mean step so far (an explicit solver on a stiff problem instead keeps
    # steps near its stability limit)
    mean = (t - t0) / max(accepted, 1)
    tiny = h <= 1e3 * np.finfo(np.float64).eps * max(abs(t), 1.0) or accepted == 0 \
        or h < 1e-6 * mean or not np.isfinite(h)
    # the steps the whole span needs at the last accepted step size
    need = accepted + (t1 - t) / h if h > 0 else np.inf
    eps = float(np.finfo(np.float64).eps)
    tight = rtol is not None and rtol < TIGHT_RTOL_EPS * eps
    rejected = (steps - accepted) / max(steps, 1)
    if reverse and (status == 3 or not np.isfinite(ymax)):
        advice = ("This is the reverse pass: the continuous adjoint's system, whose field is "
                  "the vector field's VJP, went NaN or infinite (its steps then shrink to "
                  "nothing): the field's derivative in the state or in its parameters is not "
                  "finite where the solution goes, though the field is (a sqrt at 0, even "
                  "multiplied by 0). Make the field differentiable there.")
    elif status == 3 or not np.isfinite(ymax):
        advice = ("The state became NaN or infinite: the vector field is not finite there "
                  "(a log or sqrt of a negative value, a division by zero), or the "
                  "solution blows up.")
    elif ymax > 1e8 * max(y0max, 1.0):
        advice = ("The solution grows without bound: a finite-time blow-up near that time, "
                  "or an unstable model. Check the vector field and its parameters.")
    elif tiny and implicit:
        advice = ("The step size collapsed: the implicit stages' Newton iterations fail "
                  "(a singular or wrong Jacobian, non-finite values of f), or the solution "
                  "is not smooth there (a discontinuity: integrate up to it and restart).")
    elif tiny:
        advice = ("The step size collapsed: the vector field is singular or not finite "
                  "near the state reached (NaN values are rejected steps), or the solution "
                  "is not smooth there (a discontinuity: integrate up to it and restart).")
    elif status == 1 and tight:
        advice = (f"The tolerance is near the rounding level (rtol = {rtol:.1e}, "
                  f"{rtol / eps:.0f} eps): meeting it takes short steps (about {need:.3g} "
                  f"of {h:.3g} for the span). Loosen `rtol` (1e-12 or more in float64), or "
                  f"raise `max_steps` (it is {max_steps}).")
    elif status == 1 and not implicit and rejected >= STIFF_REJECTED:
        advice = (f"The problem is likely stiff: {rejected:.0%} of the steps were rejected, "
                  f"as at an explicit solver's stability limit, and about {need:.3g} steps "
                  f"of {h:.3g} would cover the span. Use a stiff solver "
                  f"(solver='kvaerno5'), or raise `max_steps` (it is {max_steps}).")
    elif status == 1:
        advice = (f"`max_steps` (it is {max_steps}) is too small for the span at this step "
                  f"size: about {need:.3g} steps of {h:.3g} cover [{t0:.6g}, {t1:.6g}]. "
                  f"Raise `max_steps` to about {_round_up(1.5 * need)}, or loosen "
                  f"`rtol`/`atol`.")
    else:
        advice = f"Raise `max_steps` (it is {max_steps}), or loosen `rtol`/`atol`."
    site.fail(ConvergenceError,
              f"the {solver} integration failed: {STATUS[status]}, {where}. {advice}",
              residual=t, tolerance=t1, iterations=steps)


def _round_up(x: float) -> int:
    """`x` rounded up to two significant digits (an advised step count)."""
    if not np.isfinite(x) or x < 10:
        return int(np.ceil(x)) if np.isfinite(x) else 0
    scale = 10 ** (int(np.floor(np.log10(x))) - 1)
    return int(np.ceil(x / scale) * scale)


class _Run(NamedTuple):
    """What a lowering's integration gives the node's outputs."""

    ys: Any         # at ts (not finite past a failure)
    status: Any     # 0 success, 1 step limit, 2 step too small, 5 solver failed
    accepted: Any   # accepted steps (int32)
    steps: Any      # attempts (int32)
    t_reached: Any  # the last accepted step's time
    h_last: Any     # and its size
    ymax: Any       # max |y[:m]| there (inf before a first accepted step)
    grid: Any       # the accepted steps' times (max_steps + 1), padded with ts[-1]
    states: Any     # their states, padded with zeros (where recorded)
    work: Any       # (nfev, njev, nlu), int32
    history: Any = None  # BDF's record of its accepted steps (where kept)


@odeint_p.def_impl
def _odeint_impl(*args, body, solver, rtol, atol, max_steps, dt0=None, adaptive=True,
                 error_size=None, jac="dense", pattern=None, adjoint=CHECKPOINT.name,
                 checkpoints=None, disk=None, throw=True, record=True, states=True, dtmax=None,
                 count=False, mass=None, mass_pattern=None, site=None):
    stepper = STEPPERS[solver]
    *consts, y0, ts = args
    # times that do not increase (NaN among them: `> 0` is false for NaN)
    # fail with status 4 below; the integrators would stop on them with an
    # error of their own, so they integrate over 0, 1, 2, ... instead
    given, ts_ok = ts, jnp.all(jnp.diff(ts) > 0)
    ts = jnp.where(ts_ok, ts, jnp.arange(ts.shape[0], dtype=ts.dtype))
    n = y0.shape[0]
    m = n if error_size is None else error_size
    held = site.held if site is not None else ()
    _, dense, history = recorded(dict(
        body=body, solver=solver, max_steps=max_steps, error_size=error_size,
        adjoint=adjoint, checkpoints=checkpoints, record=record, states=states))
    # (an ESDIRK method with a mass matrix: sciad's own loop, `_esdirk`)
    run = _run_diffrax if stepper.lowering == "diffrax" and mass is None else _run_own
    extra = {} if mass is None else {"mass": (consts[mass], mass_pattern)}
    if history:
        extra["history"] = True
    r = run(body, held, consts, y0, ts, stepper=stepper, rtol=rtol, atol=atol,
            max_steps=max_steps, dt0=dt0, adaptive=adaptive, m=m, jac=jac, pattern=pattern,
            record=record, dense=dense, dtmax=dtmax, **extra)
    ys, accepted = r.ys, r.accepted
    # (6, inconsistent initial values: the loops check the algebraic
    # equations at t0, to rtol)
    status = jnp.where(ts_ok, r.status, 4)
    status = jnp.where((status == 0) & ~jnp.all(jnp.isfinite(ys)), 3, status).astype(jnp.int32)
    if throw:
        token = check(judge_ode, site or Site("ode.odeint"), when=status != 0,
                      status=status, t_reached=r.t_reached, h_last=r.h_last, steps=r.steps,
                      accepted=accepted, ymax=r.ymax, y0max=jnp.max(jnp.abs(y0[:m])),
                      t0=given[0], t1=given[-1], solver=solver, max_steps=max_steps, rtol=rtol,
                      reverse=body.name == ADJOINT_BODY)
        # (the step count too: every adjoint reads it, or what is made from
        # it, so a failed forward solve is reported before a derivative
        # integrates from where it stopped)
        ys, accepted = tie(ys, token), tie(accepted, token)
    outs = OdeintOutputs(ys, status, accepted, work=r.work if count else None)
    if not record:
        return tuple(outs.present())
    grid = r.grid
    valid = jnp.where(jnp.arange(grid.shape[0]) <= accepted, grid, jnp.inf)
    marks = jnp.minimum(jnp.searchsorted(valid, ts), accepted).astype(jnp.int32)
    outs = outs._replace(grid=grid, marks=marks)
    outs = outs._replace(states=r.states if dense else None,
                         history=r.history if history else None)
    return tuple(outs.present())


def _run_diffrax(body, held, consts, y0, ts, *, stepper, rtol, atol, max_steps, dt0, adaptive,
                 m, jac, pattern, record, dense, dtmax) -> _Run:
    """The integration by `diffrax.diffeqsolve` with the stepper's diffrax
    class, steps clipped to land on the output times."""
    # (imported here: diffrax takes seconds to import, which `import sciad`
    # does not pay)
    import diffrax
    import optimistix as optx

    n = y0.shape[0]
    norm = optx.rms_norm if m == n else (lambda e: optx.rms_norm(e[:m]))
    terms = [diffrax.ODETerm(lambda t, y, a, part=lower(part_of(body, i), held):
                             part(*a, t, y)[0])
             for i in range(len(body.outputs))]
    term = terms[0] if len(terms) == 1 else diffrax.MultiTerm(*terms)
    if adaptive and stepper.implicit:  # PID gains for stiff problems: fewer rejections
        if sparse_jacobian(jac):  # a kept factorization fits a held step size
            inner = floored(holding())(rtol=rtol, atol=atol, norm=norm, dtmax=dtmax,
                                       **STIFF_PID)
        else:
            inner = floored(diffrax.PIDController)(rtol=rtol, atol=atol, norm=norm,
                                                   dtmax=dtmax, **STIFF_PID)
    elif adaptive:
        inner = floored(diffrax.PIDController)(rtol=rtol, atol=atol, norm=norm, dtmax=dtmax)
    else:  # constant steps of dt0 (shortened to land on the output times):
        # every step with a finite error is accepted; a failed (an implicit
        # step's Newton iteration: diffrax makes its error infinite) or
        # non-finite one is rejected and retried shorter, and the steps grow
        # back to dt0
        def finite(e):  # 0 for any finite error, inf for a failed or non-finite step
            return jnp.where(jnp.all(jnp.isfinite(e[:m])), 0.0, jnp.inf)

        inner = floored(diffrax.PIDController)(rtol=0.0, atol=1.0, norm=finite, dtmax=dt0)
    controller = diffrax.ClipStepSizeController(inner, step_ts=ts)
    subs = [diffrax.SubSaveAt(ts=ts)]
    if record:  # the accepted steps' times (and states)
        subs.append(diffrax.SubSaveAt(steps=True, fn=lambda t, y, a: (t, y if dense else None)))
    # (the last accepted step, for the diagnosis: in the solver's state)
    sol = diffrax.diffeqsolve(term, diffrax_solver(stepper, jac, pattern, rtol, atol, m),
                              t0=ts[0], t1=ts[-1], dt0=dt0, y0=y0, args=tuple(consts),
                              saveat=diffrax.SaveAt(subs=subs, solver_state=True),
                              stepsize_controller=controller, max_steps=max_steps,
                              throw=False, adjoint=diffrax.ForwardMode())
    t_reached, h_last, ymax = sol.solver_state[1]
    accepted = sol.stats["num_accepted_steps"].astype(jnp.int32)
    R = diffrax.RESULTS
    status = jnp.select([sol.result == R.successful, sol.result == R.max_steps_reached,
                         sol.result == R.dt_min_reached], [0, 1, 2], 5)
    grid = states = None
    if record:
        tsteps, ysteps = sol.ys[1]
        done = jnp.isfinite(tsteps)
        grid = jnp.concatenate([ts[:1], jnp.where(done, tsteps, ts[-1])])
        if dense:
            states = jnp.concatenate([y0[None], jnp.where(done[:, None], ysteps, 0.0)])
    # the work as SciPy counts it: the stages of the accepted steps (a step's
    # last stage is the next one's first where the method is FSAL), one
    # Jacobian and factorization per accepted step of an implicit method
    c, As, b = tableau(stepper)
    fsal = int(len(c) > 1 and np.allclose(As[0][-1, :len(b)], b) and c[-1] == 1)
    nfev = (len(c) - fsal) * accepted + fsal
    nje = accepted if stepper.implicit else jnp.zeros_like(accepted)
    work = jnp.stack([nfev, nje, nje]).astype(jnp.int32)
    return _Run(sol.ys[0], status, accepted, sol.stats["num_steps"].astype(jnp.int32),
                t_reached, h_last, ymax, grid, states, work)


def _mass_for(mass, mass_pattern, n: int, jac: str, pattern):
    """The mass matrix of an `n`-element state for `_bdf.integrate`: dense
    `I_k (x) M`, or its values on the Newton matrices' `pattern` (sparse)."""
    size = mass_pattern.shape[0] if mass_pattern is not None else mass.shape[0]
    k = n // size
    if jac != "sparse":
        M = mass if mass_pattern is None else jnp.zeros((size, size), mass.dtype).at[
            mass_pattern.row_index(), np.asarray(mass_pattern.indices)].set(mass)
        return M if k == 1 else jnp.kron(jnp.eye(k, dtype=M.dtype), M)
    if mass_pattern is None:  # (a dense mass with sparse Newton matrices: its entries)
        r, c = np.nonzero(np.ones((size, size), bool))
        values = mass[r, c]
    else:
        r, c = np.asarray(mass_pattern.rows), np.asarray(mass_pattern.indices)
        values = mass
    positions = pattern.positions_of(np.concatenate([r + b * size for b in range(k)]),
                                     np.concatenate([c + b * size for b in range(k)]))
    # (every entry has its place: the pattern was made with them,
    # `with_mass_entries`)
    assert np.all(positions >= 0), "the Newton pattern holds the mass matrix's entries"
    return jnp.zeros((pattern.nnz,), values.dtype).at[positions].set(jnp.tile(values, k))


def _run_own(body, held, consts, y0, ts, *, stepper, rtol, atol, max_steps, dt0, adaptive,
             m, jac, pattern, record, dense, dtmax, mass=None, history=False) -> _Run:
    """The integration by one of sciad's own loops: BDF
    (`sciad.solvers.ode._bdf`), Radau IIA (`_radau`), or an ESDIRK method's
    with a mass matrix (`_esdirk`); `history`: BDF records its accepted steps
    (for its discrete adjoint)."""
    del adaptive  # (all are adaptive; checked by the abstract eval)
    part = lower(part_of(body, 0), held)
    method = {"bdf": _bdf, "radau": _radau, "diffrax": _esdirk}[stepper.lowering]
    jac = "sparse" if sparse_jacobian(jac) else "dense"
    extra = {} if mass is None else {"mass": _mass_for(*mass, y0.shape[0], jac, pattern)}
    if history:
        extra["history"] = True
    if method is _esdirk:  # (its tableau, and the embedded estimate's weights)
        c, As, b = tableau(stepper)
        extra.update(tableau=(c, As[-1], b, error_weights(stepper)), order=stepper.order)
    r = method.integrate(lambda t, y: part(*consts, t, y)[0], y0, ts, rtol=rtol, atol=atol,
                         max_steps=max_steps, m=m, jac=jac, pattern=pattern, dt0=dt0,
                         dtmax=dtmax, record=record, dense=dense, **extra)
    return _Run(r.ys, r.status, r.accepted, r.steps, r.t_reached, r.h_last, r.ymax, r.grid,
                r.states, jnp.stack(list(r.counts)).astype(jnp.int32), r.history)


# ---------------------------------------------------------------------------
# forward mode: the forward-sensitivity system


@functools.lru_cache(maxsize=128)
def _sensitivity_body(graph: Graph, nonzero: tuple) -> Graph:
    """`(*consts, *dconsts[nonzero], t, [y, dy]) -> ([f, (df/dy) dy + (df/dc) dc],)`;
    for each of an IMEX field's parts (their split kept: the stiff part's
    sensitivity is stepped implicitly with it)."""

    *ctypes, ttype, ytype = graph.in_types
    n = ytype.shape[0]

    def body(*a):
        nc = len(ctypes)
        consts, rest = list(a[:nc]), list(a[nc:])
        dconsts = [rest.pop(0) if nz else Zero(t.update()) for nz, t in zip(nonzero, ctypes)]
        t, Y = rest
        y, dy = Y[:n], Y[n:]
        fs, dfs = jvp_eval(graph, [*consts, t, y], [*dconsts, Zero(ttype.update()), dy])
        return [ops.concatenate([f, ops.zeros_like(f) if is_zero(df) else df])
                for f, df in zip(fs, dfs)]

    types = list(ctypes) + [t for nz, t in zip(nonzero, ctypes) if nz] + \
        [ttype, TensorType((2 * n,), ytype.dtype)]
    g, consts, _ = trace_body(body, types, name=f"{graph.name}_jvp")
    assert not consts
    return g


@odeint_p.def_jvp
def _odeint_jvp(primals, tangents, **params):

    *consts, y0, ts = primals
    *dconsts, dy0, dts = tangents
    graph = params["body"]
    nonzero = tuple(not is_zero(t) for t in dconsts)
    if not any(nonzero) and is_zero(dy0) and is_zero(dts):
        outs = odeint_p.bind(*primals, **params)
        return outs, [Zero(type_of(o).update()) for o in outs]
    n = y0.shape[0]
    dy0 = ops.zeros_like(y0) if is_zero(dy0) else dy0
    if not is_zero(dts):
        dy0 = dy0 - field_at(graph, consts, ts[0], y0) * dts[0]
    stepper = STEPPERS[params["solver"]]
    if stepper.discrete and recorded(params)[1]:
        return _stepwise_jvp(primals, [*dconsts, dy0], dts, params)
    aug = _sensitivity_body(graph, nonzero)
    extra = [t for t in dconsts if not is_zero(t)]
    pattern = augmented_pattern(params, aug)
    if pattern is not None and params.get("mass") is not None:  # (M - c J's entries)
        pattern = with_mass_entries(pattern, params["mass_pattern"])
    p = derived_params(params, body=aug, error_size=params.get("error_size") or n,
                       pattern=pattern)
    outs = OdeintOutputs.of(
        odeint_p.bind(*consts, *extra, ops.concatenate([y0, dy0]), ts, **p), p)
    # (the primal results come out of the node that computes the tangents:
    # marked so that a transposition of the tangent map takes them for
    # primal values, see `jvp_primal`)
    # (the states where recorded: the primal's and their tangents; the work
    # counted, where counted, is the sensitivity system's)
    states, dys = outs.states, outs.ys[:, n:]
    outs = outs._replace(ys=jvp_primal(outs.ys[:, :n]),
                         states=None if states is None else jvp_primal(states[:, :n]))
    return outs.present(), _tangent_outputs(outs, dys, None if states is None else
                                            states[:, n:], dts, params, consts, ts)


def _stepwise_jvp(primals, tangents, dts, params):
    """The JVP of a node that records its states: the discrete forward
    sensitivity of the steps the node took (`_ode_bdf_adjoint.bdf_jvp`,
    `_ode_adjoint.stored_jvp`), on its own recorded steps, so the states'
    tangents are on the grid of the states themselves wherever the two are
    computed (`sd.to_jax` forms a function's outputs and their tangents in
    two programs); `tangents`: of `(*consts, y0)`, `y0`'s with the initial
    time's tangent in it."""
    *consts, _, ts = primals
    outs = OdeintOutputs.of(odeint_p.bind(*primals, **params), params)
    if outs.history is not None:
        from ._ode_bdf_adjoint import bdf_jvp
        dstates, dys = bdf_jvp(primals, tangents, outs, params)
    elif STEPPERS[params["solver"]].lowering == "radau":  # (its own pass: one node)
        from ._ode_radau_adjoint import radau_jvp
        dstates, dys = radau_jvp(primals, tangents, outs, params)
    else:
        dstates, dys = stored_jvp(primals, tangents, outs, params)
    return outs.present(), _tangent_outputs(outs, dys, dstates, dts, params, consts, ts)


def _tangent_outputs(outs, dys, dstates, dts, params, consts, ts) -> list:
    """The JVP's tangents of a node's outputs `outs` (an `OdeintOutputs`,
    the primal's) from those of `ys` and of the states (None where none):
    no derivative of a failure (`throw=False`), the output times' tangents
    `f(t_i, y_i) dt_i` added; status, steps, grid, marks, history and work
    have none."""
    if not params.get("throw", True):  # no derivative of a failure
        dys = root_guard_p.bind(outs.status, dys, of="odeint")
        if dstates is not None:
            dstates = root_guard_p.bind(outs.status, dstates, of="odeint")
    if not is_zero(dts):
        dys = dys + fields_at(params["body"], consts, ts, outs.ys) * dts[:, None]
    return OdeintOutputs(dys, *(None if o is None else Zero(type_of(o).update())
                                for o in (outs.status, outs.steps, outs.grid, outs.marks)),
                         states=dstates,
                         history=None if outs.history is None else
                         Zero(type_of(outs.history).update()),
                         work=None if outs.work is None else
                         Zero(type_of(outs.work).update())).present()


# The tangent-map form of an `odeint` (the JVP's, on the state `[y, dy]`) is
# linear in the tangent operands only where the primal ones are fixed: it is
# transposed as its VJP where the tangents are zero, which is the discrete
# adjoint of the sensitivity system's steps (that of the primal part too,
# whose cotangents are dropped).
odeint_p.def_transpose(vjp_transpose(odeint_p))


# ---------------------------------------------------------------------------
# reverse mode


@odeint_p.def_vjp
def _odeint_vjp(primals, outs, cts, **params):

    *consts, y0, ts = primals
    if params.get("mass") is not None and ADJOINTS[params.get("adjoint",
                                                           CHECKPOINT.name)].continuous:
        raise NotSupportedError(
            f"reverse mode through an ode.odeint with a mass matrix (a DAE) and "
            f"adjoint={params.get('adjoint')!r} is not available: the continuous adjoint "
            f"needs consistent adjoint values on the algebraic equations. Use "
            f"adjoint='checkpoint' (the discrete adjoint of the steps; BDF's default), or "
            f"forward mode (sd.jvp, sd.jacfwd), which integrates the sensitivities with the "
            f"same mass matrix.", op="ode.odeint")
    outs, cts = OdeintOutputs.of(outs, params), OdeintOutputs.of(cts, params)
    ct = cts.ys
    if not params.get("throw", True) and not is_zero(ct):
        ct = root_guard_p.bind(outs.status, ct, of="odeint")  # no derivative of a failure
    # (the states at every step get cotangents where a reverse pass that
    # read them is differentiated in reverse mode again)
    ct_states = cts.states if cts.states is not None and not is_zero(cts.states) else None
    if is_zero(ct) and ct_states is None:
        return [None] * len(primals)
    if is_zero(ct):
        ct = ops.zeros(type_of(outs.ys).shape, type_of(outs.ys).dtype)
    if not (params.get("record", True) and params.get("states", True)):
        # (a node `dce` spared the recording)
        params = {k: v for k, v in params.items() if k not in ("record", "states")}
        outs = OdeintOutputs.of(odeint_p.bind(*primals, **params), params)
    if isinstance(ts, Tracer):  # (held here, an outer derivative may move them)
        # the steps land on the output times (marks): those grid points move
        # with them, which the reverse pass's derivatives (second order in
        # the times) read; the steps between are held
        outs = outs._replace(grid=outs.grid.at[outs.marks].set(ts))
    graph = params["body"]
    adjoint = ADJOINTS[params.get("adjoint", CHECKPOINT.name)]
    if ct_states is not None and not adjoint.forms_state_cotangents(outs):
        raise NotSupportedError(
            "reverse mode over the reverse mode of an ode.odeint node with "
            f"adjoint={adjoint.name!r}: its cotangent of the states at every step is not "
            "formed. Use forward over reverse (sd.hvp, sd.jvp of sd.grad), or "
            f"adjoint={CHECKPOINT.name!r}.", op="ode.odeint")
    bars = adjoint.vjp(primals, outs, ct, params, ct_states)
    bars = [None if b is None or is_zero(b) else b for b in bars]
    if not needs_ct(ts):  # constant (or held) times: no cotangent to form
        return bars + [None]
    ybar0 = bars[-1]
    # the output times: y(t_i) moves with t_i at f(t_i, y_i); the initial
    # time moves the whole solution: dy/dt0 = -Phi f(t0, y0)
    F = fields_at(graph, consts, ts, outs.ys)
    tbar = ops.sum(F * ct, axis=1)
    if ybar0 is not None:
        tbar = tbar - ops.where(ops.arange(ts.shape[0]) == 0, ops.sum(F[0] * ybar0), 0.0)
    return bars + [tbar]


@odeint_p.def_dce
def _odeint_dce(node, used):
    # nothing reads the step grid, marks or states (no reverse pass): the
    # loop need not record its steps
    # nor its work (where it counts): the loop need not count
    count = node.params.get("count", False)
    used = OdeintOutputs.of(used, node.params)
    kept, params = OdeintOutputs.of(node.outputs, node.params), dict(node.params)
    if params.get("record", True) and not (used.grid or used.marks or used.states
                                           or used.history):
        kept, params["record"] = kept._replace(grid=None, marks=None, states=None,
                                               history=None), False
    elif (kept.states is not None or kept.history is not None) \
            and not (used.states or used.history):
        # (the grid read, the states not: `odeint(throw=False)`'s time reached)
        kept, params["states"] = kept._replace(states=None, history=None), False
    if count and not used.work:
        kept, params["count"] = kept._replace(work=None), False
    if params == node.params:
        return None
    return node.replace(outputs=kept.present(), params=params)


@odeint_p.def_sparsity
def _odeint_sparsity(outs, *deps, **params):
    return dense_all(outs, *deps)


# a batch of integrations is a `map` of one: `jax.vmap` of diffrax's loop
# (every example steps until all are done)
odeint_p.def_batch(map_rule(odeint_p))


@odeint_p.def_cost
def _odeint_cost(node, body_cost):
    # per step (their number is known only when it runs): one evaluation of
    # the vector field per stage, and for an implicit solver a Newton
    # iteration per implicit stage
    p = node.params
    F = body_cost(p["body"])
    stepper = STEPPERS[p["solver"]]
    n = node.inputs[-2].type.size
    if stepper.lowering == "radau":  # three stages, about two iterations a step
        per = 6.0 * (F.flops + 4.0 * n * n)
        return Cost(per, F.peak, f"per step ({_si(per)})")
    if not stepper.replayable:  # BDF: about two Newton iterations a step
        per = 2.0 * (F.flops + 2.0 * n * n + 8.0 * n)
        return Cost(per, F.peak, f"per step ({_si(per)})")
    c, As, b = tableau(stepper)
    per = len(b) * (F.flops + 4.0 * n)
    if stepper.implicit:
        per += float(np.count_nonzero(np.diag(As[-1]))) * (F.flops + 2.0 * n * n)
    return Cost(per, F.peak, f"per step ({_si(per)})")


register_v1_migration("ode.odeint", graph_param_v1(field_body))  # (was the param `graph`)
