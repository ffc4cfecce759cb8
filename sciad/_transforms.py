"""The user-facing derivative transforms: `jvp`, `vjp`, `grad`,
`value_and_grad`, `hvp`, `jacfwd`, `jacrev`.

Each traces the user's function into a graph and emits its forward- or
reverse-mode derivative with sciad's graph transforms. Inside a trace (for
example under `sd.function`, `sd.trace` or another transform) the
derivative's nodes go into the enclosing graph, so transforms compose:
`sd.grad(sd.grad(f))`, `sd.jvp(sd.grad(f), ...)`, `sd.jacfwd(sd.jacrev(f))`.
Called on concrete arrays, a transformed function is compiled with
`sd.function` (cached per signature) and run.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from . import numpy as snp
from ._function import function
from ._traceback import api_boundary
from .errors import DTypeError, ShapeError
from .graph import Tracer, TensorType, Zero, instantiate, is_differentiable
from .graph._autodiff import jvp_eval, type_of, vjp_eval
from .graph._batch import batch_graph, batched_front
from .graph._trace import current_builder, trace_flat
from .primitives._jacobian import (batched_map, checks_cotangents, forward_checks, jacobian_leaf,
                                   keep)
from .primitives._stop_gradient import stop_gradient_p

_tree = jax.tree_util


def _in_trace(tree) -> bool:
    return current_builder() is not None or any(
        isinstance(x, Tracer) for x in _tree.tree_leaves(tree))


def _trace(f: Callable, args: tuple, op: str):
    graph, in_tree, out_tree, captured = trace_flat(
        f, tuple(args), closure=True, name=getattr(f, "__name__", op))
    return graph, in_tree, out_tree, list(captured)


def _argnums(argnums, n: int, op: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for i in nums:
        if not -n <= i < n:
            raise ShapeError(f"argnums {argnums} is out of range for {n} positional "
                             "arguments.", op=op)
    return tuple(i % n for i in nums)


def _check_like(primal, t, op: str, what: str, of: str) -> None:
    """A tangent (`what="tangent"`) or cotangent `t` must have the shape and
    dtype of `primal`, its primal or output (`of`): a wrong shape is a
    `ShapeError`, a wrong dtype (float32 for a float64 value) a `DTypeError`."""
    tp, tt = type_of(primal), type_of(t)
    if tp.shape != tt.shape:
        raise ShapeError(f"a {what} must have its {of}'s shape: {of} {tp.str_short()}, "
                         f"{what} {tt.str_short()}.", op=op)
    if tp.dtype != tt.dtype:
        raise DTypeError(f"a {what} must have its {of}'s dtype: {of} {tp.str_short()} "
                         f"needs a {tp.dtype} {what}, got {tt.str_short()}. Convert it "
                         f"with `.astype(np.{tp.dtype.name})`.", op=op)


def _check_differentiable(tree, op: str, what: str) -> None:
    for leaf in _tree.tree_leaves(tree):
        t = type_of(leaf)
        if not is_differentiable(t):
            raise DTypeError(f"{what} must be float or complex arrays to differentiate with "
                             f"respect to them, got {t.str_short()}. Convert with "
                             "`.astype(float)`, or leave it out of `argnums`.", op=op)


class _Transformed:
    """A derivative of a user function: emits its graph when traced, runs
    compiled (cached per signature) on concrete arrays."""

    def __init__(self, inline: Callable, fn: Callable, kind: str):
        self._inline = inline
        self._compiled = None
        self.__wrapped__ = fn
        self.__name__ = f"{kind}_{getattr(fn, '__name__', 'f')}"
        self.__doc__ = f"The {kind} of `{getattr(fn, '__qualname__', fn)}` (sciad)."

    @api_boundary
    def __call__(self, *args, **kwargs):
        if _in_trace((args, kwargs)):
            return self._inline(*args, **kwargs)
        if self._compiled is None:
            self._compiled = function(self._inline)
        return self._compiled(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sciad {self.__name__}>"


def _run(inline: Callable, *args):
    """`inline(*args)` in the current trace, or compiled once on arrays."""
    if _in_trace(args):
        return inline(*args)
    return function(inline)(*args)


# ---------------------------------------------------------------------------
# forward mode


def _jvp_emit(graph, primals: list, tangents: list, name: str):
    """`jvp_eval(graph, primals, tangents)` with forward mode's gauge checks
    (`forward_checks`). The tangents of float and complex outputs are
    instantiated; the others (a factorization's) are `Zero`s.

    The JVP is emitted directly; only where it emitted a node that checks
    its cotangents is the tangent map traced again on its own (as a graph
    to transpose: its nodes merge with the emitted ones in `cse`)."""
    live = [i for i, t in enumerate(tangents) if not isinstance(t, Zero)]
    diff = [is_differentiable(a.type) for a in graph.outputs]

    def instantiated(touts):
        return [instantiate(t) if d else Zero(a.type.update())
                for t, d, a in zip(touts, diff, graph.outputs)]

    builder = current_builder()
    start = len(builder.nodes)
    outs, touts = jvp_eval(graph, primals, tangents)
    touts = instantiated(touts)
    if not live or not checks_cotangents(builder.nodes[start:]):
        return outs, touts

    def tangent_map(*ts):
        full = list(tangents)
        for i, t in zip(live, ts):
            full[i] = t
        return [t for t, d in zip(instantiated(jvp_eval(graph, primals, full)[1]), diff)
                if d]

    lin, _, _, captured = trace_flat(tangent_map, tuple(tangents[i] for i in live),
                                     closure=True, name=name)
    kept = iter(keep([t for t, d in zip(touts, diff) if d],
                     forward_checks(lin, len(live), list(captured))))
    return outs, [next(kept) if d else t for t, d in zip(touts, diff)]


def _jvp_inline(f, primals: tuple, tangents: tuple):
    p_leaves, p_tree = _tree.tree_flatten(primals)
    t_leaves, t_tree = _tree.tree_flatten(tangents)
    if p_tree != t_tree:
        raise ShapeError(f"`primals` and `tangents` must have the same structure, got "
                         f"{p_tree} and {t_tree}.", op="jvp")
    for p, t in zip(p_leaves, t_leaves):
        if is_differentiable(type_of(p)):
            _check_like(p, t, "jvp", "tangent", "primal")
    graph, _, out_tree, captured = _trace(f, primals, "jvp")
    tans = [t if is_differentiable(type_of(p)) else Zero(type_of(p).update())
            for p, t in zip(p_leaves, t_leaves)]
    outs, touts = _jvp_emit(graph, list(p_leaves) + captured,
                            tans + [Zero(type_of(c).update()) for c in captured],
                            f"jvp_{graph.name}")
    return (_tree.tree_unflatten(out_tree, outs),
            _tree.tree_unflatten(out_tree, [instantiate(t) for t in touts]))


def jvp(f: Callable, primals: Sequence, tangents: Sequence):
    """Forward mode: `(f(*primals), J(primals) @ tangents)`.

    **Arguments:**

    - `f`: a function of arrays (pytrees in and out) written with
      `sciad.numpy` and primitives.
    - `primals`: a tuple of `f`'s positional arguments.
    - `tangents`: a tuple of the same structure, each leaf with its primal's
      shape and dtype (integer and boolean leaves are not differentiated).

    **Returns:**

    `(out, tangent_out)`, two pytrees of `f`'s output structure.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)
    out, tangent = sd.jvp(f, (np.array([0.0, 1.0]),), (np.array([1.0, 1.0]),))
    float(tangent)                            # 0.9092974268256818
    ```
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ShapeError("`primals` and `tangents` must be tuples of arguments, got "
                         f"{type(primals).__name__} and {type(tangents).__name__}.", op="jvp")
    return _run(lambda p, t: _jvp_inline(f, p, t), tuple(primals), tuple(tangents))


# ---------------------------------------------------------------------------
# reverse mode


def _traced(leaves: list) -> list:
    """The float leaves given as constants, as values of the current trace:
    a reverse pass emitted inside another trace (`sd.grad(g)(0.7)` in a
    traced function) hands its rules their primals, and rules that form
    cotangents only for traced operands (a constant matrix needs none)
    would otherwise give none for the very arguments being differentiated."""
    if current_builder() is None:
        return leaves
    out = []
    for x in leaves:
        if not isinstance(x, Tracer):
            a = snp.asarray(x)
            if np.dtype(a.dtype).kind in "fc":
                x = stop_gradient_p.bind(a)  # (a constant: no outer derivative to stop)
        out.append(x)
    return out


def _vjp_inline(f, primals: tuple, has_aux: bool):
    p_leaves, p_tree = _tree.tree_flatten(primals)
    graph, _, full_tree, captured = _trace(f, primals, "vjp")
    # values closed over are held fixed: no rule forms their cotangents
    outs, backward = vjp_eval(graph, _traced(list(p_leaves)) + captured,
                              [True] * len(p_leaves) + [False] * len(captured))
    if has_aux:
        kids = full_tree.children() if full_tree.num_nodes > 1 else []
        if len(kids) != 2:
            raise ShapeError("with `has_aux=True`, `f` must return a pair (output, aux).",
                             op="vjp")
        out_tree, aux_tree = kids
        n = out_tree.num_leaves
        aux = _tree.tree_unflatten(aux_tree, outs[n:])
        outs = outs[:n]
    else:
        out_tree, aux, n = full_tree, None, len(outs)
    out = _tree.tree_unflatten(out_tree, outs)
    n_all = len(graph.outputs)

    def vjp_fn(ct):
        ct_leaves, ct_tree = _tree.tree_flatten(ct)
        if ct_tree != out_tree:
            raise ShapeError(f"the cotangent must have the output's structure {out_tree}, "
                             f"got {ct_tree}.", op="vjp")
        cts = []
        for o, c in zip(outs, ct_leaves):
            _check_like(o, c, "vjp", "cotangent", "output")
            to = type_of(o)
            cts.append(c if is_differentiable(to) else Zero(to.update()))
        cts += [Zero(a.type.update()) for a in graph.outputs[n:n_all]]  # aux: no ct
        in_cts = backward(cts)[: len(p_leaves)]
        return _tree.tree_unflatten(p_tree, [instantiate(c) for c in in_cts])

    return out, vjp_fn, aux


def vjp(f: Callable, *primals, has_aux: bool = False):
    """Reverse mode: `(f(*primals), vjp_fn)` with `vjp_fn(ct) = ct @ J`, a tuple
    with one cotangent per primal (integer leaves get zeros).

    Inside a trace, `vjp_fn` emits the backward part into the same graph and
    must be called in that trace. On concrete arrays `vjp_fn` is compiled and
    recomputes the forward part. With `has_aux=True`, `f` returns
    `(out, aux)` and the result is `(out, vjp_fn, aux)`.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)
    out, pullback = sd.vjp(f, np.array([0.0, 1.0]))
    pullback(1.0)[0]                          # [0.         0.90929743]
    ```
    """
    if has_aux and not _in_trace(primals):
        raise ShapeError("`has_aux=True` is supported inside traced functions; on "
                         "arrays use `sd.value_and_grad(f, has_aux=True)`.", op="vjp")
    if _in_trace(primals):
        out, vjp_fn, aux = _vjp_inline(f, primals, has_aux)
        return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
    out = function(f)(*primals)

    def vjp_fn(ct):
        return function(lambda p, c: _vjp_inline(f, p, False)[1](c))(primals, ct)

    return out, vjp_fn


def _value_and_grad_inline(f, argnums, has_aux: bool, op: str):
    def inline(*args, **kwargs):
        nums = _argnums(argnums, len(args), op)
        diff = tuple(args[i] for i in nums)
        _check_differentiable(diff, op, "the arguments in `argnums`")

        def g(*d):
            full = list(args)
            for i, v in zip(nums, d):
                full[i] = v
            return f(*full, **kwargs)

        out, vjp_fn, aux = _vjp_inline(g, diff, has_aux)
        t = type_of(out) if not isinstance(out, (tuple, list, dict)) else None
        if t is None or t.shape != () or t.dtype.kind != "f":
            shown = t.str_short() if t is not None else type(out).__name__
            raise ShapeError(f"needs `f` to return a real scalar, got {shown}. For other "
                             "outputs use `sd.vjp` or `sd.jacrev`.", op=op)

        grads = vjp_fn(snp.ones((), t.dtype))
        grads = grads[0] if isinstance(argnums, int) else grads
        return ((out, aux) if has_aux else out), grads
    return inline


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """A function returning `(f(*args), grad)`; see `sd.grad`. With
    `has_aux=True` it returns `((out, aux), grad)`.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)
    value, g = sd.value_and_grad(f)(np.array([0.0, 1.0]))
    float(value)                              # 0.7080734182735712
    g                                         # [0.         0.90929743]
    ```
    """
    return _Transformed(_value_and_grad_inline(f, argnums, has_aux, "value_and_grad"), f,
                        "value_and_grad")


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """The gradient of a real scalar function.

    **Arguments:**

    - `f`: returns a real scalar (with `has_aux=True`, a pair `(scalar, aux)`).
    - `argnums`: which positional argument(s) to differentiate: an int gives
      that argument's gradient, a tuple a tuple of gradients. They must be
      float or complex (complex follows JAX: `grad(|z|^2)(z) = 2 conj(z)`).

    **Returns:**

    A function of `f`'s arguments returning the gradient (a pytree like the
    argument), or `(grad, aux)` with `has_aux=True`. Traceable and
    composable: `sd.grad(sd.grad(f))`, `sd.trace(sd.grad(f), x)`.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)
    sd.grad(f)(np.array([0.0, 1.0]))          # [0.         0.90929743]
    ```
    """
    vg = _value_and_grad_inline(f, argnums, has_aux, "grad")

    def inline(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return _Transformed(inline, f, "grad")


def hvp(f: Callable, x, v):
    """The Hessian-vector product `H(x) v` of a real scalar `f`, as the JVP of
    its gradient (forward over reverse).

    For many directions at one point (a randomized eigensolver's block,
    Lanczos, Newton-CG), batch them: `sd.vmap(lambda v: sd.hvp(f, x, v))(V)`
    runs what does not depend on `v` (`f`'s computation and its reverse
    pass) once for the block and only each direction's own derivative passes
    per direction: for a sparse `slogdet`, 6 factorizations' worth of work a
    direction against 9 for one product alone.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)
    sd.hvp(f, np.array([0.0, 1.0]), np.array([1.0, 0.0]))   # [2. 0.]
    ```
    """
    return jvp(grad(f), (x,), (v,))[1]


# ---------------------------------------------------------------------------
# Jacobians
#
# A Jacobian is one batched derivative, not one derivative per basis vector:
# the tangent map `t -> J t` (jacfwd) or the cotangent map `c -> c J` of an
# output (jacrev) is traced once as a graph, and that graph is batched
# (`batch_graph`, the transform behind `sd.vmap`) over the identity basis.
# The primal computation in it does not depend on the basis, so it is
# emitted once, unbatched; the derivative nodes become whole-batch
# operations (a matmul becomes one matmul with an extra axis, a solve one
# solve with many right-hand sides). The graph grows with the program, not
# with the size of the Jacobian.


def _jacobian_setup(f, argnums, args, op: str):
    """Traces `f` as a function of its argument `argnums` (one array); the
    other arguments are held fixed (captured)."""
    if not isinstance(argnums, int):
        raise ShapeError(f"{op} takes a single int `argnums`.", op=op)
    (i,) = _argnums(argnums, len(args), op)
    x = args[i]
    if not isinstance(x, Tracer) and not hasattr(x, "shape") and not isinstance(
            x, (int, float, complex)):
        raise ShapeError(f"the argument in `argnums` must be one array, got "
                         f"{type(x).__name__}.", op=op)
    _check_differentiable(x, op, "the argument in `argnums`")
    if not isinstance(type_of(x), TensorType):
        raise ShapeError(f"the argument in `argnums` must be a dense array, got "
                         f"{type_of(x).str_short()}. For a sparse matrix, differentiate "
                         "with respect to the array of its values.", op=op)

    def g(xi):
        full = list(args)
        full[i] = xi
        return f(*full)

    graph, _, out_tree, captured = _trace(g, (x,), op)
    for a in graph.outputs:
        if not isinstance(a.type, TensorType):
            raise ShapeError(f"{op} needs `f` to return arrays, got an output of type "
                             f"{a.type.str_short()}.", op=op)
    return x, type_of(x), graph, out_tree, captured


def jacfwd(f: Callable, argnums: int = 0):
    """The Jacobian of `f` with respect to its argument `argnums`, by forward
    mode.

    Computed as one batched JVP: the tangent map `t -> J t` is traced once
    and batched over the `n` unit vectors of the input (as `sd.vmap` does),
    so the graph has the size of one JVP, whatever `n`. Best when the input
    has fewer elements than the outputs.

    **Arguments:**

    - `f`: a function of arrays returning an array or a pytree of arrays.
    - `argnums`: the position (an int) of the argument to differentiate, one
      float or complex array; the other arguments are held fixed.

    **Returns:**

    A function of `f`'s arguments returning the Jacobian: for an input of
    shape `I`, a pytree like `f`'s output with a leaf of shape `O + I` for
    each output leaf of shape `O` (zeros where the output does not depend on
    the input).

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    sd.jacfwd(snp.sin)(np.array([0.0, 1.0]))  # [[1. 0.] [0. 0.54030231]]
    ```
    """

    def inline(*args):
        x, tx, graph, out_tree, captured = _jacobian_setup(f, argnums, args, "jacfwd")
        zeros = [Zero(type_of(c).update()) for c in captured]

        def tangents(t):
            return jvp_eval(graph, [x] + captured, [t] + zeros)[1]

        cols = (batched_map(tangents, tx.update(), "jacfwd_tangents", forward=True)
                if tx.size
                else [None] * len(graph.outputs))
        leaves = []
        for a, col in zip(graph.outputs, cols):
            shape = tuple(a.type.shape) + tuple(tx.shape)
            leaves.append(snp.zeros(shape, a.type.dtype) if col is None else
                          jacobian_leaf(*col, tx.size, a.type.shape, tx.shape, rows=False))
        return _tree.tree_unflatten(out_tree, leaves)

    return _Transformed(inline, f, "jacfwd")


def jacrev(f: Callable, argnums: int = 0):
    """The Jacobian of `f` with respect to its argument `argnums`, by reverse
    mode.

    Computed as one forward pass and one batched backward pass per output
    leaf: the cotangent map `c -> c J` of the output is traced once and
    batched over the output's `m` unit vectors (as `sd.vmap` does), so the
    graph has the size of one VJP, whatever `m`. Best when the outputs have
    fewer elements than the input.

    **Arguments:**

    - `f`: a function of arrays returning an array or a pytree of arrays.
    - `argnums`: the position (an int) of the argument to differentiate, one
      float or complex array; the other arguments are held fixed.

    **Returns:**

    A function of `f`'s arguments returning the Jacobian: for an input of
    shape `I`, a pytree like `f`'s output with a leaf of shape `O + I` for
    each output leaf of shape `O` (zeros where the output does not depend on
    the input).

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    sd.jacrev(snp.sin)(np.array([0.0, 1.0]))  # [[1. 0.] [0. 0.54030231]]
    ```
    """

    def inline(*args):
        x, tx, graph, out_tree, captured = _jacobian_setup(f, argnums, args, "jacrev")
        outs, backward = vjp_eval(graph, _traced([x]) + captured,
                                  [True] + [False] * len(captured))

        leaves = []
        for k, o in enumerate(outs):
            to = type_of(o)
            row = None
            if to.size and tx.size and is_differentiable(to):

                def cotangent(c, k=k):
                    cts = [Zero(type_of(a).update()) for a in outs]
                    cts[k] = c
                    return [backward(cts)[0]]

                (row,) = batched_map(cotangent, to.update(), "jacrev_cotangents")
            shape = tuple(to.shape) + tuple(tx.shape)
            leaves.append(snp.zeros(shape, tx.dtype) if row is None else
                          jacobian_leaf(*row, to.size, to.shape, tx.shape, rows=True))
        return _tree.tree_unflatten(out_tree, leaves)

    return _Transformed(inline, f, "jacrev")


# ---------------------------------------------------------------------------
# batching


def _axes_for(axes, tree, what: str) -> list:
    """`axes` (an int, None, or a pytree prefix of `tree`) as one axis per
    leaf of `tree`, in `jax.tree_util` order."""
    out: list = []

    def walk(a, sub):
        if a is None or isinstance(a, (int, np.integer)):
            out.extend([None if a is None else int(a)] * len(_tree.tree_leaves(sub)))
        elif isinstance(a, (tuple, list)) and isinstance(sub, (tuple, list)) and \
                len(a) == len(sub):
            for x, y in zip(a, sub):
                walk(x, y)
        elif isinstance(a, dict) and isinstance(sub, dict) and set(a) == set(sub):
            for k in sorted(sub):
                walk(a[k], sub[k])
        else:
            raise ShapeError(f"`{what}` must be an int, None, or a pytree prefix of "
                             f"{_tree.tree_structure(tree)}, got {axes!r}.", op="vmap")

    walk(axes, tree)
    return out


def _vmap_inline(f, in_axes, out_axes, args: tuple, spmd_axis_name=None):
    leaves = _tree.tree_leaves(args)
    axes = _axes_for(in_axes, args, "in_axes")
    per, dims, size = [], [], None
    for x, a in zip(leaves, axes):
        t = type_of(x)
        if a is None:
            per.append(x)
            dims.append(None)
            continue
        if not isinstance(t, TensorType) or not -len(t.shape) <= a < len(t.shape):
            raise ShapeError(f"in_axes {a} does not exist in an argument of type "
                             f"{t.str_short() if hasattr(t, 'str_short') else t}.", op="vmap")
        a %= len(t.shape)
        if size is None:
            size = t.shape[a]
        elif t.shape[a] != size:
            raise ShapeError(f"the mapped axes have different sizes: {size} and "
                             f"{t.shape[a]} (an argument of type {t.str_short()}).", op="vmap")
        per.append(TensorType(t.shape[:a] + t.shape[a + 1:], t.dtype))
        dims.append(a)
    if size is None:
        raise ShapeError("vmap needs at least one mapped argument (in_axes all None).",
                         op="vmap")
    per_args = _tree.tree_unflatten(_tree.tree_structure(args), per)
    graph, _, out_tree, captured = trace_flat(f, tuple(per_args), closure=True,
                                              name=getattr(f, "__name__", "vmap"))
    outs = batch_graph(graph, list(leaves) + captured, dims + [None] * len(captured),
                       spmd_axis_name)
    o_axes = _axes_for(out_axes, _tree.tree_unflatten(out_tree, [0] * len(outs)),
                       "out_axes")

    result = []
    for (v, d), a in zip(outs, o_axes):
        if a is None:
            if d is not None:
                raise ShapeError("out_axes=None for an output that depends on the mapped "
                                 "arguments.", op="vmap")
            result.append(v)
            continue
        v = batched_front(v, d, size)
        result.append(snp.moveaxis(v, 0, a) if a != 0 else v)
    return _tree.tree_unflatten(out_tree, result)


def vmap(f: Callable, in_axes=0, out_axes=0, *, spmd_axis_name: str | None = None):
    """The batched `f`: maps `f` over an axis of its arguments, as
    `jax.vmap`, as a graph transform. `f` is traced once on one example's
    shapes, and every node of its graph is replaced by its batch rule's
    whole-batch computation (a primitive without one is one `map` node,
    `jax.vmap` of its implementation, with a warning), so the batched
    program is an ordinary graph: it prints, differentiates, optimizes and
    lowers.

    **Arguments:**

    - `f`: a function of arrays (pytrees in and out).
    - `in_axes`: the mapped axis of each argument: an int, None (not
      mapped), or a tuple with one entry (int, None or a pytree prefix) per
      positional argument.
    - `out_axes`: where the batch axis goes in each output (an int, None for
      outputs that do not depend on the mapped arguments, or a pytree prefix
      of the outputs).
    - `spmd_axis_name`: the axis of a device mesh that the batch is split
      over (as in `jax.vmap`). The batched solves, factorizations and other
      `map` nodes then run under `jax.shard_map`: each device handles its
      own examples, host-call solves included, and the batch size must be a
      multiple of the axis' device count. The mesh is the one the arguments
      are sharded over (`sd.function(..., in_shardings=...)` or arrays put
      with a `NamedSharding`), else `jax.set_mesh`'s; with no mesh at all
      it runs on one device, so one script serves one device and many. With
      a shared matrix (`in_axes=(None, 0)`), each device factors it once
      and solves its own right-hand sides.

    **Returns:**

    The batched function.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = lambda x: snp.sum(snp.sin(x) ** 2)   # one example: a vector
    X = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]])
    sd.vmap(f)(X)                             # [0.70807342 1.53489523 0.84673667]
    ```
    """
    if spmd_axis_name is not None and not isinstance(spmd_axis_name, str):
        raise ShapeError(f"`spmd_axis_name` must be a mesh axis name (a str), got "
                         f"{spmd_axis_name!r}.", op="vmap")

    def inline(*args):
        return _vmap_inline(f, in_axes, out_axes, args, spmd_axis_name)

    inline.__name__ = f"vmap_{getattr(f, '__name__', 'f')}"
    return _Transformed(inline, f, "vmap")
