"""Elementwise primitives: unary math, binary arithmetic, comparisons, select,
and dtype conversion.

Dtypes follow NumPy exactly: a primitive's output dtype is the one NumPy's
ufunc gives for its input dtype, and the primitive accepts only input dtypes
that NumPy's ufunc computes in without casting (`sciad.numpy` casts first,
e.g. `sin` of an int64 array converts it to float64). Binary primitives
broadcast their operands (NumPy rules) and need both operands of one dtype.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError
from ..graph import Primitive, TensorType
from ._util import broadcast_shapes, same_dtype, tensor


@functools.lru_cache(maxsize=None)
def ufunc_out_dtype(ufunc: np.ufunc, dtypes: tuple[np.dtype, ...]) -> np.dtype | None:
    """The output dtype of `ufunc` on `dtypes` if it computes there without
    casting the inputs, else None."""
    try:
        loop = ufunc.resolve_dtypes(dtypes + (None,))
    except Exception:  # NumPy has no loop for these dtypes
        return None
    if tuple(loop[: len(dtypes)]) != dtypes:
        return None
    return loop[-1]


def _real_dtype(dtype: np.dtype) -> np.dtype:
    return np.finfo(dtype).dtype if dtype.kind == "c" else dtype


def _float_or_complex_rule(name: str):
    def rule(dtype: np.dtype) -> np.dtype:
        if dtype.kind not in "fc":
            raise DTypeError(f"expects a float or complex operand, got {dtype}.", op=name)
        return _real_dtype(dtype)
    return rule


def _ufunc_rule(name: str, ufunc: np.ufunc):
    def rule(*dtypes: np.dtype) -> np.dtype:
        out = ufunc_out_dtype(ufunc, dtypes)
        if out is None:
            raise DTypeError(
                f"has no computation for operand dtype{'s' if len(dtypes) > 1 else ''} "
                f"{', '.join(map(str, dtypes))} (NumPy's `{ufunc.__name__}` would cast "
                "them first; `sciad.numpy` does that for you).", op=name)
        return out
    return rule


# name -> (jax function, numpy ufunc or a dtype rule)
UNARY = {
    "neg": (jnp.negative, np.negative),
    "exp": (jnp.exp, np.exp),
    "log": (jnp.log, np.log),
    "log1p": (jnp.log1p, np.log1p),
    "expm1": (jnp.expm1, np.expm1),
    "sin": (jnp.sin, np.sin),
    "cos": (jnp.cos, np.cos),
    "tan": (jnp.tan, np.tan),
    "arcsin": (jnp.arcsin, np.arcsin),
    "arccos": (jnp.arccos, np.arccos),
    "arctan": (jnp.arctan, np.arctan),
    "sinh": (jnp.sinh, np.sinh),
    "cosh": (jnp.cosh, np.cosh),
    "tanh": (jnp.tanh, np.tanh),
    "sqrt": (jnp.sqrt, np.sqrt),
    "abs": (jnp.abs, np.absolute),
    "sign": (jnp.sign, np.sign),
    "square": (jnp.square, np.square),
    "floor": (jnp.floor, np.floor),
    "ceil": (jnp.ceil, np.ceil),
    "conj": (jnp.conj, np.conjugate),
    "isfinite": (jnp.isfinite, np.isfinite),
    "logical_not": (jnp.logical_not, np.logical_not),
    "invert": (jnp.invert, np.invert),
    "real": (jnp.real, _float_or_complex_rule("real")),
    "imag": (jnp.imag, _float_or_complex_rule("imag")),
    "angle": (jnp.angle, _float_or_complex_rule("angle")),
}

BINARY = {
    "add": (jnp.add, np.add),
    "sub": (jnp.subtract, np.subtract),
    "mul": (jnp.multiply, np.multiply),
    "div": (jnp.true_divide, np.true_divide),
    "floor_divide": (jnp.floor_divide, np.floor_divide),
    "remainder": (jnp.remainder, np.remainder),
    "pow": (jnp.power, np.power),
    "maximum": (jnp.maximum, np.maximum),
    "minimum": (jnp.minimum, np.minimum),
    "arctan2": (jnp.arctan2, np.arctan2),
    "eq": (jnp.equal, np.equal),
    "ne": (jnp.not_equal, np.not_equal),
    "lt": (jnp.less, np.less),
    "le": (jnp.less_equal, np.less_equal),
    "gt": (jnp.greater, np.greater),
    "ge": (jnp.greater_equal, np.greater_equal),
    "logical_and": (jnp.logical_and, np.logical_and),
    "logical_or": (jnp.logical_or, np.logical_or),
    "bitwise_and": (jnp.bitwise_and, np.bitwise_and),
    "bitwise_or": (jnp.bitwise_or, np.bitwise_or),
    "bitwise_xor": (jnp.bitwise_xor, np.bitwise_xor),
}

# NumPy orders complex numbers lexicographically; XLA has no such order, so
# these reject complex operands instead of disagreeing with NumPy.
_NO_COMPLEX = {"maximum", "minimum", "lt", "le", "gt", "ge", "floor_divide", "remainder",
               "floor", "ceil"}


def _make_unary(name: str, fn, rule) -> Primitive:
    p = Primitive(name)
    dtype_rule = _ufunc_rule(name, rule) if isinstance(rule, np.ufunc) else rule

    @p.def_abstract_eval
    def _shape(x):
        x = tensor(x, name)
        if name in _NO_COMPLEX and x.dtype.kind == "c":
            raise DTypeError(f"is not defined for complex operands, got {x.str_short()}.",
                             op=name)
        return TensorType(x.shape, dtype_rule(x.dtype))

    @p.def_impl
    def _impl(x):
        return fn(x)

    return p


def _make_binary(name: str, fn, ufunc) -> Primitive:
    p = Primitive(name)
    dtype_rule = _ufunc_rule(name, ufunc)

    @p.def_abstract_eval
    def _shape(x, y):
        x, y = tensor(x, name), tensor(y, name)
        dtype = same_dtype((x, y), name)
        if name in _NO_COMPLEX and dtype.kind == "c":
            raise DTypeError(
                f"is not defined for complex operands (no order on complex numbers), got "
                f"{x.str_short()} and {y.str_short()}.", op=name)
        shape = broadcast_shapes((x.shape, y.shape), name, (x, y))
        return TensorType(shape, dtype_rule(dtype, dtype))

    @p.def_impl
    def _impl(x, y):
        out = fn(x, y)
        if name in ("floor_divide", "remainder") and jnp.issubdtype(x.dtype, jnp.integer):
            out = jnp.where(y == 0, jnp.zeros_like(out), out)  # NumPy: x // 0 == x % 0 == 0
        return out

    return p


unary_primitives = {name: _make_unary(name, fn, rule) for name, (fn, rule) in UNARY.items()}
binary_primitives = {name: _make_binary(name, fn, uf) for name, (fn, uf) in BINARY.items()}

# `select(cond, x, y)`: x where cond, else y (NumPy's 3-argument `where`).
select_p = Primitive("select")


@select_p.def_abstract_eval
def _select_shape(cond, x, y):
    cond, x, y = (tensor(t, "select") for t in (cond, x, y))
    if cond.dtype != np.bool_:
        raise DTypeError(f"`cond` must be boolean, got {cond.str_short()}.", op="select")
    dtype = same_dtype((x, y), "select")
    return TensorType(broadcast_shapes((cond.shape, x.shape, y.shape), "select",
                                       (cond, x, y)), dtype)


@select_p.def_impl
def _select_impl(cond, x, y):
    return jnp.where(cond, x, y)


# `convert(x, dtype=...)`: NumPy's `astype` (complex -> real drops the imaginary part).
convert_p = Primitive("convert")


@convert_p.def_abstract_eval
def _convert_shape(x, *, dtype):
    x = tensor(x, "convert")
    return TensorType(x.shape, dtype)


@convert_p.def_impl
def _convert_impl(x, *, dtype):
    if jnp.iscomplexobj(x) and np.dtype(dtype).kind != "c":
        x = jnp.real(x)
    return x.astype(dtype)
