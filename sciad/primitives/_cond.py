"""Branches and recomputation as nodes: `cond` (JAX's `lax.cond`) and
`checkpoint` (`jax.checkpoint`: recompute a function's interior in the
backward pass instead of saving it).

`cond[true_body, false_body](pred, *args)` applies one of two bodies to the
same operands. Both bodies follow the closed-body convention
(`sciad.graph._body`) with every operand a const: they take `(*args)`,
where `args` are the values either branch closed over (in the order of a
union of both closures) followed by the operands the user passed, and they
return outputs of one structure and type.

Rules:

- JVP: a `cond` of the two bodies' JVPs. An output's tangent is present if
  it is nonzero in either branch (the other branch makes it zeros).
- VJP: the forward `cond` runs each branch's forward part (`vjp_graph`) and
  returns the values its backward part needs, the other branch's saved
  values as zeros (the outputs of a `cond` have one type, whichever branch
  runs; JAX's `cond` does the same). The backward pass is a `cond` of the
  two backward parts. A saved value that is not an array (a factorization
  computed in a branch) makes the backward branch recompute its forward
  part from the operands instead.

`checkpoint[body](*args)` applies its body; its VJP saves only the operands
and the backward pass recomputes the body (behind an optimization barrier,
so XLA cannot merge the recomputation with the forward pass and keep the
interior alive after all). Its JVP is a `checkpoint` of the body's JVP, so
forward over reverse (`sd.hvp`) recomputes too. Inside a scan body, the
scan's reverse mode then stacks only the checkpoint's operands per step.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from .. import _ops as ops
from ..errors import DTypeError, NotSupportedError, ShapeError
from ..graph import Body, Graph, Literal, Primitive, TensorType, Var, Zero
from ..graph import instantiate, is_differentiable, is_zero, lower
from ..graph._autodiff import needs_ct, type_of, vjp_eval, vjp_graph, zeros
from ..graph._cost import Cost
from ..graph._batch import batch_body, batch_graph, batch_size_of, batched_front, front_where
from ..graph._batch import to_front
from ..graph._body import (applied_batch_rule, applied_body, applied_linearity_rule,
                           applied_transpose_rule, dce_rule, inline, jvp_body, trace_body)
from ..graph._serialize import register_v1_migration
from ..graph._sparsity import body_rule, sparsity_eval, union
from ..graph._trace import Tracer, _leaf_type, current_builder, is_value_leaf

_tree = jax.tree_util


def _needs_ct(x) -> bool:
    return needs_ct(x)


def _wrt(args) -> list[bool]:
    """The operands the reverse pass differentiates (the branches' VJPs
    form cotangents for those only)."""
    return [_needs_ct(a) for a in args]


def _sig(types) -> str:
    return "(" + ", ".join(t.str_short() for t in types) + ")"


# ---------------------------------------------------------------------------
# cond


cond_p = Primitive("cond", multiple_results=True,
                   params={"true_body": Body, "false_body": Body})


def cond_params(true_body: Graph, false_body: Graph) -> dict:
    """The params of a `cond` node with these branches."""
    return dict(true_body=applied_body(true_body), false_body=applied_body(false_body))


@cond_p.def_abstract_eval
def _cond_shape(pred, *in_types, true_body, false_body):
    op = "cond"
    for name, b in (("true_body", true_body), ("false_body", false_body)):
        if not isinstance(b, Body):
            raise ShapeError(f"`{name}` must be a Body, got {b!r}.", op=op)
        if tuple(b.in_types) != tuple(in_types):
            raise ShapeError(f"{name} {b.name!r} takes {_sig(b.in_types)}, got "
                             f"{_sig(in_types)}.", op=op)
    if not (isinstance(pred, TensorType) and pred.shape == () and pred.dtype == np.bool_):
        raise DTypeError(f"the predicate must be a bool scalar, got {pred.str_short()}.",
                         op=op)
    if tuple(true_body.out_types) != tuple(false_body.out_types):
        raise ShapeError(f"the branches return different types: {_sig(true_body.out_types)} "
                         f"and {_sig(false_body.out_types)}.", op=op)
    return true_body.out_types


@cond_p.def_impl
def _cond_impl(pred, *args, true_body, false_body, site=None):
    held = site.held if site is not None else ()
    ft, ff = lower(true_body, held), lower(false_body, held)
    return tuple(jax.lax.cond(pred, lambda a: tuple(ft(*a)), lambda a: tuple(ff(*a)),
                              tuple(args)))


@cond_p.def_jvp
def _cond_jvp(primals, tangents, *, true_body, false_body):
    pred, args = primals[0], primals[1:]
    nz = [not is_zero(t) and is_differentiable(type_of(a))
          for a, t in zip(args, tangents[1:])]
    (jt, nz_t), (jf, nz_f) = (jvp_body(b, nz) for b in (true_body, false_body))
    out_nz = [a or b for a, b in zip(nz_t, nz_f)]
    if nz_t != out_nz:
        jt, _ = jvp_body(true_body, nz, instantiate=out_nz)
    if nz_f != out_nz:
        jf, _ = jvp_body(false_body, nz, instantiate=out_nz)
    targs = [instantiate(t) for t, z in zip(tangents[1:], nz) if z]
    res = cond_p.bind(pred, *args, *targs, **cond_params(jt, jf))
    n = len(true_body.outputs)
    it = iter(res[n:])
    touts = [next(it) if z else Zero(type_of(o).update()) for o, z in zip(res[:n], out_nz)]
    return tuple(res[:n]), tuple(touts)


# (the predicate stays; an operand goes when neither branch reads it)
cond_p.def_dce(dce_rule("true_body", "false_body", skip=1))


# -- reverse mode ---------------------------------------------------------------


def _saved_plan(vg, nout: int):
    """Where each saved value of a branch's forward part comes from: a
    literal, an operand (by index), or an output of the forward `cond` (an
    array the branch computes). None if a computed value is not an array."""
    pos = {v: i for i, v in enumerate(vg.forward.inputs)}
    plan, computed = [], []
    for a in vg.forward.outputs[nout:]:
        if isinstance(a, Literal):
            plan.append(("lit", a.value))
        elif a in pos:
            plan.append(("arg", pos[a]))
        elif not isinstance(a.type, TensorType):
            return None
        else:
            plan.append(("res", len(computed)))
            computed.append(a)
    return plan, computed


def _resolve(plan, args, res):
    return [v if kind == "lit" else args[v] if kind == "arg" else res[v]
            for kind, v in plan]


@cond_p.def_vjp_fwd
def _cond_vjp_fwd(primals, *, true_body, false_body):
    pred, args = primals[0], list(primals[1:])
    nout = len(true_body.outputs)
    vgs = [vjp_graph(b, _wrt(args)) for b in (true_body, false_body)]
    plans = [_saved_plan(vg, nout) for vg in vgs]
    if any(p is None for p in plans):
        outs = cond_p.bind(*primals, **cond_params(true_body, false_body))
        return tuple(outs), ("recompute", primals)
    res_types = [[a.type for a in p[1]] for p in plans]
    in_types = [type_of(a) for a in args]

    def forward(k):
        def fn(*a):
            r = inline(vgs[k].forward, a)
            mine = [r[nout + i] for i, (kind, _) in enumerate(plans[k][0]) if kind == "res"]
            other = [zeros(t) for t in res_types[1 - k]]
            return list(r[:nout]) + (mine + other if k == 0 else other + mine)
        return fn

    bodies = [trace_body(forward(k), in_types, name=f"{b.name}_fwd")
              for k, b in enumerate((true_body, false_body))]
    assert not bodies[0][1] and not bodies[1][1], "a branch's forward part closes over nothing"
    out = cond_p.bind(pred, *args, **cond_params(bodies[0][0], bodies[1][0]))
    nt = len(res_types[0])
    return tuple(out[:nout]), ("residuals", primals, vgs, [p[0] for p in plans],
                               list(out[nout:nout + nt]), list(out[nout + nt:]))


@cond_p.def_vjp_bwd
def _cond_vjp_bwd(res, cts, *, true_body, false_body):
    kind, primals = res[0], res[1]
    pred, args = primals[0], list(primals[1:])
    bodies = (true_body, false_body)
    diff_in = [i for i, v in enumerate(true_body.inputs) if is_differentiable(v.type)]
    diff_out = [i for i, a in enumerate(true_body.outputs) if is_differentiable(a.type)]
    wrt = _wrt(args)
    need = [i for i in diff_in if wrt[i]]
    ct_idx = [i for i in diff_out if not is_zero(cts[i])]
    if not need:
        return (None,) * len(primals)
    given = [cts[i] for i in ct_idx]
    na = len(args)

    def out_cts(body, in_cts):
        return [instantiate(in_cts[i]) for i in need]

    if kind == "recompute":
        extra = []

        def backward(k):
            def fn(*a):
                _, bwd = vjp_eval(bodies[k], list(a[:na]), wrt)
                ct = [Zero(o.type.update()) for o in bodies[k].outputs]
                for i, c in zip(ct_idx, a[na:]):
                    ct[i] = c
                return out_cts(bodies[k], bwd(ct))
            return fn
    else:
        _, _, vgs, plans, res_t, res_f = res
        extra = res_t + res_f
        nt = len(res_t)

        def backward(k):
            def fn(*a):
                r = a[na:na + len(extra)]
                saved = _resolve(plans[k], a[:na], r[:nt] if k == 0 else r[nt:])
                ct = dict(zip(ct_idx, a[na + len(extra):]))
                ct_in = [ct[i] if i in ct else zeros(bodies[k].outputs[i].type.update())
                         for i in diff_out]
                in_cts = dict(zip(need, inline(vgs[k].backward, saved + ct_in)))
                return out_cts(bodies[k], in_cts)
            return fn

    types = [type_of(a) for a in args] + [type_of(e) for e in extra] + [
        type_of(c) for c in given]
    gs = [trace_body(backward(k), types, name=f"{b.name}_bwd") for k, b in enumerate(bodies)]
    assert not gs[0][1] and not gs[1][1], "a branch's backward part closes over nothing"
    out = iter(cond_p.bind(pred, *args, *extra, *given, **cond_params(gs[0][0], gs[1][0])))
    in_cts: list = [None] * len(primals)
    for i in need:
        in_cts[1 + i] = next(out)
    return tuple(in_cts)


# -- transposition: a `cond` in a tangent map ------------------------------------
# (its JVP, linear in the tangent operands): a `cond` of the two branches'
# transposes, each recomputing what it needs of its primal part


# (the predicate is never linear: a boolean)
cond_p.def_linearity(applied_linearity_rule("true_body", "false_body", skip=1))
cond_p.def_transpose(applied_transpose_rule(cond_p, "true_body", "false_body", skip=1))


# -- public function --------------------------------------------------------------


def _leaf_types(leaves, what: str):
    return [_leaf_type(x, what) for x in leaves]


def _union_inputs(body: Graph, consts: list, union: list) -> Graph:
    """`body` (inputs: its own consts, then the operands) made to take the
    consts of `union` (a superset, in its order) instead."""
    own = {id(c): v for c, v in zip(consts, body.inputs)}
    ins = [own.get(id(c)) or Var(type_of(c)) for c in union]
    return body.replace(inputs=tuple(ins) + body.inputs[len(consts):])


def cond(pred, true_fun: Callable, false_fun: Callable, *operands):
    """`true_fun(*operands)` if `pred` else `false_fun(*operands)`: JAX's
    `lax.cond`, as one node of the graph holding both branches.

    ```python
    flux = sd.cond(u[0] > 0, lambda u: u * a, lambda u: u * b, u)
    ```

    Only the taken branch runs. Differentiable in forward and reverse mode
    and at second order in the operands and every traced value a branch
    closes over (the predicate has no derivative). A Python bool `pred` just
    calls the chosen function.

    **Arguments:**

    - `pred`: a bool scalar (an integer one means `pred != 0`).
    - `true_fun`, `false_fun`: functions of `*operands`, written with sciad
      ops, returning results of one pytree structure, shapes and dtypes.
    - `operands`: the arguments (pytrees of arrays) passed to the branch.

    **Returns:**

    The taken branch's result.
    """
    op = "cond"
    for name, f in (("true_fun", true_fun), ("false_fun", false_fun)):
        if not callable(f):
            raise ShapeError(f"`{name}` must be a function, got {type(f).__name__}.", op=op)
    if not isinstance(pred, Tracer):
        p = np.asarray(pred)
        if p.shape != () or p.dtype.kind not in "biu":
            raise DTypeError(f"the predicate must be a bool scalar, got {p.dtype} of shape "
                             f"{p.shape}.", op=op)
        return true_fun(*operands) if bool(p) else false_fun(*operands)
    pt = type_of(pred)
    if not isinstance(pt, TensorType) or pt.shape != () or (
            pt.dtype != np.bool_ and pt.dtype.kind not in "iu"):
        raise DTypeError(f"the predicate must be a bool scalar, got {pt.str_short()}"
                         + (" (compare it, e.g. `x > 0`)." if isinstance(pt, TensorType)
                            and pt.shape == () else "."), op=op)
    if pt.dtype != np.bool_:
        pred = pred != 0
    leaves, in_tree = _tree.tree_flatten(tuple(operands), is_leaf=is_value_leaf)
    in_types = _leaf_types(leaves, "an operand")
    traced = []
    for f in (true_fun, false_fun):
        trees: list = []

        def flat(*a, f=f, trees=trees):
            out = f(*_tree.tree_unflatten(in_tree, list(a)))
            out_leaves, t = _tree.tree_flatten(out, is_leaf=is_value_leaf)
            trees.append(t)
            return list(out_leaves)

        name = getattr(f, "__name__", "branch").replace("<lambda>", "lambda")
        g, consts, _ = trace_body(flat, in_types, name=name)
        traced.append((g, consts, trees[0]))
    (gt, ct, tt), (gf, cf, tf) = traced
    if tt != tf:
        raise ShapeError(f"the branches return different structures: true_fun {tt}, "
                         f"false_fun {tf}.", op=op)
    if gt.out_types != gf.out_types:
        raise ShapeError(f"the branches return different types: true_fun "
                         f"{_sig(gt.out_types)}, false_fun {_sig(gf.out_types)}.", op=op)
    union, seen = [], set()
    for c in ct + cf:
        if id(c) not in seen:
            seen.add(id(c))
            union.append(c)
    gt, gf = _union_inputs(gt, ct, union), _union_inputs(gf, cf, union)
    outs = cond_p.bind(pred, *union, *leaves, **cond_params(gt, gf))
    return _tree.tree_unflatten(tt, list(outs))


# ---------------------------------------------------------------------------
# checkpoint


checkpoint_p = Primitive("checkpoint", multiple_results=True, params={"body": Body})
barrier_p = Primitive("optimization_barrier", multiple_results=True, params={})


@checkpoint_p.def_abstract_eval
def _checkpoint_shape(*in_types, body):
    if not isinstance(body, Body):
        raise ShapeError(f"`body` must be a Body, got {body!r}.", op="checkpoint")
    if tuple(body.in_types) != tuple(in_types):
        raise ShapeError(f"body {body.name!r} takes {_sig(body.in_types)}, got "
                         f"{_sig(in_types)}.", op="checkpoint")
    return body.out_types


@checkpoint_p.def_impl
def _checkpoint_impl(*args, body, site=None):
    return tuple(lower(body, site.held if site is not None else ())(*args))


@checkpoint_p.def_jvp
def _checkpoint_jvp(primals, tangents, *, body):
    nz = [not is_zero(t) and is_differentiable(type_of(a)) for a, t in zip(primals, tangents)]
    jg, out_nz = jvp_body(body, nz)
    res = checkpoint_p.bind(*primals, *[instantiate(t) for t, z in zip(tangents, nz) if z],
                            body=applied_body(jg))
    n = len(body.outputs)
    it = iter(res[n:])
    return tuple(res[:n]), tuple(next(it) if z else Zero(type_of(o).update())
                                 for o, z in zip(res[:n], out_nz))


checkpoint_p.def_dce(dce_rule("body"))


@checkpoint_p.def_vjp_fwd
def _checkpoint_vjp_fwd(primals, *, body):
    return tuple(checkpoint_p.bind(*primals, body=body)), primals


@checkpoint_p.def_vjp_bwd
def _checkpoint_vjp_bwd(primals, cts, *, body):
    # the recomputation reads the operands through a barrier that also takes
    # the cotangents: so it belongs to the backward pass (a graph split into
    # forward and backward parts, a scan body's, leaves it there), and XLA
    # cannot merge it with the forward computation (which would keep the
    # interior alive until the backward pass, undoing the checkpoint)
    arrays = [i for i, a in enumerate(primals) if isinstance(type_of(a), TensorType)]
    given = [c for c in cts if not is_zero(c) and isinstance(type_of(c), TensorType)]
    fresh = list(primals)
    if arrays:
        for i, v in zip(arrays, barrier_p.bind(*[primals[i] for i in arrays], *given)):
            fresh[i] = v
    _, backward = vjp_eval(body, fresh)
    in_cts = backward(list(cts))
    return tuple(c if _needs_ct(p) else None for p, c in zip(primals, in_cts))


@barrier_p.def_abstract_eval
def _barrier_shape(*in_types):
    return tuple(in_types)


@barrier_p.def_impl
def _barrier_impl(*args):
    return tuple(jax.lax.optimization_barrier(tuple(args)))


@barrier_p.def_jvp
def _barrier_jvp(primals, tangents):
    return tuple(barrier_p.bind(*primals)), tuple(tangents)


@barrier_p.def_transpose
def _barrier_transpose(cts, *args):
    return tuple(cts)


checkpoint_p.def_linearity(applied_linearity_rule("body"))
# a checkpoint of the body's transpose: its primal part is recomputed there
checkpoint_p.def_transpose(applied_transpose_rule(checkpoint_p, "body"))


def checkpoint(f: Callable) -> Callable:
    """`f`, recomputed in the backward pass instead of saved: JAX's
    `jax.checkpoint` (remat), as one node holding `f`'s graph.

    ```python
    step = sd.checkpoint(lambda u: u + dt * rhs(u))
    ```

    Reverse mode through the node saves only its operands (the arguments
    and the traced values `f` closes over), not the values computed inside,
    and runs `f` again in the backward pass: less memory for one more
    evaluation of `f`. Used as a scan's body (or inside it), the scan's
    reverse mode stacks only the carries. The derivatives are those of `f`.

    **Arguments:**

    - `f`: a function of pytrees of arrays, written with sciad ops.

    **Returns:**

    A function with `f`'s signature.
    """
    if not callable(f):
        raise ShapeError(f"`f` must be a function, got {type(f).__name__}.", op="checkpoint")
    name = getattr(f, "__name__", "checkpoint").replace("<lambda>", "lambda")

    def wrapped(*args):
        leaves, in_tree = _tree.tree_flatten(tuple(args), is_leaf=is_value_leaf)
        if not any(isinstance(x, Tracer) for x in leaves) and not _tracing():
            return f(*args)
        trees: list = []

        def flat(*a):
            out = f(*_tree.tree_unflatten(in_tree, list(a)))
            out_leaves, t = _tree.tree_flatten(out, is_leaf=is_value_leaf)
            trees.append(t)
            return list(out_leaves)

        g, consts, _ = trace_body(flat, _leaf_types(leaves, "an argument"), name=name)
        outs = checkpoint_p.bind(*consts, *leaves, body=applied_body(g))
        return _tree.tree_unflatten(trees[0], list(outs))

    wrapped.__name__ = name
    wrapped.__doc__ = f.__doc__
    wrapped.__wrapped__ = f
    return wrapped


def _tracing() -> bool:
    return current_builder() is not None


# ---------------------------------------------------------------------------
# batching (`sd.vmap`)


@cond_p.def_batch
def _cond_batch(args, dims, *, true_body, false_body):
    # One predicate for the batch: a `cond` of the batched branches (an output
    # is batched if it is in either branch). A predicate per example: both
    # branches run on the whole batch and each example's result is selected,
    # as `jax.vmap` of `lax.cond` does; a branch's run-time checks then see
    # the examples that do not take it too.

    size = batch_size_of(args, dims)
    flags = [d is not None for d in dims[1:]]
    operands = front_where(args[1:], dims[1:], flags, size)
    if dims[0] is None:
        (gt, bt), (gf, bf) = (batch_body(b, flags, size) for b in (true_body, false_body))
        out = [a or b for a, b in zip(bt, bf)]
        if bt != out:
            gt, _ = batch_body(true_body, flags, size, out)
        if bf != out:
            gf, _ = batch_body(false_body, flags, size, out)
        res = cond_p.bind(args[0], *operands, **cond_params(gt, gf))
        return list(res), [0 if b else None for b in out]
    in_dims = [0 if f else None for f in flags]
    t, f = (batch_graph(b, operands, in_dims) for b in (true_body, false_body))
    pred = to_front(args[0], dims[0])
    outs = []
    for (a, da), (b, db) in zip(t, f):
        if not isinstance(type_of(a), TensorType):
            raise NotSupportedError(
                f"a branch returns a {type_of(a).str_short()}, which cannot be selected per "
                "example: under sd.vmap a cond whose predicate differs between examples runs "
                "both branches and selects, which needs array outputs.", op="cond")
        a, b = batched_front(a, da, size), batched_front(b, db, size)
        ndim = len(type_of(a).shape)
        outs.append(ops.where(ops.reshape(pred, (size,) + (1,) * (ndim - 1)), a, b))
    return outs, [0] * len(outs)


checkpoint_p.def_batch(applied_batch_rule(checkpoint_p))


@barrier_p.def_batch
def _barrier_batch(args, dims):
    return list(barrier_p.bind(*args)), list(dims)


# ---------------------------------------------------------------------------
# cost (`sd.cost`)


@cond_p.def_cost
def _cond_cost(node, body):
    t, f = body(node.params["true_body"]), body(node.params["false_body"])
    return Cost(max(t.flops, f.flops), max(t.peak, f.peak), "the costlier branch")


@checkpoint_p.def_cost
def _checkpoint_cost(node, body):
    b = body(node.params["body"])
    return Cost(b.flops, b.peak)


# ---------------------------------------------------------------------------
# Sparsity: a checkpoint is its body; a barrier passes its operands on; a
# cond's outputs depend on what either branch's do (and not on the
# predicate, a boolean).

def _install_sparsity_rules() -> None:
    checkpoint_p.def_sparsity(body_rule(lambda params: params["body"]))
    barrier_p.def_sparsity(lambda outs, *deps: [d.matrix for d in deps])

    @cond_p.def_sparsity
    def _cond_sparsity(outs, pred, *deps, true_body, false_body):
        a = sparsity_eval(true_body, deps)
        b = sparsity_eval(false_body, deps)
        return [union(x.matrix, y.matrix) for x, y in zip(a, b)]


_install_sparsity_rules()


# version-1 files: the bodies were plain graphs
register_v1_migration("cond", lambda p: cond_params(p["true_body"], p["false_body"]))
register_v1_migration("checkpoint", lambda p: {"body": applied_body(p["body"])})
