"""Static indexing: `getitem` (basic NumPy indexing: ints, slices, `None`,
`...`) and the functional updates `index_set` / `index_add` behind
`x.at[idx].set(v)` / `.add(v)`.

The index is a static param, a `StaticIndex` normalized against the
operand's shape: each entry is an int (a removed axis), a `(start, stop,
step)` triple (stop `None` means "through the beginning" for negative steps),
or `None` (a new axis of size 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from .. import _ops as ops
from .._ops import StaticIndex as StaticIndex, normalize_index as normalize_index
from ..config import x64_scope
from ..errors import DTypeError, IndexingError, ShapeError
from ..graph import Primitive, TensorType, instantiate, is_linear, zeros
from ..graph._autodiff import type_of
from ..graph._batch import batch_size_of, batched_front, to_front
from ..graph._cost import Cost, size
from ..graph._sparsity import _bool, _check_entries, moves, scatter_add, select_rows, union
from ._take import batched_take
from ._util import tensor


getitem_p = Primitive("getitem", params={"index": StaticIndex})


def _check_index(x: TensorType, index, op: str) -> None:
    if not isinstance(index, StaticIndex):
        raise IndexingError(f"`index` must be a StaticIndex, got {index!r}.", op=op)
    if normalize_index(index.to_jax(), x.shape, op) != index:
        raise IndexingError(f"index {index} is not normalized for {x.str_short()}.", op=op)


@getitem_p.def_abstract_eval
def _getitem_shape(x, *, index):
    x = tensor(x, "getitem")
    _check_index(x, index, "getitem")
    return TensorType(index.out_shape(x.shape), x.dtype)


@getitem_p.def_impl
def _getitem_impl(x, *, index):
    return x[index.to_jax()]


def _make_update(name: str, method: str) -> Primitive:
    p = Primitive(name, params={"index": StaticIndex})

    @p.def_abstract_eval
    def _shape(x, v, *, index):
        x, v = tensor(x, name), tensor(v, name)
        _check_index(x, index, name)
        target = index.out_shape(x.shape)
        if v.shape != target:
            raise ShapeError(f"the update must have the indexed shape {target}, got "
                             f"{v.str_short()}.", op=name)
        if v.dtype != x.dtype:
            raise DTypeError(f"the update's dtype must be {x.dtype}, got {v.str_short()}.",
                             op=name)
        return x.update()

    @p.def_impl
    def _impl(x, v, *, index):
        ix = index.to_jax()
        # `.at[]` wants the update without the new-axis dims that None adds
        v = jnp.reshape(v, x[ix].shape)
        return getattr(x.at[ix], method)(v)

    return p


index_set_p = _make_update("index_set", "set")
index_add_p = _make_update("index_add", "add")


# ---------------------------------------------------------------------------
# Derivative rules: getitem and the updates are linear in (x, v).

@getitem_p.def_jvp
def _getitem_jvp(primals, tangents, *, index):
    (x,), (t,) = primals, tangents
    return getitem_p.bind(x, index=index), getitem_p.bind(t, index=index)


@getitem_p.def_transpose
def _getitem_transpose(ct, x, *, index):
    return (index_add_p.bind(zeros(x.type), ct, index=index),)


def _update_jvp(prim):
    def jvp(primals, tangents, *, index):
        (x, v), (tx, tv) = primals, tangents
        return prim.bind(x, v, index=index), prim.bind(instantiate(tx), instantiate(tv),
                                                       index=index)
    return jvp


index_set_p.def_jvp(_update_jvp(index_set_p))
index_add_p.def_jvp(_update_jvp(index_add_p))


@index_set_p.def_transpose
def _index_set_transpose(ct, x, v, *, index):
    ct_x = index_set_p.bind(ct, zeros(TensorType(index.out_shape(ct.shape), ct.dtype)),
                            index=index) if is_linear(x) else None
    return ct_x, getitem_p.bind(ct, index=index) if is_linear(v) else None


@index_add_p.def_transpose
def _index_add_transpose(ct, x, v, *, index):
    return (ct if is_linear(x) else None,
            getitem_p.bind(ct, index=index) if is_linear(v) else None)


# Sparsity: a slice and a `set` move elements; an `add` also sums the update
# into the elements it lands on (found by indexing the output's element ids).

def _index_add_sparsity(outs, x, v, *, index):
    # the output element each element of `v` lands on
    with x64_scope(), jax.ensure_compile_time_eval():
        landed = np.asarray(getitem_p.impl_rule(
            jnp.arange(x.size, dtype=jnp.int64).reshape(x.shape), index=index))
    return scatter_add(outs[0], x, v, landed)


def _install_sparsity_rules() -> None:
    getitem_p.def_sparsity(moves(getitem_p.impl_rule))
    index_set_p.def_sparsity(moves(index_set_p.impl_rule))
    index_add_p.def_sparsity(_index_add_sparsity)


_install_sparsity_rules()


# ---------------------------------------------------------------------------
# Traced indices: `dynamic_slice` and `dynamic_update_slice`, which loop
# bodies need (`x[i]`, `x.at[i].set(v)` with `i` a loop counter). The start
# of the window on each axis is an integer scalar operand; as in JAX (and
# XLA), a start is clamped so that the window stays inside the array.

dynamic_slice_p = Primitive("dynamic_slice", params={"sizes": tuple[int, ...]})
dynamic_update_slice_p = Primitive("dynamic_update_slice", params={})


def _check_starts(x: TensorType, starts, op: str) -> None:
    if len(starts) != len(x.shape):
        raise ShapeError(f"needs one start per axis of {x.str_short()}, got {len(starts)}.",
                         op=op)
    for k, s in enumerate(starts):
        if not isinstance(s, TensorType) or s.shape != () or s.dtype.kind not in "iu":
            raise IndexingError(f"start {k} must be an integer scalar, got "
                                f"{s.str_short()}.", op=op)


@dynamic_slice_p.def_abstract_eval
def _dynamic_slice_shape(x, *starts, sizes):
    op = "dynamic_slice"
    x = tensor(x, op)
    _check_starts(x, starts, op)
    if len(sizes) != len(x.shape) or any(not 0 <= s <= d for s, d in zip(sizes, x.shape)):
        raise ShapeError(f"window sizes {tuple(sizes)} do not fit {x.str_short()}.", op=op)
    return TensorType(tuple(sizes), x.dtype)


@dynamic_slice_p.def_impl
def _dynamic_slice_impl(x, *starts, sizes):
    return jax.lax.dynamic_slice(x, starts, sizes)


@dynamic_update_slice_p.def_abstract_eval
def _dynamic_update_slice_shape(x, update, *starts):
    op = "dynamic_update_slice"
    x, update = tensor(x, op), tensor(update, op)
    _check_starts(x, starts, op)
    if len(update.shape) != len(x.shape) or any(u > d for u, d in zip(update.shape,
                                                                       x.shape)):
        raise ShapeError(f"the update {update.str_short()} does not fit in "
                         f"{x.str_short()}.", op=op)
    if update.dtype != x.dtype:
        raise DTypeError(f"the update's dtype must be {x.dtype}, got {update.str_short()}.",
                         op=op)
    return x.update()


@dynamic_update_slice_p.def_impl
def _dynamic_update_slice_impl(x, update, *starts):
    return jax.lax.dynamic_update_slice(x, update, starts)


@dynamic_update_slice_p.def_cost
def _dynamic_update_slice_cost(node, body):
    # XLA writes the update into the array in place: a copy of the update

    return Cost(float(size(node.inputs[1].type)))


# Both are linear in their array operands (for fixed starts):
#   dynamic_slice:        ct_x = dynamic_update_slice(0, ct)
#   dynamic_update_slice: ct_x = dynamic_update_slice(ct, 0), ct_update = dynamic_slice(ct)
# (the clamping is the same on both sides, so the pairs are exact transposes).

@dynamic_slice_p.def_jvp
def _dynamic_slice_jvp(primals, tangents, *, sizes):
    x, *starts = primals
    return (dynamic_slice_p.bind(x, *starts, sizes=sizes),
            dynamic_slice_p.bind(instantiate(tangents[0]), *starts, sizes=sizes))


@dynamic_slice_p.def_transpose
def _dynamic_slice_transpose(ct, x, *starts, sizes):
    assert is_linear(x) and not any(is_linear(s) for s in starts)
    return (dynamic_update_slice_p.bind(zeros(x.type), ct, *starts),
            *([None] * len(starts)))


@dynamic_update_slice_p.def_jvp
def _dynamic_update_slice_jvp(primals, tangents):
    x, u, *starts = primals
    tx, tu = tangents[:2]
    return (dynamic_update_slice_p.bind(x, u, *starts),
            dynamic_update_slice_p.bind(instantiate(tx), instantiate(tu), *starts))


@dynamic_update_slice_p.def_transpose
def _dynamic_update_slice_transpose(ct, x, u, *starts):
    ct_x = ct_u = None
    if is_linear(x):
        ct_x = dynamic_update_slice_p.bind(ct, zeros(type_of(u)), *starts)
    if is_linear(u):
        ct_u = dynamic_slice_p.bind(ct, *starts, sizes=tuple(type_of(u).shape))
    return (ct_x, ct_u, *([None] * len(starts)))


# Sparsity: per axis, the positions of the operand a position of the window
# can be (a constant start, clamped as XLA clamps it: one; a traced start:
# any that keeps the window inside); an element's are their product. A
# dynamic update keeps an element of `x` unless the window covers it
# whatever the starts, and takes the update's elements that can land on it.

def _clamped(start, n: int, w: int):
    return None if start.value is None else min(max(int(start.value), 0), n - w)


def _window(n: int, w: int, start) -> np.ndarray:
    """`(w, n)` bool: whether window position `o` can be position `j`."""
    s = np.arange(n)[None, :] - np.arange(w)[:, None]  # the start that makes it so
    first = _clamped(start, n, w)
    return (s >= 0) & (s <= n - w) if first is None else s == first


def _product(ms):
    """The Kronecker product of per-axis bool matrices, as a CSR matrix."""
    ms = [sp.csr_matrix(m) for m in ms]
    _check_entries(int(np.prod([m.nnz for m in ms], dtype=np.int64)))
    out = sp.csr_matrix(np.ones((1, 1), bool))
    for m in ms:
        out = sp.kron(out, m, format="csr")
    return out


def _dynamic_slice_sparsity(outs, x, *starts, sizes):
    return _bool(_product(_window(n, w, s) for n, w, s in zip(x.shape, sizes, starts))
                 @ x.matrix)


def _dynamic_update_slice_sparsity(outs, x, update, *starts):
    covered = np.ones((), bool)
    for n, w, s in zip(x.shape, update.shape, starts):
        p, first = np.arange(n), _clamped(s, n, w)
        surely = (p >= n - w) & (p < w) if first is None else (p >= first) & (p < first + w)
        covered = np.multiply.outer(covered, surely)
    kept = select_rows(x.matrix, np.where(covered.ravel(), -1, np.arange(x.size)))
    if not update.matrix.nnz:
        return kept
    lands = _product(_window(n, w, s).T for n, w, s in zip(x.shape, update.shape, starts))
    return union(kept, _bool(lands @ update.matrix))


dynamic_slice_p.def_sparsity(_dynamic_slice_sparsity)
dynamic_update_slice_p.def_sparsity(_dynamic_update_slice_sparsity)


# ---------------------------------------------------------------------------
# Batch rules: the batch axis leads, and the index gets a full slice for it.
# A batched start of a dynamic slice (each example at its own offset) is a
# gather of the window (`batched_take`); a dynamic update at batched starts
# is the update gathered into place under a mask.

def _prefixed(index: StaticIndex, size: int) -> StaticIndex:
    return StaticIndex(((0, size, 1),) + index.items)


def _install_batch_rules() -> None:
    def getitem_rule(args, dims, *, index):
        (x,), (d,) = args, dims
        x = to_front(x, d)
        return getitem_p.bind(x, index=_prefixed(index, x.shape[0])), 0

    def update_rule(prim):
        def rule(args, dims, *, index):
            size = batch_size_of(args, dims)
            x, v = (batched_front(a, d, size) for a, d in zip(args, dims))
            return prim.bind(x, v, index=_prefixed(index, size)), 0
        return rule

    def clamped(start, d, n, w, size):
        # each example's start (batch axis first), clamped as XLA clamps it
        start = batched_front(start, d, size)
        return ops.clip(ops.astype(start, np.int64), 0, n - w)

    def dynamic_slice_rule(args, dims, *, sizes):
        (x, *starts), (d, *sd) = args, dims
        size = batch_size_of(args, dims)
        x = batched_front(x, d, size)
        fixed = [np.int64(0) if s is not None else st for st, s in zip(starts, sd)]
        # the axes whose start is the same for every example: one slice
        whole = tuple(x.shape[k + 1] if s is not None else w
                      for k, (w, s) in enumerate(zip(sizes, sd)))
        x = dynamic_slice_p.bind(x, np.int64(0), *fixed, sizes=(size,) + whole)
        # each example at its own start: a gather of the window on that axis
        for k, (st, s) in enumerate(zip(starts, sd)):
            if s is not None:
                first = clamped(st, s, x.shape[k + 1], sizes[k], size)
                idx = ops.reshape(first, (size, 1)) + ops.arange(sizes[k], dtype=np.int64)
                x = batched_take(x, idx, k)
        return x, 0

    def dynamic_update_slice_rule(args, dims):
        (x, u, *starts), (dx, du, *sd) = args, dims
        size = batch_size_of(args, dims)
        x, u = batched_front(x, dx, size), batched_front(u, du, size)
        if all(s is None for s in sd):
            return dynamic_update_slice_p.bind(x, u, np.int64(0), *starts), 0
        # each example's window: the update spread over the whole array (a
        # gather on each axis) and a mask of where it lands
        mask = None
        for k, st in enumerate(starts):
            n, w = x.shape[k + 1], u.shape[k + 1]
            first = clamped(st, sd[k], n, w, size)
            j = ops.arange(n, dtype=np.int64) - ops.reshape(first, (size, 1))
            inside = (j >= 0) & (j < w)
            u = batched_take(u, ops.clip(j, 0, w - 1), k)
            shape = [size] + [1] * (len(x.shape) - 1)
            shape[k + 1] = n
            inside = ops.reshape(inside, tuple(shape))
            mask = inside if mask is None else mask & inside
        return ops.where(mask, u, x), 0

    getitem_p.def_batch(getitem_rule)
    index_set_p.def_batch(update_rule(index_set_p))
    index_add_p.def_batch(update_rule(index_add_p))
    dynamic_slice_p.def_batch(dynamic_slice_rule)
    dynamic_update_slice_p.def_batch(dynamic_update_slice_rule)


_install_batch_rules()
