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

from .. import _ops as ops
from .._ops import BINARY as BINARY, UNARY as UNARY
from ..errors import DTypeError
from ..graph import Primitive, TensorType, Zero, add_tangents, instantiate, is_linear
from ..graph._batch import elementwise_rule
from ..graph._sparsity import elementwise
from ._creation import is_constant
from ._util import (
    broadcast_shapes,
    broadcast_tangent,
    if_same_type,
    same_dtype,
    tensor,
    unbroadcast,
    unbroadcast_product,
)


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


# NumPy orders complex numbers lexicographically; XLA has no such order, so
# these reject complex operands instead of disagreeing with NumPy.
_NO_COMPLEX = {"maximum", "minimum", "lt", "le", "gt", "ge", "floor_divide", "remainder",
               "floor", "ceil"}


def _make_unary(name: str, fn, rule) -> Primitive:
    p = Primitive(name, params={})
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
    p = Primitive(name, params={})
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
select_p = Primitive("select", params={})


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
convert_p = Primitive("convert", params={"dtype": np.dtype})


@convert_p.def_abstract_eval
def _convert_shape(x, *, dtype):
    x = tensor(x, "convert")
    return TensorType(x.shape, dtype)


@convert_p.def_impl
def _convert_impl(x, *, dtype):
    if jnp.iscomplexobj(x) and np.dtype(dtype).kind != "c":
        x = jnp.real(x)
    return x.astype(dtype)


# ---------------------------------------------------------------------------
# Derivative rules. `x` is the operand, `y` the result, `t` the tangent.
# Subgradient choices at kinks: abs'(0) = 0, sign' = floor' = ceil' = 0,
# maximum/minimum split a tie evenly (0.5 each), sqrt'(0) = inf (as JAX).
# Complex operands follow JAX: holomorphic ops multiply by f'(x).

def _abs_jvp(x, y, t):
    if x.dtype.kind != "c":
        return t * ops.sign(x)
    # d|z| = Re(conj(z) dz) / |z|, taken as 0 at z = 0
    safe = ops.where(y == 0, 1.0, y)
    return ops.where(y == 0, 0.0, ops.real(ops.conj(x) * t) / safe)


def _sign_jvp(x, y, t):
    if x.dtype.kind != "c":
        return Zero(TensorType(x.shape, x.dtype))
    # s = z/|z|: ds = (dz - s Re(conj(s) dz)) / |z|, taken as 0 at z = 0
    r = ops.abs(x)
    safe = ops.where(r == 0, 1.0, r)
    return ops.where(r == 0, 0.0, (t - y * ops.real(ops.conj(y) * t)) / safe)


def _zero_jvp(x, y, t):
    return Zero(TensorType(y.shape, y.dtype))


def _angle_jvp(x, y, t):
    if x.dtype.kind != "c":
        return Zero(TensorType(y.shape, y.dtype))
    return ops.imag(t / x)  # d arg(z) = Im(dz / z)


def _imag_jvp(x, y, t):
    return ops.imag(t) if x.dtype.kind == "c" else Zero(TensorType(y.shape, y.dtype))


_UNARY_JVP = {
    "neg": lambda x, y, t: -t,
    "exp": lambda x, y, t: t * y,
    "log": lambda x, y, t: t / x,
    "log1p": lambda x, y, t: t / (1 + x),
    "expm1": lambda x, y, t: t * (y + 1),
    "sin": lambda x, y, t: t * ops.cos(x),
    "cos": lambda x, y, t: -(t * ops.sin(x)),
    "tan": lambda x, y, t: t * (1 + y * y),
    "arcsin": lambda x, y, t: t / ops.sqrt(1 - x * x),
    "arccos": lambda x, y, t: -(t / ops.sqrt(1 - x * x)),
    "arctan": lambda x, y, t: t / (1 + x * x),
    "sinh": lambda x, y, t: t * ops.cosh(x),
    "cosh": lambda x, y, t: t * ops.sinh(x),
    "tanh": lambda x, y, t: t * (1 - y * y),
    "sqrt": lambda x, y, t: t / (2 * y),
    "abs": _abs_jvp,
    "sign": _sign_jvp,
    "square": lambda x, y, t: t * (2 * x),
    "floor": _zero_jvp,
    "ceil": _zero_jvp,
    "conj": lambda x, y, t: ops.conj(t),
    "real": lambda x, y, t: ops.real(t),
    "imag": _imag_jvp,
    "angle": _angle_jvp,
}


def _install_unary_rules() -> None:
    for name, rule in _UNARY_JVP.items():
        p = unary_primitives[name]

        def jvp(primals, tangents, _p=p, _rule=rule):
            (x,), (t,) = primals, tangents
            y = _p.bind(x)
            return y, _rule(x, y, t)

        p.def_jvp(jvp)

    unary_primitives["neg"].def_transpose(lambda ct, x: (-ct,))
    unary_primitives["conj"].def_transpose(lambda ct, x: (ops.conj(ct),))

    # real: C -> R; its transpose embeds a real cotangent as complex (JAX's rule)
    @unary_primitives["real"].def_transpose
    def _real_transpose(ct, x):
        return (ops.astype(ct, x.dtype),)

    # imag: C -> R, Im(v) = Re(-i v), so the transpose is -i times the cotangent
    @unary_primitives["imag"].def_transpose
    def _imag_transpose(ct, x):
        if x.dtype.kind != "c":
            return (None,)
        return (ops.astype(ct, x.dtype) * np.asarray(-1j, x.dtype),)


def _max_weight(x, y, greater):
    """1 where `x` wins, 0.5 on a tie, 0 where `y` wins."""
    win = ops.greater(x, y) if greater else ops.less(x, y)
    return ops.where(win, 1.0, ops.where(x == y, 0.5, 0.0)).astype(x.dtype)


def _binary_jvp_rules(x, y, tx, ty, out, name):
    """The tangent of `name(x, y)`, as a sum of terms, each None if zero."""
    zx, zy = isinstance(tx, Zero), isinstance(ty, Zero)
    if name == "add":
        return [None if zx else tx, None if zy else ty]
    if name == "sub":
        return [None if zx else tx, None if zy else -ty]
    if name == "mul":
        return [None if zx else tx * y, None if zy else x * ty]
    if name == "div":
        return [None if zx else tx / y, None if zy else -(out * ty / y)]
    if name == "pow":
        terms = [None, None]
        if not zx:  # d/dx x^y = y x^(y-1), taken as 0 where y == 0 (x^0 = 1).
            # There the base is replaced by 1: at x = 0, x^(y-1) is infinite,
            # and the derivatives of this rule would multiply it by a zero.
            y0 = y == 0
            base = ops.where(y0, 1.0, x).astype(x.dtype)
            terms[0] = tx * ops.where(y0, 0.0, y * ops.power(base, y - 1)).astype(out.dtype)
        if not zy:  # d/dy x^y = log(x) x^y, taken as 0 where x == 0
            safe = ops.where(x == 0, 1.0, x).astype(x.dtype)
            terms[1] = ty * ops.where(x == 0, 0.0, ops.log(safe) * out).astype(out.dtype)
        return terms
    if name in ("maximum", "minimum"):
        w = _max_weight(x, y, name == "maximum")
        return [None if zx else tx * w, None if zy else ty * (1 - w)]
    if name == "arctan2":  # d atan2(a, b) = (b da - a db) / (a^2 + b^2)
        r2 = x * x + y * y
        return [None if zx else tx * y / r2, None if zy else -(ty * x / r2)]
    if name == "remainder":  # x mod y = x - y floor(x / y)
        return [None if zx else tx, None if zy else -(ty * ops.floor_divide(x, y))]
    if name == "floor_divide":
        return [None, None]
    raise AssertionError(f"no JVP for {name}")


_LINEAR_BINARY = {"add", "sub"}


def _install_binary_rules() -> None:
    for name in ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "arctan2",
                 "remainder", "floor_divide"):
        p = binary_primitives[name]

        def jvp(primals, tangents, _p=p, _name=name):
            (x, y), (tx, ty) = primals, tangents
            out = _p.bind(x, y)
            terms = [broadcast_tangent(t, out.shape)
                     for t in _binary_jvp_rules(x, y, tx, ty, out, _name) if t is not None]
            if not terms:
                return out, Zero(TensorType(out.shape, out.dtype))
            tout = terms[0]
            for t in terms[1:]:
                tout = add_tangents(tout, t)
            return out, tout

        p.def_jvp(jvp)

    @binary_primitives["add"].def_transpose
    def _add_transpose(ct, x, y):
        return (unbroadcast(ct, x.shape) if is_linear(x) else None,
                unbroadcast(ct, y.shape) if is_linear(y) else None)

    @binary_primitives["sub"].def_transpose
    def _sub_transpose(ct, x, y):
        return (unbroadcast(ct, x.shape) if is_linear(x) else None,
                unbroadcast(-ct, y.shape) if is_linear(y) else None)

    # mul is linear in one operand at a time (the JVP never multiplies two tangents)
    @binary_primitives["mul"].def_transpose
    def _mul_transpose(ct, x, y):
        assert not (is_linear(x) and is_linear(y)), "mul: both operands linear"
        if is_linear(x):
            return unbroadcast_product(ct, y, x.shape), None
        return None, unbroadcast_product(x, ct, y.shape)

    @binary_primitives["div"].def_transpose
    def _div_transpose(ct, x, y):
        assert is_linear(x) and not is_linear(y), "div: only the numerator may be linear"
        return unbroadcast(ct / y, x.shape), None


_install_unary_rules()
_install_binary_rules()


@select_p.def_jvp
def _select_jvp(primals, tangents):
    (c, x, y), (_, tx, ty) = primals, tangents
    out = select_p.bind(c, x, y)
    if isinstance(tx, Zero) and isinstance(ty, Zero):
        return out, Zero(TensorType(out.shape, out.dtype))
    return out, select_p.bind(c, instantiate(tx), instantiate(ty))


@select_p.def_transpose
def _select_transpose(ct, c, x, y):
    assert not is_linear(c)
    zero = ops.zeros_like(ct)
    return (None,
            unbroadcast(select_p.bind(c, ct, zero), x.shape) if is_linear(x) else None,
            unbroadcast(select_p.bind(c, zero, ct), y.shape) if is_linear(y) else None)


@convert_p.def_jvp
def _convert_jvp(primals, tangents, *, dtype):
    (x,), (t,) = primals, tangents
    out = convert_p.bind(x, dtype=dtype)
    if np.dtype(dtype).kind not in "fc":
        return out, Zero(TensorType(out.shape, out.dtype))
    return out, convert_p.bind(t, dtype=dtype)


@convert_p.def_transpose
def _convert_transpose(ct, x, *, dtype):
    # complex -> real keeps the real part, whose transpose embeds; real ->
    # complex embeds, whose transpose keeps the real part: convert back either way.
    return (convert_p.bind(ct, dtype=x.dtype),)


# ---------------------------------------------------------------------------
# Simplify rules (the `simplify` pass): rewrites that give exactly the same
# values. "1" and "0" are constants (`is_constant`); a rewrite is made only if
# the value replacing the output has exactly its type, so `x * ones((2, 3))`
# with `x` of shape (3,) stays. Not rewritten: `x * 0` (NaN where `x` is NaN or
# infinite) and complex `x * 1`, `x / 1` (the product computes `b * 0` for the
# imaginary part of 1, NaN for an infinite `b`, and may flip a zero's sign).
# `x + 0` -> `x` keeps a -0.0 where -0.0 + 0.0 is +0.0, as XLA's simplifier does.

def _exact_one(node) -> bool:
    """Whether `x * 1 == x` exactly for the node's dtype: real and integer."""
    return node.outputs[0].type.dtype.kind != "c"


@binary_primitives["mul"].def_simplify
def _mul_simplify(node, producer):
    x, y = node.inputs
    if not _exact_one(node):
        return None
    if is_constant(y, 1, producer) and if_same_type(x, node):
        return x
    if is_constant(x, 1, producer):
        return if_same_type(y, node)
    return None


@binary_primitives["div"].def_simplify
def _div_simplify(node, producer):
    x, y = node.inputs
    if _exact_one(node) and is_constant(y, 1, producer):
        return if_same_type(x, node)
    return None


@binary_primitives["add"].def_simplify
def _add_simplify(node, producer):
    x, y = node.inputs
    if is_constant(y, 0, producer) and if_same_type(x, node):
        return x
    if is_constant(x, 0, producer):
        return if_same_type(y, node)
    return None


@binary_primitives["sub"].def_simplify
def _sub_simplify(node, producer):
    x, y = node.inputs
    return if_same_type(x, node) if is_constant(y, 0, producer) else None


@binary_primitives["pow"].def_simplify
def _pow_simplify(node, producer):
    # x ** 1 == x for real x, even inf and nan; complex powers go through exp
    # and log, which are not exact
    x, y = node.inputs
    if node.outputs[0].type.dtype.kind == "f" and is_constant(y, 1, producer):
        return if_same_type(x, node)
    return None


def _involution_simplify(node, producer):
    # neg(neg(x)) -> x, conj(conj(x)) -> x
    inner = producer(node.inputs[0])
    if inner is None or inner.primitive is not node.primitive:
        return None
    return if_same_type(inner.inputs[0], node)


unary_primitives["neg"].def_simplify(_involution_simplify)
unary_primitives["conj"].def_simplify(_involution_simplify)


@select_p.def_simplify
def _select_simplify(node, producer):
    # a constant condition (all true, or all false) picks one branch
    c, x, y = node.inputs
    for value, branch in ((True, x), (False, y)):
        if is_constant(c, value, producer) and if_same_type(branch, node):
            return branch
    return None


@convert_p.def_simplify
def _convert_simplify(node, producer):
    # a conversion to the operand's own dtype
    return if_same_type(node.inputs[0], node)


# ---------------------------------------------------------------------------
# Batch rules: every op here broadcasts its operands elementwise.

def _install_batch_rules() -> None:
    for p in (*unary_primitives.values(), *binary_primitives.values(), select_p, convert_p):
        p.def_batch(elementwise_rule(p))
        # Sparsity: each output element depends on the elements it is made from.
        p.def_sparsity(lambda outs, *deps, **params: elementwise(outs[0], *deps))


_install_batch_rules()
