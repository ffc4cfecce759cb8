"""`ode.odeint`: an initial value problem as one node, with sciad-owned
derivative rules.

The node holds the vector field as a closed body `(*consts, t, y) -> (dy/dt,)`
on a flat state `y` of `N` elements, and its operands are `(*consts, y0,
ts)`. For the IMEX solvers (`IMEX`, the KenCarp methods) the body has two
outputs, the non-stiff and the stiff part of `dy/dt`, whose sum is the
field: the first is stepped explicitly, the second implicitly. It lowers
to `diffrax.diffeqsolve` (diffrax steps, controls the step size and
detects failure), with the steps clipped to land on every output time. Its
outputs are

- `ys`: the state at `ts`, `(len(ts), N)`;
- `status` (0 success, see `STATUS`), the number of accepted steps;
- `grid`: the accepted step times (`max_steps + 1` of them, padded with the
  final time), and `marks`: for each output time, the number of steps taken
  to reach it (a step lands on each). The derivative rules read them; they
  carry no derivative.
- `states` (for the interpolated adjoint, and the checkpointed one where
  they fit its memory, `records_states`): the state at every step,
  `(max_steps + 1, N)`, padded with zeros.

Rules, each made of sciad nodes, so every order of differentiation holds:

- JVP: one `odeint` node on the forward-sensitivity system `(y, dy)`, with
  `dy' = (df/dy) dy + (df/dconsts) dconsts` from the JVP of the body. Its
  error control reads only the `y` part (`error_size`), so it takes the
  steps the primal takes: the tangent is the derivative of the computed
  solution on its step grid. Tangents of the times: `dy(t_i) += f(t_i, y_i)
  dt_i`, and `dy0 -= f(t0, y0) dt0` for the initial time.
- VJP, `adjoint="checkpoint"` (the default): the discrete adjoint of the
  steps taken. Where the states at every step fit `SNAPSHOT_BYTES`, the node
  records them (a sixth output) and the reverse pass runs down the steps,
  re-running each once from its state for its linearisation
  (`_stored_vjp`). Otherwise the steps are re-run on the recorded grid: a
  `scan` over the output intervals, each a `while` loop of Runge-Kutta
  steps, and the reverse pass is those loops' (`while_adjoint`: two-level
  checkpointing over the steps taken). A step is the solver's tableau in
  sciad ops (`rk_step`; an implicit stage is an `optimize.root` node
  solved by the chord method, started from the previous stage's slope or,
  where the next state is recorded, from the Hermite interpolant to it; with
  sparse Newton matrices a step's stages share one factorization, of the
  matrix at the step's start: `root(jac0=...)`).
  The gradient is that of the computed solution to rounding for explicit
  solvers (to the Newton tolerance for implicit ones), and agrees with the
  JVP.
- VJP, `adjoint="interpolated"` or `"backsolve"`: the continuous adjoint,
  `lambda' = -(df/dy)^T lambda`, solved backwards with the parameters'
  cotangents by `odeint` nodes (a scan over the output intervals). The
  state on the way back is the forward solution interpolated from its
  states at every step (a sixth output of the node, `(max_steps + 1, N)`)
  or, for "backsolve", integrated backwards with the adjoint: memory of one
  state, but unstable where the backward integration is (stiff or
  dissipative problems), and never the default. Both are accurate to the
  solver's tolerance (and the interpolation's) only.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import (ConvergenceError, DTypeError, InvalidOptionError, NotSupportedError,
                      ShapeError)
from ..graph import Graph, Param, Primitive, TensorType, Zero, is_zero
from ..graph._autodiff import jvp_eval, jvp_primal, needs_ct, type_of, vjp_transpose
from ..graph._types import Pattern
from ._checks import check, tie
from ._root import root_guard_p

#: solver name -> (diffrax class name, implicit)
SOLVERS = {
    "tsit5": ("Tsit5", False), "dopri5": ("Dopri5", False), "dopri8": ("Dopri8", False),
    "bosh3": ("Bosh3", False), "heun": ("Heun", False), "euler": ("Euler", False),
    "kvaerno3": ("Kvaerno3", True), "kvaerno4": ("Kvaerno4", True),
    "kvaerno5": ("Kvaerno5", True), "implicit_euler": ("ImplicitEuler", True),
    "kencarp3": ("KenCarp3", True), "kencarp4": ("KenCarp4", True),
    "kencarp5": ("KenCarp5", True),
}
#: IMEX solvers (additive Runge-Kutta: an explicit tableau for the first
#: part of the field, an ESDIRK one for the second, stiff part), and the
#: ESDIRK solver of the same order that the continuous adjoints integrate
#: the summed field with
IMEX = {"kencarp3": "kvaerno3", "kencarp4": "kvaerno4", "kencarp5": "kvaerno5"}
#: solvers without an embedded error estimate: constant steps only
FIXED_ONLY = ("euler",)
ADJOINTS = ("checkpoint", "backsolve", "interpolated")
JACOBIANS = ("dense", "sparse")
#: implicit solvers: the chord iterations of a stage stop when their
#: estimated error is below this fraction of the step's tolerance (diffrax's
#: default, 0.01, rejected half the steps of a stiff reaction-diffusion
#: problem for Newton "divergence"; 0.1 is within Hairer and Wanner's range),
#: and the step-size controller's PID gains (diffrax's suggestion for stiff
#: problems)
NEWTON_KAPPA = 0.1
STIFF_PID = {"pcoeff": 0.3, "icoeff": 0.4}
#: the replayed implicit stages' Newton tolerance on the residual scaled by
#: `|y| + atol/rtol`: this fraction of the ODE's rtol (Newton converges
#: quadratically, so the stages are then solved far below the local error
#: the steps were accepted with), floored at this many eps; and a stage
#: that stalls at its measured floor of rounding errors has converged
#: (`optimize.root`'s `at_floor`), since that floor grows with `h` times the
#: field's Jacobian (stiffness) and can lie above any fixed tolerance
STAGE_RTOL = 1e-3
STAGE_FLOOR_EPS = 100.0

STATUS = {
    0: "success",
    1: "the step limit (max_steps) was reached",
    2: "the step size fell below its minimum",
    3: "the state became NaN or infinite",
    4: "the output times are not increasing",
    5: "the solver failed (an implicit step's Newton iteration or linear solve)",
}

odeint_p = Primitive("ode.odeint", multiple_results=True, runtime_checks=True, params={
    "graph": Graph, "solver": str, "rtol": float, "atol": float, "max_steps": int,
    "dt0": Param((float, None), default=None), "adaptive": Param(bool, default=True),
    "error_size": Param((int, None), default=None),
    "jac": Param(str, default="dense"), "pattern": Param((Pattern, None), default=None),
    "adjoint": Param(str, default="checkpoint"),
    "checkpoints": Param((int, None), default=None), "throw": Param(bool, default=True),
    "record": Param(bool, default=True)})
#: `graph`: the vector field `(*consts, t, y) -> (dy/dt,)` on a flat `y`;
#: `error_size`: the step-size control reads only the first `error_size`
#: elements of the state (None: all; the sensitivity systems of the JVP set
#: it to the primal's size); `jac` and `pattern`: how the Newton systems of
#: an implicit solver are formed and solved (sparse: the pattern of
#: `df/dy` detected from `graph`, values by colored JVPs, SuperLU);
#: `adjoint`, `checkpoints`: the reverse mode (see the module docstring;
#: `checkpoints` is the number of states the checkpointed one stores evenly
#: over each output interval's steps, `sd.Segments`; None: `snapshots_for`);
#: `record`: the node outputs its step grid (and states): set False by `dce`
#: where nothing reads them (a solve that is not differentiated), which
#: spares the loop its recording


@odeint_p.def_abstract_eval
def _odeint_shape(*args, graph, solver, rtol, atol, max_steps, dt0=None, adaptive=True,
                  error_size=None, jac="dense", pattern=None, adjoint="checkpoint",
                  checkpoints=None, throw=True, record=True):
    op = "ode.odeint"
    *consts, y0, ts = args
    if solver not in SOLVERS:
        raise InvalidOptionError(f"unknown solver {solver!r}; one of {sorted(SOLVERS)}.",
                                 op=op)
    if adjoint not in ADJOINTS or jac not in JACOBIANS:
        raise InvalidOptionError(f"`adjoint` must be one of {ADJOINTS} and `jac` one of "
                                 f"{JACOBIANS}, got {adjoint!r} and {jac!r}.", op=op)
    if not isinstance(y0, TensorType) or y0.dtype.kind != "f" or len(y0.shape) != 1:
        raise DTypeError(f"`y0` must be a flat real float array, got {y0}.", op=op)
    if not isinstance(ts, TensorType) or len(ts.shape) != 1 or ts.shape[0] < 2 \
            or ts.dtype != y0.dtype:
        raise ShapeError(f"`ts` must be a 1-d array of at least 2 times of y0's dtype "
                         f"({y0.dtype}), got {ts}.", op=op)
    n = y0.shape[0]
    scalar = TensorType((), y0.dtype)
    if tuple(graph.in_types) != tuple(consts) + (scalar, y0):
        raise ShapeError("the vector field's graph does not take the node's operands.", op=op)
    outs = graph.out_types
    parts = 2 if solver in IMEX else 1
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
    if jac == "sparse" and (pattern is None or pattern.shape != (n, n)):
        raise ShapeError(f"a sparse Jacobian needs an ({n}, {n}) pattern, got {pattern!r}.",
                         op=op)
    i32 = np.dtype(np.int32)
    outs = (TensorType((ts.shape[0], n), y0.dtype), TensorType((), i32), TensorType((), i32))
    if not record:
        return outs
    outs += (TensorType((max_steps + 1,), y0.dtype), TensorType((ts.shape[0],), i32))
    if records_states(adjoint, checkpoints, max_steps, error_size or n, y0.dtype.itemsize):
        outs += (TensorType((max_steps + 1, n), y0.dtype),)  # the states at the step times
    return outs


def records_states(adjoint: str, checkpoints, max_steps: int, n: int, itemsize: int) -> bool:
    """Whether the node outputs its state at every step: for the interpolated
    adjoint, and for the checkpointed one where they all fit its memory
    (`snapshots_for`, `checkpoints` not set): its reverse pass then re-runs
    each step once from its stored state, and never the whole solve. `n`:
    the primal's size (a sensitivity system records as its primal does)."""
    if adjoint == "interpolated":
        return True
    return adjoint == "checkpoint" and checkpoints is None and \
        snapshots_for(max_steps, n, itemsize) >= max_steps


def _diffrax_solver(solver: str, jac: str, pattern, rtol: float, atol: float, m: int):
    """diffrax's solver for `solver`, tracking its last accepted step (of
    the first `m` state elements: see `_tracking`)."""
    implicit = SOLVERS[solver][1]
    cls = _solver_class(solver)
    if not implicit:
        return _tracking(cls, m)()
    from ..solvers._ode import SparseNewtonSolver, patient_chord, reusing

    extra = {}
    if jac == "sparse":  # SuperLU, its factorization kept over steps
        extra["linear_solver"] = SparseNewtonSolver(pattern)
        cls = reusing(cls, float(np.max(np.diag(_tableaus(solver)[1][-1]))))
    # (stages stop as RADAU5's do: diffrax's VeryChord fails a stage not
    # converged after two iterations, and so rejects steps a chord iteration
    # would have finished: 67 steps against 26 for a stiff heat equation)
    return _tracking(cls, m)(root_finder=patient_chord()(rtol=rtol, atol=atol,
                                                         kappa=NEWTON_KAPPA, **extra))


@functools.lru_cache(maxsize=None)
def _tracking(cls, m: int):
    """`cls` keeping `(t, h, max |y[:m]|)` of its last step in its state:
    diffrax keeps a step's solver state only when it accepts the step, so
    the final state (`SaveAt(solver_state=True)`) tells the time reached,
    the last accepted step size and the state's size there, for the
    diagnosis of a failed solve, without recording every step (`max |y|` is
    infinite before a first accepted step)."""
    import jax.numpy as jnp

    class Tracking(cls):
        def init(self, terms, t0, t1, y0, args):
            dt = jnp.result_type(y0)
            return super().init(terms, t0, t1, y0, args), (
                jnp.asarray(t0, dt), jnp.zeros((), dt), jnp.full((), jnp.inf, dt))

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            y1, err, dense, state, result = super().step(terms, t0, t1, y0, args,
                                                         solver_state[0], made_jump)
            dt = jnp.result_type(y0)
            last = (jnp.asarray(t1, dt), jnp.asarray(t1 - t0, dt),
                    jnp.max(jnp.abs(y1[:m])).astype(dt))
            return y1, err, dense, (state, last), result

    Tracking.__name__ = Tracking.__qualname__ = f"Tracking{cls.__name__}"
    return Tracking


@functools.lru_cache(maxsize=None)
def _solver_class(solver: str):
    """diffrax's class for `solver`. Its implicit Euler is wrapped so that a
    failed Newton iteration makes the step's error infinite (as diffrax's
    Runge-Kutta methods do): the step is retried shorter instead of ending
    the solve."""
    import diffrax
    import jax
    import jax.numpy as jnp

    cls = getattr(diffrax, SOLVERS[solver][0])
    if solver != "implicit_euler":
        return cls

    class ImplicitEuler(cls):
        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            y1, err, dense, state, result = super().step(terms, t0, t1, y0, args,
                                                         solver_state, made_jump)
            ok = result == diffrax.RESULTS.successful
            err = jax.tree_util.tree_map(lambda e: jnp.where(ok, e, jnp.inf), err)
            return y1, err, dense, state, result

    return ImplicitEuler


#: an integration stopped by `max_steps` is diagnosed stiff (with an
#: explicit solver) where at least this fraction of its steps were rejected,
#: as at an explicit method's stability limit (measured: about 22% for Van
#: der Pol at mu = 1000 and Robertson with tsit5, under 6% for Lotka-Volterra
#: at any tolerance)
STIFF_REJECTED = 0.1
#: and its tolerance is near rounding below this many eps
TIGHT_RTOL_EPS = 1e4


def judge_ode(site, *, status, t_reached, h_last, steps, accepted, ymax, y0max, t0, t1,
              solver, max_steps, rtol=None):
    """Raises the `ConvergenceError` of a failed integration, with a
    diagnosis."""
    status = int(status)
    if status == 0:
        return
    t, h = float(t_reached), float(h_last)
    steps, accepted, ymax, y0max = int(steps), int(accepted), float(ymax), float(y0max)
    t0, t1 = float(t0), float(t1)
    implicit = SOLVERS[solver][1]
    where = (f"at t = {t:.6g} (integrating from {t0:.6g} to {t1:.6g}), "
             f"after {steps} steps ({accepted} accepted), the last accepted step size "
             f"{h:.3e}, max |y| = {ymax:.3e}")
    if status == 4:
        site.fail(InvalidOptionError,
                  "the output times `ts` must be finite and strictly increasing "
                  f"(from {float(t0):.6g} to {float(t1):.6g}).")
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
    if status == 3 or not np.isfinite(ymax):
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


@odeint_p.def_impl
def _odeint_impl(*args, graph, solver, rtol, atol, max_steps, dt0=None, adaptive=True,
                 error_size=None, jac="dense", pattern=None, adjoint="checkpoint",
                 checkpoints=None, throw=True, record=True, site=None):
    import diffrax
    import jax.numpy as jnp
    import optimistix as optx

    from ..graph import Site, lower

    *consts, y0, ts = args
    # times that do not increase (NaN among them: `> 0` is false for NaN)
    # fail with status 4 below; diffrax would stop on them with an error of
    # its own, so it integrates over 0, 1, 2, ... instead
    given, ts_ok = ts, jnp.all(jnp.diff(ts) > 0)
    ts = jnp.where(ts_ok, ts, jnp.arange(ts.shape[0], dtype=ts.dtype))
    n = y0.shape[0]
    m = n if error_size is None else error_size
    norm = optx.rms_norm if m == n else (lambda e: optx.rms_norm(e[:m]))
    terms = [diffrax.ODETerm(lambda t, y, a, part=lower(part_of(graph, i)): part(*a, t, y)[0])
             for i in range(len(graph.outputs))]
    term = terms[0] if len(terms) == 1 else diffrax.MultiTerm(*terms)
    if adaptive and SOLVERS[solver][1]:  # PID gains for stiff problems: fewer rejections
        if jac == "sparse":  # a kept factorization fits a held step size
            from ..solvers._ode import holding

            inner = holding()(rtol=rtol, atol=atol, norm=norm, **STIFF_PID)
        else:
            inner = diffrax.PIDController(rtol=rtol, atol=atol, norm=norm, **STIFF_PID)
    elif adaptive:
        inner = diffrax.PIDController(rtol=rtol, atol=atol, norm=norm)
    else:  # constant steps of dt0 (shortened to land on the output times):
        # every step with a finite error is accepted; a failed (an implicit
        # step's Newton iteration: diffrax makes its error infinite) or
        # non-finite one is rejected and retried shorter, and the steps grow
        # back to dt0
        def finite(e):  # 0 for any finite error, inf for a failed or non-finite step
            return jnp.where(jnp.all(jnp.isfinite(e[:m])), 0.0, jnp.inf)

        inner = diffrax.PIDController(rtol=0.0, atol=1.0, norm=finite, dtmax=dt0)
    controller = diffrax.ClipStepSizeController(inner, step_ts=ts)
    dense = record and records_states(adjoint, checkpoints, max_steps, m,
                                      np.dtype(y0.dtype).itemsize)
    subs = [diffrax.SubSaveAt(ts=ts)]
    if record:  # the accepted steps' times (and states)
        subs.append(diffrax.SubSaveAt(steps=True, fn=lambda t, y, a: (t, y if dense else None)))
    # (the last accepted step, for the diagnosis: in the solver's state)
    sol = diffrax.diffeqsolve(term, _diffrax_solver(solver, jac, pattern, rtol, atol, m),
                              t0=ts[0], t1=ts[-1], dt0=dt0, y0=y0, args=tuple(consts),
                              saveat=diffrax.SaveAt(subs=subs, solver_state=True),
                              stepsize_controller=controller, max_steps=max_steps,
                              throw=False, adjoint=diffrax.ForwardMode())
    ys = sol.ys[0]
    t_reached, h_last, ymax = sol.solver_state[1]
    accepted = sol.stats["num_accepted_steps"].astype(jnp.int32)
    steps = sol.stats["num_steps"].astype(jnp.int32)
    R = diffrax.RESULTS
    status = jnp.select([sol.result == R.successful, sol.result == R.max_steps_reached,
                         sol.result == R.dt_min_reached], [0, 1, 2], 5).astype(jnp.int32)
    status = jnp.where(ts_ok, status, 4)
    status = jnp.where((status == 0) & ~jnp.all(jnp.isfinite(ys)), 3, status)
    if throw:
        token = check(judge_ode, site or Site("ode.odeint"), when=status != 0,
                      status=status, t_reached=t_reached, h_last=h_last, steps=steps,
                      accepted=accepted, ymax=ymax, y0max=jnp.max(jnp.abs(y0[:m])),
                      t0=given[0], t1=given[-1], solver=solver, max_steps=max_steps, rtol=rtol)
        # (the step count too: every adjoint reads it, or what is made from
        # it, so a failed forward solve is reported before a derivative
        # integrates from where it stopped)
        ys, accepted = tie(ys, token), tie(accepted, token)
    if not record:
        return ys, status, accepted
    tsteps, ysteps = sol.ys[1]
    done = jnp.isfinite(tsteps)
    grid = jnp.concatenate([ts[:1], jnp.where(done, tsteps, ts[-1])])
    valid = jnp.where(jnp.arange(grid.shape[0]) <= accepted, grid, jnp.inf)
    marks = jnp.minimum(jnp.searchsorted(valid, ts), accepted).astype(jnp.int32)
    if not dense:
        return ys, status, accepted, grid, marks
    states = jnp.concatenate([y0[None], jnp.where(done[:, None], ysteps, 0.0)])
    return ys, status, accepted, grid, marks, states


def _params(params: dict, **changes) -> dict:
    """`params` with `changes`; a None value means the param's default."""
    out = dict(params)
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------
# forward mode: the forward-sensitivity system


@functools.lru_cache(maxsize=128)
def _sensitivity_body(graph: Graph, nonzero: tuple) -> Graph:
    """`(*consts, *dconsts[nonzero], t, [y, dy]) -> ([f, (df/dy) dy + (df/dc) dc],)`;
    for each of an IMEX field's parts (their split kept: the stiff part's
    sensitivity is stepped implicitly with it)."""
    from .. import numpy as snp
    from ..graph._body import trace_body

    *ctypes, ttype, ytype = graph.in_types
    n = ytype.shape[0]

    def body(*a):
        nc = len(ctypes)
        consts, rest = list(a[:nc]), list(a[nc:])
        dconsts = [rest.pop(0) if nz else Zero(t.update()) for nz, t in zip(nonzero, ctypes)]
        t, Y = rest
        y, dy = Y[:n], Y[n:]
        fs, dfs = jvp_eval(graph, [*consts, t, y], [*dconsts, Zero(ttype.update()), dy])
        return [snp.concatenate([f, snp.zeros_like(f) if is_zero(df) else df])
                for f, df in zip(fs, dfs)]

    types = list(ctypes) + [t for nz, t in zip(nonzero, ctypes) if nz] + \
        [ttype, TensorType((2 * n,), ytype.dtype)]
    g, consts, _ = trace_body(body, types, name=f"{graph.name}_jvp")
    assert not consts
    return g


def field_at(graph: Graph, consts, t, y):
    """The vector field at one `(t, y)`, emitted into the current trace (the
    sum of an IMEX field's parts)."""
    from ..graph._body import inline

    return summed(inline(graph, [*consts, t, y]))


def summed(parts: list):
    """The field from the values of its parts (one, or an IMEX field's two)."""
    first, *rest = parts
    for part in rest:
        first = first + part
    return first


@functools.lru_cache(maxsize=256)
def part_of(graph: Graph, i: int) -> Graph:
    """The body of the field's part `i` alone (`graph` itself for a field of
    one part; `-1`: the stiff part, whose Jacobian the Newton systems
    hold)."""
    from ..graph._body import permute
    from ..graph._passes import dce

    if len(graph.outputs) == 1:
        return graph
    return dce(permute(graph, outputs=[i % len(graph.outputs)]))


def _fields_at(graph: Graph, consts, ts, ys):
    """`f(ts[i], ys[i])` for every output time, stacked."""
    from .. import numpy as snp

    return snp.stack([field_at(graph, consts, ts[i], ys[i]) for i in range(ts.shape[0])])


def _augmented_pattern(params: dict, g: Graph):
    """The Newton matrices' pattern of a derived system `g` (the sensitivity
    or adjoint system) where the node's are sparse, else None."""
    if params.get("jac", "dense") != "sparse":
        return None
    from .._sparse_jacobian import newton_jacobian

    return newton_jacobian(part_of(g, -1), "sparse", identity=True)[1]


@odeint_p.def_jvp
def _odeint_jvp(primals, tangents, **params):
    from .. import numpy as snp

    *consts, y0, ts = primals
    *dconsts, dy0, dts = tangents
    graph = params["graph"]
    nonzero = tuple(not is_zero(t) for t in dconsts)
    if not any(nonzero) and is_zero(dy0) and is_zero(dts):
        outs = odeint_p.bind(*primals, **params)
        return outs, [Zero(type_of(o).update()) for o in outs]
    n = y0.shape[0]
    dy0 = snp.zeros_like(y0) if is_zero(dy0) else dy0
    if not is_zero(dts):
        dy0 = dy0 - field_at(graph, consts, ts[0], y0) * dts[0]
    aug = _sensitivity_body(graph, nonzero)
    extra = [t for t in dconsts if not is_zero(t)]
    p = _params(params, graph=aug, error_size=params.get("error_size") or n,
                pattern=_augmented_pattern(params, aug))
    ys_aug, *more = odeint_p.bind(*consts, *extra, snp.concatenate([y0, dy0]), ts, **p)
    # (the primal results come out of the node that computes the tangents:
    # marked so that a transposition of the tangent map takes them for
    # primal values, see `jvp_primal`)
    ys, dys = jvp_primal(ys_aug[:, :n]), ys_aug[:, n:]
    if not params.get("throw", True):
        dys = root_guard_p.bind(more[0], dys, of="odeint")  # no derivative of a failure
    if not is_zero(dts):
        dys = dys + _fields_at(graph, consts, ts, ys) * dts[:, None]
    # status, steps (and the grid and marks where recorded), the states
    rest, dense = (more[:4], more[4:]) if params.get("record", True) else (more, [])
    outs = [ys, *rest] + [jvp_primal(d[:, :n]) for d in dense]
    return outs, [dys] + [Zero(type_of(o).update()) for o in rest] + [d[:, n:] for d in dense]


# The tangent-map form of an `odeint` (the JVP's, on the state `[y, dy]`) is
# linear in the tangent operands only where the primal ones are fixed: it is
# transposed as its VJP where the tangents are zero, which is the discrete
# adjoint of the sensitivity system's steps (that of the primal part too,
# whose cotangents are dropped).
odeint_p.def_transpose(vjp_transpose(odeint_p))


# ---------------------------------------------------------------------------
# reverse mode


@functools.lru_cache(maxsize=None)
def _tableaus(solver: str):
    """`(c, As, b)` of the solver's Runge-Kutta method: one matrix `A` (lower
    triangular, its diagonal nonzero for implicit stages) per part of the
    field, the explicit one and then the implicit one for an IMEX method
    (whose parts share `c` and `b`)."""
    import diffrax

    if solver == "implicit_euler":
        return np.array([1.0]), (np.array([[1.0]]),), np.array([1.0])
    tab = getattr(diffrax, SOLVERS[solver][0]).tableau
    tabs = tab.tableaus if isinstance(tab, diffrax.MultiButcherTableau) else (tab,)
    s = len(tabs[0].b_sol)
    As = []
    for t in tabs:
        A = np.zeros((s, s))
        for i, row in enumerate(t.a_lower, start=1):
            A[i, :i] = row
        if t.a_diagonal is not None:
            A[np.diag_indices(s)] = t.a_diagonal
        As.append(A)
        assert np.array_equal(t.b_sol, tabs[0].b_sol) and np.array_equal(t.c, tabs[0].c)
    return np.concatenate([[tabs[0].c1], tabs[0].c]), tuple(As), np.asarray(tabs[0].b_sol)


def rk_step(graph: Graph, consts, solver: str, t, h, y, jac: str, rtol: float, atol: float,
            y_next=None):
    """One step of `solver`'s Runge-Kutta method from `(t, y)` with step `h`,
    in sciad ops: an implicit stage is an `optimize.root` node. An IMEX
    method's stages weigh the slopes of the field's parts by their own
    tableaus, and solve for the stiff part only. `y_next`, the step's
    result where known (a recorded state), starts each implicit stage's
    iterations from the cubic Hermite interpolant between `y` and it."""
    from .. import numpy as snp
    from .. import optimize, sparse
    from ..graph._body import inline
    from ._stop_gradient import stop_gradient

    c, As, b = _tableaus(solver)
    stiff = part_of(graph, -1)

    def stage(z, yi, hg, ti, w):
        return (z - yi - hg * field_at(stiff, consts, ti, z)) * w

    # each equation scaled by the step's state's magnitude (floored by
    # atol/rtol), as the step-size control measures errors
    w = stop_gradient(1.0 / (snp.abs(y) + max(atol / rtol, 1e-300)))
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
        if jac == "sparse" and gamma not in jac0:
            # one matrix, at the step's start, for all the stages' chord
            # iterations: the stages share its factorization (one per step,
            # not one per stage), and their derivatives' transposed solves
            # refine with it against the Jacobian at their roots
            ys = stop_gradient(y)
            jac0[gamma] = sparse.jacobian(stage)(ys, ys, h * gamma, t, w)
        if y_next is not None:  # the first Newton iterate: interpolated
            if not guesses:
                guesses.append(stop_gradient(field_at(graph, consts, t, y)))
                guesses.append(stop_gradient(field_at(graph, consts, t + h, y_next)))
            z0 = _hermite_at(float(c[i]), h, stop_gradient(y), stop_gradient(y_next), *guesses)
        else:  # the previous stage's stiff slope carried over (an explicit
            # Euler predictor for a first stage)
            k0 = ks[-1][-1] if ks else field_at(stiff, consts, t, y)
            z0 = yi + (h * gamma) * k0
        z = optimize.root(stage, z0, (yi, h * gamma, ti, w),
                          method="chord", jac=jac, tol=1e-12,
                          atol=max(STAGE_RTOL * rtol, STAGE_FLOOR_EPS * eps),
                          jac0=jac0.get(gamma), at_floor=True).x
        ks.append(inline(graph, [*consts, ti, z]))
    out = y
    for i, bi in enumerate(b):
        for k in ks[i] if bi != 0.0 else ():
            out = out + (h * float(bi)) * k
    return out


#: the memory the checkpointed reverse pass may fill with stored states
#: (its number of snapshots is chosen so, between sqrt(max_steps) and
#: max_steps: a small system stores every step and replays each once)
SNAPSHOT_BYTES = 64 * 2 ** 20


def snapshots_for(max_steps: int, n: int, itemsize: int) -> int:
    """The default snapshots of the replay's reverse pass: as many as
    `SNAPSHOT_BYTES` holds, at least about sqrt(max_steps)."""
    low = max(1, int(np.ceil(np.sqrt(max_steps))))
    return int(min(max_steps, max(low, SNAPSHOT_BYTES // max(n * itemsize, 1))))


def _replay(graph: Graph, solver: str, jac: str, max_steps: int, snapshots: int, grid, marks,
            rtol: float, atol: float):
    """`(*consts, y0) -> ys`: the steps the forward solve took, re-run on its
    grid: a scan over the output intervals, each a `while` loop of the steps
    from one output time to the next (whose reverse pass stores
    `snapshots` states)."""
    from .. import numpy as snp
    from ._schedules import Segments
    from ._scan import scan
    from ._while import while_loop

    def replay(*a):
        *consts, y0 = a

        def interval(y, x):
            lo, hi = x

            def step(s):
                k, y = s
                t = grid[k]
                return k + 1, rk_step(graph, consts, solver, t, grid[k + 1] - t, y, jac, rtol,
                                      atol)

            _, y = while_loop(lambda s: s[0] < hi, step, (lo, y), max_steps=max_steps,
                              checkpoints=Segments(snapshots))
            return y, y

        _, ys = scan(interval, y0, (marks[:-1], marks[1:]))
        return snp.concatenate([y0[None], ys])

    return replay


def _discrete_vjp(primals, outs, ct, params):
    """Cotangents of `(*consts, y0)`: the reverse pass of the replayed steps."""
    from ..graph._autodiff import vjp_eval
    from ..graph._body import trace_body

    *consts, y0, ts = primals
    _, _, _, grid, marks = outs[:5]
    t = type_of(y0)
    snapshots = params.get("checkpoints") or snapshots_for(params["max_steps"], t.size,
                                                           t.dtype.itemsize)
    replay = _replay(params["graph"], params["solver"], params.get("jac", "dense"),
                     params["max_steps"], snapshots, grid, marks, params["rtol"],
                     params["atol"])
    types = [type_of(c) for c in consts] + [type_of(y0)]
    g, closed, _ = trace_body(replay, types, name="replay")
    _, backward = vjp_eval(g, [*closed, *consts, y0])
    return backward([ct])[len(closed):]


@functools.lru_cache(maxsize=128)
def _step_graph(graph: Graph, solver: str, jac: str, rtol: float, atol: float) -> Graph:
    """`(*consts, t, h, y, y_next) -> (y after one step of `solver`,)`
    (`rk_step`; `y_next`, the recorded result, only starts the implicit
    stages' iterations)."""
    from ..graph._body import trace_body

    *ctypes, ttype, ytype = graph.in_types
    m = len(ctypes)

    def step(*a):
        return rk_step(graph, list(a[:m]), solver, a[m], a[m + 1], a[m + 2], jac, rtol, atol,
                       y_next=a[m + 3])

    g, closed, _ = trace_body(step, list(ctypes) + [ttype, ttype, ytype, ytype],
                              name="rk_step")
    assert not closed
    return g


def _stored_vjp(primals, outs, ct, params, ct_states=None):
    """Cotangents of `(*consts, y0)`: the discrete adjoint of the steps taken,
    linearised at the states the forward solve recorded at every step (its
    `states` output): the steps' reverse passes in a reverse scan over the
    output intervals, each a `while` loop down the interval's steps, adding
    `ct[i]` at output time `i`. Each step is re-run once, from its stored
    state, for its linearisation (an implicit stage's Newton solve).
    `ct_states`: cotangents of the states at every step, added as the pass
    reaches them."""
    from .. import numpy as snp
    from ..graph._autodiff import vjp_eval
    from ._scan import scan
    from ._while import while_loop

    *consts, y0, ts = primals
    _, _, _, grid, marks, states = outs
    step = _step_graph(params["graph"], params["solver"], params.get("jac", "dense"),
                       params["rtol"], params["atol"])
    n, dtype = y0.shape[0], type_of(y0).dtype
    ctypes = [type_of(c) for c in consts]
    wanted = _wanted(consts)

    def back(k, lam, acc):  # the reverse pass of step k
        if ct_states is not None:
            lam = lam + ct_states[k + 1]
        t = grid[k]
        _, pullback = vjp_eval(step, [*consts, t, grid[k + 1] - t, states[k], states[k + 1]])
        bars = pullback([lam])
        cb = _flat_cotangents(bars, ctypes, wanted, dtype)
        lam = snp.zeros((n,), dtype) if is_zero(bars[-2]) else bars[-2]
        return lam, (acc + snp.concatenate(cb)) if cb else acc

    def interval(carry, x):  # from output time i + 1 back to i, then ct[i]
        lam, acc = carry
        lo, hi, c = x

        def body(s):
            k, lam, acc = s
            lam, acc = back(k, lam, acc)
            return k - 1, lam, acc

        _, lam, acc = while_loop(lambda s: s[0] >= lo, body, (hi - 1, lam, acc),
                                 max_steps=params["max_steps"])
        return (lam + c, acc), None

    T = ts.shape[0]
    init = (ct[T - 1], snp.zeros((sum(t.size for t, w in zip(ctypes, wanted) if w),), dtype))
    (lam, acc), _ = scan(interval, init, (marks[:-1], marks[1:], ct[:-1]), reverse=True)
    if ct_states is not None:
        lam = lam + ct_states[0]
    return _unflatten_cotangents(acc, consts, wanted) + [lam]


def _wanted(consts) -> list:
    """Which consts the adjoints accumulate cotangents for: the traced real
    float ones (a differentiated argument is always traced: `sd.grad` lifts
    one given as a constant)."""
    return [needs_ct(c) and type_of(c).dtype.kind == "f" for c in consts]


def _flat_cotangents(bars, ctypes, wanted, dtype) -> list:
    """The `wanted` consts' cotangents among `bars`, each flat (zeros for a
    symbolic zero), in order: one step's share of the flat accumulator."""
    from .. import numpy as snp

    return [snp.zeros((t.size,), dtype) if is_zero(b) else snp.reshape(b, (-1,))
            for b, t, w in zip(bars, ctypes, wanted) if w]


def _unflatten_cotangents(acc, consts, wanted) -> list:
    """The consts' cotangents accumulated flat in `acc` (those `wanted`, in
    order; None for the others)."""
    from .. import numpy as snp

    bars, k = [], 0
    for c, w in zip(consts, wanted):
        if w:
            size = type_of(c).size
            bars.append(snp.reshape(acc[k:k + size], type_of(c).shape))
            k += size
        else:
            bars.append(None)
    return bars


def _hermite_at(s: float, h, y0, y1, f0, f1):
    """The cubic Hermite interpolant of `(y0, f0)` and `(y1, f1)` a step `h`
    apart, at the fraction `s` of the step."""
    s2, s3 = s * s, s * s * s
    return ((2 * s3 - 3 * s2 + 1) * y0 + (s3 - 2 * s2 + s) * h * f0
            + (3 * s2 - 2 * s3) * y1 + (s3 - s2) * h * f1)


def hermite(dense, grid, nsteps, graph: Graph, consts, t):
    """The forward solution at `t` from its states at the step times: the
    cubic Hermite interpolant on the step containing `t` (its slopes are the
    vector field at the step's ends)."""
    from .. import numpy as snp

    k = snp.clip(snp.searchsorted(grid, t, side="right") - 1, 0, nsteps - 1)
    t0, t1 = grid[k], grid[k + 1]
    y0, y1 = dense[k], dense[k + 1]
    h = t1 - t0
    f0, f1 = field_at(graph, consts, t0, y0), field_at(graph, consts, t1, y1)
    return _hermite_at((t - t0) / h, h, y0, y1, f0, f1)


def _continuous_vjp(primals, outs, ct, params, interpolated: bool):
    """Cotangents of `(*consts, y0)` by the continuous adjoint, `lambda' =
    -(df/dy)^T lambda` and `constsbar' = -(df/dconsts)^T lambda`, solved
    backwards in time by one `odeint` per output interval (a scan), with the
    jump `lambda += ct[i]` at each output time. The state on the way back is
    re-integrated backwards with the adjoint ("backsolve"), or interpolated
    from the forward solve's states at its steps ("interpolated")."""
    from .. import numpy as snp
    from ..graph._autodiff import vjp_eval
    from ..graph._body import trace_body
    from ._scan import scan

    *consts, y0, ts = primals
    ys, _, nsteps, grid, _, *dense = outs
    graph = params["graph"]
    n = y0.shape[0]
    wanted = _wanted(consts)
    ctypes = [type_of(c) for c in consts]
    sizes = [t.size for t, w in zip(ctypes, wanted) if w]
    dtype = type_of(y0).dtype
    extra = [dense[0], grid, nsteps] if interpolated else []
    m = len(ctypes)

    def body(*a):  # in reversed time s = -t: dS/ds = -dS/dt
        cs, rest = list(a[:m]), list(a[m:])
        s, S = rest[-2], rest[-1]
        t = -s
        if interpolated:
            y, lam = hermite(*rest[:3], graph, cs, t), S[:n]
        else:
            y, lam = S[:n], S[n:2 * n]
        fs, back = vjp_eval(graph, [*cs, t, y])  # (an IMEX field: its parts summed)
        f = summed(fs)
        bars = back([lam] * len(fs))
        cbars = _flat_cotangents(bars[:m], ctypes, wanted, dtype)
        ybar = bars[-1] if not is_zero(bars[-1]) else snp.zeros((n,), dtype)
        return snp.concatenate(([] if interpolated else [-f]) + [ybar, *cbars])

    lead = 0 if interpolated else n  # where lambda starts in the state
    total = lead + n + sum(sizes)
    g, closed, _ = trace_body(body, ctypes + [type_of(e) for e in extra] +
                              [TensorType((), dtype), TensorType((total,), dtype)],
                              name="adjoint")
    assert not closed
    # (an implicit solver's Newton matrices: sparse if the forward's are, the
    # pattern detected from the adjoint system's own graph: f's transposed)
    # (the forward's step settings: with constant steps, the same dt0; an
    # IMEX solver's summed field by the ESDIRK method of its order)
    p = _params(params, graph=g, error_size=None, pattern=_augmented_pattern(params, g),
                adjoint="backsolve", solver=IMEX.get(params["solver"], params["solver"]))
    T = ts.shape[0]
    S = snp.concatenate(([] if interpolated else [ys[T - 1]]) +
                        [ct[T - 1], snp.zeros((sum(sizes),), dtype)])

    def interval(S, x):  # from ts[i + 1] back to ts[i], then the jump of ct[i]
        lo, hi, c = x
        S = odeint_p.bind(*consts, *extra, S, snp.stack([-hi, -lo]), **p)[0][1]
        return snp.concatenate([S[:lead], S[lead:lead + n] + c, S[lead + n:]]), None

    S, _ = scan(interval, S, (ts[:-1], ts[1:], ct[:-1]), reverse=True)
    return _unflatten_cotangents(S[lead + n:], consts, wanted) + [S[lead:lead + n]]


@odeint_p.def_vjp
def _odeint_vjp(primals, outs, cts, **params):
    from .. import numpy as snp
    from ..graph import Tracer

    *consts, y0, ts = primals
    ct = cts[0]
    if not params.get("throw", True) and not is_zero(ct):
        ct = root_guard_p.bind(outs[1], ct, of="odeint")  # no derivative of a failure
    # (the states at every step get cotangents where a reverse pass that
    # read them is differentiated in reverse mode again)
    ct_states = cts[5] if len(cts) > 5 and not is_zero(cts[5]) else None
    if is_zero(ct) and ct_states is None:
        return [None] * len(primals)
    if is_zero(ct):
        ct = snp.zeros(type_of(outs[0]).shape, type_of(outs[0]).dtype)
    if not params.get("record", True):  # (a node `dce` spared the recording)
        params = {k: v for k, v in params.items() if k != "record"}
        outs = odeint_p.bind(*primals, **params)
    if isinstance(ts, Tracer):  # (held here, an outer derivative may move them)
        # the steps land on the output times (marks): those grid points move
        # with them, which the reverse pass's derivatives (second order in
        # the times) read; the steps between are held
        outs = [*outs[:3], outs[3].at[outs[4]].set(ts), *outs[4:]]
    graph = params["graph"]
    adjoint = params.get("adjoint", "checkpoint")
    if ct_states is not None and not (adjoint == "checkpoint" and len(outs) == 6):
        raise NotSupportedError(
            "reverse mode over the reverse mode of an ode.odeint node with "
            f"adjoint={adjoint!r}: its cotangent of the states at every step is not "
            "formed. Use forward over reverse (sd.hvp, sd.jvp of sd.grad), or "
            "adjoint='checkpoint'.", op="ode.odeint")
    if adjoint in ("backsolve", "interpolated"):
        bars = _continuous_vjp(primals, outs, ct, params, adjoint == "interpolated")
    elif len(outs) == 6:  # the states at every step: each step re-run once
        bars = _stored_vjp(primals, outs, ct, params, ct_states)
    else:
        bars = _discrete_vjp(primals, outs, ct, params)
    bars = [None if b is None or is_zero(b) else b for b in bars]
    if not needs_ct(ts):  # constant (or held) times: no cotangent to form
        return bars + [None]
    ybar0 = bars[-1]
    # the output times: y(t_i) moves with t_i at f(t_i, y_i); the initial
    # time moves the whole solution: dy/dt0 = -Phi f(t0, y0)
    F = _fields_at(graph, consts, ts, outs[0])
    tbar = snp.sum(F * ct, axis=1)
    if ybar0 is not None:
        tbar = tbar - snp.where(snp.arange(ts.shape[0]) == 0, snp.sum(F[0] * ybar0), 0.0)
    return bars + [tbar]


@odeint_p.def_dce
def _odeint_dce(node, used):
    # nothing reads the step grid, marks or states (no reverse pass): the
    # loop need not record its steps
    if not node.params.get("record", True) or any(used[3:]):
        return None
    return node.replace(outputs=node.outputs[:3], params={**node.params, "record": False})


@odeint_p.def_sparsity
def _odeint_sparsity(outs, *deps, **params):
    from ..graph._sparsity import dense_all

    return dense_all(outs, *deps)


def _install_batch_rule() -> None:
    # a batch of integrations is a `map` of one: `jax.vmap` of diffrax's
    # loop (every example steps until all are done)
    from ._map import map_rule

    odeint_p.def_batch(map_rule(odeint_p))


_install_batch_rule()


@odeint_p.def_cost
def _odeint_cost(node, body):
    # per step (their number is known only when it runs): one evaluation of
    # the vector field per stage, and for an implicit solver a Newton
    # iteration per implicit stage
    from ..graph._cost import Cost, _si

    p = node.params
    F = body(p["graph"])
    c, As, b = _tableaus(p["solver"])
    n = node.inputs[-2].type.size
    per = len(b) * (F.flops + 4.0 * n)
    if SOLVERS[p["solver"]][1]:
        per += float(np.count_nonzero(np.diag(As[-1]))) * (F.flops + 2.0 * n * n)
    return Cost(per, F.peak, f"per step ({_si(per)})")


# ---------------------------------------------------------------------------
# the guard of a terminal event: no event time where none was found


event_guard_p = Primitive("ode.event_guard", runtime_checks=True,
                          params={"direction": int})
#: `event_guard(found, span, t)`: `t` (an event's time), after checking
#: that the event function crossed zero (`found`, a bool) on the span
#: `(span[0], span[1]]` (`direction`: +1 upwards, -1 downwards, 0 either);
#: linear in `t` (its transpose is itself)


@event_guard_p.def_abstract_eval
def _event_guard_shape(found, span, t, *, direction):
    if not isinstance(found, TensorType) or found.dtype != np.bool_ \
            or not isinstance(span, TensorType) or span.shape[-1:] != (2,):
        raise DTypeError(f"needs a bool and a span of 2 times, got {found} and {span}.",
                         op="ode.event_guard")
    return t


def judge_event(site, *, found, span, direction):
    found = np.asarray(found).reshape(-1)  # (a batch: its first failing example)
    if found.all():
        return
    t0, t1 = np.asarray(span, np.float64).reshape(-1, 2)[
        int(np.argmin(found)) if np.ndim(span) > 1 else 0]
    way = {1: "upwards ", -1: "downwards ", 0: ""}[direction]
    site.fail(ConvergenceError,
              f"no event: the event function did not cross zero {way}on ({t0:.6g}, "
              f"{t1:.6g}] along the solution. Integrate over a longer span, or check the "
              f"event function's sign at the start and the `direction`.")


@event_guard_p.def_impl
def _event_guard_impl(found, span, t, *, direction, site=None):
    from ..graph import Site

    return tie(t, check(judge_event, site or Site("ode.event_guard"), when=~found.all(),
                        found=found, span=span, direction=direction))


@event_guard_p.def_jvp
def _event_guard_jvp(primals, tangents, **params):
    (found, span, t), (_, _, dt) = primals, tangents
    out = event_guard_p.bind(found, span, t, **params)
    return out, Zero(type_of(out).update()) if is_zero(dt) else \
        event_guard_p.bind(found, span, dt, **params)


@event_guard_p.def_transpose
def _event_guard_transpose(ct, found, span, t, **params):
    return None, None, event_guard_p.bind(found, span, ct, **params)


@event_guard_p.def_batch
def _event_guard_batch(args, dims, **params):
    from ..graph._batch import batch_size_of, batched_front

    size = batch_size_of(args, dims)
    found, span, t = (batched_front(a, d, size) for a, d in zip(args, dims))
    return event_guard_p.bind(found, span, t, **params), 0


@event_guard_p.def_sparsity
def _event_guard_sparsity(outs, found, span, t, **params):
    return t.matrix
