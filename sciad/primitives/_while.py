"""`while`: a loop whose step count is computed (JAX's `lax.while_loop`), as
one node holding its predicate and its body.

`while[cond_body, body, max_steps, checkpoints](*consts, *init)`
runs `carry = body(*consts, *carry)` while `cond_body(*consts, *carry)` (a
bool scalar) holds. Both bodies follow the closed-body convention
(`sciad.graph._body`): consts (the union of what either closes over), then
the carries.

- `max_steps` (optional) bounds the loop. A loop that reaches it with its
  predicate still true fails when the program runs (a `ConvergenceError`
  naming the node and the user's line), never a silently truncated state.
- JVP: a `while` of the body's JVP, the predicate reading only primals. A
  carry's tangent is symbolically zero only if it stays zero through the
  body (a fixed point, as for `scan`).
- VJP: only with `max_steps`. By default (`checkpoints=None` or
  `Segments(s)`) the forward pass counts its steps, and the backward pass is
  one `while_adjoint` node over the steps that ran: it re-runs them storing
  `s` evenly spaced carries (s about sqrt(max_steps)), then re-runs each
  segment once, keeping its carries for the backward parts. It stores at
  most `s + ceil(max_steps / s)` carries and its cost grows with the steps
  run, not with `max_steps`. Its JVP is a `while_adjoint` of the JVPs (so
  `sd.hvp` keeps the bound); its VJP stores every carry. With a `Binomial`
  or `EveryK` schedule the loop is instead the scan of `max_steps` steps
  `carry = cond(pred(carry), body, identity)(carry)`, and its backward pass
  that scan's checkpointed one (`scan_adjoint`), whose cost grows with
  `max_steps`. Without `max_steps` reverse mode is an error that says what
  to do instead.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _cache, _ops as ops
from ..errors import (ConvergenceError, DTypeError, InvalidOptionError, NotSupportedError,
                      ShapeError, plain)
from ..graph import Body, Graph, Param, Primitive, TensorType, Var, Zero
from ..graph import instantiate, is_differentiable, is_linear, is_zero, lower
from ..graph._autodiff import expansion_transpose, type_of, vjp_eval
from ..graph._cost import Cost, graph_cost, nbytes, steps_note
from ..graph._batch import batch_body, batch_size_of, carry_fixed_point, front_where
from ..graph._body import (as_body, dce_rule, hoist, hoist_rule, inline, layout, nonlinear_body,
                           trace_body)
from ..graph._serialize import register_v1_migration
from ..graph._sparsity import dense_all
from ..graph._trace import Tracer, is_value_leaf, trace_flat
from . import _disk
from ._checks import check, tie
from ._cond import _leaf_types, _sig, _union_inputs, cond, cond_p, cond_params
from ._loop_adjoint import (assemble_cts, check_storable, check_zero_starts, ct_inits, ct_plan,
                            grouped_jvp, loop_body_jvp, loop_linearity, split_grouped,
                            step_vjp_graph, storable_primal_carries, transposed_step,
                            with_unused_inputs)
from ._loop_sparsity import loop_sparsity
from ._map import map_rule
from ._scan import Checkpointed, checkpointed_bwd, scan
from ._schedules import (SCHEDULES, Binomial, MemoryBudget, Segments, as_schedule, disk_pays,
                         inner_needs, ram_recomputed)

_tree = jax.tree_util

while_p = Primitive("while", multiple_results=True, runtime_checks=True, params={
    "cond_body": Body, "body": Body,
    "max_steps": Param((int, None), default=None),
    "checkpoints": Param((*SCHEDULES, Segments, None), default=None),
    # (False: the bound holds by construction, no check of it in the program)
    "checked": Param(bool, default=True)})


def carried_body(graph: Graph, num_consts: int) -> Body:
    """A loop body `(*consts, *carry) -> ...` as a `Body` of `num_consts`
    consts, its other inputs carries."""
    return as_body(graph, num_consts, len(graph.inputs) - num_consts)


def loop_bodies(cond_body: Graph, body: Graph, num_consts: int) -> dict:
    """The body params of a `while` node with `num_consts` consts."""
    return dict(cond_body=carried_body(cond_body, num_consts),
                body=carried_body(body, num_consts))


@while_p.def_abstract_eval
def _while_shape(*in_types, cond_body, body, max_steps=None, checkpoints=None, checked=True):
    op = "while"
    for name, b in (("cond_body", cond_body), ("body", body)):
        if not isinstance(b, Body):
            raise ShapeError(f"`{name}` must be a Body, got {b!r}.", op=op)
        if tuple(b.in_types) != tuple(in_types):
            raise ShapeError(f"{name} {b.name!r} takes {_sig(b.in_types)}, got "
                             f"{_sig(in_types)}.", op=op)
    if cond_body.num_consts != body.num_consts:
        raise ShapeError(f"cond_body has {cond_body.num_consts} consts, the body "
                         f"{body.num_consts}.", op=op)
    num_consts = body.num_consts
    carry = tuple(in_types[num_consts:])
    if tuple(body.out_types) != carry:
        raise ShapeError(f"the body returns {_sig(body.out_types)}, the carry is "
                         f"{_sig(carry)}.", op=op)
    ct = cond_body.out_types
    if len(ct) != 1 or ct[0] != TensorType((), np.bool_):
        raise DTypeError(f"the predicate must return one bool scalar, got {_sig(ct)}.", op=op)
    if max_steps is not None and max_steps < 0:
        raise InvalidOptionError(f"`max_steps` must be >= 0, got {max_steps}.", op=op)
    return carry


def _judge_steps(site, *, max_steps, steps=0, running=True):
    if not running:
        return
    site.fail(ConvergenceError,
              f"the loop did not end within max_steps={max_steps}: its predicate still "
              f"held after {int(steps)} steps. Raise `max_steps`, or check that the "
              "predicate turns false.", iterations=int(steps))


@while_p.def_impl
def _while_impl(*args, cond_body, body, max_steps=None, checkpoints=None, site=None,
                checked=True):
    num_consts = body.num_consts
    held = site.held if site is not None else ()
    fc, fb = lower(cond_body, held), lower(body, held)
    consts, init = args[:num_consts], tuple(args[num_consts:])
    if max_steps is None:
        return tuple(jax.lax.while_loop(lambda c: fc(*consts, *c)[0],
                                        lambda c: tuple(fb(*consts, *c)), init))

    # the predicate of the current carry rides along, so that the loop's end
    # tells whether it stopped on the predicate or on the bound
    def step(s):
        i, _, c = s
        c = tuple(fb(*consts, *c))
        return i + 1, fc(*consts, *c)[0], c

    i, running, carry = jax.lax.while_loop(lambda s: s[1] & (s[0] < max_steps), step,
                                           (jnp.int64(0), fc(*consts, *init)[0], init))
    if not checked:
        return carry
    token = check(_judge_steps, site, when=running, max_steps=max_steps, steps=i,
                  running=running)
    return tie(carry, token)


@while_p.def_jvp
def _while_jvp(primals, tangents, *, cond_body, body, max_steps=None, checkpoints=None,
               checked=True):
    num_consts = body.num_consts
    nc, nk = num_consts, len(primals) - num_consts
    nz0 = [not is_zero(t) for t in tangents]
    jg, nz, _ = loop_body_jvp(body, nc, nk, nz0)
    tan = [instantiate(tangents[i]) for i in range(len(primals)) if nz[i]]
    n_dc = sum(nz[:nc])
    args = list(primals[:nc]) + tan[:n_dc] + list(primals[nc:]) + tan[n_dc:]
    cb = with_unused_inputs(cond_body, nc, [type_of(t) for t in tan[:n_dc]])
    cb = with_unused_inputs(cb, len(cb.inputs), [type_of(t) for t in tan[n_dc:]])
    res = while_p.bind(*args, **loop_bodies(cb, jg, nc + n_dc),
                       **_extra(max_steps, checkpoints, checked))
    carry, dcarry = list(res[:nk]), iter(res[nk:])
    touts = [next(dcarry) if nz[nc + i] else Zero(type_of(c).update())
             for i, c in enumerate(carry)]
    return tuple(carry), tuple(touts)


def _extra(max_steps, checkpoints, checked=True) -> dict:
    out = {}
    if max_steps is not None:
        out["max_steps"] = max_steps
    if checkpoints is not None:
        out["checkpoints"] = checkpoints
    if not checked:  # (a bound that holds by construction: see `bounded_while_loop`)
        out["checked"] = False
    return out


# (a carry the predicate reads stays, and with it what computes it)
while_p.def_dce(dce_rule("body", loop=True, readers=("cond_body",)))


@while_p.def_hoist
def _while_hoist(node):
    return hoist_rule(node, also=("cond_body",))


# -- reverse mode ---------------------------------------------------------------


def default_snapshots(max_steps: int) -> int:
    """The snapshots of a bounded loop's reverse mode when none are given:
    about log2(max_steps), a recomputation factor of a few."""
    return max(1, math.ceil(math.log2(max(max_steps, 2))))


def _bounded_step(cond_body: Graph, body: Graph, nc: int) -> Graph:
    """One step of the bounded form: `carry = cond(pred(carry), body,
    identity)(carry)`, a scan body `(*consts, *carry) -> (*carry)`."""
    ident_in = tuple(Var(v.type, v.hint) for v in body.inputs)
    identity = Graph(ident_in, (), ident_in[nc:], "identity")

    def step(*a):
        (p,) = inline(cond_body, a)
        return list(cond_p.bind(p, *a, **cond_params(body, identity)))

    g, consts, _ = trace_body(step, [v.type for v in body.inputs], name=f"{body.name}_bounded")
    assert not consts, "a bounded step closes over nothing"
    return g


def budget_schedule(budget: MemoryBudget, carry_bytes: int, max_steps: int, op: str,
                    inner: int = 0, step_flops: float = 0.0, only_segments: bool = False):
    """A bounded loop's schedule for `budget`: `Segments(s)` with the most
    snapshots whose `s + ceil(max_steps / s) + 1` carries fit (beside
    `inner` bytes, what a step's own reverse pass holds: `inner_needs`),
    where some do; else `Binomial` over `max_steps` steps with the carries
    that fit (fewer carries, more recomputation). With the budget's `disk`,
    where the segments' snapshots do not fit: `Segments(s, directory)`,
    its snapshots on disk, where the steps that spares take longer than the
    snapshots' trips to disk (`disk_pays`), or always with `only_segments`
    (a caller that has no other schedule: an ODE's replay)."""
    n = budget.carries(carry_bytes, op, inner=inner)
    N = max(max_steps, 1)

    def held(s):  # the snapshots, the longest segment's carries, the one worked on
        return s + -(-N // s) + 1

    # (held(s) is smallest near sqrt(N) and grows beyond it: the largest s
    # that fits, by bisection above sqrt(N))
    lo = max(1, math.isqrt(N))
    lo = min((lo, lo + 1), key=held)
    if held(lo) <= n:
        hi = N
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if held(mid) <= n:
                lo = mid
            else:
                hi = mid - 1
        return Segments(lo)
    ram = budget.schedule(carry_bytes, max_steps, op, inner=inner)
    if budget.disk is not None and n >= 4:
        # the snapshots on disk: a segment's carries, the one worked on and
        # two in flight (one written, one read ahead) in RAM
        disk = Segments(-(-N // (n - 3)), budget.disk)
        saved = ram_recomputed(ram, N) - 2 * N
        if only_segments or disk_pays(saved, disk.snapshots, carry_bytes, step_flops):
            return disk
    return ram


def default_segments(max_steps: int) -> int:
    """The snapshots of a bounded loop's default reverse mode (`Segments`):
    about sqrt(max_steps), which minimizes the stored carries."""
    return max(1, math.ceil(math.sqrt(max(max_steps, 1))))


def _counted(cond_body: Graph, body: Graph, nc: int):
    """The loop's predicate and body with a step counter (an int32 carry,
    last), so that reverse mode knows the steps the loop ran."""
    i32 = TensorType((), np.dtype(np.int32))
    types = [v.type for v in body.inputs] + [i32]

    def pred(*a):
        return inline(cond_body, a[:-1])

    def step(*a):
        return inline(body, a[:-1]) + [a[-1] + 1]

    c, cc, _ = trace_body(pred, types, name=cond_body.name)
    b, bc, _ = trace_body(step, types, name=body.name)
    assert not cc and not bc, "a counted loop closes over nothing"
    return c, b


@while_p.def_vjp_fwd
def _while_vjp_fwd(primals, *, cond_body, body, max_steps=None, checkpoints=None,
                   checked=True):
    num_consts = body.num_consts
    if max_steps is None:
        raise NotSupportedError(
            "reverse mode through a while loop needs a bound on its steps: pass "
            "`max_steps=N` (the gradient is then a checkpointed loop of N steps), use "
            "`sd.fori_loop` or `sd.scan` if the step count is known, or write the loop's "
            "result as the solution of an equation and differentiate that implicitly.",
            op="while")
    if checkpoints is not None and not isinstance(checkpoints, Segments):
        outs = while_p.bind(*primals, **loop_bodies(cond_body, body, num_consts),
                            **_extra(max_steps, checkpoints, checked))
        return tuple(outs), (primals, None)

    cb, bb = _counted(cond_body, body, num_consts)
    outs = while_p.bind(*primals, ops.zeros((), np.int32), **loop_bodies(cb, bb, num_consts),
                        **_extra(max_steps, checkpoints, checked))
    return tuple(outs[:-1]), (primals, outs[-1])


@while_p.def_vjp_bwd
def _while_vjp_bwd(res, cts, *, cond_body, body, max_steps=None, checkpoints=None,
                   checked=True):
    num_consts = body.num_consts

    primals, steps = res
    nc, nk = num_consts, len(primals) - num_consts
    if steps is None:
        step = _bounded_step(cond_body, body, nc)
        schedule = checkpoints or Binomial(default_snapshots(max_steps))
        return checkpointed_bwd(Checkpointed(primals), cts, step, nc, nk, max_steps,
                                 False, schedule)
    check_storable(body, nc, nk)
    ct_carry_idx, acc_idx, _, _ = ct_plan(body, nc, nk, primals, cts)
    v = step_vjp_graph(body, nc, nk, ct_carry_idx, acc_idx, [], [])
    ctc0, acc0 = ct_inits(primals, cts, ct_carry_idx, acc_idx)
    snapshots = checkpoints.snapshots if checkpoints else default_segments(max_steps)
    disk = checkpoints.directory if checkpoints else None
    out = while_adjoint_p.bind(steps, *primals, *ctc0, *acc0, body=carried_body(body, nc),
                               step=Body.of(v, nc, len(ctc0) + len(acc0)),
                               max_steps=max_steps, snapshots=snapshots,
                               **({"disk": disk} if disk else {}))
    return assemble_cts(primals, nc, nk, ct_carry_idx, acc_idx, [], out)


# -- while_adjoint: the reverse pass over the steps a loop ran --------------------


while_adjoint_p = Primitive("while_adjoint", multiple_results=True, params={
    "body": Body, "step": Body, "max_steps": int, "snapshots": int,
    "disk": Param((str, None), default=None)})
#: operands `(steps, *consts, *init, *ct_carry)` (`WhileAdjointOperands`):
#: `body` is the loop's step `(*consts, *carry) -> (*carry)`, run `steps`
#: times from `init`; `step` its backward part, a body `(*consts, *ct_carry,
#: *carry) -> (*ct_carry)` whose carries are the cotangents of the carries
#: and the accumulated cotangents of the consts (its layout counts them).
#: Outputs: the final `ct_carry` (the cotangents of `init`, the accumulated
#: ones of the consts), as a reverse loop of `step` over the `steps` carries
#: would give them. The
#: carries are recomputed on the `Segments(snapshots)` schedule: at most
#: `snapshots + ceil(max_steps / snapshots)` are stored at once; with `disk`
#: (a directory) the snapshots are written to a file there (`_disk`) and
#: only a segment's carries are held.


WhileAdjointOperands = layout(
    "WhileAdjointOperands", ("steps", "consts", "carry", "ct_carry"),
    """A `while_adjoint` node's operands: `[steps]` (one value), the loop's
    consts and initial carries, then the step's initial carries (the
    cotangents of the final carries, then the accumulators of the consts'
    cotangents), which the node's outputs are the final values of.""")


def _adjoint_split(args, body: Body) -> WhileAdjointOperands:
    return WhileAdjointOperands.split(args, 1, body.num_consts, body.num_carry)


@while_adjoint_p.def_abstract_eval
def _while_adjoint_shape(*in_types, body, step, max_steps, snapshots, disk=None):
    op = "while_adjoint"
    for name, g in (("body", body), ("step", step)):
        if not isinstance(g, Body):
            raise ShapeError(f"`{name}` must be a Body, got {g!r}.", op=op)
    (steps,), consts, carry, ctc = _adjoint_split(in_types, body)
    if steps != TensorType((), np.dtype(np.int32)):
        raise DTypeError(f"`steps` must be an int32 scalar, got {steps}.", op=op)
    if tuple(body.in_types) != tuple(consts) + tuple(carry) or \
            tuple(body.out_types) != tuple(carry):
        raise ShapeError("the body does not take and return the operands' carries.", op=op)
    if step.layout != (len(consts), len(ctc), len(carry)) or \
            tuple(step.in_types) != tuple(consts) + tuple(ctc) + tuple(carry) or \
            tuple(step.out_types) != tuple(ctc):
        raise ShapeError("the step graph does not match the operands.", op=op)
    if max_steps < 0 or snapshots < 1:
        raise InvalidOptionError(f"needs max_steps >= 0 and snapshots >= 1, got {max_steps} and "
                                 f"{snapshots}.", op=op)
    return tuple(ctc)


@while_adjoint_p.def_impl
def _while_adjoint_impl(*args, body, step, max_steps, snapshots, disk=None, site=None):
    (steps,), consts, init, ctc0 = _adjoint_split(args, body)
    held = site.held if site is not None else ()
    bare = site.bare if site is not None else None
    if disk is not None:
        number, held = _disk.held_store(disk, site)
    fb, fs = lower(body, held), lower(step, held)
    n = jnp.asarray(steps, jnp.int32)
    s = snapshots
    seglen = max(-(-max(max_steps, 1) // s), 1)  # the longest segment
    seg = jnp.maximum((n + s - 1) // s, 1)      # this run's segment length
    nseg = (n + seg - 1) // seg
    carry_types = [TensorType(jnp.shape(c), jnp.asarray(c).dtype) for c in init]

    def advance(c):
        return tuple(fb(*consts, *c))

    def store(buf, c, slot, when):
        return tuple(jax.lax.dynamic_update_index_in_dim(b, jnp.where(when, v, b[slot]), slot, 0)
                     for b, v in zip(buf, c))

    # the snapshots: the carry entering every seg-th step, up to the last
    # segment's start (the steps after it are run in phase 2); in cells, or
    # written to disk (folding the loop's bound into the write's condition:
    # under `vmap` the loop runs on for the examples that are done)
    last = jnp.maximum(nseg - 1, 0)
    if disk is None:
        def fwd(k, state):
            buf, c = state
            buf = store(buf, c, jnp.minimum(k // seg, s - 1), k % seg == 0)
            return buf, advance(c)

        buf0 = tuple(jnp.zeros((s,) + jnp.shape(c), jnp.asarray(c).dtype) for c in init)
        buf, c = jax.lax.fori_loop(0, last * seg, fwd, (buf0, tuple(init)))
        buf = store(buf, c, jnp.minimum(last, s - 1), nseg > 0)
        token = None
    else:
        def fwd(k, state):
            token, c = state
            due = (k % seg == 0) & (k < last * seg)  # (both: under `vmap` the cond is a select)
            token = jax.lax.cond(due, lambda t: _disk.write(number, k // seg, t, c, bare,
                                                            when=due), lambda t: t, token)
            return token, advance(c)

        token, c = jax.lax.fori_loop(0, last * seg, fwd, (jnp.zeros((), jnp.int32),
                                                          tuple(init)))
        token = _disk.write(number, last, token, c, bare, when=nseg > 0)
    sb0 = tuple(jnp.zeros((seglen,) + jnp.shape(c), jnp.asarray(c).dtype) for c in init)

    def segment(jj, state):  # the segments in reverse: recompute, then back
        ctc, token = state
        j = nseg - 1 - jj
        lo = j * seg
        hi = jnp.minimum(lo + seg, n)
        if token is None:
            start = tuple(b[j] for b in buf)
        else:  # (slot j, reading j - 1 ahead; -1 for an example whose loop is done)
            start, token = _disk.read(number, jnp.where(jj < nseg, j, -1),
                                      jnp.where(jj + 1 < nseg, j - 1, -1), token,
                                      carry_types, bare)

        def rec(k, st):
            sb, c = st
            return store(sb, c, k - lo, True), advance(c)

        # (the carries entering the segment's steps: its last step is not run)
        sb, c = jax.lax.fori_loop(lo, hi - 1, rec, (sb0, start))
        sb = store(sb, c, hi - 1 - lo, True)

        def back(kk, ctc):
            c = tuple(b[hi - 1 - kk - lo] for b in sb)
            return tuple(fs(*consts, *ctc, *c))

        return jax.lax.fori_loop(0, hi - lo, back, ctc), token

    ctc, token = jax.lax.fori_loop(0, nseg, segment, (tuple(ctc0), token))
    if token is not None:
        token = _disk.end(number, token)
        ctc = tie(ctc, token) if ctc else ctc
    return ctc


@while_adjoint_p.def_jvp
def _while_adjoint_jvp(primals, tangents, *, body, step, max_steps, snapshots, disk=None):
    num_consts = body.num_consts
    # the reverse pass is a fixed composition of forward and backward steps;
    # its JVP is the same composition of their JVPs, on the same schedule

    nc, nk, nct = num_consts, body.num_carry, step.num_carry
    sizes = (nc, nk, nct)
    rest = primals[1:]
    diff = [is_differentiable(type_of(p)) for p in rest]
    bj, _ = grouped_jvp(body, [is_differentiable(t) for t in body.in_types], (nc, nk), (nk,),
                        [is_differentiable(t) for t in body.out_types])
    sj, _ = grouped_jvp(step, [is_differentiable(t) for t in step.in_types],
                        (nc, nct, nk), (nct,),
                        [is_differentiable(t) for t in step.out_types])
    groups, lo = [], 0
    for size in sizes:
        groups.append(list(rest[lo:lo + size])
                      + [instantiate(tangents[1 + i]) for i in range(lo, lo + size) if diff[i]])
        lo += size
    g0, g1, g2 = groups
    out = while_adjoint_p.bind(primals[0], *g0, *g1, *g2, body=carried_body(bj, len(g0)),
                               step=Body.of(sj, len(g0), len(g2)),
                               max_steps=max_steps, snapshots=snapshots,
                               **({"disk": disk} if disk else {}))
    return split_grouped(out, step.out_types, (nct,))


def _adjoint_by_scans(*args, body, step, max_steps, snapshots, disk=None):
    """What a `while_adjoint` node computes, as two scans of `max_steps` steps
    that do nothing past `steps`: the forward one stacking every carry, then
    the reverse one of `step`."""
    (steps,), consts, init, ctc = _adjoint_split(args, body)

    def fwd(c, _):
        k, cs = c
        new = cond(k < steps, lambda cs: tuple(inline(body, list(consts) + list(cs))),
                   lambda cs: tuple(cs), tuple(cs))
        return (k + 1, new), tuple(cs)

    _, carries = scan(fwd, (ops.zeros((), np.int32), tuple(init)), length=max_steps)

    def bwd(state, x):
        k, cs = x
        new = cond(k < steps,
                   lambda st: tuple(inline(step, list(consts) + list(st) + list(cs))),
                   lambda st: tuple(st), tuple(state))
        return new, None

    out, _ = scan(bwd, tuple(ctc), (ops.arange(max_steps, dtype=np.int32), carries),
                  reverse=True)
    return list(out)


@while_adjoint_p.def_vjp
def _while_adjoint_vjp(primals, outs, cts, **params):
    # reverse over reverse: the VJP of the same computation with every carry
    # stored, as bounded scans (forward over reverse, `sd.hvp`, keeps the
    # checkpointing of the first reverse pass)

    g, _, _ = trace_flat(lambda *a: _adjoint_by_scans(*a, **params),
                         tuple(type_of(p) for p in primals), name="while_adjoint")
    _, backward = vjp_eval(g, list(primals))
    return tuple(backward(list(cts)))


@while_adjoint_p.def_sparsity
def _while_adjoint_sparsity(outs, *deps, **params):
    return dense_all(outs, *deps)


def _install_adjoint_batch_rule() -> None:
    # a batch of reverse passes: `jax.vmap` of the loops (each example runs
    # its own number of steps)

    while_adjoint_p.def_batch(map_rule(while_adjoint_p))


_install_adjoint_batch_rule()


# -- transposition: a `while` in a tangent map -------------------------------------
#
# The JVP of a while loop carries primals and tangents, and is linear in its
# tangent operands for the steps its primal predicate lets it run. Its
# transpose counts those steps with a loop of the primal part alone, then
# runs the transposed step (`transposed_step`) back over them: with
# `max_steps`, one `while_adjoint` node (the primal carries recomputed from
# about sqrt(max_steps) stored ones, as reverse mode does); without a
# bound, which no storage can be sized for, each step's primal carry is
# recomputed from the start (steps^2 / 2 primal steps, no stored carries).


@while_p.def_transpose
def _while_transpose(cts, *args, cond_body, body, max_steps=None, checkpoints=None,
                     checked=True):
    num_consts = body.num_consts

    nc, nk = num_consts, len(args) - num_consts
    linear = [is_linear(a) for a in args]
    lin, _ = loop_linearity(body, linear, nc, nk)
    check_zero_starts(args, linear, lin, nc, nk, "while")
    nl_k = [k for k in range(nk) if not lin[nc + k]]
    lk = [k for k in range(nk) if lin[nc + k]]
    lc = [i for i in range(nc) if lin[i]]
    fb, st = transposed_step(body, lin, [], nc, nk)
    pred = nonlinear_body(cond_body, lin, [0], name=cond_body.name)
    consts = [a for a, f in zip(args[:nc], lin[:nc]) if not f]
    init = [args[nc + k] for k in nl_k]
    ct0 = ([instantiate(cts[k]) for k in lk]
           + [instantiate(Zero(body.inputs[i].type.update())) for i in lc])
    m = len(consts)
    cb, bb = _counted(pred, fb, m)
    steps = while_p.bind(*consts, *init, ops.zeros((), np.int32), **loop_bodies(cb, bb, m),
                         **_extra(max_steps, None, checked))[-1]
    if max_steps is not None:
        storable_primal_carries(body, nl_k, nc, "while")
        snapshots = checkpoints.snapshots if isinstance(checkpoints, Segments) else \
            default_segments(max_steps)
        disk = checkpoints.directory if isinstance(checkpoints, Segments) else None
        out = while_adjoint_p.bind(steps, *consts, *init, *ct0, body=carried_body(fb, m),
                                   step=Body.of(st, m, len(lk) + len(lc)),
                                   max_steps=max_steps, snapshots=snapshots,
                                   **({"disk": disk} if disk else {}))
    else:
        out = _recomputing_transpose(fb, st, consts, init, ct0, steps)
    out = iter(out)
    in_cts: list = [None] * len(args)
    for k in lk:
        c = next(out)
        if is_linear(args[nc + k]):
            in_cts[nc + k] = c
    for i in lc:
        in_cts[i] = next(out)
    return tuple(in_cts)


@while_p.def_linearity
def _while_linearity(linear, *, cond_body, body, max_steps=None, checkpoints=None,
                     checked=True):
    num_consts = body.num_consts

    return loop_linearity(body, linear, num_consts, len(linear) - num_consts)[0][num_consts:]


def _recomputing_transpose(fb: Graph, st: Graph, consts, init, ct0, steps) -> list:
    """The transposed steps of an unbounded loop that ran `steps` steps, the
    last first, each primal carry recomputed from `init`."""
    nct = len(ct0)

    def back(s):
        k, ct = s[0] - 1, s[1]
        _, c = while_loop(lambda t: t[0] < k,
                          lambda t: (t[0] + 1, tuple(inline(fb, [*consts, *t[1]]))),
                          (np.int32(0), tuple(init)))
        return k, tuple(inline(st, [*consts, *ct, *c]))

    _, ct = while_loop(lambda s: s[0] > 0, back, (steps, tuple(ct0)))
    assert len(ct) == nct
    return list(ct)


# a `while_adjoint` in a tangent map (forward over reverse, `sd.hvp`) is
# transposed as the bounded scans it stands for, storing every carry (as
# its VJP does)
while_adjoint_p.def_transpose(expansion_transpose(while_adjoint_p, _adjoint_by_scans))


# -- batching (`sd.vmap`) ---------------------------------------------------------


@while_p.def_batch
def _while_batch(args, dims, *, cond_body, body, max_steps=None, checkpoints=None,
                 checked=True):
    num_consts = body.num_consts
    # The body is batched with its carries' flags at a fixed point. If the
    # predicate is then the same for every example, that is the loop. If it
    # differs (per-example stopping), every carry is batched, the loop runs
    # while any example's predicate holds, and a step leaves the examples
    # whose predicate is false as they are: each stops where it would alone.
    # `max_steps` bounds the steps of the longest-running example.
    nc, n = num_consts, len(args)
    size = batch_size_of(args, dims)
    flags = [d is not None for d in dims]
    gb, flags, _ = carry_fixed_point(lambda f, force: batch_body(body, f, size, force),
                                     flags, nc, n)
    gc, (pred_b,) = batch_body(cond_body, flags, size)
    if pred_b:
        flags = flags[:nc] + [True] * (n - nc)
        gc, gb = _per_example_loop(cond_body, body, flags, size, nc)
    outs = while_p.bind(*front_where(args, dims, flags, size), **loop_bodies(gc, gb, nc),
                        **_extra(max_steps, checkpoints, checked))
    return list(outs), [0 if f else None for f in flags[nc:]]


def _per_example_loop(cond_body: Graph, body: Graph, flags, size: int, nc: int):
    """The predicate and body of a batched loop whose examples stop at
    different steps: `any(pred)`, and a step that updates only the examples
    whose predicate holds."""

    gc, _ = batch_body(cond_body, flags, size)
    gb, _ = batch_body(body, flags, size, [True] * (len(flags) - nc))
    types = tuple(gb.in_types)

    def pred(*a):
        return [ops.any(inline(gc, a)[0])]

    def step(*a):
        (p,) = inline(gc, a)
        new = inline(gb, a)
        return [ops.where(ops.reshape(p, (size,) + (1,) * (len(type_of(c).shape) - 1)), v, c)
                for v, c in zip(new, a[nc:])]

    c, _, _ = trace_flat(pred, types, name=cond_body.name)
    b, _, _ = trace_flat(step, types, name=body.name)
    return c, b


# -- public function --------------------------------------------------------------


def while_loop(cond_fun: Callable, body_fun: Callable, init_val, max_steps: int | None = None,
               checkpoints=None):
    """`val = body_fun(val)` while `cond_fun(val)`: JAX's `lax.while_loop`, as
    one node of the graph.

    ```python
    def newton(s):
        x, k = s
        return x - (x * x - a) / (2 * x), k + 1
    x, k = sd.while_loop(lambda s: ~(abs(s[0] ** 2 - a) <= 1e-12), newton, (a, 0),
                         max_steps=50)
    ```

    (`~(err <= tol)`, not `err > tol`: a NaN iterate keeps the loop running
    to `max_steps`, which raises, instead of ending it as if it converged.)

    Forward mode (`sd.jvp`) works always. Reverse mode (`sd.grad`) needs
    `max_steps`: the backward pass runs over the steps the loop ran,
    re-running them from about sqrt(max_steps) stored carries (two-level
    checkpointing: at most about 2 sqrt(max_steps) carries are stored, and
    each step is recomputed at most twice). A loop whose result solves an equation is
    better differentiated implicitly than through its iterations.

    **Arguments:**

    - `cond_fun`: `val -> bool scalar`.
    - `body_fun`: `val -> val`, returning `init_val`'s structure, shapes and
        dtypes.
    - `init_val`: the initial value, a pytree of arrays.
    - `max_steps`: None, or an int bounding the steps. A loop still running
        after `max_steps` steps raises `sciad.errors.ConvergenceError` when
        the program runs.
    - `checkpoints`: reverse mode's schedule. By default
        `sd.Segments(s)` with s about sqrt(max_steps) (see above). An int or
        `sd.Binomial(s)` (at most `s` stored carries) or `sd.EveryK(k)`
        checkpoint the loop as a scan of `max_steps` steps that stop
        changing the carry once `cond_fun` turns false: fewer stored
        carries, but a cost that grows with `max_steps`, not the steps run.
        `sd.MemoryBudget(ram=...)`: `Segments` with the most snapshots that
        fit in `ram` bytes, or where none fit, the binomial schedule with
        the carries that do; with `disk=`, where the snapshots do not fit,
        `Segments` with its snapshots on disk. Needs `max_steps`.

    **Returns:**

    The final value.
    """
    return _while_loop(cond_fun, body_fun, init_val, max_steps, checkpoints)


def bounded_while_loop(cond_fun: Callable, body_fun: Callable, init_val, max_steps: int,
                       checkpoints=None):
    """`while_loop` for a loop whose steps cannot exceed `max_steps` by
    construction (sciad's passes over a solve's recorded steps): it stops
    there without a check of the bound in the program. (A check is a host
    call; in a loop's body it keeps XLA from compiling that loop as one
    function, `sciad.config.loops_policy`.)"""
    return _while_loop(cond_fun, body_fun, init_val, max_steps, checkpoints, checked=False)


def _while_loop(cond_fun, body_fun, init_val, max_steps, checkpoints, checked=True):
    op = "while_loop"
    for name, f in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(f):
            raise ShapeError(f"`{name}` must be a function, got {type(f).__name__}.", op=op)
    if max_steps is not None:
        if isinstance(max_steps, Tracer) or not isinstance(max_steps, (int, np.integer)) \
                or isinstance(max_steps, bool) or max_steps < 0:
            raise InvalidOptionError(f"`max_steps` must be None or a Python int >= 0, got "
                                     f"{plain(max_steps)}.", op=op)
        max_steps = int(max_steps)
    if not isinstance(checkpoints, Segments):
        checkpoints = as_schedule(checkpoints, op)
    if checkpoints is not None and max_steps is None:
        raise InvalidOptionError("`checkpoints` needs `max_steps` (reverse mode checkpoints a "
                                 "loop of max_steps steps).", op=op)

    leaves, tree = _tree.tree_flatten(init_val, is_leaf=is_value_leaf)
    types = _leaf_types(leaves, "a leaf of `init_val`")
    budget = checkpoints if isinstance(checkpoints, MemoryBudget) else None
    if max_steps is not None and not any(
            isinstance(t, TensorType) and (np.issubdtype(t.dtype, np.number)) for t in types):
        raise ShapeError("with `max_steps`, the loop's value needs a numeric array among its "
                         "leaves (the bound's check is tied to it).", op=op)

    def flat_body(*a):
        out = body_fun(_tree.tree_unflatten(tree, list(a)))
        out_leaves, t = _tree.tree_flatten(out, is_leaf=is_value_leaf)
        if t != tree:
            raise ShapeError(f"`body_fun` must return `init_val`'s structure {tree}, got "
                             f"{t}.", op=op)
        return list(out_leaves)

    def flat_cond(*a):
        out = cond_fun(_tree.tree_unflatten(tree, list(a)))
        t = type_of(out) if isinstance(out, Tracer) else None
        if not isinstance(t, TensorType) or t.shape != () or t.dtype != np.bool_:
            got = t.str_short() if t is not None else type(out).__name__
            raise DTypeError(f"`cond_fun` must return a traced bool scalar, got {got}"
                             + (" (a Python value: the predicate must depend on the "
                                "loop's value)" if t is None else "") + ".", op=op)
        return [out]

    def name(f, default):
        return getattr(f, "__name__", default).replace("<lambda>", "lambda")

    gb, cb_consts, _ = trace_body(flat_body, types, name=name(body_fun, "body"))
    for k, (t, o) in enumerate(zip(types, gb.out_types)):
        if t != o:
            raise ShapeError(f"leaf {k} of the loop's value enters `body_fun` as "
                             f"{t.str_short()} and leaves it as {o.str_short()}; it must "
                             "keep its shape and dtype (convert with `.astype`).", op=op)
    gc, cc_consts, _ = trace_body(flat_cond, types, name=name(cond_fun, "cond"))
    union, seen = [], set()
    for c in cc_consts + cb_consts:
        if id(c) not in seen:
            seen.add(id(c))
            union.append(c)
    gb, gc = _union_inputs(gb, cb_consts, union), _union_inputs(gc, cc_consts, union)
    nc = len(union)
    gb, consts = hoist(gb, nc, union)
    gc = with_unused_inputs(gc, nc, [type_of(c) for c in consts[nc:]])
    if budget is not None:  # (the body's own loops hold their share of it)
        checkpoints = budget_schedule(budget, sum(nbytes(t) for t in types), max_steps, op,
                                      inner=inner_needs(gb), step_flops=graph_cost(gb).flops)
    outs = while_p.bind(*consts, *leaves, **loop_bodies(gc, gb, len(consts)),
                        **_extra(max_steps, checkpoints, checked))
    return _tree.tree_unflatten(tree, list(outs))


# ---------------------------------------------------------------------------
# sparsity: followed step by step while the predicate's value is a constant
# (a loop counting its steps), else the union of the carries' patterns over
# the steps, to its fixed point (the loop may stop after any step),
# interpreted at most `max_steps` times; dense past `SPARSITY_STEPS`
# iterations without one (`loop_sparsity`). The predicate selects a step
# count, not values.


@while_p.def_sparsity
def _while_sparsity(outs, *deps, cond_body, body, max_steps=None, checkpoints=None,
                    checked=True):
    num_consts = body.num_consts

    res = loop_sparsity(body, deps[:num_consts], deps[num_consts:], [], max_steps,
                        exact=False, cond=cond_body)
    return dense_all(outs, *deps) if res is None else res[0]


# ---------------------------------------------------------------------------
# cost (`sd.cost`)


@while_p.def_cost
def _while_cost(node, body):
    p = node.params
    b, c = body(p["body"]), body(p["cond_body"])
    per = b.flops + c.flops
    n = p["max_steps"] if p.get("max_steps") is not None else None
    note = (f"at most {steps_note(n, per)}" if n is not None
            else f"{steps_note(None, per)}, trip count unknown")
    return Cost(per * (n if n is not None else 1), max(b.peak, c.peak), note)


@while_adjoint_p.def_cost
def _while_adjoint_cost(node, body):
    # at most: the snapshots' run to the last segment and each segment's
    # again (every step recomputed at most twice), a backward step per step
    p = node.params
    n, s = p["max_steps"], p["snapshots"]
    g = p["body"]
    fb, st = body(g), body(p["step"])
    carry = sum(nbytes(v.type) for v in g.inputs[g.num_consts:g.num_consts + g.num_carry])
    seglen = max(-(-max(n, 1) // s), 1)
    on_disk = p.get("disk") is not None
    cells = seglen + (3 if on_disk else s + 1)  # (on disk: one worked on, two in flight)
    disk = f", {s} carries ({_cache.si(s * carry)}) on disk" if on_disk else ""
    return Cost(2 * n * fb.flops + n * st.flops, cells * carry + max(fb.peak, st.peak),
                f"at most {n} steps, segments({s}): at most {2 * n} forward steps "
                f"recomputed{disk}")


# version-1 files: `num_consts` was a param of the node
def _while_v1(params: dict) -> dict:
    params = dict(params)
    nc = params.pop("num_consts")
    return {**params, **loop_bodies(params["cond_body"], params["body"], nc)}


def _while_adjoint_v1(params: dict) -> dict:
    # (and its step was a plain graph, its carries counted by `num_ct_carry`
    # and `num_acc`)
    params = dict(params)
    nc, nct = params.pop("num_consts"), params.pop("num_ct_carry") + params.pop("num_acc")
    return {**params, "body": carried_body(params["body"], nc),
            "step": as_body(params["step"], nc, nct)}


register_v1_migration("while", _while_v1)
register_v1_migration("while_adjoint", _while_adjoint_v1)
