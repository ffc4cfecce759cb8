"""Shared pieces of the shape rules: broadcasting, dtype checks, axes."""

from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from ..errors import DTypeError, ShapeError
from ..graph import TensorType


#: The declared type (`sciad.graph.Param`) of a param holding one number: a
#: Python scalar, or a NumPy one (the JSON format keeps either exactly).
SCALAR = (bool, int, float, complex, np.bool_, np.number)

#: The declared type of a shape, an axis list or a permutation.
INTS = tuple[int, ...]


def tensor(t, op: str, what: str = "operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise DTypeError(f"{what} must be a dense array, got {t}.", op=op)
    return t


def broadcast_shapes(shapes: Sequence[tuple[int, ...]], op: str,
                     types: Sequence[TensorType] | None = None) -> tuple[int, ...]:
    """NumPy broadcasting of `shapes`, or a `ShapeError` naming both sides."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        dim = 1
        for s in shapes:
            d = s[k - ndim + len(s)] if k - ndim + len(s) >= 0 else 1
            if d != 1:
                if dim != 1 and d != dim:
                    shown = ", ".join(t.str_short() for t in types) if types else \
                        ", ".join(map(str, shapes))
                    raise ShapeError(
                        f"operands {shown} cannot be broadcast together: axis "
                        f"{k - ndim} has sizes {dim} and {d}.", op=op)
                dim = d
        out.append(dim)
    return tuple(out)


def same_dtype(types: Sequence[TensorType], op: str) -> np.dtype:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise DTypeError(
            f"operands must share one dtype, got "
            f"{', '.join(t.str_short() for t in types)}. (`sciad.numpy` promotes for "
            "you; direct primitive calls must convert first.)", op=op)
    return types[0].dtype


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    # NumPy's rule: an integer, not a bool (`int()` would take 1.5 as 1)
    given = axis
    try:
        axis = None if isinstance(axis, (bool, np.bool_)) else operator.index(axis)
    except TypeError:
        axis = None
    if axis is None:
        many = " (this function takes one axis)" if isinstance(given, (tuple, list)) else ""
        raise ShapeError(f"`axis` must be an integer{many}, got {given!r}.", op=op)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of bounds for an array of {ndim} "
                         f"dimension{'s' if ndim != 1 else ''}.", op=op)
    return axis % ndim if ndim else 0


def normalize_axes(axes, ndim: int, op: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    if not isinstance(axes, (tuple, list)):  # one axis (NumPy's rule)
        axes = (axes,)
    out = tuple(normalize_axis(a, ndim, op) for a in axes)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {tuple(axes)}.", op=op)
    return out


def if_same_type(a, node):
    """`a` if it can replace `node`'s output in a simplify rule (it has
    exactly the output's type: dtype, shape and tags), else None."""
    return a if a.type == node.outputs[0].type else None


def is_float_or_complex(dtype: np.dtype) -> bool:
    return dtype.kind in "fc"


class _LazyNumpy:
    """`sciad.numpy`, imported on first use: derivative rules are written with
    it, and it imports this package."""

    def __getattr__(self, name):
        from .. import numpy

        return getattr(numpy, name)


snp = _LazyNumpy()


def unbroadcast(ct, shape: tuple[int, ...]):
    """Sums `ct` (the cotangent of a broadcast result) back to `shape`."""
    shape = tuple(shape)
    if tuple(ct.shape) == shape:
        return ct
    lead = len(ct.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and ct.shape[lead + i] != 1)
    out = snp.sum(ct, axis=axes) if axes else ct
    return snp.reshape(out, shape)


def broadcast_tangent(t, shape: tuple[int, ...]):
    """A tangent broadcast to an output's `shape`."""
    return t if tuple(t.shape) == tuple(shape) else snp.broadcast_to(t, shape)
