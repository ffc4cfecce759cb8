"""Batching: the graph transform behind `sd.vmap`.

A batched value is a pair `(value, dim)`: `dim` is the axis of `value` that
runs over the batch, or None for a value that is the same for every example
(a constant, a closed-over array, an `in_axes=None` argument). `BatchEmit`
walks a graph traced on one example's shapes and emits, for each node, the
batched computation into the current trace: a node none of whose operands is
batched is emitted as it is; otherwise its primitive's batch rule
(`Primitive.def_batch`) runs on the operands and their batch dims and
returns the outputs and theirs. The result is an ordinary graph of whole
operations on batched arrays, which prints, optimizes and lowers like any
other.

A batch rule has the signature `rule(args, dims, **params) -> (out, dim)`
(lists of outputs and dims for a primitive with multiple results), written
with sciad ops; the helpers below move a batch dim to the front and give an
unbatched operand a batch axis. A primitive without a rule is mapped over
the batch as one `map` node (`jax.vmap` of its implementation when
lowered), with a one-time warning naming it: the graph's size does not
depend on the batch size.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import jax
import numpy as np

from ..errors import BatchFallbackWarning, ShapeError
from ._autodiff import add_any_p, jvp_primal_p, literal_operand, type_of
from ._autodiff import _bind as _bind_node
from ._body import Body
from ._core import Literal, Node, Primitive, lookup_primitive
from ._interpret import Interpreter
from ._trace import Tracer, current_source, emitting_for, trace_flat
from ._types import BatchedType, TensorType


_warned: set[str] = set()

# `map_rule(prim)`: the batch rule that maps `prim` over the batch as one
# `map` node. The `map` primitive lives above this layer, so it registers
# its rule maker here when imported (as non-tensor types register `zeros`).
_map_rule: Callable[[Primitive], Callable] | None = None


def register_map_rule(make: Callable[[Primitive], Callable]) -> None:
    """How a primitive is mapped over a batch as one node: for a primitive
    without a batch rule, and one whose rule is for arrays only, given a
    sparse matrix or a factorization."""
    global _map_rule
    _map_rule = make


def _bind(name: str, *args, **params):
    """Binds the registered primitive `name` (this layer is below the op layer
    and the primitives: the few array ops batching itself needs are bound by
    name, as `sciad._ops` does)."""
    return lookup_primitive(name).bind(*args, **params)


def _size_at(a, d) -> int:
    t = type_of(a)
    return t.size if isinstance(t, BatchedType) else t.shape[d]


def batch_size_of(args: Sequence, dims: Sequence) -> int:
    sizes = {_size_at(a, d) for a, d in zip(args, dims) if d is not None}
    if len(sizes) != 1:
        raise ShapeError(f"batched operands disagree on the batch size: {sorted(sizes)}.",
                         op="vmap")
    return sizes.pop()


def to_front(x, d):
    """`x` with its batch dim `d` first (unchanged if `d` is 0; a batch of
    sparse matrices or factorizations always has it first)."""
    if d == 0:
        return x
    ndim = len(x.shape)
    d = d % ndim
    if d == 0:
        return x
    return _bind("transpose", x, perm=(d,) + tuple(n for n in range(ndim) if n != d))


def batched_front(x, d, size: int):
    """`x` with a leading batch axis of `size`: moved there, or broadcast
    for an unbatched `x` (`d` None)."""
    if d is not None:
        return to_front(x, d)
    t = type_of(x)
    if not isinstance(t, TensorType):  # a sparse matrix or a factorization, repeated
        body, _, _ = trace_flat(lambda v: [v], (t,), name="repeat")
        (out,) = _bind("map", x, body=Body.of(body), batched=(False,), size=size)
        return out
    if not isinstance(x, (Tracer, np.ndarray, jax.Array)):  # a Python or NumPy scalar
        x = np.asarray(x)
    shape = tuple(x.shape)
    out = _bind("reshape", x, shape=(1,) + shape)
    return out if size == 1 else _bind("broadcast_to", out, shape=(size,) + shape)


def fallback_rule(prim: Primitive) -> Callable:
    """The batch rule of a primitive without one: a `map` node of one
    example's node, whatever the batch size (lowered as `jax.vmap` of the
    implementation; see `map`). Warns once per primitive."""
    if prim.name not in _warned:
        _warned.add(prim.name)
        src = current_source()
        warnings.warn_explicit(
            f"primitive {prim.name!r} has no batch rule: sd.vmap maps it over the batch as "
            "one `map` node (`jax.vmap` of its implementation, its derivatives mapped the "
            "same way). Give it one with `def_batch`.", BatchFallbackWarning,
            getattr(src, "file", None) or "<sciad>", getattr(src, "line", None) or 0)
    assert _map_rule is not None, "sciad.primitives was not imported; this is a bug in sciad."
    return _map_rule(prim)


class BatchEmit(Interpreter):
    """Emits the batched form of each node into the current trace; values
    are `(value, dim)` pairs.

    `spmd_axis` (a mesh axis name, or None) is the axis of a device mesh
    that the batch is split over (`sd.vmap(..., spmd_axis_name=...)`): it
    is given to the rules that map a body over the batch (`map` nodes),
    which then run each device's share of the examples on that device."""

    def __init__(self, graph, spmd_axis: str | None = None):
        super().__init__(graph)
        self.spmd_axis = spmd_axis

    def literal(self, lit: Literal):
        return literal_operand(lit), None

    def run_node(self, node: Node, invals: Sequence):
        args = [v for v, _ in invals]
        dims = [d for _, d in invals]
        prim = node.primitive
        with emitting_for(node.source):
            if all(d is None for d in dims):
                return [(o, None) for o in _bind_node(prim, args, dict(node.params))]
            rule = prim.batch_rule
            if rule is None:
                rule = fallback_rule(prim)
            elif not getattr(rule, "maps", False) and any(
                    not isinstance(type_of(a), TensorType) for a in args):
                # a rule written for arrays, given a sparse matrix or a factorization
                rule = _map_rule(prim)
            extra = {"spmd_axis": self.spmd_axis} if getattr(rule, "maps", False) else {}
            outs, odims = rule(args, dims, **extra, **node.params)
            if not prim.multiple_results:
                outs, odims = [outs], [odims]
        return list(zip(outs, odims))


def batch_graph(graph, args: Sequence, dims: Sequence, spmd_axis: str | None = None) -> list:
    """Emits `graph` batched on `args` (with batch dims `dims`) into the
    current trace; returns its outputs as `(value, dim)` pairs. `spmd_axis`:
    see `BatchEmit`."""
    return BatchEmit(graph, spmd_axis).run(*zip(args, dims))


# ---------------------------------------------------------------------------
# rules shared by families of primitives


def elementwise_rule(prim: Primitive):
    """The batch rule of an op that broadcasts its operands (NumPy's rule):
    each batched operand gets its batch axis first and size-1 axes up to
    the result's rank, so that the batch axis lines up; unbatched operands
    broadcast from the right as before."""
    def rule(args, dims, **params):
        ranks = [len(a.shape) - (d is not None) for a, d in zip(args, dims)]
        r = max(ranks)
        ops = []
        for a, d, k in zip(args, dims, ranks):
            if d is None:
                ops.append(a)
                continue
            a = to_front(a, d)
            ops.append(a if k == r else _bind("reshape", a, shape=(a.shape[0],) + (1,) * (r - k)
                                              + tuple(a.shape[1:])))
        return prim.bind(*ops, **params), 0
    return rule


def front_rule(prim: Primitive, shift=None):
    """The batch rule of an op on operands of one shape (or whose batch axis
    can lead): every operand gets a leading batch axis (broadcast if
    unbatched), and `shift(params)` gives the params for the extra axis."""
    def rule(args, dims, **params):
        size = batch_size_of(args, dims)
        ops = [batched_front(a, d, size) for a, d in zip(args, dims)]
        out = prim.bind(*ops, **(shift(**params) if shift else params))
        if prim.multiple_results:
            return list(out), [0] * len(out)
        return out, 0
    return rule


def shift_axes(*names: str):
    """A `shift` for `front_rule`: the named params (an axis or a tuple of
    axes) move up by one."""
    def shift(**params):
        out = dict(params)
        for n in names:
            v = params[n]
            out[n] = tuple(int(a) + 1 for a in v) if isinstance(v, tuple) else int(v) + 1
        return out
    return shift


# ---------------------------------------------------------------------------
# bodies: how higher-order nodes batch


def batched_type(t, size: int):
    """The type of a value batched at axis 0 whose examples have type `t`:
    an array with one more axis, or a `BatchedType`."""
    if isinstance(t, TensorType):
        return t.update(shape=(size,) + tuple(t.shape), tags=t.tags)
    return BatchedType(t, size)


def example_type(t):
    """The type of one example of a value batched at axis 0."""
    if isinstance(t, BatchedType):
        return t.inner
    return t.update(shape=tuple(t.shape[1:]), tags=t.tags)


def batch_body(graph, batched: Sequence[bool], size: int,
               force: Sequence[bool] | None = None, *, name: str | None = None):
    """The batched form of a closed body, as a new closed body.

    `batched[i]` says whether input `i` carries a batch axis (of `size`, at
    axis 0); the new body's inputs have those axes. Returns `(body,
    out_batched)`: the new body's outputs carry a batch axis at 0 where
    `out_batched` says so, which is where the batched computation gives one
    or `force` asks for one (an unbatched value is then broadcast). A loop
    asks for its carries' batch axes to be a fixed point by forcing the
    carries that enter batched."""
    in_types = [batched_type(t, size) if b else t for t, b in zip(graph.in_types, batched)]
    force = list(force or ())
    force += [False] * (len(graph.outputs) - len(force))
    out_b: list[bool] = []

    def fn(*args):
        outs = batch_graph(graph, args, [0 if b else None for b in batched])
        out_b[:] = [d is not None or f for (_, d), f in zip(outs, force)]
        return [batched_front(o, d, size) if b else o for (o, d), b in zip(outs, out_b)]

    g, _, _ = trace_flat(fn, tuple(in_types), name=name or graph.name)
    return g, out_b


def carry_fixed_point(batch, batched: list[bool], lo: int, hi: int, out_lo: int = 0):
    """Batches a loop body until its carries' batch flags are a fixed point.

    `batched[lo:hi]` are the carries' flags (on the body's inputs), which
    the body returns as outputs `out_lo:out_lo + hi - lo`; `batch(flags,
    force)` batches the body. A carry is batched if it enters batched or the
    body makes it so. Returns `(body, flags, out_batched)`."""
    flags = list(batched)
    while True:
        force = [False] * out_lo + flags[lo:hi]
        body, out_b = batch(flags, force)
        new = [a or b for a, b in zip(flags[lo:hi], out_b[out_lo:out_lo + hi - lo])]
        if new == flags[lo:hi]:
            return body, flags, out_b
        flags[lo:hi] = new


def front_where(args, dims, flags, size: int) -> list:
    """The operands of a batched body node: those flagged batched with their
    batch axis first (broadcast if they have none), the others as they are."""
    return [batched_front(a, d, size) if f else a for a, d, f in zip(args, dims, flags)]


# the batch rules of the autodiff layer's own primitives
add_any_p.def_batch(front_rule(add_any_p))
jvp_primal_p.def_batch(lambda args, dims: (jvp_primal_p.bind(args[0]), dims[0]))
