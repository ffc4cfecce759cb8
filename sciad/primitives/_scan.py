"""Loops as nodes: `scan` (and `fori_loop`, built on it), with reverse mode
that stores each step's residuals or checkpoints carries on a binomial
(revolve) schedule.

`scan[body, length, reverse, checkpoints]` applies its body (a `Body`, which
counts its consts and carries) `length` times. Its operands follow the
closed-body convention (`sciad.graph._body`): `(*consts, *init, *xs)`, and
the body maps `(*consts,
*carry, *x)` (one slice of each `xs` operand) to `(*carry, *y)`. The node's
outputs are the final carry and the `y`s stacked along a new leading axis.

Rules, each a loop itself, so every order of differentiation is a loop:

- JVP: a scan over the body's JVP graph, with consts, carries and per-step
  inputs extended by their tangents. A carry's tangent is symbolically zero
  only if it stays zero through the body (a fixed point over the carries).
- VJP, `checkpoints=None`: the body is split by `vjp_graph` into what the
  forward pass computes and saves and what the backward pass does with it.
  The forward scan runs the former and stacks the saved values of each step
  (values that only read consts are hoisted out of the loop, and the saved
  consts and per-step inputs are not stacked again); the backward pass is a
  reverse scan over the latter, carrying the carries' cotangents and the sums
  of the consts' cotangents, its per-step outputs the cotangents of `xs`.
  Where a saved value cannot be stacked (a sparse matrix or a factorization
  computed in a step), each step's carry is stored and the backward step
  recomputes the body's forward part.
- VJP, `checkpoints=Binomial(s)` (or `EveryK(k)`): the forward scan stores
  only the carries the schedule stores first (`_stored_fwd`); the backward
  pass is one `scan_adjoint` node that re-runs the forward steps from at most
  `s` stored carries, on the binomial schedule of
  `checkpoint_schedules.MultistageCheckpointSchedule` (Griewank and Walther's
  revolve: the fewest recomputed steps for `s` snapshots). It is replayed as
  runs of plain loops (`_replay`): the steps whose backward parts come next
  are advanced keeping their residuals (in the place of their carries, where
  no larger), and their backward parts read them. Its JVP is a
  `scan_adjoint` on the two bodies' JVPs with the same schedule, so
  Hessian-vector products (forward over reverse) keep the memory bound.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _cache, _ops as ops
from ..errors import InvalidOptionError, ShapeError, plain
from ..graph import Graph, Literal, Param, Primitive, TensorType, Var, Zero
from ..graph import is_differentiable, is_linear, is_zero
from ..graph import instantiate, lower
from ..graph._autodiff import expansion_transpose, type_of, vjp_eval, vjp_graph, zeros
from ..graph._cost import Cost, graph_cost, loop_body_peak, nbytes, steps_note
from ..graph._batch import batch_body, batch_size_of, batched_front, carry_fixed_point, front_where
from ..graph._body import (Body, as_body, dce_rule, drop_inputs, hoist, hoist_nodes, hoist_rule,
                           inline, layout, live_inputs, permute, trace_body)
from ..graph._serialize import register_v1_migration
from ..graph._sparsity import Deps, dense_all, value_shape
from ..graph._trace import Tracer, _leaf_type, is_value_leaf, trace_flat
from ._checks import tie
from ._indexing import dynamic_update_slice_p
from . import _disk
from ._host_level import replay_in_host_memory
from ._schedules import (SCHEDULES, MemoryBudget, TwoLevel, advanced, as_schedule,
                         checkpoint_runs, inner_needs)
from ._loop_adjoint import (assemble_cts, body_wrt, check_storable, check_zero_starts, ct_inits,
                            ct_plan, grouped_jvp, loop_body_jvp, loop_linearity, split_grouped,
                            step_vjp_graph, storable_primal_carries, transposed_step,
                            with_unused_inputs)
from ._loop_sparsity import loop_sparsity
from ._replay import replay, split_step
from ._shape import reshape_p

_tree = jax.tree_util


# ---------------------------------------------------------------------------
# scan


scan_p = Primitive("scan", multiple_results=True, params={
    "body": Body, "length": int,
    "reverse": Param(bool, default=False),
    "checkpoints": Param((*SCHEDULES, None), default=None)})


ScanOutputs = layout(
    "ScanOutputs", ("carry", "ys"),
    """A scan's outputs (and its body's): the final carries, then the stacked
    per-step outputs. `split(outs, num_carry)`.""")


def _groups(seq, nc: int, nk: int):
    seq = list(seq)
    return seq[:nc], seq[nc:nc + nk], seq[nc + nk:]


def _stacked(t, length: int) -> TensorType:
    return TensorType((length,) + tuple(t.shape), t.dtype)


@scan_p.def_abstract_eval
def _scan_shape(*in_types, body, length, reverse=False, checkpoints=None):
    op = "scan"
    if not isinstance(body, Body):
        raise ShapeError(f"`body` must be a Body, got {body!r}.", op=op)
    num_consts, num_carry = body.num_consts, body.num_carry
    if length < 0 or num_consts < 0 or num_carry < 0:
        raise ShapeError(f"needs length, num_consts, num_carry >= 0, got {length}, "
                         f"{num_consts}, {num_carry}.", op=op)
    if len(in_types) != len(body.inputs) or num_consts + num_carry > len(in_types) \
            or num_carry > len(body.outputs):
        raise ShapeError(f"the body takes {len(body.inputs)} inputs and gives "
                         f"{len(body.outputs)} outputs; the node has {len(in_types)} "
                         f"operands, {num_consts} consts and {num_carry} carries.", op=op)
    consts, carry, xs = _groups(in_types, num_consts, num_carry)
    bconsts, bcarry, bxs = _groups(body.in_types, num_consts, num_carry)
    if tuple(consts) != tuple(bconsts):
        raise ShapeError("the consts do not match the body's inputs.", op=op)
    for k, (t, b, o) in enumerate(zip(carry, bcarry, body.out_types)):
        if not (t == b == o):
            raise ShapeError(f"carry {k} is {t.str_short()}; the body takes "
                             f"{b.str_short()} and returns {o.str_short()}.", op=op)
    for k, (t, b) in enumerate(zip(xs, bxs)):
        if not isinstance(t, TensorType) or t != _stacked(b, length):
            raise ShapeError(f"xs {k} must be {_stacked(b, length).str_short()} (length "
                             f"{length} of the body's {b.str_short()}), got "
                             f"{t.str_short()}.", op=op)
    ys = body.out_types[num_carry:]
    for t in ys:
        if not isinstance(t, TensorType):
            raise ShapeError(f"per-step outputs must be arrays, got {t.str_short()}.", op=op)
    return tuple(carry) + tuple(_stacked(t, length) for t in ys)


@scan_p.def_impl
def _scan_impl(*args, body, length, reverse=False, checkpoints=None, site=None):
    num_consts, num_carry = body.num_consts, body.num_carry
    f = lower(body, site.held if site is not None else ())
    consts, init, xs = _groups(args, num_consts, num_carry)

    def step(carry, x):
        outs = ScanOutputs.split(f(*consts, *carry, *x), num_carry)
        return tuple(outs.carry), tuple(jnp.asarray(y) for y in outs.ys)

    carry, ys = jax.lax.scan(step, tuple(init), tuple(xs), length=length, reverse=reverse)
    return (*carry, *ys)


def _params(body, nc, nk, length, reverse, checkpoints) -> dict:
    out = dict(body=as_body(body, nc, nk), length=length)
    if reverse:
        out["reverse"] = True
    if checkpoints is not None:
        out["checkpoints"] = checkpoints
    return out


def _interleave(primals, tangents, nz, lo, hi):
    return list(primals[lo:hi]) + [instantiate(tangents[i]) for i in range(lo, hi) if nz[i]]


@scan_p.def_jvp
def _scan_jvp(primals, tangents, *, body, length, reverse=False, checkpoints=None):
    nc, nk, n = body.num_consts, body.num_carry, len(primals)
    nz0 = [not is_zero(t) for t in tangents]
    jg, nz, out_nz = loop_body_jvp(body, nc, nk, nz0)
    args = (_interleave(primals, tangents, nz, 0, nc)
            + _interleave(primals, tangents, nz, nc, nc + nk)
            + _interleave(primals, tangents, nz, nc + nk, n))
    nc2 = nc + sum(nz[:nc])
    nk2 = nk + sum(nz[nc:nc + nk])
    res = list(scan_p.bind(*args, **_params(jg, nc2, nk2, length, reverse, checkpoints)))
    carry, dcarry = res[:nk], iter(res[nk:nk2])
    ys, dys = res[nk2:nk2 + len(body.outputs) - nk], iter(res[nk2 + len(body.outputs) - nk:])
    outs = carry + ys
    touts = []
    for i, o in enumerate(outs):
        it = dcarry if i < nk else dys
        touts.append(next(it) if out_nz[i] else Zero(type_of(o).update()))
    return tuple(outs), tuple(touts)


# -- dead outputs and carries ---------------------------------------------------


scan_p.def_dce(dce_rule("body", loop=True))


scan_p.def_hoist(hoist_rule)


@scan_p.def_vjp_fwd
def _scan_vjp_fwd(primals, *, body, length, reverse=False, checkpoints=None):
    params = _params(body, body.num_consts, body.num_carry, length, reverse, checkpoints)
    if checkpoints is None:
        wrt = body_wrt(body, body.num_consts, body.num_carry, primals)
        return _residual_fwd(vjp_graph(body, wrt), primals, params)
    return _stored_fwd(primals, params)


@scan_p.def_vjp_bwd
def _scan_vjp_bwd(res, cts, *, body, length, reverse=False, checkpoints=None):
    num_consts, num_carry = body.num_consts, body.num_carry
    if isinstance(res, Residuals):
        return _residual_bwd(res, cts, body, num_consts, num_carry, length, reverse)
    if isinstance(res, StoredCarries):
        return _carry_bwd(res, cts, body, num_consts, num_carry, length, reverse)
    return checkpointed_bwd(res, cts, body, num_consts, num_carry, length, reverse,
                             checkpoints)


# What the forward pass of reverse mode leaves for the backward pass, one
# layout per way of doing it (`def_vjp_fwd`'s residuals).


class Residuals(NamedTuple):
    """Each step's saved values (`checkpoints=None`): `stacked` the stacked
    ones, `where` where each saved value of the backward body comes from,
    `consts` the forward scan's consts (the hoisted values included) and
    `vjp` the body's split `VJPGraph`."""
    primals: tuple
    consts: list
    stacked: list
    where: list
    vjp: object


class StoredCarries(NamedTuple):
    """Each step's incoming carry, stacked (saved values that are not arrays
    cannot be stacked: the backward step recomputes them)."""
    primals: tuple
    carries: list


class Checkpointed(NamedTuple):
    """The operands of a checkpointed loop, and the cells the forward pass
    wrote (`_stored_fwd`; None if it wrote none)."""
    primals: tuple
    cells: tuple | None = None


def _residual_fwd(vg, primals, params):
    """The forward scan of reverse mode: the body's forward part (from
    `vjp_graph`), its values that only read consts hoisted out, stacking each
    step's saved values except consts and per-step inputs (the backward scan
    reads those from the operands). If a value to stack is not an array (a
    sparse matrix or a factorization computed in a step), each step's carry
    is stored instead and the backward step recomputes the forward part."""
    nout = len(params["body"].outputs)
    nc, nk = params["body"].num_consts, params["body"].num_carry
    consts, init, xs = _groups(primals, nc, nk)
    fwd, consts2 = hoist(vg.forward, nc, consts)
    nc2 = len(consts2)
    pos = {v: i for i, v in enumerate(fwd.inputs)}
    where, stack = [], []
    for a in fwd.outputs[nout:]:
        i = pos.get(a) if isinstance(a, Var) else None
        if isinstance(a, Literal):
            where.append(("lit", a))
        elif i is not None and i < nc2:
            where.append(("const", i))
        elif i is not None and i >= nc2 + nk:
            where.append(("x", i - nc2 - nk))
        else:
            if not isinstance(a.type, TensorType):
                return _carry_fallback(primals, params)
            where.append(("stack", len(stack)))
            stack.append(nout + len(where) - 1)
    fbody = permute(fwd, outputs=list(range(nout)) + stack)
    p = dict(params, body=as_body(fbody, nc2, nk))
    res = scan_p.bind(*consts2, *init, *xs, **p)
    outs, stacked = tuple(res[:nout]), list(res[nout:])
    return outs, Residuals(primals, consts2, stacked, where, vg)


def _stored_fwd(primals, params):
    """The forward scan of checkpointed reverse mode. Besides its outputs it
    writes the carries that the backward pass's first run starts from (the
    schedule's first stores, `Runs.forward`) into cells, an extra carry per
    carry: the backward pass then does not run the loop forward again."""
    body = params["body"]
    nc, nk = body.num_consts, body.num_carry
    if not all(isinstance(v.type, TensorType) for v in body.inputs[nc:nc + nk]) or \
            isinstance(params["checkpoints"], TwoLevel):
        # (the backward pass says why it cannot; a two-level one makes its own
        # forward sweep, writing to disk)
        outs = scan_p.bind(*primals, **params)
        return outs, Checkpointed(primals)
    runs = checkpoint_runs(params["checkpoints"], params["length"])
    consts, init, xs = _groups(primals, nc, nk)
    carry_types = [v.type for v in body.inputs[nc:nc + nk]]
    cells = [zeros(TensorType((runs.cells + 1,) + tuple(t.shape), t.dtype))
             for t in carry_types]
    zero = np.zeros((), np.int64)  # (indices are int64, as `x.at[i]` makes them)

    def step(*args):
        consts, carry = args[:nc], args[nc:nc + nk]
        buf, x, cell = args[nc + nk:nc + 2 * nk], args[nc + 2 * nk:-1], args[-1]
        outs = ScanOutputs.split(inline(body, list(consts) + list(carry) + list(x)), nk)
        buf = [dynamic_update_slice_p.bind(b, reshape_p.bind(c, shape=(1,) + tuple(t.shape)),
                                           cell, *[zero] * len(t.shape))
               for b, c, t in zip(buf, carry, carry_types)]
        return outs.carry + buf + outs.ys

    types = (list(body.in_types[:nc + nk]) + [type_of(b) for b in cells]
             + list(body.in_types[nc + nk:]) + [TensorType((), np.int64)])
    g, bconsts, _ = trace_body(step, types, name=f"{body.name}_stores")
    table = runs.forward[::-1] if params.get("reverse") else runs.forward
    res = scan_p.bind(*bconsts, *consts, *init, *cells, *xs, table.astype(np.int64),
                      **dict(params, body=as_body(g, len(bconsts) + nc, 2 * nk)))
    outs = tuple(res[:nk]) + tuple(res[2 * nk:])
    return outs, Checkpointed(primals, tuple(res[nk:2 * nk]))


def _carry_fallback(primals, params):
    outs, carries = _carry_fwd(primals, params)
    return outs, StoredCarries(primals, carries)


def _residual_bwd(res, cts, body, nc, nk, length, reverse):
    primals, consts2, stacked, where, vg = res
    xs = primals[nc + nk:]
    nc2 = len(consts2)
    diff_in = [i for i, v in enumerate(body.inputs) if is_differentiable(v.type)]
    diff_out = [i for i, a in enumerate(body.outputs) if is_differentiable(a.type)]
    ct_carry_idx, acc_idx, cty_idx, x_idx = ct_plan(body, nc, nk, primals, cts)
    wrt = body_wrt(body, nc, nk, primals)  # (as `vg` was made for)
    ct_carry0, acc0 = ct_inits(primals, cts, ct_carry_idx, acc_idx)
    n_ctc, n_acc = len(ct_carry_idx), len(acc_idx)
    nx, nst = len(xs), len(stacked)
    types = ([type_of(c) for c in consts2] + [type_of(c) for c in ct_carry0]
             + [type_of(a) for a in acc0]
             + [TensorType(type_of(s).shape[1:], type_of(s).dtype) for s in stacked]
             + [TensorType(type_of(x).shape[1:], type_of(x).dtype) for x in xs]
             + [TensorType(type_of(cts[i]).shape[1:], type_of(cts[i]).dtype)
                for i in cty_idx])

    def step(*args):
        c2 = args[:nc2]
        ctc = args[nc2:nc2 + n_ctc]
        acc = args[nc2 + n_ctc:nc2 + n_ctc + n_acc]
        k = nc2 + n_ctc + n_acc
        st, xsl, cty = args[k:k + nst], args[k + nst:k + nst + nx], args[k + nst + nx:]
        saved = []
        for kind, i in where:
            saved.append(i.value if kind == "lit" else c2[i] if kind == "const"
                         else xsl[i] if kind == "x" else st[i])
        out_ct = {i: c for i, c in zip(ct_carry_idx, ctc)}
        out_ct.update(zip(cty_idx, cty))
        ct_in = [out_ct[i] if i in out_ct else instantiate(Zero(body.outputs[i].type.update()))
                 for i in diff_out]
        in_cts = dict(zip([i for i in diff_in if wrt[i]],
                          inline(vg.backward, saved + ct_in)))
        new_ctc = [in_cts[nc + i] for i in ct_carry_idx]
        new_acc = [a + in_cts[i] for a, i in zip(acc, acc_idx)]
        return new_ctc + new_acc + [in_cts[i] for i in x_idx]

    g, bconsts, _ = trace_body(step, types, name=f"{body.name}_bwd")
    args = list(bconsts) + list(consts2) + ct_carry0 + acc0 + stacked + list(xs) + [
        cts[i] for i in cty_idx]
    out = scan_p.bind(*args, **_params(g, len(bconsts) + nc2, n_ctc + n_acc, length,
                                       not reverse, None))
    return assemble_cts(primals, nc, nk, ct_carry_idx, acc_idx, x_idx, out)


def _carry_fwd(primals, params):
    """The forward scan with each step's incoming carry stacked as well."""
    body = params["body"]
    nc, nk = body.num_consts, body.num_carry
    nout = len(body.outputs)
    check_storable(body, nc, nk)
    g = body.replace(outputs=body.outputs + body.inputs[nc:nc + nk])
    res = scan_p.bind(*primals, **dict(params, body=g))
    return tuple(res[:nout]), list(res[nout:])


def _carry_bwd(res, cts, body, nc, nk, length, reverse):
    primals, carries = res
    consts, init, xs = _groups(primals, nc, nk)
    ct_carry_idx, acc_idx, cty_idx, x_idx = ct_plan(body, nc, nk, primals, cts)
    v = step_vjp_graph(body, nc, nk, ct_carry_idx, acc_idx, cty_idx, x_idx)
    ctc0, acc0 = ct_inits(primals, cts, ct_carry_idx, acc_idx)
    out = scan_p.bind(*consts, *ctc0, *acc0, *carries, *xs, *[cts[i] for i in cty_idx],
                      **_params(v, nc, len(ctc0) + len(acc0), length, not reverse, None))
    return assemble_cts(primals, nc, nk, ct_carry_idx, acc_idx, x_idx, out)


def checkpointed_bwd(res, cts, body, nc, nk, length, reverse, checkpoints):
    primals = res.primals
    consts, init, xs = _groups(primals, nc, nk)
    check_storable(body, nc, nk)
    ct_carry_idx, acc_idx, cty_idx, x_idx = ct_plan(body, nc, nk, primals, cts)
    v = step_vjp_graph(body, nc, nk, ct_carry_idx, acc_idx, cty_idx, x_idx)
    ctc0, acc0 = ct_inits(primals, cts, ct_carry_idx, acc_idx)
    cells = list(res.cells) if res.cells is not None else []
    out = scan_adjoint_p.bind(
        *consts, *init, *xs, *ctc0, *acc0, *[cts[i] for i in cty_idx], *cells,
        body=as_body(live_inputs(body, [True] * nk + [False] * (len(body.outputs) - nk))[0],
                     nc, nk),
        step=Body.of(v, nc, len(ctc0) + len(acc0)), length=length,
        **({"reverse": True} if reverse else {}),
        schedule=checkpoints, **({"stored": True} if cells else {}))
    return assemble_cts(primals, nc, nk, ct_carry_idx, acc_idx, x_idx, out)


# ---------------------------------------------------------------------------
# scan_adjoint: the backward pass of a checkpointed scan


scan_adjoint_p = Primitive("scan_adjoint", multiple_results=True, params={
    "body": Body, "step": Body, "length": int,
    "reverse": Param(bool, default=False), "schedule": SCHEDULES,
    "stored": Param(bool, default=False)})
#: operands `(*consts, *init, *xs, *ct_carry, *ct_ys)` (`ScanAdjointOperands`),
#: and with `stored` the cells the forward pass wrote (`_stored_fwd`), one
#: per carry; `body` is the forward step `(*consts, *carry, *x) -> (*carry,
#: *y)` and `step` its backward part, a body `(*consts, *ct_carry, *carry, *x,
#: *ct_y) -> (*ct_carry, *ct_x)` whose carries `ct_carry` are the cotangents
#: of the carries and the accumulated cotangents of the consts (its layout
#: counts them). Outputs (`ScanAdjointOutputs`): the final `ct_carry` and
#: the stacked `ct_x`s, as a reverse scan of `step` over
#: the carries of `body` would give them; the carries are recomputed from
#: the ones `schedule` stores (`_replay`). The stored cells are the carries
#: at steps of that loop, so they spare the recomputation but change nothing:
#: the rules treat them as constants (no tangent, no cotangent), each node
#: derived from this one recomputing them, and they must hold what
#: `_stored_fwd` writes.


def _unstored(args, params: dict):
    """A `scan_adjoint`'s operands and params without its stored cells (the
    node computes the same without them)."""
    if not params.get("stored"):
        return list(args), params
    nk = params["body"].num_carry
    return list(args[:len(args) - nk]), {k: v for k, v in params.items() if k != "stored"}


ScanAdjointOperands = layout(
    "ScanAdjointOperands", ("consts", "carry", "xs", "ct_carry", "ct_ys"),
    """A `scan_adjoint` node's operands (stored cells apart): the forward
    scan's consts, initial carries and stacked per-step inputs, then the
    step's initial carries (the cotangents of the final carries, then the
    accumulators of the consts' cotangents) and the stacked cotangents of
    the per-step outputs. `split(ops, nc, nk, nx, step.num_carry)`.""")

ScanAdjointOutputs = layout(
    "ScanAdjointOutputs", ("ct_carry", "ct_xs"),
    """A `scan_adjoint` node's outputs (and its step's): the step's final
    carries (the cotangents of the initial carries, the accumulated ones of
    the consts), then the stacked cotangents of the per-step inputs.
    `split(outs, step.num_carry)`.""")


@scan_adjoint_p.def_abstract_eval
def _scan_adjoint_shape(*in_types, body, step, length, reverse=False,
                        schedule, stored=False, site=None):
    op = "scan_adjoint"
    for name, g in (("body", body), ("step", step)):
        if not isinstance(g, Body):
            raise ShapeError(f"`{name}` must be a Body, got {g!r}.", op=op)
    num_consts, num_carry = body.num_consts, body.num_carry
    nx = len(body.inputs) - num_consts - num_carry
    if step.num_consts != num_consts:
        raise ShapeError(f"the step has {step.num_consts} consts, the body {num_consts}.", op=op)
    if stored:
        if not isinstance(schedule, SCHEDULES):
            raise ShapeError(f"`schedule` must be one of {[c.__name__ for c in SCHEDULES]}, "
                             f"got {schedule!r}.", op=op)
        n = checkpoint_runs(schedule, length).cells + 1
        in_types, cells = in_types[:len(in_types) - num_carry], in_types[-num_carry:]
        carry = in_types[num_consts:num_consts + num_carry]
        for k, (c, t) in enumerate(zip(cells, carry)):
            want = TensorType((n,) + tuple(t.shape), t.dtype)
            if c != want:
                raise ShapeError(f"stored cells {k} must be {want.str_short()}, got "
                                 f"{c.str_short()}.", op=op)
    consts, carry, xs, ctc, cty = ScanAdjointOperands.split(in_types, num_consts, num_carry, nx,
                                                            step.num_carry)
    _scan_shape(*consts, *carry, *xs, body=body, length=length)
    if not isinstance(schedule, SCHEDULES):
        raise InvalidOptionError(f"`schedule` must be one of "
                                 f"{[c.__name__ for c in SCHEDULES]}, got {schedule!r}.", op=op)
    want = (list(consts) + list(ctc) + list(carry)
            + [TensorType(t.shape[1:], t.dtype) for t in xs]
            + [TensorType(t.shape[1:], t.dtype) for t in cty])
    if tuple(want) != step.in_types:
        raise ShapeError("the step graph's inputs do not match the operands.", op=op)
    souts = ScanAdjointOutputs.split(step.out_types, step.num_carry)
    if souts.ct_carry != list(ctc):
        raise ShapeError("the step graph's carries do not match the operands.", op=op)
    return tuple(ctc) + tuple(_stacked(t, length) for t in souts.ct_xs)


@scan_adjoint_p.def_impl
def _scan_adjoint_impl(*args, body, step, length, reverse=False,
                       schedule, stored=False, site=None):
    num_consts, num_carry = body.num_consts, body.num_carry
    # The schedule's actions compiled into runs of advances and backward
    # steps, the backward steps reading kept residuals (`_replay`).
    nc, nk, nacc = num_consts, num_carry, step.num_carry
    nx = len(body.inputs) - nc - nk
    cells = args[len(args) - nk:] if stored else None
    args = args[:len(args) - nk] if stored else args
    consts, init, xs, ctc0, cty = ScanAdjointOperands.split(args, nc, nk, nx, nacc)
    x_types = ScanAdjointOutputs.split(step.out_types, nacc).ct_xs
    ct_xs = tuple(jnp.zeros((length,) + t.shape, t.dtype) for t in x_types)
    if length == 0:
        return (*ctc0, *ct_xs)
    split = split_step(step, nc, nk, nx, nacc)
    held = site.held if site is not None else ()
    two_level = isinstance(schedule, TwoLevel)
    on_disk = two_level and not schedule.host
    if on_disk:
        number, held = _disk.held_store(schedule.directory, site)
    fb, fr, fs = lower(body, held), lower(split.residuals, held), lower(split.backward, held)
    once = lower(split.once, held)(*consts) if split.once is not None else ()

    def at(arrs, k):
        return [jax.lax.dynamic_index_in_dim(x, k, keepdims=False) for x in arrs]

    def advance(k, carry):
        return tuple(fb(*consts, *carry, *at(xs, k))[:nk])

    def residuals(k, carry):
        return tuple(fr(*consts, *carry, *at(xs, k)))

    def backward(k, res, acc):
        x = at(xs, k)
        saved = [res[j] if kind == "res" else consts[j] if kind == "const" else
                 x[j] if kind == "x" else once[j] for kind, j in split.where]
        out = ScanAdjointOutputs.split(fs(*saved, *acc, *at(cty, k)), nacc)
        return (tuple(out.ct_carry),
                tuple(jnp.asarray(v, t.dtype) for v, t in zip(out.ct_xs, x_types)))

    carry_types = body.in_types[nc:nc + nk]
    index = (lambda t: length - 1 - t) if reverse else (lambda t: t)

    def backward_of(runs, index, start, acc, ct_xs, stored=None):
        return replay(runs, index, advance, residuals, backward, tuple(start), carry_types,
                      split.residuals.out_types, tuple(acc), ct_xs, stored=stored)

    if not two_level:
        acc, ct_xs = backward_of(checkpoint_runs(schedule, length), index, init, ctc0, ct_xs,
                                 stored=cells)
        return (*acc, *ct_xs)
    if not on_disk:
        acc, ct_xs = replay_in_host_memory(schedule, length, index, advance, backward_of, init,
                                           ctc0, ct_xs)
        return (*acc, *ct_xs)
    acc, ct_xs, token = _disk.replay_on_disk(
        schedule, length, index, advance, backward_of, init, number, carry_types, ctc0, ct_xs,
        site.bare if site is not None else None)
    if acc:  # (the store is closed when the results are)
        acc = tie(tuple(acc), token)
    elif ct_xs:
        ct_xs = tie(tuple(ct_xs), token)
    return (*acc, *ct_xs)


@scan_adjoint_p.def_jvp
def _scan_adjoint_jvp(primals, tangents, *, body, step, length,
                      reverse=False, schedule, stored=False):
    num_consts, num_carry = body.num_consts, body.num_carry
    # The backward pass is a fixed composition of forward steps and backward
    # steps; its JVP is the same composition of their JVPs: the same schedule
    # on the JVP of `body` (carries with their tangents) and of `step`, every
    # differentiable value with its tangent. (Stored cells are left out: the
    # JVP node recomputes them with their tangents.)
    if stored:
        n = len(primals) - num_carry
        primals, tangents = primals[:n], tangents[:n]
    nc, nk, nct = num_consts, num_carry, step.num_carry
    nx = len(body.inputs) - nc - nk
    sizes = (nc, nk, nx, nct, len(primals) - nc - nk - nx - nct)
    diff = [is_differentiable(type_of(p)) for p in primals]
    bnz = [is_differentiable(t) for t in body.in_types]
    bforce = [is_differentiable(t) for t in body.out_types]
    bj, _ = grouped_jvp(body, bnz, (nc, nk, nx), (nk, len(body.outputs) - nk), bforce)
    snz = [is_differentiable(t) for t in step.in_types]
    sforce = [is_differentiable(t) for t in step.out_types]
    nctx = len(step.outputs) - nct
    sj, _ = grouped_jvp(step, snz, (nc, nct, nk, nx, sizes[4]), (nct, nctx), sforce)
    groups, lo = [], 0
    for size in sizes:
        groups.append(list(primals[lo:lo + size])
                      + [instantiate(tangents[i]) for i in range(lo, lo + size) if diff[i]])
        lo += size
    out = scan_adjoint_p.bind(
        *[a for g in groups for a in g], body=as_body(bj, len(groups[0]), len(groups[1])),
        step=Body.of(sj, len(groups[0]), len(groups[3])), length=length,
        **({"reverse": True} if reverse else {}), schedule=schedule)
    return split_grouped(out, step.out_types, (nct, nctx))


@scan_adjoint_p.def_hoist
def _scan_adjoint_hoist(node):
    # the forward body and the step share their consts: what either hoists
    # becomes a const of both
    p = node.params
    nc, nk = p["body"].num_consts, p["body"].num_carry
    consts = node.inputs[:nc]
    rb = hoist_nodes(p["body"], nc, consts)
    rs = hoist_nodes(p["step"], nc, consts)
    if rb is None and rs is None:
        return None
    outer, atoms = [], []
    body, step = p["body"], p["step"]
    nb = ns = 0
    if rb is not None:
        outer += rb[0]
        atoms += rb[1]
        body, nb = rb[2], len(rb[1])
    if rs is not None:
        outer += rs[0]
        atoms += rs[1]
        step, ns = rs[2], len(rs[1])
    body = with_unused_inputs(body, nc + nb, [a.type for a in atoms[nb:]])
    step = with_unused_inputs(step, nc, [a.type for a in atoms[:nb]])
    params = dict(p, body=as_body(body, nc + nb + ns, nk),
                  step=as_body(step, nc + nb + ns, p["step"].num_carry))
    return outer, node.replace(inputs=consts + tuple(atoms) + node.inputs[nc:],
                               params=params)


def _by_scans_parts(body: Body, step: Body, operands, stored: bool):
    """A `scan_adjoint` node's operands as `_adjoint_by_scans` reads them
    (`(consts, init, xs, ct_carry, ct_ys)`; a stored schedule's cells, the
    last `num_carry` operands, dropped), and the forward body that also
    outputs each step's incoming carry."""
    nc, nk = body.num_consts, body.num_carry
    if stored:
        operands = operands[:len(operands) - nk]
    nx = len(body.inputs) - nc - nk
    parts = ScanAdjointOperands.split(operands, nc, nk, nx, step.num_carry)
    fwd = body.replace(outputs=body.outputs[:nk] + body.inputs[nc:nc + nk])
    return (*parts, fwd)


def _adjoint_by_scans(*args, body, step, length, reverse=False,
                      schedule, stored=False):
    """What a `scan_adjoint` node computes, as two plain scans: the forward
    scan storing every step's carry, then the reverse scan of `step`."""
    consts, init, xs, ctc, cty, fwd = _by_scans_parts(body, step, args, stored)
    nc, nk = body.num_consts, body.num_carry
    carries = ScanOutputs.split(scan_p.bind(*consts, *init, *xs,
                                            **_params(fwd, nc, nk, length, reverse, None)),
                                nk).ys
    return scan_p.bind(*consts, *ctc, *carries, *xs, *cty,
                       **_params(step, nc, step.num_carry, length, not reverse, None))


@scan_adjoint_p.def_vjp
def _scan_adjoint_vjp(primals, outs, cts, **params):
    # Reverse over reverse: the VJP of the same computation with every carry
    # stored (the schedule bounds the memory of the first reverse pass, not
    # of this second one; forward over reverse, `sd.hvp`, keeps the bound).

    args, params = _unstored(primals, params)
    g, _, _ = trace_flat(lambda *a: list(_adjoint_by_scans(*a, **params)),
                         tuple(type_of(p) for p in args), name="scan_adjoint")
    _, backward = vjp_eval(g, list(args))
    return tuple(backward(list(cts))) + (None,) * (len(primals) - len(args))


# ---------------------------------------------------------------------------
# public functions


def _flat_types(leaves, what: str):
    return [_leaf_type(x, what) for x in leaves]


def scan(f: Callable, init, xs=None, length: int | None = None, reverse: bool = False,
         checkpoints=None):
    """Loops `f` over the leading axis of `xs`, carrying a state: JAX's
    `lax.scan`, as one node of the graph.

    ```python
    def step(u, _):
        u = u + dt * (D @ u)
        return u, u[probe]
    u_final, trace = sd.scan(step, u0, length=1000)
    ```

    Differentiable in forward and reverse mode and at second order in
    `init`, `xs` and every traced value `f` closes over. Reverse mode stores
    each step's residuals (as JAX's scan does); with `checkpoints=s` it stores
    at most `s` carries and recomputes the steps between them (binomial
    checkpointing), for the same gradient.

    **Arguments:**

    - `f`: `(carry, x) -> (carry, y)`, written with sciad ops. The carry it
        returns must have `init`'s structure, shapes and dtypes.
    - `init`: the initial carry, a pytree of arrays.
    - `xs`: a pytree of arrays scanned along their leading axis (all of one
        length), or None.
    - `length`: the number of steps; needed when `xs` is None, checked
        against `xs` otherwise.
    - `reverse`: run from the last element of `xs` to the first (the `y`s are
        still stacked in `xs`'s order).
    - `checkpoints`: None (reverse mode stores every step's residuals), an
        int `s` or `sd.Binomial(s)` (at most `s` stored carries, binomial
        recomputation), `sd.EveryK(k)` (every `k`-th carry stored, fewer
        than `2 length` steps recomputed), or `sd.MemoryBudget(ram=...)`
        (the binomial schedule whose stored carries fit in `ram` bytes;
        with `disk=dir`, carries that do not fit may go to disk where that
        recomputes fewer steps, a `TwoLevel` schedule; with `host=` on a
        GPU, to its pinned host memory).

    **Returns:**

    `(carry, ys)`: the final carry, and the `y`s stacked along a new leading
    axis (a pytree of `f`'s `y` structure).
    """
    op = "scan"
    checkpoints = as_schedule(checkpoints, op)
    if not callable(f):
        raise ShapeError(f"`f` must be a function (carry, x) -> (carry, y), got "
                         f"{type(f).__name__}.", op=op)
    init_leaves, init_tree = _tree.tree_flatten(init, is_leaf=is_value_leaf)
    xs_leaves, xs_tree = _tree.tree_flatten(xs, is_leaf=is_value_leaf)
    carry_types = _flat_types(init_leaves, "a leaf of `init`")
    xs_types = _flat_types(xs_leaves, "a leaf of `xs`")
    lengths = {t.shape[0] for t in xs_types if len(t.shape) >= 1}
    if any(len(t.shape) == 0 for t in xs_types):
        raise ShapeError("every leaf of `xs` needs a leading axis to scan over, got a "
                         "scalar.", op=op)
    if len(lengths) > 1:
        raise ShapeError(f"the leaves of `xs` must share their leading length, got "
                         f"{sorted(lengths)}.", op=op)
    if length is None:
        if not lengths:
            raise ShapeError("needs `length` when `xs` is None.", op=op)
        length = lengths.pop()
    else:
        if not isinstance(length, (int, np.integer)) or isinstance(length, bool) \
                or length < 0:
            raise InvalidOptionError(f"`length` must be an int >= 0, got {plain(length)}.", op=op)
        length = int(length)
        if lengths and lengths != {length}:
            raise ShapeError(f"`length` is {length} but `xs` has leading length "
                             f"{lengths.pop()}.", op=op)
    x_types = [TensorType(t.shape[1:], t.dtype) for t in xs_types]
    nk = len(carry_types)
    budget = checkpoints if isinstance(checkpoints, MemoryBudget) else None
    y_tree: list = []

    def flat_body(*args):
        carry = _tree.tree_unflatten(init_tree, args[:nk])
        x = _tree.tree_unflatten(xs_tree, args[nk:])
        out = f(carry, x)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ShapeError(f"`f` must return a pair (carry, y), got "
                             f"{type(out).__name__}.", op=op)
        new_carry, y = out
        c_leaves, c_tree = _tree.tree_flatten(new_carry, is_leaf=is_value_leaf)
        if c_tree != init_tree:
            raise ShapeError(f"`f` must return a carry of `init`'s structure {init_tree}, "
                             f"got {c_tree}.", op=op)
        y_leaves, yt = _tree.tree_flatten(y, is_leaf=is_value_leaf)
        y_tree.append(yt)
        return list(c_leaves) + list(y_leaves)

    body, consts, _ = trace_body(flat_body, carry_types + x_types,
                                 name=getattr(f, "__name__", "body").replace("<lambda>",
                                                                             "lambda"))
    nc = len(consts)
    paths = [_tree.keystr(p) for p, _ in _tree.tree_flatten_with_path(
        init, is_leaf=is_value_leaf)[0]]
    for k, (t, o) in enumerate(zip(carry_types, body.out_types[:nk])):
        if t != o:
            raise ShapeError(f"the carry{paths[k]} enters `f` as {t.str_short()} and "
                             f"leaves it as {o.str_short()}; a carry keeps its shape and "
                             "dtype (convert with `.astype`).", op=op)
    body, consts = hoist(body, nc, consts)
    body, consts = prune_consts(body, consts)
    if budget is not None:  # (the body's own loops hold their share of it)
        checkpoints = budget.schedule(sum(nbytes(t) for t in carry_types), length, op,
                                      inner=inner_needs(body), disk=True,
                                      step_flops=graph_cost(body).flops)
    for v, path in zip(body.inputs[len(consts):], paths):
        v.hint = "carry" + path if path else "carry"
    xpaths = [_tree.keystr(p) for p, _ in _tree.tree_flatten_with_path(
        xs, is_leaf=is_value_leaf)[0]]
    for v, path in zip(body.inputs[len(consts) + nk:], xpaths):
        v.hint = "x" + path if path else "x"
    outs = ScanOutputs.split(scan_p.bind(*consts, *init_leaves, *xs_leaves,
                                         **_params(body, len(consts), nk, length, bool(reverse),
                                                   checkpoints)), nk)
    carry = _tree.tree_unflatten(init_tree, outs.carry)
    ys = _tree.tree_unflatten(y_tree[0], outs.ys)
    return carry, ys


def prune_consts(body: Graph, consts: list) -> tuple[Graph, list]:
    """`body` without the consts it does not read (and `consts` without them).
    Its dead nodes go too: one may read a const that no output needs."""
    live, used = live_inputs(body, [True] * len(body.outputs))
    nc = len(consts)
    keep = used[:nc] + [True] * (len(body.inputs) - nc)
    if all(keep):
        return body, consts
    return drop_inputs(live, keep), [c for c, k in zip(consts, keep) if k]


def fori_loop(lower: int, upper: int, body_fun: Callable, init_val, checkpoints=None):
    """`val = body_fun(i, val)` for `i` in `range(lower, upper)`: JAX's
    `lax.fori_loop` with static bounds, as a `scan` node (so reverse mode and
    `checkpoints` work as for `sd.scan`).

    **Arguments:**

    - `lower`, `upper`: Python ints (the trip count is static).
    - `body_fun`: `(i, val) -> val`, with `i` a traced int64 scalar.
    - `init_val`: the initial value, a pytree of arrays.
    - `checkpoints`: as for `sd.scan`.

    **Returns:**

    The final value.
    """
    op = "fori_loop"
    for name, v in (("lower", lower), ("upper", upper)):
        if isinstance(v, Tracer) or not isinstance(v, (int, np.integer)) \
                or isinstance(v, bool):
            raise ShapeError(f"`{name}` must be a Python int (the trip count is static), "
                             f"got {plain(v)}. A loop whose bound is computed needs "
                             "`sd.while_loop`.", op=op)
    lower, upper = int(lower), int(upper)
    n = max(upper - lower, 0)

    def step(carry, _):
        i, val = carry
        return (i + 1, body_fun(i, val)), None

    (_, val), _ = scan(step, (np.int64(lower), init_val), length=n, checkpoints=checkpoints)
    return val


@scan_p.def_linearity
def _scan_linearity(linear, *, body, length, reverse=False, checkpoints=None):
    num_consts, num_carry = body.num_consts, body.num_carry
    # a final carry as its carry (its start, after no steps), the stacked
    # outputs as the body's
    lin, out = loop_linearity(body, linear, num_consts, num_carry)
    return lin[num_consts:num_consts + num_carry] + out[num_carry:]


@scan_p.def_transpose
def _scan_transpose(cts, *args, body, length, reverse=False, checkpoints=None):
    nc, nk, n = body.num_consts, body.num_carry, len(args)
    linear = [is_linear(a) for a in args]
    lin, out_lin = loop_linearity(body, linear, nc, nk)
    check_zero_starts(args, linear, lin, nc, nk, "scan")
    lk = [k for k in range(nk) if lin[nc + k]]
    nl_k = [k for k in range(nk) if not lin[nc + k]]
    lc = [i for i in range(nc) if lin[i]]
    lx = [i for i in range(nc + nk, n) if lin[i]]
    given = [j for j in range(nk, len(body.outputs)) if out_lin[j] and not is_zero(cts[j])]
    fb, st = transposed_step(body, lin, given, nc, nk)
    consts = [a for a, f in zip(args[:nc], lin[:nc]) if not f]
    init = [args[nc + k] for k in nl_k]
    xs = [a for a, f in zip(args[nc + nk:], lin[nc + nk:]) if not f]
    ct0 = ([instantiate(cts[k]) for k in lk]
           + [instantiate(Zero(body.inputs[i].type.update())) for i in lc])
    cty = [cts[j] for j in given]
    storable_primal_carries(body, nl_k, nc, "scan")
    if checkpoints is not None and nl_k:
        out = scan_adjoint_p.bind(*consts, *init, *xs, *ct0, *cty,
                                  body=as_body(fb, len(consts), len(nl_k)),
                                  step=Body.of(st, len(consts), len(lk) + len(lc)), length=length,
                                  **({"reverse": True} if reverse else {}),
                                  schedule=checkpoints)
    else:
        stacked = []
        if nl_k:  # the primal carry each step starts from
            g = fb.replace(outputs=fb.outputs + fb.inputs[len(consts):len(consts) + len(nl_k)])
            stacked = scan_p.bind(*consts, *init, *xs, **_params(g, len(consts), len(nl_k),
                                                                 length, reverse, None))
            stacked = list(stacked[len(nl_k):])
        out = scan_p.bind(*consts, *ct0, *stacked, *xs, *cty,
                          **_params(st, len(consts), len(ct0), length, not reverse, None))
    out = iter(out)
    in_cts: list = [None] * n
    for k in lk:
        c = next(out)
        if is_linear(args[nc + k]):
            in_cts[nc + k] = c
    for i in lc + lx:
        in_cts[i] = next(out)
    return tuple(in_cts)


def _install_adjoint_transpose() -> None:
    # a `scan_adjoint` in a tangent map (forward over a checkpointed reverse
    # pass, `sd.hvp`) is transposed as the two plain scans it stands for,
    # storing every carry (as its VJP does)
    scan_adjoint_p.def_transpose(expansion_transpose(scan_adjoint_p, _adjoint_by_scans))


_install_adjoint_transpose()


# ---------------------------------------------------------------------------
# batching (`sd.vmap`): a loop of batched steps


def _second(a, d):
    """A stacked (per-step) operand with its batch axis second, after the
    step axis; None if it has none."""

    return None if d is None else (a if d == 1 else ops.moveaxis(a, d, 1))


@scan_p.def_batch
def _scan_batch(args, dims, *, body, length, reverse=False, checkpoints=None):
    num_consts, num_carry = body.num_consts, body.num_carry
    # The body is batched on its consts', carries' and per-step slices' batch
    # flags, the carries' flags a fixed point; stacked operands and results
    # keep the step axis first and carry the batch axis second.
    nc, nk = num_consts, num_carry
    size = batch_size_of(args, dims)
    flags = [d is not None for d in dims]
    g, flags, out_b = carry_fixed_point(
        lambda f, force: batch_body(body, f, size, force), flags, nc, nc + nk)
    operands = (front_where(args[:nc + nk], dims[:nc + nk], flags, size)
                + [a if d is None else _second(a, d)
                   for a, d in zip(args[nc + nk:], dims[nc + nk:])])
    outs = scan_p.bind(*operands, **_params(g, nc, nk, length, reverse, checkpoints))
    out_b = ScanOutputs.split(out_b, nk)
    return list(outs), ([0 if b else None for b in out_b.carry]
                        + [1 if b else None for b in out_b.ys])


@scan_adjoint_p.def_batch
def _scan_adjoint_batch(args, dims, *, body, step, length,
                        reverse=False, schedule, stored=False):
    num_consts, num_carry = body.num_consts, body.num_carry
    # The forward body's carries are batched to their fixed point first (the
    # step reads them but does not change them), then the step's cotangent
    # carries and accumulators to theirs. (Stored cells are left out: the
    # batched node recomputes them.)
    nc, nk, nct = num_consts, num_carry, step.num_carry
    if stored:
        args, dims = args[:len(args) - nk], dims[:len(dims) - nk]
    nx = len(body.inputs) - nc - nk
    size = batch_size_of(args, dims)
    consts, carry, xs, ctc, cty = ScanAdjointOperands.split(
        [d is not None for d in dims], nc, nk, nx, nct)
    gb, fb, _ = carry_fixed_point(
        lambda f, force: batch_body(body, f, size, force), consts + carry + xs, nc, nc + nk)
    carry = fb[nc:nc + nk]
    gs, fs, os_ = carry_fixed_point(
        lambda f, force: batch_body(step, f, size, force), consts + ctc + carry + xs + cty,
        nc, nc + nct)
    ctc = fs[nc:nc + nct]
    flags = consts + carry + xs + ctc + cty
    g = ScanAdjointOperands.split(zip(args, dims, flags), nc, nk, nx, nct)

    def front(group):  # batched where the flags say, the batch axis first
        return [batched_front(a, d, size) if f else a for a, d, f in group]

    def second(group):  # stacked: the step axis first, the batch axis second
        return [a if d is None else _second(a, d) for a, d, _ in group]

    operands = ScanAdjointOperands(front(g.consts), front(g.carry), second(g.xs),
                                   front(g.ct_carry), second(g.ct_ys)).flat()
    outs = scan_adjoint_p.bind(*operands, body=as_body(gb, nc, nk), step=as_body(gs, nc, nct),
                               length=length,
                               **({"reverse": True} if reverse else {}), schedule=schedule)
    os_ = ScanAdjointOutputs.split(os_, nct)
    return list(outs), ([0 if b else None for b in os_.ct_carry]
                        + [1 if b else None for b in os_.ct_xs])


def _install_sparsity_rules() -> None:
    @scan_p.def_sparsity
    def _scan_sparsity(outs, *deps, body, length, reverse=False, checkpoints=None):
        consts, init, xs = body.groups(deps)
        res = loop_sparsity(body, consts, init, xs, length, exact=True, reverse=reverse)
        if res is None:
            return dense_all(outs, *deps)
        return list(res[0]) + list(res[1])

    @scan_adjoint_p.def_sparsity
    def _scan_adjoint_sparsity(outs, *deps, body, step, length,
                               reverse=False, schedule, stored=False):
        # what `_adjoint_by_scans` computes: the forward scan stacking each
        # step's carry, then the reverse scan of `step` over them (stored
        # cells hold carries of that scan: they add nothing)
        consts, init, xs, ctc, cty, fwd = _by_scans_parts(body, step, deps, stored)
        nc, nk = body.num_consts, body.num_carry
        res = loop_sparsity(fwd, consts, init, xs, length, exact=True, reverse=reverse)
        if res is not None:
            carries = [Deps(m, (length,) + value_shape(v.type))
                       for m, v in zip(res[1], body.inputs[nc:nc + nk])]
            res = loop_sparsity(step, consts, ctc, carries + xs + cty, length,
                                exact=True, reverse=not reverse)
        if res is None:
            return dense_all(outs, *deps)
        return list(res[0]) + list(res[1])


_install_sparsity_rules()


# ---------------------------------------------------------------------------
# cost (`sd.cost`)


def _carry_bytes(body: Graph, nc: int, nk: int) -> int:
    return sum(nbytes(v.type) for v in body.inputs[nc:nc + nk])


@scan_p.def_cost
def _scan_cost(node, body):
    p = node.params
    g = p["body"]
    nc, nk = g.num_consts, g.num_carry
    b, n = body(g), p["length"]
    peak = loop_body_peak(g, b, g.inputs[nc:nc + nk])
    return Cost(n * b.flops, peak, steps_note(n, b.flops))


@scan_adjoint_p.def_cost
def _scan_adjoint_cost(node, body):
    p = node.params
    n, sched = p["length"], p["schedule"]
    fb, st = body(p["body"]), body(p["step"])
    carry = _carry_bytes(p["body"], p["body"].num_consts, p["body"].num_carry)
    if isinstance(sched, TwoLevel):
        recomputed = sched.recomputed(n)
        m, last = sched.segments(max(n, 1))  # (m - 1 carries on disk)
        cells = checkpoint_runs(sched.inner(), sched.segment if m > 1 else last).cells + 3
        return Cost(recomputed * fb.flops + n * st.flops,
                    cells * carry + max(fb.peak, st.peak),
                    f"{n} steps, {sched}: {recomputed} forward steps recomputed, "
                    f"{m - 1} carries ({_cache.si((m - 1) * carry)}) {sched.where}")
    recomputed = advanced(sched, n)
    runs = checkpoint_runs(sched, n)
    cells = runs.cells + 1
    if p.get("stored") and len(runs.runs):  # the forward pass ran the first stretch
        recomputed -= int(runs.runs[0, 2])
        cells = 0  # (and holds the cells: an operand)
    temp = cells * carry + max(fb.peak, st.peak)
    return Cost(recomputed * fb.flops + n * st.flops, temp,
                f"{n} steps, {sched}: {recomputed} forward steps recomputed")


# ---------------------------------------------------------------------------
# version-1 files: `num_consts` and `num_carry` were params of the node (and
# `scan_adjoint`'s step a plain graph)


def _v1(params: dict) -> dict:
    params = dict(params)
    nc, nk = params.pop("num_consts"), params.pop("num_carry")
    return {**params, "body": as_body(params["body"], nc, nk)}


def _adjoint_v1(params: dict) -> dict:
    # and the step's carries were counted by `num_ct_carry` and `num_acc`
    params = _v1(params)
    nct = params.pop("num_ct_carry") + params.pop("num_acc")
    return {**params, "step": as_body(params["step"], params["body"].num_consts, nct)}


register_v1_migration("scan", _v1)
register_v1_migration("scan_adjoint", _adjoint_v1)
