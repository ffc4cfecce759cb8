"""`while`: a loop whose step count is computed (JAX's `lax.while_loop`), as
one node holding its predicate and its body.

`while[cond_body, body, num_consts, max_steps, checkpoints](*consts, *init)`
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
- VJP: only with `max_steps`. The loop is then the scan of `max_steps`
  steps `carry = cond(pred(carry), body, identity)(carry)`, whose steps
  after the predicate turns false do nothing; its backward pass is the
  checkpointed backward pass of that scan (`scan_adjoint`, the binomial
  schedule of `checkpoints` snapshots, by default about log2(max_steps)),
  so reverse mode stores a bounded number of carries however many steps
  run. The forward pass is the `while` itself, exiting early. Without
  `max_steps` reverse mode is an error that says what to do instead.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConvergenceError, DTypeError, NotSupportedError, ShapeError
from ..graph import Graph, Param, Primitive, TensorType, Var, Zero
from ..graph import instantiate, is_zero, lower
from ..graph._autodiff import type_of
from ..graph._batch import batch_body, batch_size_of, carry_fixed_point, front_where
from ..graph._body import drop_inputs, hoist, hoist_nodes, inline, live_inputs, trace_body
from ..graph._trace import Tracer, is_value_leaf
from ._checks import check, tie
from ._cond import _sig, _union_inputs, cond_p
from ._control import SCHEDULES, Binomial, _checkpointed_bwd, _scan_body_jvp, _with_unused_inputs
from ._control import as_schedule

_tree = jax.tree_util

while_p = Primitive("while", multiple_results=True, runtime_checks=True, params={
    "cond_body": Graph, "body": Graph, "num_consts": int,
    "max_steps": Param((int, None), default=None),
    "checkpoints": Param((*SCHEDULES, None), default=None)})


@while_p.def_abstract_eval
def _while_shape(*in_types, cond_body, body, num_consts, max_steps=None, checkpoints=None):
    op = "while"
    for name, b in (("cond_body", cond_body), ("body", body)):
        if not isinstance(b, Graph):
            raise ShapeError(f"`{name}` must be a Graph, got {b!r}.", op=op)
        if tuple(b.in_types) != tuple(in_types):
            raise ShapeError(f"{name} {b.name!r} takes {_sig(b.in_types)}, got "
                             f"{_sig(in_types)}.", op=op)
    carry = tuple(in_types[num_consts:])
    if tuple(body.out_types) != carry:
        raise ShapeError(f"the body returns {_sig(body.out_types)}, the carry is "
                         f"{_sig(carry)}.", op=op)
    ct = cond_body.out_types
    if len(ct) != 1 or ct[0] != TensorType((), np.bool_):
        raise DTypeError(f"the predicate must return one bool scalar, got {_sig(ct)}.", op=op)
    if max_steps is not None and max_steps < 0:
        raise ShapeError(f"`max_steps` must be >= 0, got {max_steps}.", op=op)
    return carry


def _judge_steps(site, *, max_steps, steps=0, running=True):
    if not running:
        return
    site.fail(ConvergenceError,
              f"the loop did not end within max_steps={max_steps}: its predicate still "
              f"held after {int(steps)} steps. Raise `max_steps`, or check that the "
              "predicate turns false.", iterations=int(steps))


@while_p.def_impl
def _while_impl(*args, cond_body, body, num_consts, max_steps=None, checkpoints=None,
                site=None):
    fc, fb = lower(cond_body), lower(body)
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
    token = check(_judge_steps, site, when=running, max_steps=max_steps, steps=i,
                  running=running)
    return tie(carry, token)


@while_p.def_jvp
def _while_jvp(primals, tangents, *, cond_body, body, num_consts, max_steps=None,
               checkpoints=None):
    nc, nk = num_consts, len(primals) - num_consts
    nz0 = [not is_zero(t) for t in tangents]
    jg, nz, _ = _scan_body_jvp(body, nc, nk, nz0)
    tan = [instantiate(tangents[i]) for i in range(len(primals)) if nz[i]]
    n_dc = sum(nz[:nc])
    args = list(primals[:nc]) + tan[:n_dc] + list(primals[nc:]) + tan[n_dc:]
    cb = _with_unused_inputs(cond_body, nc, [type_of(t) for t in tan[:n_dc]])
    cb = _with_unused_inputs(cb, len(cb.inputs), [type_of(t) for t in tan[n_dc:]])
    res = while_p.bind(*args, cond_body=cb, body=jg, num_consts=nc + n_dc,
                       **_extra(max_steps, checkpoints))
    carry, dcarry = list(res[:nk]), iter(res[nk:])
    touts = [next(dcarry) if nz[nc + i] else Zero(type_of(c).update())
             for i, c in enumerate(carry)]
    return tuple(carry), tuple(touts)


def _extra(max_steps, checkpoints) -> dict:
    out = {}
    if max_steps is not None:
        out["max_steps"] = max_steps
    if checkpoints is not None:
        out["checkpoints"] = checkpoints
    return out


@while_p.def_dce
def _while_dce(node, used):
    p = node.params
    nc, cb = p["num_consts"], p["cond_body"]
    _, cond_live = live_inputs(cb, [True])
    live = [u or c for u, c in zip(used, cond_live[nc:])]
    while True:
        g, in_live = live_inputs(p["body"], live)
        new = [a or b for a, b in zip(live, in_live[nc:])]
        if new == live:
            break
        live = new
    keep = [a or b for a, b in zip(in_live[:nc], cond_live[:nc])] + live
    if all(keep):
        return None
    return node.replace(inputs=tuple(a for a, k in zip(node.inputs, keep) if k),
                        outputs=tuple(v for v, k in zip(node.outputs, live) if k),
                        params=dict(p, cond_body=drop_inputs(cb, keep),
                                    body=drop_inputs(g, keep), num_consts=sum(keep[:nc])))


@while_p.def_hoist
def _while_hoist(node):
    nc = node.params["num_consts"]
    res = hoist_nodes(node.params["body"], nc, node.inputs[:nc])
    if res is None:
        return None
    outer, atoms, body = res
    cb = _with_unused_inputs(node.params["cond_body"], nc, [a.type for a in body.inputs[
        nc:nc + len(atoms)]])
    params = dict(node.params, body=body, cond_body=cb, num_consts=nc + len(atoms))
    return outer, node.replace(inputs=node.inputs[:nc] + tuple(atoms) + node.inputs[nc:],
                               params=params)


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
        return list(cond_p.bind(p, *a, true_body=body, false_body=identity))

    g, consts, _ = trace_body(step, [v.type for v in body.inputs], name=f"{body.name}_bounded")
    assert not consts, "a bounded step closes over nothing"
    return g


@while_p.def_vjp_fwd
def _while_vjp_fwd(primals, *, cond_body, body, num_consts, max_steps=None,
                   checkpoints=None):
    if max_steps is None:
        raise NotSupportedError(
            "reverse mode through a while loop needs a bound on its steps: pass "
            "`max_steps=N` (the gradient is then a checkpointed loop of N steps), use "
            "`sd.fori_loop` or `sd.scan` if the step count is known, or write the loop's "
            "result as the solution of an equation and differentiate that implicitly.",
            op="while")
    outs = while_p.bind(*primals, cond_body=cond_body, body=body, num_consts=num_consts,
                        **_extra(max_steps, checkpoints))
    return tuple(outs), primals


@while_p.def_vjp_bwd
def _while_vjp_bwd(primals, cts, *, cond_body, body, num_consts, max_steps=None,
                   checkpoints=None):
    nc, nk = num_consts, len(primals) - num_consts
    step = _bounded_step(cond_body, body, nc)
    schedule = checkpoints or Binomial(default_snapshots(max_steps))
    return _checkpointed_bwd(("checkpointed", primals), cts, step, nc, nk, max_steps, False,
                             schedule)


# -- batching (`sd.vmap`) ---------------------------------------------------------


@while_p.def_batch
def _while_batch(args, dims, *, cond_body, body, num_consts, max_steps=None,
                 checkpoints=None):
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
    outs = while_p.bind(*front_where(args, dims, flags, size), cond_body=gc, body=gb,
                        num_consts=nc, **_extra(max_steps, checkpoints))
    return list(outs), [0 if f else None for f in flags[nc:]]


def _per_example_loop(cond_body: Graph, body: Graph, flags, size: int, nc: int):
    """The predicate and body of a batched loop whose examples stop at
    different steps: `any(pred)`, and a step that updates only the examples
    whose predicate holds."""
    from .. import numpy as snp
    from ..graph._trace import trace_flat

    gc, _ = batch_body(cond_body, flags, size)
    gb, _ = batch_body(body, flags, size, [True] * (len(flags) - nc))
    types = tuple(gb.in_types)

    def pred(*a):
        return [snp.any(inline(gc, a)[0])]

    def step(*a):
        (p,) = inline(gc, a)
        new = inline(gb, a)
        return [snp.where(snp.reshape(p, (size,) + (1,) * (len(type_of(c).shape) - 1)), v, c)
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
    x, k = sd.while_loop(lambda s: abs(s[0] ** 2 - a) > 1e-12, newton, (a, 0),
                         max_steps=50)
    ```

    Forward mode (`sd.jvp`) works always. Reverse mode (`sd.grad`) needs
    `max_steps`: the gradient is then computed as that of a loop of
    `max_steps` steps that stop changing the carry once `cond_fun` turns
    false, checkpointed so that it stores at most `checkpoints` carries (a
    binomial schedule). Its cost grows with `max_steps`, not the steps run:
    give a tight bound. A loop whose result solves an equation is better
    differentiated implicitly than through its iterations.

    **Arguments:**

    - `cond_fun`: `val -> bool scalar`.
    - `body_fun`: `val -> val`, returning `init_val`'s structure, shapes and
        dtypes.
    - `init_val`: the initial value, a pytree of arrays.
    - `max_steps`: None, or an int bounding the steps. A loop still running
        after `max_steps` steps raises `sciad.errors.ConvergenceError` when
        the program runs.
    - `checkpoints`: reverse mode's schedule (an int or `sd.Binomial(s)`:
        at most `s` stored carries; or `sd.EveryK(k)`); by default
        `Binomial` with about log2(max_steps) snapshots. Needs `max_steps`.

    **Returns:**

    The final value.
    """
    op = "while_loop"
    for name, f in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(f):
            raise ShapeError(f"`{name}` must be a function, got {type(f).__name__}.", op=op)
    if max_steps is not None:
        if isinstance(max_steps, Tracer) or not isinstance(max_steps, (int, np.integer)) \
                or isinstance(max_steps, bool) or max_steps < 0:
            raise ShapeError(f"`max_steps` must be None or a Python int >= 0, got "
                             f"{max_steps!r}.", op=op)
        max_steps = int(max_steps)
    checkpoints = as_schedule(checkpoints, op)
    if checkpoints is not None and max_steps is None:
        raise ShapeError("`checkpoints` needs `max_steps` (reverse mode checkpoints a "
                         "loop of max_steps steps).", op=op)
    from ._cond import _leaf_types

    leaves, tree = _tree.tree_flatten(init_val, is_leaf=is_value_leaf)
    types = _leaf_types(leaves, "a leaf of `init_val`")
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
    gc = _with_unused_inputs(gc, nc, [type_of(c) for c in consts[nc:]])
    outs = while_p.bind(*consts, *leaves, cond_body=gc, body=gb, num_consts=len(consts),
                        **_extra(max_steps, checkpoints))
    return _tree.tree_unflatten(tree, list(outs))


# ---------------------------------------------------------------------------
# sparsity: the union of the carries' patterns over the steps, to its fixed
# point (the loop may stop after any step), interpreted at most
# `max_steps` times; dense past `SPARSITY_STEPS` iterations without one
# (`loop_sparsity`). The predicate selects a step count, not values.


@while_p.def_sparsity
def _while_sparsity(outs, *deps, cond_body, body, num_consts, max_steps=None,
                    checkpoints=None):
    from ..graph._sparsity import dense_all
    from ._control import loop_sparsity

    res = loop_sparsity(body, deps[:num_consts], deps[num_consts:], [], max_steps,
                        exact=False)
    return dense_all(outs, *deps) if res is None else res[0]


# ---------------------------------------------------------------------------
# cost (`sd.cost`)


@while_p.def_cost
def _while_cost(node, body):
    from ..graph._cost import Cost, steps_note

    p = node.params
    b, c = body(p["body"]), body(p["cond_body"])
    per = b.flops + c.flops
    n = p["max_steps"] if p.get("max_steps") is not None else None
    note = (f"at most {steps_note(n, per)}" if n is not None
            else f"{steps_note(None, per)}, trip count unknown")
    return Cost(per * (n if n is not None else 1), max(b.peak, c.peak), note)
