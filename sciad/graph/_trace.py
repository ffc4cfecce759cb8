"""Tracing: run a Python function on `Tracer`s and record a `Graph`.

A `Tracer` stands for a `Var` of the graph being built. Operators on it
(`+`, `@`, indexing, ...) are installed by `sciad.numpy`, which turns them
into primitive applications; `Primitive.bind` records each as a `Node`.
Outside any trace, `bind` runs the primitive's implementation eagerly.
"""

from __future__ import annotations

import inspect
import re
import threading
from typing import Callable, Sequence

import jax
import numpy as np

from .. import config
from .._traceback import api_boundary
from ..config import x64_scope
from ..errors import DTypeError, MissingRuleError, SciadError, TracerError, reraise
from ._core import Graph, Literal, Node, Primitive, Var
from ._lower import Site
from ._source import SourceInfo, source_from_traceback, user_source
from ._types import AbstractType, SparseArray, SparseType, TensorType


class _State(threading.local):
    def __init__(self):
        self.stack: list[GraphBuilder] = []
        # the source of the node the AD transforms are emitting nodes for
        self.source: SourceInfo | None = None


_state = _State()


class emitting_for:
    """`with emitting_for(node.source):` attributes what is recorded inside
    to that node.

    The AD transforms emit nodes on behalf of a node of the graph they
    differentiate: its re-emission, and the nodes of its JVP, VJP and
    transpose rules. The innermost user frame is then the line that called
    `sd.grad(f)(x)`, so those nodes would all point there; instead they (and
    the sciad errors raised while they are recorded) carry the source of the
    node they stand for, the line in `f`. A `None` source (a graph built by
    hand) leaves the enclosing one in place.
    """

    __slots__ = ("source", "_outer")

    def __init__(self, source: SourceInfo | None):
        self.source = source

    def __enter__(self) -> None:
        self._outer = _state.source
        if self.source is not None:
            _state.source = self.source

    def __exit__(self, typ, err, tb) -> bool:
        _state.source = self._outer
        if isinstance(err, SciadError) and self.source is not None:
            err.with_source(self.source)
        return False


def current_source() -> SourceInfo | None:
    """The source of a node recorded now: the node being differentiated (see
    `emitting_for`), else the innermost user frame."""
    return _state.source or user_source()


class GraphBuilder:
    """Collects the nodes of one graph while its function runs.

    A traced value of an enclosing trace that is still running (a closure
    over an outer function's variable) is *captured*: it becomes an extra
    input of this graph, listed in `captured` with the outer tracer it
    stands for, so the caller can pass it in.
    """

    __slots__ = ("name", "inputs", "nodes", "alive", "captured", "_capture_map")

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Var] = []
        self.nodes: list[Node] = []
        self.alive = True
        self.captured: list[tuple["Tracer", Var]] = []
        self._capture_map: dict[int, Var] = {}

    def new_input(self, type: AbstractType, hint: str | None = None) -> "Tracer":
        var = Var(type, hint)
        self.inputs.append(var)
        return Tracer(self, var)

    def atom(self, x, op: str):
        """The operand `x` as a `Var` of this graph or a `Literal`."""
        if isinstance(x, Tracer):
            if x._builder is self:
                return x._var
            if x._builder.alive and x._builder in _state.stack:
                var = self._capture_map.get(id(x._var))
                if var is None:
                    var = Var(x._var.type, x._var.hint)
                    self._capture_map[id(x._var)] = var
                    self.captured.append((x, var))
                return var
            raise _foreign_tracer(x, op)
        return literal_of(x, op)

    def build(self, outputs: Sequence, op: str = "trace") -> Graph:
        outs = tuple(self.atom(o, op) for o in outputs)
        inputs = tuple(self.inputs) + tuple(v for _, v in self.captured)
        return Graph(inputs, tuple(self.nodes), outs, self.name)


def _foreign_tracer(x: "Tracer", op: str) -> TracerError:
    return TracerError(
        f"a traced value {x._var.type.str_short()} from a finished trace "
        f"({x._builder.name}) was used. Values computed inside a traced function "
        "cannot be kept and used after it returns; return them instead.", op=op,
        source=current_source())


def literal_of(x, op: str = "trace") -> Literal:
    """A constant operand from a Python scalar, NumPy or (concrete) JAX array."""
    if isinstance(x, Literal):
        return x
    if isinstance(x, SparseArray):
        if isinstance(x.data, jax.core.Tracer):
            x = x.data
        else:
            return Literal(np.asarray(x.data), x.type)
    if isinstance(x, jax.core.Tracer):
        raise TracerError(
            "a JAX traced value cannot be captured as a sciad constant. Pass it as "
            "an argument of the sciad function (or use `sd.to_jax`).", op=op,
            source=current_source())
    if isinstance(x, (Graph, Var)) or callable(x) and not hasattr(x, "__array__"):
        raise TypeError(f"{op}: expected an array or a scalar operand, got {x!r}.")
    try:
        value = np.asarray(x)
    except Exception as e:
        raise DTypeError(f"cannot use {type(x).__name__} {x!r} as an array: {e}",
                         op=op, source=current_source()) from None
    if value.dtype == object or value.dtype.kind in "USVMm":
        raise DTypeError(
            f"expected a numeric array or scalar, got {type(x).__name__} with dtype "
            f"{value.dtype}.", op=op, source=current_source())
    return Literal(value)


def is_value_leaf(x) -> bool:
    """Pytree leaves of sciad values: a concrete sparse matrix is one value
    (not its data vector)."""
    return isinstance(x, SparseArray)


def runtime_leaves(tree) -> list:
    """The run-time arrays of `tree`'s sciad values, in graph-input order (a
    sparse matrix gives its data vector)."""
    return [x.data if isinstance(x, SparseArray) else x
            for x in jax.tree_util.tree_leaves(tree, is_leaf=is_value_leaf)]


def wrap_outputs(outs, types) -> list:
    """Run-time arrays as values of `types` (sparse data as `SparseArray`s)."""
    return [SparseArray(o, t) if isinstance(t, SparseType) else o
            for o, t in zip(outs, types)]


def current_builder() -> GraphBuilder | None:
    stack = _state.stack
    return stack[-1] if stack else None


class Tracer:
    """A value being traced: a `Var` of the graph under construction.

    Arithmetic, comparison, indexing and `.T`/`.shape`/`.dtype` work as on a
    NumPy array (installed by `sciad.numpy`). Python control flow on a traced
    value (`if x > 0:`) does not: its value is not known while tracing.
    """

    __slots__ = ("_builder", "_var")
    __array_priority__ = 1000

    def __init__(self, builder: GraphBuilder, var: Var):
        self._builder = builder
        self._var = var

    @property
    def type(self) -> AbstractType:
        return self._var.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self._var.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self._var.type.dtype

    @property
    def ndim(self) -> int:
        return len(self._var.type.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._var.type.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced value.")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d traced value.")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return f"Tracer<{self._var.type.str_short()}>"

    # -- conversions to concrete Python values are impossible while tracing
    def _concrete(self, what: str):
        raise TracerError(
            f"{what} of a traced value {self._var.type.str_short()} is not known while "
            "tracing. Python control flow on traced values (`if x > 0:`, "
            "`while err > tol:`) needs a data-dependent control-flow op "
            "(`sd.cond` / `sd.while_loop`); for elementwise choices use "
            "`snp.where(cond, a, b)`.", op="trace", source=current_source())

    def __bool__(self):
        self._concrete("the truth value")

    def __int__(self):
        self._concrete("int()")

    def __float__(self):
        self._concrete("float()")

    def __complex__(self):
        self._concrete("complex()")

    def __index__(self):
        self._concrete("using it as an index")

    # NumPy's dispatch protocols (NEP 13, NEP 18): `np.sin(x)`, `np.sum(x)` and
    # `ndarray * x` on a traced `x` run the sciad function registered for that
    # NumPy function object (see `sciad._numpy_interop`); others raise.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _numpy_call(ufunc, method, inputs, kwargs, self)

    def __array_function__(self, func, types, args, kwargs):
        return _numpy_call(func, None, args, kwargs, self)

    def __array__(self, *args, **kwargs):
        raise TracerError(
            f"a traced value {self._var.type.str_short()} cannot be converted to a "
            "NumPy array. Use `sciad.numpy` (snp) functions instead of `numpy` ones "
            "inside traced functions.", op="trace", source=current_source())

    def __setitem__(self, index, value):
        at = _index_text(index)
        raise TracerError(
            f"a traced value {self._var.type.str_short()} cannot be changed in place "
            f"(`x[{at}] = ...`): sciad's arrays are immutable, as JAX's. Write "
            f"`x = x.at[{at}].set(value)` (or `.add(value)`), which returns the updated "
            "array.", op="trace", source=current_source())

    __hash__ = None  # `==` builds a graph node, so tracers are unhashable


def _index_text(index) -> str:
    """`index` as written between brackets: `0`, `1:3`, `:, 2`, `...`; `idx`
    for an index that is not a simple one."""
    def one(i):
        if isinstance(i, slice):
            if i.step is None:
                return ":".join("" if v is None else str(v) for v in (i.start, i.stop))
            return ":".join("" if v is None else str(v) for v in (i.start, i.stop, i.step))
        if i is Ellipsis:
            return "..."
        if i is None:
            return "None"
        if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            return str(int(i))
        raise TypeError

    try:
        return ", ".join(map(one, index)) if isinstance(index, tuple) else one(index)
    except TypeError:
        return "idx"


#: where JAX's message on an argument it cannot take names the function
_JAX_FUNCTION = re.compile(r"argument to <function (\w+)|^([\w.]+) requires ndarray")


def _jax_on_tracer(err: TypeError) -> TracerError | None:
    """The `TracerError` for JAX's `TypeError` on a sciad traced value passed
    to a JAX function (`jnp.sin(x)`), naming the `sciad.numpy` function to
    use where there is one; None for another `TypeError`."""
    text = str(err)
    if f"{Tracer.__module__}.Tracer" not in text:
        return None
    m = _JAX_FUNCTION.search(text)
    name = (m.group(1) or m.group(2)).rsplit(".", 1)[-1].lstrip("_") if m else None
    if name and name.startswith("reduce_"):  # jnp.sum is jax's `_reduce_sum`
        name = name[len("reduce_"):]
    what = f"`{name}`" if name else "a function"
    # (the sciad functions with NumPy's semantics: `sciad.numpy` fills the table)
    known = {getattr(f, "__name__", None): getattr(f, "__module__", "") for f in
             _numpy_dispatch.values()}
    module = {"sciad.numpy": "snp", "sciad.fft": "sd.fft"}.get(known.get(name))
    use = (f"`{module}.{name}`" if module == "sd.fft" else
           f"`snp.{name}` (`import sciad.numpy as snp`)" if module else
           "`sciad.numpy` (`import sciad.numpy as snp`)")
    return TracerError(
        f"JAX's {what} was given a sciad traced value: JAX functions cannot take "
        f"sciad's values. Use {use} in functions that sciad traces; to run JAX code "
        "as one node, wrap it with `sd.primitive_from_jax(fn, name)`.", op="trace")


# NumPy function or ufunc object (not its name) -> the sciad function with its
# semantics, and the handler that uses the table; both set by
# `sciad._numpy_interop.install` when `sciad.numpy` is imported
_numpy_dispatch: dict[object, Callable] = {}
_numpy_handler: Callable | None = None


def _numpy_call(func, method, args, kwargs, tracer: Tracer):
    if _numpy_handler is None:
        raise TracerError(
            f"NumPy's `{getattr(func, '__name__', func)}` cannot take a traced value "
            f"{tracer.type.str_short()}. Use `sciad.numpy` (snp) functions inside traced "
            "functions.", op="trace", source=current_source())
    return _numpy_handler(func, method, args, kwargs, tracer)


def _check_params(prim: Primitive, params: dict) -> None:
    for k, v in params.items():
        try:
            hash(v)
        except TypeError:
            raise TypeError(
                f"{prim.name}: param {k}={v!r} is not hashable. Params are static: "
                "use tuples instead of lists, and pass arrays as operands.") from None


def bind(prim: Primitive, args: Sequence, params: dict):
    """Applies `prim`: records a node while tracing, else evaluates eagerly."""
    builder = current_builder()
    if builder is None:
        for a in args:
            if isinstance(a, Tracer):
                raise _foreign_tracer(a, prim.name)
        return _eager(prim, args, params)
    _check_params(prim, params)
    atoms = tuple(builder.atom(a, prim.name) for a in args)
    out_types = _abstract_eval(prim, [a.type for a in atoms], params)
    outs = tuple(Var(t) for t in out_types)
    builder.nodes.append(Node(prim, atoms, outs, params, frozenset(), current_source()))
    tracers = tuple(Tracer(builder, v) for v in outs)
    return tracers if prim.multiple_results else tracers[0]


def _abstract_eval(prim: Primitive, in_types, params):
    try:
        return prim.abstract_eval(*in_types, **params)
    except SciadError as e:
        if e.op is None:
            e.op = prim.name
        raise e.with_source(current_source()) from None


def _eager(prim: Primitive, args, params):
    """Runs `prim` on concrete values; the shape rule still checks them first."""
    _check_params(prim, params)
    types, values = [], []
    for a in args:
        if isinstance(a, jax.Array):
            types.append(TensorType.of(a))
            values.append(a)
        else:
            lit = literal_of(a, prim.name)
            types.append(lit.type)
            values.append(lit.value)
    out_types = _abstract_eval(prim, types, params)
    if prim.impl_rule is None:
        raise MissingRuleError(
            f"has no implementation; define one with `@{prim.name}_p.def_impl`.",
            op=prim.name)
    with x64_scope():
        if prim.runtime_checks:
            out = _run_checked(prim, values, params, Site(prim.name, current_source()))
        else:
            out = prim.impl_rule(*values, **params)
    if all(isinstance(t, TensorType) for t in out_types):
        return out
    outs = tuple(out) if prim.multiple_results else (out,)
    outs = tuple(SparseArray(o, t) if isinstance(t, SparseType) else o
                 for o, t in zip(outs, out_types))
    return outs if prim.multiple_results else outs[0]


def _run_checked(prim: Primitive, values, params, site):
    """An implementation with run-time checks, run eagerly: compiled once per
    (primitive, params, call site) rather than op by op (its checks and
    solvers are many small ops), its result waited for, and a failed check
    raised as the sciad error it names (not JAX's runtime error carrying
    its text)."""
    key = (prim, tuple(sorted(params.items())), site)
    try:
        fn = _EAGER_CHECKED.get(key)
    except TypeError:  # an unhashable param value: compiled, not cached
        key, fn = None, None
    if fn is None:
        fn = jax.jit(lambda *xs: prim.impl_rule(*xs, site=site, **params))
        if key is not None:
            if len(_EAGER_CHECKED) >= 64:
                _EAGER_CHECKED.pop(next(iter(_EAGER_CHECKED)))
            _EAGER_CHECKED[key] = fn
    try:
        return jax.block_until_ready(fn(*values))
    except Exception as e:  # JaxRuntimeError, or the host function's own error
        reraise(e)


_EAGER_CHECKED: dict = {}


# --------------------------------------------------------------------------
# Tracing whole functions

_IDENT = re.compile(r"[^0-9a-zA-Z_]+")


def _arg_names(fn: Callable, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (
                inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        elif params and params[-1].kind is inspect.Parameter.VAR_POSITIONAL and i >= len(params) - 1:
            names.append(f"{params[-1].name}{i - len(params) + 1}")
        else:
            names.append(f"arg{i}")
    return names


def _leaf_type(x, where: str) -> AbstractType:
    if isinstance(x, AbstractType):
        return x
    if isinstance(x, (Tracer, SparseArray)):  # a traced value: its own type
        return x.type
    if isinstance(x, jax.ShapeDtypeStruct):
        return TensorType(x.shape, x.dtype)
    if isinstance(x, (bool, int, float, complex, np.ndarray, np.generic, jax.Array)):
        return TensorType.of(x)
    raise TypeError(
        f"trace: {where} is a {type(x).__name__}, which is not an array. Array "
        "arguments (NumPy, JAX, Python scalars, `TensorType`s) are traced; pass "
        "other values with `static_argnums`.")


def trace_flat(fn: Callable, args: tuple, kwargs: dict | None = None, *,
               static_argnums: Sequence[int] = (), name: str | None = None,
               closure: bool = False):
    """Traces `fn(*args, **kwargs)`; returns `(graph, in_tree, out_tree)`.

    The non-static arguments' pytree leaves are the graph's inputs, in
    `jax.tree_util` order of `(dynamic_args, kwargs)`. With `closure=True`
    (tracing inside another trace), traced values of the enclosing traces
    that `fn` closes over become extra trailing inputs of the graph, and the
    result is `(graph, in_tree, out_tree, captured)` with `captured` the
    outer tracers to pass for them.
    """
    kwargs = kwargs or {}
    static = {i % len(args) if args else i for i in static_argnums}
    dyn_idx = [i for i in range(len(args)) if i not in static]
    dyn = (tuple(args[i] for i in dyn_idx), kwargs)
    leaves_with_path, in_tree = jax.tree_util.tree_flatten_with_path(dyn, is_leaf=is_value_leaf)
    names = _arg_names(fn, len(args))
    builder = GraphBuilder(name or getattr(fn, "__name__", "graph").replace("<lambda>", "lambda"))
    tracers = []
    for path, leaf in leaves_with_path:
        first = path[0].idx  # 0: positional, 1: keyword
        if first == 0:
            argpos = dyn_idx[path[1].idx]
            base, rest = names[argpos], path[2:]
        else:
            base, rest = str(path[1].key), path[2:]
        where = f"argument {base!r}" + (jax.tree_util.keystr(rest) if rest else "")
        hint = _IDENT.sub("_", base + jax.tree_util.keystr(rest)).strip("_") or None
        tracers.append(builder.new_input(_leaf_type(leaf, where), hint))
    dyn_tracers, kw_tracers = jax.tree_util.tree_unflatten(in_tree, tracers)
    full = list(args)
    for i, t in zip(dyn_idx, dyn_tracers):
        full[i] = t
    _state.stack.append(builder)
    try:
        out = fn(*full, **kw_tracers)
    except SciadError as e:
        # errors raised before a node was recorded (e.g. by sciad.numpy's
        # argument checks) get the user's line from the traceback
        raise e.with_source(source_from_traceback(e.__traceback__))
    except TypeError as e:  # a JAX function given a traced value
        err = _jax_on_tracer(e)
        if err is None:
            raise
        raise err.with_source(source_from_traceback(e.__traceback__)) from e
    finally:
        _state.stack.pop()
        builder.alive = False
    out_leaves, out_tree = jax.tree_util.tree_flatten(out, is_leaf=is_value_leaf)
    builder.alive = True  # outputs may still be captured from enclosing traces
    _state.stack.append(builder)
    try:
        graph = builder.build(out_leaves, op="trace")
    finally:
        _state.stack.pop()
        builder.alive = False
    if closure:
        return graph, in_tree, out_tree, [t for t, _ in builder.captured]
    if builder.captured:
        t = builder.captured[0][0]
        raise TracerError(
            f"a traced value {t.type.str_short()} of the enclosing trace "
            f"({t._builder.name}) was used inside a nested trace. Pass it as an "
            "argument to the inner function instead of capturing it.", op="trace",
            source=current_source())
    return graph, in_tree, out_tree


@api_boundary
def trace(fn: Callable, *args, static_argnums: int | Sequence[int] = (), **kwargs) -> Graph:
    """Traces `fn(*args, **kwargs)` into a `Graph`.

    **Arguments:**

    - `fn`: a Python function of arrays (pytrees of arrays in and out), written
      with `sciad.numpy` ops and primitives.
    - `*args`, `**kwargs`: example arguments. Only their shapes and dtypes
      matter; `TensorType`s and `jax.ShapeDtypeStruct`s stand for arrays.
    - `static_argnums`: positions of arguments passed to `fn` as they are
      (Python values, not traced).

    **Returns:**

    The `Graph`; its inputs are the pytree leaves of the non-static arguments.
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    graph, _, _ = trace_flat(fn, args, kwargs, static_argnums=static_argnums)

    if config.enable_checks:
        graph.verify()
    return graph
