"""Shared pieces of the shape rules: broadcasting, dtype checks, axes."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import _ops as ops
from .._ops import broadcast_shapes as broadcast_shapes
from .._ops import normalize_axes as normalize_axes, normalize_axis as normalize_axis
from ..errors import DTypeError
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


def same_dtype(types: Sequence[TensorType], op: str) -> np.dtype:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise DTypeError(
            f"operands must share one dtype, got "
            f"{', '.join(t.str_short() for t in types)}. (`sciad.numpy` promotes for "
            "you; direct primitive calls must convert first.)", op=op)
    return types[0].dtype


def if_same_type(a, node):
    """`a` if it can replace `node`'s output in a simplify rule (it has
    exactly the output's type: dtype, shape and tags), else None."""
    return a if a.type == node.outputs[0].type else None


def is_float_or_complex(dtype: np.dtype) -> bool:
    return dtype.kind in "fc"


def unbroadcast(ct, shape: tuple[int, ...]):
    """Sums `ct` (the cotangent of a broadcast result) back to `shape`."""
    shape = tuple(shape)
    if tuple(ct.shape) == shape:
        return ct
    lead = len(ct.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and ct.shape[lead + i] != 1)
    out = ops.sum(ct, axis=axes) if axes else ct
    return ops.reshape(out, shape)


def broadcast_tangent(t, shape: tuple[int, ...]):
    """A tangent broadcast to an output's `shape`."""
    return t if tuple(t.shape) == tuple(shape) else ops.broadcast_to(t, shape)
