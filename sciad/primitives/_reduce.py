"""Reductions over static axes: `reduce_sum`, `reduce_prod`, `reduce_max`,
`reduce_min`. The reduced axes are removed (`sciad.numpy` handles
`keepdims` with a reshape, and NumPy's accumulation dtypes with a convert)."""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import DTypeError, ShapeError
from ..graph import Primitive, TensorType
from ._util import normalize_axes, tensor

_REDUCERS = {
    "reduce_sum": jnp.sum,
    "reduce_prod": jnp.prod,
    "reduce_max": jnp.max,
    "reduce_min": jnp.min,
}


def _make_reduce(name: str, fn) -> Primitive:
    p = Primitive(name)

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
