"""`sd.to_jax(f)`: a sciad function as a plain JAX function, with sciad's
derivatives.

The returned function traces `f` into a sciad graph once per input signature,
optimizes it and lowers it to JAX ops, so it can be used wherever JAX code
can: under `jax.jit`, `jax.vmap`, `jax.grad`, `jax.jvp`, inside optimistix
loops. Its derivatives are sciad's, never JAX's AD of the lowered ops:

- The function is a `jax.custom_jvp`. Its JVP rule runs the forward half of
  `vjp_graph(g)` (the outputs and the values the backward half needs) and
  applies the tangents through one JAX primitive, `sciad_linear`, which is
  linear in them.
- `sciad_linear` evaluates to the tangent outputs of `jvp_graph(g)` (forward
  mode, sciad's JVP rules), and its JAX transpose rule is the backward half
  of `vjp_graph(g)` on the saved values (reverse mode, sciad's VJP rules: a
  primitive's `def_vjp`, else the transpose of its JVP).
- Both halves are wrapped the same way in turn, so derivatives of any order
  (`jax.hessian`, `jax.jacfwd(jax.jacrev(f))`) stay sciad's.
- The derivative graphs are built per set of differentiated inputs (the
  JVP rule takes JAX's symbolic zeros): an input JAX does not differentiate
  is a constant to sciad too, so no rule forms a derivative with respect to
  it (`x ** c` with `c` an argument held fixed forms no `log(x)`, whose NaN
  at a negative `x` a second derivative would otherwise multiply by zero).
- Under `jax.vmap`, `sciad_linear` records the batch axes in its params and
  stays one linear primitive, so `jax.grad` of a function that vmaps `f`
  still transposes through sciad's backward graph.

A `jax.custom_vjp` would give reverse mode only (JAX refuses `jax.jvp` of
it); a linear primitive with a transpose rule gives JAX both directions
while reverse mode still runs sciad's own backward graph.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive as JaxPrimitive
from jax.interpreters import ad, batching, mlir

from . import config
from ._function import _as_program, partitioned
from ._traceback import api_boundary
from ._transforms import _jvp_emit
from .errors import NotSupportedError, SciadError, reraise
from .graph import (Graph, Literal, Zero, format_node, is_differentiable, lower, trace_flat, verify,
                    vjp_graph)
from .graph._types import holds_tuple, leaf_types
from .graph.passes import optimize, place_releases

_tree = jax.tree_util


# ---------------------------------------------------------------------------
# One graph as a JAX function with sciad's derivatives


def _flat_lower(graph: Graph) -> Callable:
    """`graph` lowered as a function of flat arrays: each value is the arrays
    of its type's `leaf_types` (one for a tensor or a sparse matrix's data,
    several for a factorization), inputs and outputs alike."""
    held = lower(graph)
    unheld = []  # (made on first use: the graph holding no compiled factor)
    in_sizes = [len(leaf_types(v.type)) for v in graph.inputs]
    out_kinds = [holds_tuple(a.type) for a in graph.outputs]

    def flat(*leaves):
        lowered = held
        if partitioned(leaves):  # (XLA partitions it: see `place_releases`)
            if not unheld:
                unheld.append(lower(place_releases(graph, hold=False)))
            lowered = unheld[0]
        args, i = [], 0
        for v, k in zip(graph.inputs, in_sizes):
            args.append(tuple(leaves[i:i + k]) if holds_tuple(v.type) else leaves[i])
            i += k
        out = []
        for o, is_factor in zip(lowered(*args), out_kinds):
            out.extend(o if is_factor else (o,))
        return out

    def run(*leaves):
        # one call that declares no effects where all are sciad's own: JAX
        # then dispatches a `jax.jit` of it from C++ (see `sciad._function`)
        return _as_program(flat, leaves)

    run.__name__ = graph.name
    return run


def _leaf_positions(values) -> tuple[list[int], int]:
    """The position of each value's first leaf, and the number of leaves."""
    starts, i = [], 0
    for v in values:
        starts.append(i)
        i += len(leaf_types(v.type))
    return starts, i


def _tangent_graph(graph: Graph, diff: list[int]) -> Graph:
    """`(*primals, *tangents of the inputs `diff`) -> tangents of the float and
    complex outputs` (a factorization output has none)."""
    n = len(graph.inputs)

    def fn(*args):
        tangents: list = [Zero(v.type.update()) for v in graph.inputs]
        for i, t in zip(diff, args[n:]):
            tangents[i] = t
        _, touts = _jvp_emit(graph, list(args[:n]), tangents, f"jvp_{graph.name}")
        return [t for t, a in zip(touts, graph.outputs) if is_differentiable(a.type)]

    in_types = list(graph.in_types) + [graph.inputs[i].type.update() for i in diff]
    g, _, _ = trace_flat(fn, tuple(in_types), name=f"tangent_{graph.name}")
    return g


class _GraphFn:
    """`graph` as a `jax.custom_jvp` of flat JAX arrays (`self.fn`): the
    leaves of its inputs (see `_flat_lower`) in, of its outputs out.

    The derivative graphs are built on first use, once for each set of
    inputs JAX differentiates (`wrt`, leaf positions): a function only ever
    differentiated in reverse mode never needs JVP rules beyond those its
    VJP derives from, and one only used forward never needs transpose rules.
    Hashed by identity: it is the `fn` param of `sciad_linear`.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        in_starts, self.n_in = _leaf_positions(graph.inputs)
        out_starts, self.n_out = _leaf_positions(graph.outputs)
        self.out_leaf_types = [t for a in graph.outputs for t in leaf_types(a.type)]
        # differentiable values are tensors or sparse data: one leaf each
        self.input_at = {in_starts[i]: i for i, v in enumerate(graph.inputs)
                         if is_differentiable(v.type)}
        self.diff_in = list(self.input_at)
        self.diff_out = [out_starts[i] for i, a in enumerate(graph.outputs)
                         if is_differentiable(a.type)]
        self.diff_out_types = [graph.outputs[i].type for i, a in enumerate(graph.outputs)
                               if is_differentiable(a.type)]
        self.run = jax.jit(_flat_lower(graph))
        self.fn = jax.custom_jvp(self._primal)
        self.fn.defjvp(self._jvp, symbolic_zeros=True)
        self._vjp: dict[tuple[int, ...], tuple] = {}
        self._tangent: dict[tuple[int, ...], tuple] = {}

    def _primal(self, *args):
        return self.run(*args)

    # -- derivative graphs, built once each ---------------------------------
    def _mask(self, wrt: tuple[int, ...]) -> list[bool]:
        """The graph inputs at the leaf positions `wrt`, flagged."""
        inputs = {self.input_at[i] for i in wrt}
        return [i in inputs for i in range(len(self.graph.inputs))]

    def vjp(self, wrt: tuple[int, ...]):
        """`(forward, backward, n_saved)` (two `_GraphFn`s) for the inputs at
        the leaf positions `wrt`, or the `SciadError` that building the VJP
        raised (re-raised only if reverse mode is used). The forward's
        results are the outputs' leaves, then the saved values' (a
        factorization saved for the backward pass is its arrays); the
        backward's, a cotangent per input in `wrt`."""
        if wrt not in self._vjp:
            try:
                v = vjp_graph(self.graph, self._mask(wrt))
                forward = optimize(v.forward)
                backward = optimize(v.backward)
                if config.enable_checks:
                    verify(forward)
                    verify(backward)
                # the forward half is a _GraphFn too: at second order (the
                # rule itself differentiated) its derivatives are sciad's
                self._vjp[wrt] = (_GraphFn(forward), _GraphFn(backward),
                                  _leaf_positions(forward.outputs)[1] - self.n_out)
            except SciadError as e:
                self._vjp[wrt] = (e,)
        return self._vjp[wrt]

    def tangent(self, wrt: tuple[int, ...]):
        """`(lowered, _GraphFn)` of the tangent map `(*primals, *tangents of
        the inputs at the leaf positions wrt) -> tangents of the float and
        complex outputs`, from `jvp_graph`."""
        if wrt not in self._tangent:
            t = optimize(_tangent_graph(self.graph, [self.input_at[i] for i in wrt]))
            if config.enable_checks:
                verify(t)
            self._tangent[wrt] = (_flat_lower(t), _GraphFn(t))
        return self._tangent[wrt]

    # -- the custom JVP rule -------------------------------------------------
    def _jvp(self, primals, tangents):
        primals = [_canonical(p) for p in primals]
        # JAX's symbolic zeros: the inputs it does not differentiate
        wrt = tuple(i for i in self.diff_in if type(tangents[i]) is not SymbolicZero)
        if not wrt or not self.diff_out:
            outs = self.run(*primals)
            return outs, [_zero_tangent(t.shape, t.dtype) for t in self.out_leaf_types]
        vjp = self.vjp(wrt)
        if isinstance(vjp[0], SciadError):
            outs, saved = self.run(*primals), []
        else:
            res = _raising(vjp[0].fn, primals)
            outs, saved = res[: self.n_out], res[self.n_out:]
        t_in = [_canonical(tangents[i]) for i in wrt]
        t_diff = iter(linear_p.bind(*primals, *saved, *t_in, fn=self, wrt=wrt,
                                    n_saved=len(saved), levels=()))
        diff_out = set(self.diff_out)
        touts = [next(t_diff) if i in diff_out else _zero_tangent(t.shape, t.dtype)
                 for i, t in enumerate(self.out_leaf_types)]
        return list(outs), touts


def _canonical(x):
    """A JAX value for `x`: JAX hands rules the caller's own NumPy values
    where it does not trace them, also as the value inside a `vmap` tracer
    (which a `custom_jvp` called with it then trips over, inside `jit`).
    `float0` zeros stay as they are."""
    if isinstance(x, jax.core.Tracer) and isinstance(getattr(x, "val", None), np.ndarray):
        return x + np.zeros((), x.dtype)  # the same values, as a JAX array
    if isinstance(x, (jax.Array, jax.core.Tracer)) or (
            isinstance(x, np.ndarray) and x.dtype == jax.dtypes.float0):
        return x
    return jnp.asarray(x)


def _raising(f: Callable, args):
    """`f(*args)`; where it runs here (not traced by an enclosing
    `jax.jit`), a failed run-time check is raised as the sciad error it
    names, not as JAX's runtime error carrying its text. (Under your own
    `jax.jit` the program runs after this returns: see `sciad.errors.unwrapped`.)"""
    try:
        out = f(*args)
        if not any(isinstance(a, jax.core.Tracer) for a in jax.tree_util.tree_leaves(args)):
            out = jax.block_until_ready(out)
        return out
    except Exception as e:
        reraise(e)


def _zero_tangent(shape, dtype):
    """The zero tangent JAX expects for an output of this dtype (`float0` for
    integers and booleans)."""
    if np.dtype(dtype).kind in "fc":
        return jnp.zeros(shape, dtype)
    return np.zeros(shape, jax.dtypes.float0)


# ---------------------------------------------------------------------------
# `sciad_linear`: the tangent map, linear in its last operands
#
# Operands: `(*primals, *saved, *tangents)`, tangents for the inputs
# differentiated only. Results: tangents of the float and complex outputs.
# Params: `fn` (the `_GraphFn`), `wrt` (the leaf positions of the inputs
# differentiated), `n_saved`, and `levels`, one
# `(in_axes, size)` per enclosing `jax.vmap`, innermost first; every result
# has the batch dimensions in front, outermost first.

linear_p = JaxPrimitive("sciad_linear")
linear_p.multiple_results = True


def _split(args, fn: _GraphFn, n_saved: int):
    a, b = fn.n_in, fn.n_in + n_saved
    return list(args[:a]), list(args[a:b]), list(args[b:])


def _vmapped(f: Callable, levels, pick: Callable) -> Callable:
    """`f` under one `jax.vmap` per level; `pick(in_axes)` selects the axes
    of the operands `f` takes."""
    for in_axes, size in levels:
        f = jax.vmap(f, in_axes=tuple(pick(in_axes)), out_axes=0, axis_size=size)
    return f


def _pick_primals_tangents(fn: _GraphFn, n_saved: int) -> Callable:
    def pick(axes):
        p, _, t = _split(axes, fn, n_saved)
        return p + t

    return pick


def _linear_impl(*args, fn: _GraphFn, wrt, n_saved: int, levels):
    p, _, t = _split(args, fn, n_saved)
    lowered, _ = fn.tangent(wrt)
    return _vmapped(lowered, levels, _pick_primals_tangents(fn, n_saved))(*p, *t)


def _linear_abstract_eval(*avals, fn: _GraphFn, wrt, n_saved: int, levels):
    prefix = tuple(size for _, size in reversed(levels))
    return [jax.core.ShapedArray(prefix + t.shape, t.dtype)
            for t in (leaf_types(u)[0] for u in fn.diff_out_types)]


def _linear_jvp(primals, tangents, *, fn: _GraphFn, wrt, n_saved: int, levels):
    # d[J(p) t] = J(p) dt + (dJ(p)[dp]) t: the JVP of the tangent map itself,
    # through its own sciad-derived wrapper. `saved` is a function of `p`, so
    # its tangents carry nothing new.
    params = dict(fn=fn, wrt=wrt, n_saved=n_saved, levels=levels)
    out = linear_p.bind(*primals, **params)
    p, saved, t = _split(primals, fn, n_saved)
    dp, _, dt = _split(tangents, fn, n_saved)
    if all(type(d) is ad.Zero for d in dp + dt):
        return out, [ad.Zero(jax.core.get_aval(o).to_tangent_aval()) for o in out]
    if all(type(d) is ad.Zero for d in dp):  # linear: J(p) dt
        return out, linear_p.bind(*p, *saved, *[ad.instantiate_zeros(d) for d in dt],
                                  **params)
    _, tangent_fn = fn.tangent(wrt)
    f = _vmapped(tangent_fn.fn, levels, _pick_primals_tangents(fn, n_saved))
    # only the operands with a tangent are differentiated: the others stay
    # constants (JAX's symbolic zeros), so the tangent map's own derivative
    # graphs leave them out (see `_GraphFn`)
    args, tans = p + t, dp + dt
    live = [i for i, d in enumerate(tans) if type(d) is not ad.Zero]

    def g(*xs):
        full = list(args)
        for i, x in zip(live, xs):
            full[i] = x
        return f(*full)

    _, tout = jax.jvp(g, tuple(args[i] for i in live), tuple(tans[i] for i in live))
    return out, list(tout)


def _linear_transpose(cts, *args, fn: _GraphFn, wrt, n_saved: int, levels):
    p, saved, t = _split(args, fn, n_saved)
    assert not any(ad.is_undefined_primal(x) for x in p + saved), (
        "sciad_linear is linear only in its tangent operands")
    # A tangent JAX knows (a zero for an argument not differentiated) gets no
    # cotangent.
    linear = [ad.is_undefined_primal(x) for x in t]
    if not any(linear) or all(type(c) is ad.Zero for c in cts):
        return [None] * len(args)
    vjp = fn.vjp(wrt)
    if isinstance(vjp[0], SciadError):
        raise vjp[0]
    _, backward, _ = vjp
    cts = [ad.instantiate_zeros(c) for c in cts]
    b = backward.fn
    for in_axes, size in levels:
        b = _vmap_transposed(b, in_axes, size, fn, n_saved, len(cts))
    t_cts = _raising(b, [*saved, *cts])
    return [None] * (fn.n_in + n_saved) + [c if lin else None
                                           for c, lin in zip(t_cts, linear)]


def _vmap_transposed(b: Callable, in_axes, size: int, fn: _GraphFn, n_saved: int,
                     n_cts: int) -> Callable:
    """One vmap level of the backward function: the saved values keep their
    axes, the cotangents are batched in front, and each tangent's cotangent
    goes to its tangent's axis (summed where the tangent was not batched:
    the transpose of a broadcast)."""
    _, s_axes, t_axes = _split(in_axes, fn, n_saved)
    vb = jax.vmap(b, in_axes=(*s_axes, *([0] * n_cts)), out_axes=0, axis_size=size)

    def f(*a):
        return [o.sum(0) if ax is None else jnp.moveaxis(o, 0, ax)
                for o, ax in zip(vb(*a), t_axes)]

    return f


def _linear_batch(args, dims, *, fn: _GraphFn, wrt, n_saved: int, levels):
    # `batching.not_mapped` is None; axes are stored non-negative
    dims = tuple(d % np.ndim(a) if isinstance(d, int) else None
                 for a, d in zip(args, dims))
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    outs = linear_p.bind(*args, fn=fn, wrt=wrt, n_saved=n_saved,
                         levels=levels + ((dims, size),))
    return outs, [0] * len(outs)


# Eager evaluation (a `jax.jvp` outside `jax.jit`) compiles once per
# (graph, levels) instead of dispatching the lowered ops one by one.
linear_p.def_impl(jax.jit(_linear_impl, static_argnames=("fn", "wrt", "n_saved", "levels")))
linear_p.def_abstract_eval(_linear_abstract_eval)
ad.primitive_jvps[linear_p] = _linear_jvp
ad.primitive_transposes[linear_p] = _linear_transpose
batching.primitive_batchers[linear_p] = _linear_batch
mlir.register_lowering(linear_p, mlir.lower_fun(_linear_impl, multiple_results=True))


# ---------------------------------------------------------------------------
# The public wrapper


def _not_canonical(graph: Graph) -> str | None:
    """The first value of `graph` whose dtype JAX would narrow (x64 off), as
    text, or None."""
    def bad(t) -> bool:
        dt = getattr(t, "dtype", None)
        return dt is not None and jax.dtypes.canonicalize_dtype(dt) != np.dtype(dt)

    for v in graph.inputs:
        if bad(v.type):
            return f"input {v.type.str_short()}"
    for node in graph.nodes:
        if any(bad(v.type) for v in node.outputs) or any(
                isinstance(a, Literal) and bad(a.type) for a in node.inputs):
            return format_node(node)
        for sub in node.subgraphs:  # (bodies, in params or tuples of them)
            found = _not_canonical(sub)
            if found is not None:
                return found
    for a in graph.outputs:
        if bad(a.type):
            return f"output {a.type.str_short()}"
    return None


class _ToJax:
    """The function `sd.to_jax(f)` returns; see there."""

    def __init__(self, f: Callable):
        self.fn = f
        self.graphs: list[Graph] = []  # one per traced signature, in order
        self._cache: dict[Any, tuple[_GraphFn, Any]] = {}
        self.__name__ = getattr(f, "__name__", "f")
        self.__qualname__ = getattr(f, "__qualname__", self.__name__)
        self.__doc__ = getattr(f, "__doc__", None)
        self.__wrapped__ = f

    def _compile(self, key, args, kwargs, leaves) -> tuple[_GraphFn, Any]:
        x64 = key[-1]
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        in_tree = _tree.tree_structure((args, kwargs))
        s_args, s_kwargs = _tree.tree_unflatten(in_tree, specs)
        graph, _, out_tree = trace_flat(self.fn, tuple(s_args), s_kwargs,
                                        name=self.__name__)
        verify(graph)
        graph = optimize(graph)
        if not x64:
            found = _not_canonical(graph)
            if found is not None:
                raise NotSupportedError(
                    f"`{self.__qualname__}` computes with 64-bit values, but JAX's "
                    "x64 mode is off here, so JAX would compute them in 32 bits. "
                    "Enable it (`with jax.enable_x64(True):` or "
                    "`jax.config.update('jax_enable_x64', True)`), or keep the "
                    "function in 32 bits (pass `dtype=` to constructors). First "
                    f"64-bit value: {found}", op="to_jax")
        entry = (_GraphFn(graph), out_tree)
        self.graphs.append(graph)
        self._cache[key] = entry
        return entry

    @api_boundary
    def __call__(self, *args, **kwargs):
        leaves, in_tree = _tree.tree_flatten((args, kwargs))
        leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves]
        x64 = config.x64_enabled()
        key = (in_tree, tuple((tuple(x.shape), np.dtype(x.dtype)) for x in leaves),
               bool(config.enable_checks), x64)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(key, args, kwargs, leaves)
        gfn, out_tree = entry
        return _tree.tree_unflatten(out_tree, list(_raising(gfn.fn, leaves)))

    @property
    def trace_count(self) -> int:
        """How many signatures have been traced so far."""
        return len(self._cache)

    def __repr__(self) -> str:
        return f"<sciad.to_jax {self.__qualname__!r}>"


def to_jax(f: Callable) -> Callable:
    """A sciad function as a plain JAX function, differentiated by sciad.

    **Arguments:**

    - `f`: a function of arrays (pytrees in and out) written with
      `sciad.numpy` and primitives.

    **Returns:**

    A function of JAX (or NumPy) arrays with `f`'s pytree structure in and
    out. Each new input signature (tree structure, shapes, dtypes and JAX's
    x64 mode) traces `f` once into a graph, optimizes and lowers it (the
    graphs are in `.graphs`). It composes with every JAX transform:

    - `jax.jit`, `jax.vmap`: the lowered ops are ordinary JAX ops.
    - `jax.grad`, `jax.vjp`, `jax.jacrev`: sciad's reverse mode, the backward
      half of `vjp_graph` (so a primitive's own `def_vjp` is what runs).
    - `jax.jvp`, `jax.jacfwd`, `jax.linearize`: sciad's forward mode,
      `jvp_graph`. Higher derivatives (`jax.hessian`) compose the two.

    Integer and boolean inputs and outputs carry no derivatives (JAX's
    `float0` tangents). Float64 follows JAX's x64 mode where the function is
    called: with it on (`with jax.enable_x64(True):`), float64 stays float64;
    with it off JAX has already made float inputs float32 and the graph is
    traced in float32, and a graph that would still compute in 64 bits raises
    `NotSupportedError`. Arrays of enclosing JAX traces cannot be closed over
    by `f`; pass them as arguments.

    **Example:**

    ```python
    import jax
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = sd.to_jax(lambda x: snp.sum(snp.sin(x) ** 2))
    jax.jit(jax.grad(f))(np.array([0.0, 1.0]))   # [0.         0.90929743]
    ```
    """
    if not callable(f):
        raise TypeError(f"to_jax: expected a function, got {f!r}.")
    return _ToJax(f)
