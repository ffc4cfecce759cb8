"""Integer-array indexing along one axis, and sorting.

- `index_bounds[size, mode, distinct](i)`: integer indices into an axis of
  `size`, brought into `[0, size)` by NumPy's `mode`: "raise" (negative
  indices count from the end; anything outside `[-size, size)` is an
  `IndexingError` when the program runs), "wrap" (modulo `size`) or "clip"
  (to `[0, size - 1]`; negative indices clip to 0, as in NumPy). With
  `distinct`, repeated indices (after the mode) are an `IndexingError` too:
  `x.at[i].set(v)` needs them distinct for its derivative to be defined.
  Concrete indices are checked by `sciad.numpy` when the program is traced,
  so this node appears only for traced ones. Its one host call is made only
  when a check fails.
- `take[axis](x, i)`: `x` gathered at in-range indices `i` along `axis`;
  the result has shape `x.shape[:axis] + i.shape + x.shape[axis + 1:]`
  (`numpy.take`).
- `scatter_add[axis](x, v, i)`: `x` with `v` added at `i` along `axis`
  (repeated indices accumulate); `v` has `take`'s result shape.
- `scatter_set[axis](x, v, i)`: `x` with `v` written at distinct `i`.
- `sort[axis](x)`, `argsort[axis](x)`: NumPy's (stable) sort along an axis.

The three index ops are linear in `x` and `v` and pair up as transposes:
`take^T = scatter_add(0, ., i)`, `scatter_add^T = (ct, take(ct, i))`,
`scatter_set^T = (scatter_set(ct, 0, i), take(ct, i))`. The indices are
integers and get no cotangent. `sort`'s tangent is the tangent taken at
`argsort(x)`: exact where the values are distinct, and where two are equal
the tangent of the one placed first (a one-sided derivative, as JAX's).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from .._ops import _out_of_bounds_text
from ..errors import DTypeError, IndexingError, InvalidOptionError, ShapeError
from ..graph import Param, Primitive, TensorType, instantiate, is_linear, zeros
from ..graph._autodiff import type_of
from ..graph._batch import batch_size_of, batched_front, front_rule, shift_axes, to_front
from ..graph._cost import Cost, size
from ..graph._sparsity import Deps, along, axes_groups, by_ids, grouped, scatter_add
from ..graph._sparsity import select_rows, union
from ._checks import check, tie
from ._util import normalize_axis, tensor

MODES = ("raise", "wrap", "clip")


def _int_indices(i, op: str) -> TensorType:
    if not isinstance(i, TensorType) or i.dtype.kind not in "iu":
        raise IndexingError(f"indices must be an integer array, got "
                            f"{getattr(i, 'str_short', lambda: i)()}.", op=op)
    return i


# ---------------------------------------------------------------------------
# index_bounds

index_bounds_p = Primitive("index_bounds", params={"size": int, "mode": str,
                                                   "distinct": bool,
                                                   "batch_dims": Param(int, default=0)},
                           runtime_checks=True)
#: (`batch_dims`: the leading axes of `i` that run over examples of a batch;
#: with `distinct`, the indices must be distinct within each example.)


@index_bounds_p.def_abstract_eval
def _index_bounds_shape(i, *, size, mode, distinct, batch_dims=0):
    op = "index_bounds"
    i = _int_indices(i, op)
    if not 0 <= batch_dims <= i.ndim:
        raise IndexingError(f"`batch_dims` must be in [0, {i.ndim}], got {batch_dims}.", op=op)
    if mode not in MODES:
        raise IndexingError(f"`mode` must be one of {MODES}, got {mode!r}.", op=op)
    if size < 0 or (size == 0 and i.size > 0 and mode != "raise"):
        raise IndexingError(f"cannot index an empty axis with mode {mode!r}.", op=op)
    return i


def _judge_indices(site, *, size, mode, total=0, out_of_range=False, first=0, repeated=False,
                   first_repeated=0, count=0):
    if out_of_range:
        site.fail(IndexingError, _out_of_bounds_text(int(first), size, int(count), total)
                  + " Check the indices, or pass mode='wrap' or mode='clip'.")
    if repeated:
        site.fail(IndexingError, f"`.at[i].set(v)` needs distinct indices, but index "
                  f"{int(first_repeated)} repeats. Use `.at[i].add(v)` to accumulate, or "
                  "make the indices distinct.")


@index_bounds_p.def_impl
def _index_bounds_impl(i, *, size, mode, distinct, batch_dims=0, site=None):
    if mode == "wrap":
        out = jnp.mod(i, size)
    elif mode == "clip":
        out = jnp.clip(i, 0, size - 1)
    else:
        out = jnp.where(i < 0, i + size, i)
    measures = {}
    if mode == "raise":
        bad = (i < -size) | (i >= size)
        measures.update(out_of_range=jnp.any(bad), count=jnp.sum(bad),
                        first=jnp.where(jnp.any(bad), i.ravel()[jnp.argmax(bad.ravel())], 0))
    per = int(np.prod(i.shape[batch_dims:], dtype=np.int64))
    if distinct and per > 1:
        s = jnp.sort(out.reshape(-1, per), axis=1)  # within each example
        dup = (s[:, 1:] == s[:, :-1]).ravel()
        measures.update(repeated=jnp.any(dup),
                        first_repeated=s[:, 1:].ravel()[jnp.argmax(dup)])
    if not measures:
        return out
    failing = measures.get("out_of_range", False) | measures.get("repeated", False)
    token = check(_judge_indices, site, when=failing, size=size, mode=mode, total=int(i.size),
                  **measures)
    return tie(out, token)


# ---------------------------------------------------------------------------
# take, scatter_add, scatter_set

take_p = Primitive("take", params={"axis": int})


def _take_shape_of(x: TensorType, i: TensorType, axis: int) -> tuple[int, ...]:
    return x.shape[:axis] + i.shape + x.shape[axis + 1:]


def _check_axis(x: TensorType, axis: int, op: str) -> None:
    if x.ndim == 0 or normalize_axis(axis, x.ndim, op) != axis:
        raise ShapeError(f"`axis` must be in [0, {x.ndim}), got {axis} for "
                         f"{x.str_short()}.", op=op)


@take_p.def_abstract_eval
def _take_shape(x, i, *, axis):
    x, i = tensor(x, "take"), _int_indices(i, "take")
    _check_axis(x, axis, "take")
    if x.shape[axis] == 0 and i.size:
        raise IndexingError(f"cannot take from the empty axis {axis} of {x.str_short()}.",
                            op="take")
    return TensorType(_take_shape_of(x, i, axis), x.dtype)


@take_p.def_impl
def _take_impl(x, i, *, axis):
    # `index_bounds` (or the caller) put the indices in range
    return jnp.take(x, i, axis=axis, mode="clip")


def _ix(axis, i):
    return (slice(None),) * axis + (i,)


def _make_scatter(name: str) -> Primitive:
    p = Primitive(name, params={"axis": int})

    @p.def_abstract_eval
    def _shape(x, v, i, *, axis):
        x, v, i = tensor(x, name), tensor(v, name), _int_indices(i, name)
        _check_axis(x, axis, name)
        want = _take_shape_of(x, i, axis)
        if v.shape != want:
            raise ShapeError(f"the update must have shape {want} (x.shape[:axis] + "
                             f"indices.shape + x.shape[axis+1:]), got {v.str_short()}.",
                             op=name)
        if v.dtype != x.dtype:
            raise DTypeError(f"the update's dtype must be {x.dtype}, got "
                             f"{v.str_short()}.", op=name)
        return x.update()

    return p


scatter_add_p = _make_scatter("scatter_add")
scatter_set_p = _make_scatter("scatter_set")


@scatter_add_p.def_impl
def _scatter_add_impl(x, v, i, *, axis):
    return x.at[_ix(axis, i)].add(v, mode="clip")


@scatter_set_p.def_impl
def _scatter_set_impl(x, v, i, *, axis):
    return x.at[_ix(axis, i)].set(v, mode="clip", unique_indices=True)


# linear in (x, v) for fixed indices

@take_p.def_jvp
def _take_jvp(primals, tangents, *, axis):
    (x, i), t = primals, tangents[0]
    return take_p.bind(x, i, axis=axis), take_p.bind(instantiate(t), i, axis=axis)


@take_p.def_transpose
def _take_transpose(ct, x, i, *, axis):
    assert is_linear(x) and not is_linear(i)
    return scatter_add_p.bind(zeros(type_of(x)), ct, i, axis=axis), None


def _scatter_jvp(prim):
    def jvp(primals, tangents, *, axis):
        (x, v, i), (tx, tv) = primals, tangents[:2]
        return (prim.bind(x, v, i, axis=axis),
                prim.bind(instantiate(tx), instantiate(tv), i, axis=axis))
    return jvp


scatter_add_p.def_jvp(_scatter_jvp(scatter_add_p))
scatter_set_p.def_jvp(_scatter_jvp(scatter_set_p))


@scatter_add_p.def_transpose
def _scatter_add_transpose(ct, x, v, i, *, axis):
    return (ct if is_linear(x) else None,
            take_p.bind(ct, i, axis=axis) if is_linear(v) else None, None)


@scatter_set_p.def_transpose
def _scatter_set_transpose(ct, x, v, i, *, axis):
    ct_x = scatter_set_p.bind(ct, zeros(type_of(v)), i, axis=axis) if is_linear(x) else None
    return ct_x, take_p.bind(ct, i, axis=axis) if is_linear(v) else None, None


# ---------------------------------------------------------------------------
# sort, argsort

sort_p = Primitive("sort", params={"axis": int})
argsort_p = Primitive("argsort", params={"axis": int})


@sort_p.def_abstract_eval
def _sort_shape(x, *, axis):
    x = tensor(x, "sort")
    _check_axis(x, axis, "sort")
    if x.dtype.kind == "c":
        raise DTypeError(f"complex values have no order (NumPy sorts them "
                         f"lexicographically; sciad does not), got {x.str_short()}.",
                         op="sort")
    return x.update()


@argsort_p.def_abstract_eval
def _argsort_shape(x, *, axis):
    _sort_shape(x, axis=axis)
    return TensorType(x.shape, np.dtype(np.int64))


@sort_p.def_impl
def _sort_impl(x, *, axis):
    return jnp.sort(x, axis=axis, stable=True)


@argsort_p.def_impl
def _argsort_impl(x, *, axis):
    return jnp.argsort(x, axis=axis, stable=True).astype(jnp.int64)


@sort_p.def_jvp
def _sort_jvp(primals, tangents, *, axis):
    (x,), (t,) = primals, tangents
    order = argsort_p.bind(x, axis=axis)
    return sort_p.bind(x, axis=axis), ops.take_along_axis(instantiate(t), order, axis,
                                                          mode="promise_in_bounds")


@sort_p.def_cost
def _sort_cost(node, body):
    # about n log2 n comparisons per sorted line of n values

    x = node.inputs[0].type
    n = x.shape[node.params["axis"]]
    return Cost(float(size(x)) * np.log2(max(n, 2)))


argsort_p.def_cost(_sort_cost)


# ---------------------------------------------------------------------------
# `searchsorted[side](a, v)`: where each of `v` would go in the sorted 1-D
# `a` (NumPy's `side`: "left" or "right"). Integer-valued: no derivative.

searchsorted_p = Primitive("searchsorted", params={"side": str})


@searchsorted_p.def_abstract_eval
def _searchsorted_shape(a, v, *, side):
    op = "searchsorted"
    a, v = tensor(a, op), tensor(v, op)
    if a.ndim != 1:
        raise ShapeError(f"the sorted array must be 1-D, got {a.str_short()}.", op=op)
    if side not in ("left", "right"):
        raise InvalidOptionError(f"`side` must be 'left' or 'right', got {side!r}.", op=op)
    if a.dtype != v.dtype:
        raise DTypeError(f"operands must share one dtype, got {a.str_short()} and "
                         f"{v.str_short()}.", op=op)
    if a.dtype.kind == "c":
        raise DTypeError(f"complex values have no order, got {a.str_short()}.", op=op)
    return TensorType(v.shape, np.dtype(np.int64))


@searchsorted_p.def_impl
def _searchsorted_impl(a, v, *, side):
    return jnp.searchsorted(a, v, side=side).astype(jnp.int64)


@searchsorted_p.def_cost
def _searchsorted_cost(node, body):
    n = node.inputs[0].type.shape[0]
    return Cost(float(size(node.inputs[1].type)) * np.log2(max(n, 2)))


# ---------------------------------------------------------------------------
# Batch rules.
#
# With the indices unbatched, the batch axis of `x` (and `v`) leads and
# `axis` moves up. With batched indices, each example indexes its own slice:
# `x`'s batch axis and indexed axis are merged into one axis of `B * n`
# entries, each example's indices are offset by `b * n`, and one `take` (or
# scatter) on the merged axis does the whole batch; the axes are then put
# back in place.

def _merged(x, axis):
    """`x` (batch axis first) as `(B * n, *other axes)`: the batch axis and
    `axis` (of the example) merged, the example's other axes in order."""
    b, n = x.shape[0], x.shape[axis + 1]
    x = ops.moveaxis(x, axis + 1, 1)
    return ops.reshape(x, (b * n,) + tuple(x.shape[2:]))


def _offset(i, n: int):
    b = i.shape[0]
    return i + ops.reshape(ops.arange(b, dtype=np.int64) * n, (b,) + (1,) * (len(i.shape) - 1))


def batched_take(x, i, axis: int):
    """`take` of each example's `x` at its own indices `i` along `axis` (of
    the example), both with the batch axis first; the result too."""
    pre, k = axis, len(i.shape) - 1
    out = take_p.bind(_merged(x, axis), _offset(i, x.shape[axis + 1]), axis=0)
    # (B, *i, *pre, *post) -> (B, *pre, *i, *post)
    perm = (0,) + tuple(range(1 + k, 1 + k + pre)) + tuple(range(1, 1 + k)) + \
        tuple(range(1 + k + pre, len(out.shape)))
    return ops.transpose(out, perm)


def _install_batch_rules() -> None:
    def take_rule(args, dims, *, axis):
        (x, i), (dx, di) = args, dims
        if di is None:
            return take_p.bind(to_front(x, dx), i, axis=axis + 1), 0
        if dx is None:  # one array, every example's indices: their batch dim stays
            return take_p.bind(x, i, axis=axis), axis + di
        return batched_take(to_front(x, dx), to_front(i, di), axis), 0

    def scatter_rule(prim):
        def rule(args, dims, *, axis):
            (x, v, i), (dx, dv, di) = args, dims
            size = batch_size_of(args, dims)
            x, v = batched_front(x, dx, size), batched_front(v, dv, size)
            if di is None:
                return prim.bind(x, v, i, axis=axis + 1), 0
            i = to_front(i, di)
            n, pre, k = x.shape[axis + 1], axis, len(i.shape) - 1
            # v: (B, *pre, *i, *post) -> (B, *i, *pre, *post), the merged layout
            perm = (0,) + tuple(range(1 + pre, 1 + pre + k)) + tuple(range(1, 1 + pre)) + \
                tuple(range(1 + pre + k, len(v.shape)))
            out = prim.bind(_merged(x, axis), ops.transpose(v, perm), _offset(i, n), axis=0)
            out = ops.reshape(out, (size, n) + tuple(out.shape[1:]))
            return ops.moveaxis(out, 1, axis + 1), 0
        return rule

    def index_bounds_rule(args, dims, *, size, mode, distinct, batch_dims=0):
        (i,), (d,) = args, dims
        i = ops.moveaxis(i, d, batch_dims) if d != batch_dims else i
        return index_bounds_p.bind(i, size=size, mode=mode, distinct=distinct,
                                   batch_dims=batch_dims + 1), batch_dims

    def searchsorted_rule(args, dims, *, side):
        (a, v), (da, dv) = args, dims
        if da is None:
            return searchsorted_p.bind(a, v, side=side), dv
        # each example's own sorted array: count the entries before each value
        size = batch_size_of(args, dims)
        a, v = to_front(a, da), batched_front(v, dv, size)
        k = len(v.shape) - 1
        a = ops.reshape(a, (size,) + (1,) * k + (a.shape[1],))
        v = ops.expand_dims(ops.astype(v, a.dtype), -1)
        before = (a < v) if side == "left" else (a <= v)
        return ops.sum(ops.astype(before, np.int64), axis=-1), 0

    index_bounds_p.def_batch(index_bounds_rule)
    take_p.def_batch(take_rule)
    scatter_add_p.def_batch(scatter_rule(scatter_add_p))
    scatter_set_p.def_batch(scatter_rule(scatter_set_p))
    sort_p.def_batch(front_rule(sort_p, shift_axes("axis")))
    argsort_p.def_batch(front_rule(argsort_p, shift_axes("axis")))
    searchsorted_p.def_batch(searchsorted_rule)


_install_batch_rules()


# ---------------------------------------------------------------------------
# Sparsity. With constant indices, `take` and the scatters move elements to
# known places (clipped into range as the implementations clip them); with
# traced ones, an element may be any of its line along `axis`. A scatter
# keeps an element of `x` unless a constant index surely writes over it
# (`scatter_set`); `sort` mixes each line along its axis.

def _clipped(i, n: int) -> np.ndarray:
    return np.clip(np.asarray(i.value, np.int64), 0, max(n - 1, 0))


def _line_groups(shape, axis: int, k: int = 1) -> np.ndarray:
    """Each element's line: its position on the axes but `axis ... axis + k`."""
    return axes_groups(shape, tuple(range(axis, axis + k)))


def _take_sparsity(outs, x, i, *, axis):
    if i.value is not None:
        idx = _clipped(i, x.shape[axis])
        return by_ids(lambda ids: np.take(ids, idx, axis=axis), x)
    return grouped(outs[0], x, _line_groups(x.shape, axis),
                   _line_groups(outs[0].shape, axis, len(i.shape)))


def _scatter_sparsity(overwrites: bool):
    def rule(outs, x, v, i, *, axis):
        if i.value is None:
            return union(x.matrix, grouped(outs[0], v, _line_groups(v.shape, axis, len(i.shape)),
                                           _line_groups(x.shape, axis)))
        ids = np.arange(x.size, dtype=np.int64).reshape(x.shape)
        positions = np.take(ids, _clipped(i, x.shape[axis]), axis=axis).ravel()
        if overwrites:
            keep = np.arange(x.size, dtype=np.int64)
            keep[positions] = -1
            x = Deps(select_rows(x.matrix, keep), x.shape)
        return scatter_add(outs[0], x, v, positions)
    return rule


def _sort_sparsity(outs, x, *, axis):
    return along(outs[0], x, (axis,))


take_p.def_sparsity(_take_sparsity)
scatter_add_p.def_sparsity(_scatter_sparsity(overwrites=False))
scatter_set_p.def_sparsity(_scatter_sparsity(overwrites=True))
sort_p.def_sparsity(_sort_sparsity)
