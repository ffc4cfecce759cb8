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


def unbroadcast_product(a, b, shape: tuple[int, ...]):
    """`unbroadcast(a * b, shape)`: the transpose of a product, one operand
    the cotangent (of the product's broadcast shape) and the other the
    factor, for an operand of `shape`. Where that sum runs over trailing
    axes which the factor spans exactly, the factor broadcast along the
    others (a per-cell coefficient times a shared element matrix, `rho[:,
    None, None] * Ke`), it is one matrix-vector product `ct.reshape(p, q) @
    factor.ravel()`: XLA:CPU's fused reduction otherwise writes the factor
    broadcast to the cotangent's shape out as a buffer of its own when the
    broadcast is shared with the forward product (268 MiB for the 524,288
    HEX8 cells of a million-node mesh). Every other case (no axis kept, or
    no factor of that form) is the product, then the sum."""
    shape = tuple(shape)
    out = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    r = len(out)
    ct, y = (a, b) if tuple(a.shape) == out else (b, a)
    xs = (1,) * (r - len(shape)) + shape
    ys = (1,) * (r - len(y.shape)) + tuple(y.shape)
    k = next((i for i in range(r) if all(xs[j] == 1 for j in range(i, r))), r)
    contract = (tuple(ct.shape) == out and 0 < k < r and len(shape) == r
                and np.prod(out[k:], dtype=np.int64) > 1
                and all(xs[i] == out[i] and ys[i] == 1 for i in range(k))
                and all(ys[i] == out[i] for i in range(k, r)))
    if not contract:
        return unbroadcast(a * b, shape)
    p = int(np.prod(out[:k], dtype=np.int64))
    q = int(np.prod(out[k:], dtype=np.int64))
    return ops.reshape(ops.matmul(ops.reshape(ct, (p, q)), ops.reshape(y, (q,))), shape)


def broadcast_tangent(t, shape: tuple[int, ...]):
    """A tangent broadcast to an output's `shape`."""
    return t if tuple(t.shape) == tuple(shape) else ops.broadcast_to(t, shape)
