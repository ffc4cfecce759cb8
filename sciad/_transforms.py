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

from ._traceback import api_boundary
from ._function import function
from .errors import DTypeError, ShapeError
from .graph import Tracer, TensorType, Zero, instantiate, is_differentiable
from .graph._autodiff import jvp_eval, type_of, vjp_eval
from .graph._trace import current_builder, trace_flat

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
    outs, touts = jvp_eval(graph, list(p_leaves) + captured,
                           tans + [Zero(type_of(c).update()) for c in captured])
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
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ShapeError("`primals` and `tangents` must be tuples of arguments, got "
                         f"{type(primals).__name__} and {type(tangents).__name__}.", op="jvp")
    return _run(lambda p, t: _jvp_inline(f, p, t), tuple(primals), tuple(tangents))


# ---------------------------------------------------------------------------
# reverse mode


def _vjp_inline(f, primals: tuple, has_aux: bool):
    p_leaves, p_tree = _tree.tree_flatten(primals)
    graph, _, full_tree, captured = _trace(f, primals, "vjp")
    outs, backward = vjp_eval(graph, list(p_leaves) + captured)
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
        from . import numpy as snp

        grads = vjp_fn(snp.ones((), t.dtype))
        grads = grads[0] if isinstance(argnums, int) else grads
        return ((out, aux) if has_aux else out), grads
    return inline


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """A function returning `(f(*args), grad)`; see `sd.grad`. With
    `has_aux=True` it returns `((out, aux), grad)`."""
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
    """
    vg = _value_and_grad_inline(f, argnums, has_aux, "grad")

    def inline(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return _Transformed(inline, f, "grad")


def hvp(f: Callable, x, v):
    """The Hessian-vector product `H(x) v` of a real scalar `f`, as the JVP of
    its gradient (forward over reverse)."""
    return jvp(grad(f), (x,), (v,))[1]


# ---------------------------------------------------------------------------
# Jacobians


def _basis(t: TensorType):
    """The `t.size` unit vectors of type `t`, as constants."""
    eye = np.eye(t.size, dtype=t.dtype)
    return [eye[i].reshape(t.shape) for i in range(t.size)]


def _stack_leaves(rows: list, out_shape: tuple, in_shape: tuple, axis: int, dtype):
    from . import numpy as snp

    if not rows:
        return snp.zeros(out_shape + in_shape, dtype)
    return snp.reshape(snp.stack(rows, axis=axis), out_shape + in_shape)


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

    def g(xi):
        full = list(args)
        full[i] = xi
        return f(*full)

    graph, _, out_tree, captured = _trace(g, (x,), op)
    return x, type_of(x), graph, out_tree, captured


def jacfwd(f: Callable, argnums: int = 0):
    """The Jacobian by forward mode: one JVP per input element. For an input
    of shape `I` and output of shape `O` the Jacobian has shape `O + I`."""

    def inline(*args):
        x, tx, graph, out_tree, captured = _jacobian_setup(f, argnums, args, "jacfwd")
        cols = []
        for e in _basis(tx):
            _, touts = jvp_eval(graph, [x] + captured,
                                [e] + [Zero(type_of(c).update()) for c in captured])
            cols.append([instantiate(t) for t in touts])
        leaves = [_stack_leaves([c[k] for c in cols], a.type.shape, tx.shape, -1,
                                a.type.dtype) for k, a in enumerate(graph.outputs)]
        return _tree.tree_unflatten(out_tree, leaves)

    return _Transformed(inline, f, "jacfwd")


def jacrev(f: Callable, argnums: int = 0):
    """The Jacobian by reverse mode: one backward pass per output element.
    For an input of shape `I` and output of shape `O` it has shape `O + I`."""

    def inline(*args):
        x, tx, graph, out_tree, captured = _jacobian_setup(f, argnums, args, "jacrev")
        outs, backward = vjp_eval(graph, [x] + captured)
        leaves = []
        for k, o in enumerate(outs):
            to = type_of(o)
            rows = []
            for e in _basis(to):
                cts = [Zero(type_of(a).update()) for a in outs]
                cts[k] = e
                rows.append(instantiate(backward(cts)[0]))
            leaves.append(_stack_leaves(rows, to.shape, tx.shape, 0, tx.dtype))
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
    from .graph._batch import batch_graph, batched_front

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
    from . import numpy as snp

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
    whole-batch computation (a primitive without one runs one example at a
    time, with a warning), so the batched program is an ordinary graph:
    it prints, differentiates, optimizes and lowers.

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
      with a `NamedSharding`), else `jax.set_mesh`'s.

    **Returns:**

    The batched function.
    """
    if spmd_axis_name is not None and not isinstance(spmd_axis_name, str):
        raise ShapeError(f"`spmd_axis_name` must be a mesh axis name (a str), got "
                         f"{spmd_axis_name!r}.", op="vmap")

    def inline(*args):
        return _vmap_inline(f, in_axes, out_axes, args, spmd_axis_name)

    inline.__name__ = f"vmap_{getattr(f, '__name__', 'f')}"
    return _Transformed(inline, f, "vmap")
