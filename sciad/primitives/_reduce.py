"""Reductions over static axes: `reduce_sum`, `reduce_prod`, `reduce_max`,
`reduce_min`. The reduced axes are removed (`sciad.numpy` handles
`keepdims` with a reshape, and NumPy's accumulation dtypes with a convert)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from .. import _ops as ops
from ..errors import DTypeError, ShapeError
from ..graph import Primitive, TensorType
from ..graph._batch import front_rule, shift_axes
from ..graph._sparsity import _bool, _check_entries, along
from ._util import INTS, normalize_axes, tensor

_REDUCERS = {
    "reduce_sum": jnp.sum,
    "reduce_prod": jnp.prod,
    "reduce_max": jnp.max,
    "reduce_min": jnp.min,
}


def _make_reduce(name: str, fn) -> Primitive:
    p = Primitive(name, params={"axes": INTS})

    @p.def_abstract_eval
    def _shape(x, *, axes):
        x = tensor(x, name)
        if not isinstance(axes, tuple) or normalize_axes(axes, x.ndim, name) != axes \
                or tuple(sorted(axes)) != axes:
            raise ShapeError(f"`axes` must be a sorted tuple of distinct axes in "
                             f"[0, {x.ndim}), got {axes!r}.", op=name)
        if name in ("reduce_max", "reduce_min"):
            if x.dtype.kind == "c":
                raise DTypeError(f"is not defined for complex operands, got "
                                 f"{x.str_short()}.", op=name)
            if any(x.shape[a] == 0 for a in axes):
                raise ShapeError(f"cannot reduce {x.str_short()} over an empty axis: the "
                                 "maximum/minimum of nothing has no value.", op=name)
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(shape, x.dtype)

    @p.def_impl
    def _impl(x, *, axes):
        if name in ("reduce_sum", "reduce_prod"):  # jnp would widen small ints
            return fn(x, axis=axes, dtype=x.dtype)
        return fn(x, axis=axes)

    return p


reduce_primitives = {name: _make_reduce(name, fn) for name, fn in _REDUCERS.items()}
reduce_sum_p = reduce_primitives["reduce_sum"]
reduce_prod_p = reduce_primitives["reduce_prod"]
reduce_max_p = reduce_primitives["reduce_max"]
reduce_min_p = reduce_primitives["reduce_min"]


# ---------------------------------------------------------------------------
# Derivative rules

def _kept_shape(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _expand(y, x_shape, axes):
    """`y` (reduced over `axes`) broadcast back to `x_shape`."""
    return ops.broadcast_to(ops.reshape(y, _kept_shape(x_shape, axes)), x_shape)


@reduce_sum_p.def_jvp
def _reduce_sum_jvp(primals, tangents, *, axes):
    (x,), (t,) = primals, tangents
    return reduce_sum_p.bind(x, axes=axes), reduce_sum_p.bind(t, axes=axes)


@reduce_sum_p.def_transpose
def _reduce_sum_transpose(ct, x, *, axes):
    return (_expand(ct, x.shape, axes),)


def _extremum_jvp(prim):
    # The tangent is the mean of the tangents at the positions that attain the
    # extremum: the derivative where it is unique, the average on a tie.
    def jvp(primals, tangents, *, axes):
        (x,), (t,) = primals, tangents
        y = prim.bind(x, axes=axes)
        hit = ops.astype(x == _expand(y, x.shape, axes), x.dtype)
        count = reduce_sum_p.bind(hit, axes=axes)
        return y, reduce_sum_p.bind(t * hit, axes=axes) / count
    return jvp


reduce_max_p.def_jvp(_extremum_jvp(reduce_max_p))
reduce_min_p.def_jvp(_extremum_jvp(reduce_min_p))


@reduce_prod_p.def_jvp
def _reduce_prod_jvp(primals, tangents, *, axes):
    # d prod(x) = sum_i t_i prod_{j != i} x_j. The products of the others are
    # formed directly (an n x n masked product over the n reduced elements),
    # so zeros in x need no division: exact where prod(x)/x_i would be 0/0.
    (x,), (t,) = primals, tangents
    y = reduce_prod_p.bind(x, axes=axes)
    keep = [i for i in range(x.ndim) if i not in axes]
    perm = tuple(keep) + tuple(axes)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    lead = tuple(x.shape[i] for i in keep)
    xr = ops.reshape(ops.transpose(x, perm), lead + (n,))
    tr = ops.reshape(ops.transpose(t, perm), lead + (n,))
    grid = ops.broadcast_to(ops.reshape(xr, lead + (1, n)), lead + (n, n))
    others = ops.prod(ops.where(ops.eye(n, dtype=bool), ops.ones((), x.dtype), grid), axis=-1)
    return y, ops.sum(tr * others, axis=-1)


# ---------------------------------------------------------------------------
# `cumsum[axis, reverse](x)`: running sums along one axis (from the end with
# `reverse`). Linear; its transpose is the running sum the other way, so a
# transpose of a transpose is the original op.

cumsum_p = Primitive("cumsum", params={"axis": int, "reverse": bool})


@cumsum_p.def_abstract_eval
def _cumsum_shape(x, *, axis, reverse):
    x = tensor(x, "cumsum")
    if x.ndim == 0 or normalize_axes((axis,), x.ndim, "cumsum") != (axis,):
        raise ShapeError(f"`axis` must be in [0, {x.ndim}), got {axis} for "
                         f"{x.str_short()}.", op="cumsum")
    if x.dtype == np.bool_:
        raise DTypeError("sums of bools are counts: convert to an integer dtype first.",
                         op="cumsum")
    return x.update()


@cumsum_p.def_impl
def _cumsum_impl(x, *, axis, reverse):
    return jax.lax.cumsum(x, axis=axis, reverse=reverse)


@cumsum_p.def_jvp
def _cumsum_jvp(primals, tangents, *, axis, reverse):
    (x,), (t,) = primals, tangents
    return (cumsum_p.bind(x, axis=axis, reverse=reverse),
            cumsum_p.bind(t, axis=axis, reverse=reverse))


@cumsum_p.def_transpose
def _cumsum_transpose(ct, x, *, axis, reverse):
    return (cumsum_p.bind(ct, axis=axis, reverse=not reverse),)


# ---------------------------------------------------------------------------
# Batch rules: the batch axis leads, the reduced (or scanned) axes move up.

def _install_batch_rules() -> None:
    for p in reduce_primitives.values():
        p.def_batch(front_rule(p, shift_axes("axes")))
    cumsum_p.def_batch(front_rule(cumsum_p, shift_axes("axis")))


_install_batch_rules()


# ---------------------------------------------------------------------------
# Sparsity: an output element depends on the elements reduced into it (a
# cumulative sum: on those up to it along its axis, after it if `reverse`).

def _reduce_sparsity(outs, x, *, axes):
    return along(outs[0], x, axes, ())


def _cumsum_sparsity(outs, x, *, axis, reverse):
    # in C order the line along `axis` is a (outer, L, inner) block: the
    # selection is I_outer (x) T (x) I_inner, T the triangle of a line

    shape = x.shape
    line = shape[axis]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    _check_entries(outer * inner * line * (line + 1) // 2)
    below, upto = np.tril_indices(line)
    rows, cols = (upto, below) if reverse else (below, upto)
    tri = sp.csr_matrix((np.ones(rows.size, bool), (rows, cols)), shape=(line, line))
    sel = sp.kron(sp.eye(outer, dtype=bool), sp.kron(tri, sp.eye(inner, dtype=bool)),
                  format="csr")
    return _bool(_bool(sel) @ x.matrix)


for _p in reduce_primitives.values():
    _p.def_sparsity(_reduce_sparsity)
cumsum_p.def_sparsity(_cumsum_sparsity)
