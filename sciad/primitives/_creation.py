"""Array creation from static params: `full`, `arange`, `linspace`, `eye`.
They take no operands, so the printed graph shows how an array was made
instead of a large constant."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError
from ..graph import Literal, Primitive, TensorType
from ._util import INTS, SCALAR

full_p = Primitive("full", params={"shape": INTS, "dtype": np.dtype, "value": SCALAR})


@full_p.def_abstract_eval
def _full_shape(*, shape, dtype, value):
    return TensorType(shape, dtype)


@full_p.def_impl
def _full_impl(*, shape, dtype, value):
    return jnp.full(shape, value, dtype=dtype)


def is_constant(a, value, producer) -> bool:
    """Whether the operand `a` is `value` everywhere, as the simplify rules
    see it: a `Literal` whose every element is `value`, or the output of a
    `full` node of that value (`producer(a)` is the node computing `a`)."""
    if isinstance(a, Literal):
        return bool(np.all(a.value == value))
    node = producer(a)
    return (node is not None and node.primitive is full_p
            and bool(np.all(np.asarray(node.params["value"]) == value)))


def arange_length(start, stop, step) -> int:
    if step == 0:
        raise ShapeError("`step` cannot be zero.", op="arange")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return len(range(start, stop, step))
    return max(0, math.ceil((stop - start) / step))


arange_p = Primitive("arange", params={"start": SCALAR, "stop": SCALAR, "step": SCALAR,
                                        "dtype": np.dtype})


@arange_p.def_abstract_eval
def _arange_shape(*, start, stop, step, dtype):
    return TensorType((arange_length(start, stop, step),), dtype)


@arange_p.def_impl
def _arange_impl(*, start, stop, step, dtype):
    # computed as NumPy does (start + i*step in the computation dtype), then moved
    return jnp.asarray(np.arange(start, stop, step, dtype=dtype))


linspace_p = Primitive("linspace", params={"start": SCALAR, "stop": SCALAR, "num": int,
                                            "endpoint": bool, "dtype": np.dtype})


@linspace_p.def_abstract_eval
def _linspace_shape(*, start, stop, num, endpoint, dtype):
    if num < 0:
        raise ShapeError(f"`num` must be non-negative, got {num}.", op="linspace")
    return TensorType((num,), dtype)


@linspace_p.def_impl
def _linspace_impl(*, start, stop, num, endpoint, dtype):
    return jnp.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)


eye_p = Primitive("eye", params={"n": int, "m": int, "k": int, "dtype": np.dtype})


@eye_p.def_abstract_eval
def _eye_shape(*, n, m, k, dtype):
    if n < 0 or m < 0:
        raise ShapeError(f"sizes must be non-negative, got n={n}, m={m}.", op="eye")
    return TensorType((n, m), dtype)


@eye_p.def_impl
def _eye_impl(*, n, m, k, dtype):
    return jnp.eye(n, m, k, dtype=dtype)
