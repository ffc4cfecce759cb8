"""The reverse modes of an `ode.odeint` node: one record per adjoint
strategy (as diffrax's `AbstractAdjoint`s), registered by the name the
node's `adjoint` param holds (`ADJOINTS`). The node's VJP rule asks the
record: whether the node records its states at every step for it
(`records_states`), whether it forms the cotangent of those states (reverse
over reverse), and the cotangents themselves (`vjp`), each strategy with its
own loop.

- `Checkpoint` ("checkpoint", the default): the discrete adjoint of the
  steps taken. Where the states at every step fit `SNAPSHOT_BYTES`, the
  node records them and the reverse pass runs down the steps, re-running
  each once from its state for its linearisation (`stored_vjp`); otherwise
  the steps are replayed on the recorded grid and the reverse pass is that
  of the replay's loops, checkpointed (`discrete_vjp`). BDF records its
  states and steps always, and its reverse pass is its own
  (`_ode_bdf_adjoint.bdf_vjp`); Radau records its states always, and its
  reverse pass is one `ode.radau_adjoint` node
  (`_ode_radau_adjoint`: a loop down the steps with the forward's kept
  factorizations; its derivatives re-run the steps as `_ode_replay`'s
  `radau_step`).
- `Interpolated` ("interpolated") and `Backsolve` ("backsolve"): the
  continuous adjoint, solved backwards by `odeint` nodes against the forward
  solution interpolated from its recorded states, or integrated backwards
  with the adjoint (`continuous_vjp`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from .. import _ops as ops
from ..graph import TensorType, Zero, is_zero
from ..graph._autodiff import jvp_eval, needs_ct, type_of, vjp_eval
from ..graph._body import trace_body
from ..solvers.ode._ode_steppers import STEPPERS
from ..solvers._registry import family, register
from ._scan import scan
from ._ode_field import ADJOINT_BODY, augmented_pattern, derived_params, summed
from ._ode_interp import hermite
from ._ode_replay import ROWS, replay_steps, snapshots_for, step_graph
from ._while import bounded_while_loop


class Adjoint(ABC):
    """A reverse mode of `ode.odeint` (a strategy: its own loop for the
    cotangents), registered in `ADJOINTS` under `name`, the value of the
    node's `adjoint` param."""

    #: the `adjoint` param's value
    name: str = ""
    #: the continuous adjoint (any stepper), not a replay of a Runge-Kutta
    #: method's steps
    continuous: bool = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def records_states(self, checkpoints, max_steps: int, n: int, itemsize: int,
                       replayable: bool = True) -> bool:
        """Whether the node outputs its state at every step for this
        adjoint (`n`: the primal's size; a sensitivity system records as
        its primal does; `replayable`: the stepper's steps can be re-run
        from a state, `Stepper.replayable`)."""
        return False

    def forms_state_cotangents(self, outs) -> bool:
        """Whether `vjp` takes cotangents of the states at every step (a
        reverse pass that read them, differentiated in reverse mode again)
        for a node with outputs `outs` (an `OdeintOutputs`)."""
        return False

    @abstractmethod
    def vjp(self, primals, outs, ct, params: dict, ct_states=None) -> list:
        """The cotangents of `(*consts, y0)` (None where none is formed) from
        `ct`, the cotangent of `ys`; `outs`: the node's outputs (an
        `OdeintOutputs`); `ct_states`: the states' cotangents, or None."""


class Checkpoint(Adjoint):
    """The discrete adjoint of the steps taken, exact for the computed
    solution: each step re-run once from its recorded state where the states
    at every step fit `SNAPSHOT_BYTES` (and `checkpoints` is not set), else
    the steps replayed with `checkpoints` states stored per output interval
    (`snapshots_for` by default)."""

    name = "checkpoint"

    def records_states(self, checkpoints, max_steps, n, itemsize, replayable=True):
        if not replayable:  # (BDF, Radau: their own passes read them, but replay them
            return checkpoints is None  # where `checkpoints` is set)
        return checkpoints is None and snapshots_for(max_steps, n, itemsize) >= max_steps

    def forms_state_cotangents(self, outs):
        return outs.states is not None

    def vjp(self, primals, outs, ct, params, ct_states=None):
        if outs.states is not None and outs.history is not None:  # BDF: with its record
            from ._ode_bdf_adjoint import bdf_vjp
            return bdf_vjp(primals, outs, ct, params, ct_states)
        if outs.states is not None:  # the states at every step: each step re-run once
            if STEPPERS[params["solver"]].lowering == "radau":  # (its own pass: one node)
                from ._ode_radau_adjoint import radau_vjp
                return radau_vjp(primals, outs, ct, params, _wanted(primals[:-2], params),
                                 ct_states)
            return stored_vjp(primals, outs, ct, params, ct_states)
        return discrete_vjp(primals, outs, ct, params)


class Interpolated(Adjoint):
    """The continuous adjoint against the forward solution interpolated (cubic
    Hermite) from its states at every step, which the node records."""

    name = "interpolated"
    continuous = True

    def records_states(self, checkpoints, max_steps, n, itemsize, replayable=True):
        return True

    def vjp(self, primals, outs, ct, params, ct_states=None):
        return continuous_vjp(primals, outs, ct, params, interpolated=True)


class Backsolve(Adjoint):
    """The continuous adjoint with the state integrated backwards with it:
    memory of one state, but unstable where the backward integration is
    (stiff or dissipative problems)."""

    name = "backsolve"
    continuous = True

    def vjp(self, primals, outs, ct, params, ct_states=None):
        return continuous_vjp(primals, outs, ct, params, interpolated=False)


CHECKPOINT, BACKSOLVE, INTERPOLATED = Checkpoint(), Backsolve(), Interpolated()
#: every adjoint strategy, by the name the node's `adjoint` param holds: the
#: solver registry's "ode adjoint" family
ADJOINTS: dict[str, Adjoint] = family("ode adjoint")
for _adjoint in (CHECKPOINT, BACKSOLVE, INTERPOLATED):
    register(_adjoint, family="ode adjoint")


def discrete_vjp(primals, outs, ct, params):
    """Cotangents of `(*consts, y0)`: the reverse pass of the replayed steps."""
    *consts, y0, ts = primals
    grid, marks = outs.grid, outs.marks
    t = type_of(y0)
    # (BDF's carry: its differences, ROWS states)
    size = t.size * (ROWS if outs.history is not None else 1)
    snapshots = params.get("checkpoints") or snapshots_for(params["max_steps"], size,
                                                           t.dtype.itemsize)
    replay = replay_steps(params["body"], params["solver"], params.get("jac", "dense"),
                          params["max_steps"], snapshots, grid, marks, params["rtol"],
                          params["atol"], disk=params.get("disk"), mass=params.get("mass"),
                          mass_pattern=params.get("mass_pattern"), history=outs.history)
    types = [type_of(c) for c in consts] + [type_of(y0)]
    g, closed, _ = trace_body(replay, types, name="replay")
    _, backward = vjp_eval(g, [*closed, *consts, y0])
    return backward([ct])[len(closed):]


def stored_vjp(primals, outs, ct, params, ct_states=None, wanted=None):
    """Cotangents of `(*consts, y0)`: the discrete adjoint of the steps taken,
    linearised at the states the forward solve recorded at every step (its
    `states` output): the steps' reverse passes in a reverse scan over the
    output intervals, each a `while` loop down the interval's steps, adding
    `ct[i]` at output time `i`. Each step is re-run once, from its stored
    state, for its linearisation (an implicit stage's Newton solve).
    `ct_states`: cotangents of the states at every step, added as the pass
    reaches them. `wanted`: which consts get cotangents (`_wanted`'s by
    default)."""

    *consts, y0, ts = primals
    grid, marks, states = outs.grid, outs.marks, outs.states
    step = step_graph(params["body"], params["solver"], params.get("jac", "dense"),
                       params["rtol"], params["atol"], params.get("mass"),
                       params.get("mass_pattern"))
    n, dtype = y0.shape[0], type_of(y0).dtype
    ctypes = [type_of(c) for c in consts]
    wanted = _wanted(consts, params) if wanted is None else wanted

    def back(k, lam, acc):  # the reverse pass of step k
        if ct_states is not None:
            lam = lam + ct_states[k + 1]
        t = grid[k]
        _, pullback = vjp_eval(step, [*consts, t, grid[k + 1] - t, states[k], states[k + 1]])
        bars = pullback([lam])
        cb = _flat_cotangents(bars, ctypes, wanted, dtype)
        lam = ops.zeros((n,), dtype) if is_zero(bars[-2]) else bars[-2]
        return lam, (acc + ops.concatenate(cb)) if cb else acc

    T = ts.shape[0]
    lam, acc = down_the_steps(back, lambda lam, c: lam + c, ct[T - 1],
                              ops.zeros((sum(t.size for t, w in zip(ctypes, wanted) if w),),
                                        dtype), ct, marks, params["max_steps"])
    if ct_states is not None:
        lam = lam + ct_states[0]
    return _unflatten_cotangents(acc, consts, wanted) + [lam]


def down_the_steps(back, jump, lam, acc, ct, marks, max_steps: int):
    """A discrete adjoint's pass over the output intervals, from the last
    output time back to the first: `(lam, acc) = back(k, lam, acc)` for each
    step `k` of an interval, down its steps (a `while` loop), then `lam =
    jump(lam, ct[i])` at output time `i`. `lam` (the cotangent of the state
    at the last output time, its `ct` added) and `acc` (the consts'
    cotangents, flat) are the pass's carries; returns them at the first."""

    def interval(carry, x):  # from output time i + 1 back to i, then ct[i]
        lam, acc = carry
        lo, hi, c = x

        def body(s):
            k, lam, acc = s
            # (k >= lo here, but in a batch of reverse passes whose intervals
            # differ, the examples done run the step too, their results
            # dropped: they read a step of their own interval, not one
            # before it, whose data may not be a step's and fail its checks)
            lam, acc = back(ops.maximum(k, lo), lam, acc)
            return k - 1, lam, acc

        _, lam, acc = bounded_while_loop(lambda s: s[0] >= lo, body, (hi - 1, lam, acc),
                                         max_steps=max_steps)
        return (jump(lam, c), acc), None

    (lam, acc), _ = scan(interval, (lam, acc), (marks[:-1], marks[1:], ct[:-1]), reverse=True)
    return lam, acc


def up_the_steps(step, carry, state_of, outs, max_steps: int):
    """A discrete forward sensitivity's pass over the steps a node took
    (`outs`, an `OdeintOutputs` with `grid` and `marks`), from the first:
    `carry = step(k, carry)` for step `k`, from `grid[k]` to `grid[k + 1]`;
    `state_of(carry)`: the state's tangent. Returns the tangents of the
    states at every step (`(max_steps + 1, N)`, zeros past the last) and at
    the output times (`(len(ts), N)`). Two loops: the second keeps only the
    output times' (a scan over the output intervals, each a `while` loop
    down its steps, as `down_the_steps`), so its own reverse pass stores
    small carries, and the first, where nothing reads its result, is dead
    code. In a batch whose examples take different numbers of steps, those
    done run a step too (`while`'s batching), their results dropped: they
    re-run their own last step, not one past it (whose record is no step)."""
    marks, last = outs.marks, outs.steps - 1
    first = state_of(carry)

    def interval(c, x):  # from output time i to i + 1
        lo, hi = x

        def body(s):
            k, c = s
            return k + 1, step(ops.minimum(k, hi - 1), c)

        _, c = bounded_while_loop(lambda s: s[0] < hi, body, (lo, c), max_steps=max_steps)
        return c, state_of(c)

    _, at_outputs = scan(interval, carry, (marks[:-1], marks[1:]))

    def every(s):
        k, c, buf = s
        c = step(ops.minimum(k, last), c)
        return k + 1, c, buf.at[k + 1].set(state_of(c))

    buf = ops.zeros((max_steps + 1,) + tuple(type_of(first).shape), type_of(first).dtype)
    _, _, at_steps = bounded_while_loop(lambda s: s[0] <= last, every,
                                        (ops.zeros((), np.int32), carry, buf.at[0].set(first)),
                                        max_steps=max_steps)
    return at_steps, ops.concatenate([first[None], at_outputs])


def stored_jvp(primals, tangents, outs, params):
    """The tangents of the states at every step and at the output times (see
    `up_the_steps`) by the discrete forward sensitivity of the Runge-Kutta
    (or Radau) steps taken, linearised at the recorded states: the JVP of
    each step from its stored state, as `stored_vjp` pulls back through it;
    `tangents`: those of `(*consts, y0)` (`Zero`s where none)."""
    *consts, y0, ts = primals
    *dconsts, dy0 = tangents
    grid, states = outs.grid, outs.states
    step = step_graph(params["body"], params["solver"], params.get("jac", "dense"),
                      params["rtol"], params["atol"], params.get("mass"),
                      params.get("mass_pattern"))
    no_t, no_y = Zero(type_of(ts[0]).update()), Zero(type_of(y0).update())
    zeros = ops.zeros_like(y0)

    def one(k, dy):
        t = grid[k]
        _, (d,) = jvp_eval(step, [*consts, t, grid[k + 1] - t, states[k], states[k + 1]],
                           [*dconsts, no_t, no_t, dy, no_y])
        return zeros if is_zero(d) else d

    return up_the_steps(one, dy0, lambda d: d, outs, params["max_steps"])


def continuous_vjp(primals, outs, ct, params, interpolated: bool):
    """Cotangents of `(*consts, y0)` by the continuous adjoint, `lambda' =
    -(df/dy)^T lambda` and `constsbar' = -(df/dconsts)^T lambda`, solved
    backwards in time by one `odeint` per output interval (a scan), with the
    jump `lambda += ct[i]` at each output time. The state on the way back is
    re-integrated backwards with the adjoint ("backsolve"), or interpolated
    from the forward solve's states at its steps ("interpolated")."""
    from ._ode import OdeintOutputs, odeint_p  # (a cycle: this adjoint is odeint nodes)

    *consts, y0, ts = primals
    ys, nsteps, grid = outs.ys, outs.steps, outs.grid
    graph = params["body"]
    n = y0.shape[0]
    wanted = _wanted(consts, params)
    ctypes = [type_of(c) for c in consts]
    sizes = [t.size for t, w in zip(ctypes, wanted) if w]
    dtype = type_of(y0).dtype
    extra = [outs.states, grid, nsteps] if interpolated else []
    m = len(ctypes)

    # in reversed time s = end - t from each interval's end (near 0, where
    # floating-point times resolve the short steps a stiff adjoint starts
    # with, which t = 4e5 cannot): dS/ds = -dS/dt
    def body(*a):
        cs, rest = list(a[:m]), list(a[m:])
        end, s, S = rest[-3], rest[-2], rest[-1]
        t = end - s
        if interpolated:
            y, lam = hermite(*rest[:3], graph, cs, t), S[:n]
        else:
            y, lam = S[:n], S[n:2 * n]
        fs, back = vjp_eval(graph, [*cs, t, y])  # (an IMEX field: its parts summed)
        f = summed(fs)
        bars = back([lam] * len(fs))
        cbars = _flat_cotangents(bars[:m], ctypes, wanted, dtype)
        ybar = bars[-1] if not is_zero(bars[-1]) else ops.zeros((n,), dtype)
        return ops.concatenate(([] if interpolated else [-f]) + [ybar, *cbars])

    lead = 0 if interpolated else n  # where lambda starts in the state
    total = lead + n + sum(sizes)
    g, closed, _ = trace_body(body, ctypes + [type_of(e) for e in extra] +
                              [TensorType((), dtype)] * 2 + [TensorType((total,), dtype)],
                              name=ADJOINT_BODY)
    assert not closed
    # (an implicit solver's Newton matrices: sparse if the forward's are, the
    # pattern detected from the adjoint system's own graph: f's transposed)
    # (the forward's step settings: with constant steps, the same dt0; an
    # IMEX solver's summed field by the ESDIRK method of its order)
    p = derived_params(params, body=g, error_size=None, pattern=augmented_pattern(params, g),
                       adjoint=BACKSOLVE.name, count=None,
                       solver=STEPPERS[params["solver"]].summed or params["solver"])
    T = ts.shape[0]
    S = ops.concatenate(([] if interpolated else [ys[T - 1]]) +
                        [ct[T - 1], ops.zeros((sum(sizes),), dtype)])

    def interval(S, x):  # from ts[i + 1] back to ts[i], then the jump of ct[i]
        lo, hi, c = x
        span = ops.stack([ops.zeros_like(hi), hi - lo])
        S = OdeintOutputs.of(odeint_p.bind(*consts, *extra, hi, S, span, **p), p).ys[1]
        return ops.concatenate([S[:lead], S[lead:lead + n] + c, S[lead + n:]]), None

    S, _ = scan(interval, S, (ts[:-1], ts[1:], ct[:-1]), reverse=True)
    return _unflatten_cotangents(S[lead + n:], consts, wanted) + [S[lead:lead + n]]


def _wanted(consts, params: dict) -> list:
    """Which consts the adjoints accumulate cotangents for: the traced real
    float ones (a differentiated argument is always traced: `sd.grad` lifts
    one given as a constant), but the mass matrix (the node's `mass`
    operand), which has no derivative."""
    mass = params.get("mass")
    return [needs_ct(c) and type_of(c).dtype.kind == "f" and i != mass
            for i, c in enumerate(consts)]


def _flat_cotangents(bars, ctypes, wanted, dtype) -> list:
    """The `wanted` consts' cotangents among `bars`, each flat (zeros for a
    symbolic zero), in order: one step's share of the flat accumulator."""

    return [ops.zeros((t.size,), dtype) if is_zero(b) else ops.reshape(b, (-1,))
            for b, t, w in zip(bars, ctypes, wanted) if w]


def _unflatten_cotangents(acc, consts, wanted) -> list:
    """The consts' cotangents accumulated flat in `acc` (those `wanted`, in
    order; None for the others)."""

    bars, k = [], 0
    for c, w in zip(consts, wanted):
        if w:
            size = type_of(c).size
            bars.append(ops.reshape(acc[k:k + size], type_of(c).shape))
            k += size
        else:
            bars.append(None)
    return bars
