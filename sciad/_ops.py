"""The op layer: NumPy-semantics functions that bind the built-in primitives.

Derivative, transpose and batching rules are written with these (`from .. import
_ops as ops`; `ops.where(mask, g, 0.0)`), and the public `sciad.numpy` is built on
them: the functions here are `sciad.numpy`'s (same objects, `__module__` set there),
with NumPy's broadcasting, dtype promotion (NEP 50 weak Python scalars),
accumulation dtypes and `keepdims`. This layer sits above `sciad.graph` and below
`sciad.primitives`: it finds each primitive in the graph registry by name when
first called (`lookup_primitive`), so it imports no primitive module. The helpers
that both this layer and the primitives' shape rules need (axis and broadcasting
checks, the elementwise ufunc tables, concrete index normalization) live here.
"""

from __future__ import annotations

import builtins as _builtins
import functools as _functools
import operator as _operator
from dataclasses import dataclass as _dataclass
from typing import Sequence as _Sequence

import jax as _jax
import jax.numpy as _jnp
import numpy as _np

from .errors import DTypeError as _DTypeError, IndexingError as _IndexingError
from .errors import InvalidOptionError as _InvalidOptionError
from .errors import NotSupportedError as _NotSupportedError, ShapeError as _ShapeError
from .errors import TracerError as _TracerError, plain as _plain
from .graph import TensorType as _TensorType, Tracer as _Tracer
from .graph import lookup_primitive as _lookup_primitive
from .graph import register_param_type as _register_param_type
from .graph._types import SparseArray as _SparseArray, SparseType as _SparseType

_SPARSE = None  # see `set_sparse_handler`
_PRIMS: dict = {}


def _prim(name: str):
    """The registered primitive `name` (looked up once, then cached)."""
    p = _PRIMS.get(name)
    if p is None:
        p = _PRIMS[name] = _lookup_primitive(name)
        if p is None:  # pragma: no cover  (sciad.primitives registers them all)
            raise LookupError(f"no primitive {name!r} is registered (import sciad first).")
    return p


# ---------------------------------------------------------------------------
# shared checks (the primitives' shape rules use them too)

def broadcast_shapes(shapes: _Sequence[tuple[int, ...]], op: str,
                     types: _Sequence[_TensorType] | None = None) -> tuple[int, ...]:
    """NumPy broadcasting of `shapes`, or a `ShapeError` naming both sides."""
    ndim = _builtins.max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        dim = 1
        for s in shapes:
            d = s[k - ndim + len(s)] if k - ndim + len(s) >= 0 else 1
            if d != 1:
                if dim != 1 and d != dim:
                    shown = ", ".join(t.str_short() for t in types) if types else \
                        ", ".join(map(str, shapes))
                    raise _ShapeError(
                        f"operands {shown} cannot be broadcast together: axis "
                        f"{k - ndim} has sizes {dim} and {d}.", op=op)
                dim = d
        out.append(dim)
    return tuple(out)


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    # NumPy's rule: an integer, not a bool (`int()` would take 1.5 as 1)
    given = axis
    try:
        axis = None if isinstance(axis, (bool, _np.bool_)) else _operator.index(axis)
    except TypeError:
        axis = None
    if axis is None:
        many = " (this function takes one axis)" if isinstance(given, (tuple, list)) else ""
        raise _ShapeError(f"`axis` must be an integer{many}, got {given!r}.", op=op)
    if not -ndim <= axis < ndim:
        raise _ShapeError(f"axis {axis} is out of bounds for an array of {ndim} "
                          f"dimension{'s' if ndim != 1 else ''}.", op=op)
    return axis % ndim if ndim else 0


def normalize_axes(axes, ndim: int, op: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    if not isinstance(axes, (tuple, list)):  # one axis (NumPy's rule)
        axes = (axes,)
    out = tuple(normalize_axis(a, ndim, op) for a in axes)
    if len(set(out)) != len(out):
        raise _ShapeError(f"repeated axis in {tuple(axes)}.", op=op)
    return out


def is_int(x) -> bool:
    return isinstance(x, (int, _np.integer)) and not isinstance(x, (bool, _np.bool_))


def normalize_indices(i: _np.ndarray, size: int, mode: str, distinct: bool, op: str):
    """Concrete indices brought into `[0, size)`, checked when traced."""
    i = _np.asarray(i)
    if mode == "raise":
        bad = (i < -size) | (i >= size)
        if bad.any():
            first = int(i[bad].flat[0])
            raise _IndexingError(_out_of_bounds_text(first, size, int(bad.sum()), i.size),
                                 op=op)
        out = _np.where(i < 0, i + size, i)
    elif mode == "wrap":
        out = _np.mod(i, size) if size else i
    else:
        out = _np.clip(i, 0, _builtins.max(size - 1, 0))
    if distinct and _np.unique(out).size != out.size:
        raise _IndexingError(_repeated_text(out), op=op)
    return out.astype(_np.int64 if out.dtype.kind in "iu" else out.dtype, copy=False)


def _out_of_bounds_text(first: int, size: int, count: int, total: int) -> str:
    many = "" if total <= 1 else \
        f" ({count} of {total} indices {'is' if count == 1 else 'are'})"
    return f"index {first} is out of bounds for an axis of size {size}{many}."


def _repeated_text(out) -> str:
    vals, counts = _np.unique(_np.asarray(out).ravel(), return_counts=True)
    rep = vals[counts > 1]
    s = "s" if rep.size != 1 else ""
    return (f"`.at[i].set(v)` needs distinct indices, but {rep.size} index value{s} "
            f"repeat{'' if s else 's'} (first: {int(rep[0])}). Use "
            "`.at[i].add(v)` to accumulate, or make the indices distinct.")


# ---------------------------------------------------------------------------
# static indexes (the `index` param of getitem, index_set, index_add)

@_dataclass(frozen=True)
class StaticIndex:
    items: tuple

    def __str__(self) -> str:
        parts = []
        for it in self.items:
            if it is None:
                parts.append("None")
            elif isinstance(it, int):
                parts.append(str(it))
            else:
                start, stop, step = it
                text = f"{start}:{'' if stop is None else stop}"
                parts.append(text if step == 1 else f"{text}:{step}")
        return "[" + ", ".join(parts) + "]"

    def to_jax(self) -> tuple:
        return tuple(slice(*it) if isinstance(it, tuple) else it for it in self.items)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        out, k = [], 0
        for it in self.items:
            if it is None:
                out.append(1)
                continue
            if isinstance(it, tuple):
                start, stop, step = it
                out.append(len(range(start, -1 if stop is None else stop, step)))
            k += 1
        return tuple(out) + tuple(shape[k:])


_register_param_type(
    StaticIndex, "index",
    lambda ix: [it if it is None or isinstance(it, int) else list(it) for it in ix.items],
    lambda data: StaticIndex(tuple(
        it if it is None or isinstance(it, int) else (int(it[0]),
                                                      None if it[1] is None else int(it[1]),
                                                      int(it[2]))
        for it in data)),
)


def normalize_index(idx, shape: tuple[int, ...], op: str = "getitem") -> StaticIndex:
    """A NumPy basic index as a `StaticIndex` against `shape`."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    n_ellipsis = _builtins.sum(1 for i in idx if i is Ellipsis)
    if n_ellipsis > 1:
        raise _IndexingError("an index can have only one ellipsis (`...`).", op=op)
    n_real = _builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise _IndexingError(f"too many indices: {n_real} for an array of {len(shape)} "
                            f"dimension{'s' if len(shape) != 1 else ''}.", op=op)
    items, k = [], 0
    for i in idx:
        if i is Ellipsis:
            for _ in range(len(shape) - n_real):
                items.append((0, shape[k], 1))
                k += 1
        elif i is None:
            items.append(None)
        elif is_int(i):
            d = shape[k]
            if not -d <= int(i) < d:
                raise _IndexingError(f"index {int(i)} is out of bounds for axis {k} with "
                                    f"size {d}.", op=op)
            items.append(int(i) % d)
            k += 1
        elif isinstance(i, slice):
            for part in (i.start, i.stop, i.step):
                if part is not None and not is_int(part):
                    raise _IndexingError(
                        f"slice bounds must be static ints or None, got {i}. Slicing by "
                        "traced values is not supported.", op=op)
            if i.step is not None and int(i.step) == 0:
                raise _IndexingError("slice step cannot be zero.", op=op)
            start, stop, step = slice(*(None if p is None else int(p)
                                        for p in (i.start, i.stop, i.step))).indices(shape[k])
            if not range(start, stop, step):  # canonical empty slice
                start, stop, step = 0, 0, 1
            items.append((start, None if stop < 0 else stop, step))
            k += 1
        else:
            kind = type(i).__name__
            raise _IndexingError(
                f"unsupported index of type {kind}: only static ints, slices, None and "
                "`...` are supported (no integer-array, boolean-mask or traced indices).",
                op=op)
    for d in shape[k:]:
        items.append((0, d, 1))
    return StaticIndex(tuple(items))


# ---------------------------------------------------------------------------
# the elementwise primitives: JAX function and NumPy ufunc (or dtype rule)

def _real_dtype(dtype: _np.dtype) -> _np.dtype:
    return _np.finfo(dtype).dtype if dtype.kind == "c" else dtype


def _float_or_complex_rule(name: str):
    def rule(dtype: _np.dtype) -> _np.dtype:
        if dtype.kind not in "fc":
            raise _DTypeError(f"expects a float or complex operand, got {dtype}.", op=name)
        return _real_dtype(dtype)
    return rule


# name -> (jax function, numpy ufunc or a dtype rule)
UNARY = {
    "neg": (_jnp.negative, _np.negative),
    "exp": (_jnp.exp, _np.exp),
    "log": (_jnp.log, _np.log),
    "log1p": (_jnp.log1p, _np.log1p),
    "expm1": (_jnp.expm1, _np.expm1),
    "sin": (_jnp.sin, _np.sin),
    "cos": (_jnp.cos, _np.cos),
    "tan": (_jnp.tan, _np.tan),
    "arcsin": (_jnp.arcsin, _np.arcsin),
    "arccos": (_jnp.arccos, _np.arccos),
    "arctan": (_jnp.arctan, _np.arctan),
    "sinh": (_jnp.sinh, _np.sinh),
    "cosh": (_jnp.cosh, _np.cosh),
    "tanh": (_jnp.tanh, _np.tanh),
    "sqrt": (_jnp.sqrt, _np.sqrt),
    "abs": (_jnp.abs, _np.absolute),
    "sign": (_jnp.sign, _np.sign),
    "square": (_jnp.square, _np.square),
    "floor": (_jnp.floor, _np.floor),
    "ceil": (_jnp.ceil, _np.ceil),
    "conj": (_jnp.conj, _np.conjugate),
    "isfinite": (_jnp.isfinite, _np.isfinite),
    "logical_not": (_jnp.logical_not, _np.logical_not),
    "invert": (_jnp.invert, _np.invert),
    "real": (_jnp.real, _float_or_complex_rule("real")),
    "imag": (_jnp.imag, _float_or_complex_rule("imag")),
    "angle": (_jnp.angle, _float_or_complex_rule("angle")),
}

BINARY = {
    "add": (_jnp.add, _np.add),
    "sub": (_jnp.subtract, _np.subtract),
    "mul": (_jnp.multiply, _np.multiply),
    "div": (_jnp.true_divide, _np.true_divide),
    "floor_divide": (_jnp.floor_divide, _np.floor_divide),
    "remainder": (_jnp.remainder, _np.remainder),
    "pow": (_jnp.power, _np.power),
    "maximum": (_jnp.maximum, _np.maximum),
    "minimum": (_jnp.minimum, _np.minimum),
    "arctan2": (_jnp.arctan2, _np.arctan2),
    "eq": (_jnp.equal, _np.equal),
    "ne": (_jnp.not_equal, _np.not_equal),
    "lt": (_jnp.less, _np.less),
    "le": (_jnp.less_equal, _np.less_equal),
    "gt": (_jnp.greater, _np.greater),
    "ge": (_jnp.greater_equal, _np.greater_equal),
    "logical_and": (_jnp.logical_and, _np.logical_and),
    "logical_or": (_jnp.logical_or, _np.logical_or),
    "bitwise_and": (_jnp.bitwise_and, _np.bitwise_and),
    "bitwise_or": (_jnp.bitwise_or, _np.bitwise_or),
    "bitwise_xor": (_jnp.bitwise_xor, _np.bitwise_xor),
}

# ---------------------------------------------------------------------------
# operand helpers

_WEAK = (bool, int, float, complex)


def _is_weak(x) -> bool:
    return isinstance(x, _WEAK) and not isinstance(x, _np.generic)


def _operand(x, op: str):
    """`x` as a tracer, a JAX/NumPy array, or a (weak) Python scalar."""
    if isinstance(x, (_Tracer, _np.ndarray, _jax.Array)) or _is_weak(x):
        return x
    if isinstance(x, (list, tuple)):
        if _builtins.any(isinstance(v, _Tracer) for v in _jax.tree_util.tree_leaves(x)):
            return stack([_operand(v, op) for v in x])
    if type(x).__module__.startswith("scipy.sparse"):
        raise _DTypeError(f"a scipy.sparse matrix ({type(x).__name__}) is not an array: "
                          "convert it with `sd.sparse.from_scipy(A)` (sparse products and "
                          "`sd.linalg.solve` take it), or with `A.toarray()` for a dense "
                          "array.", op=op)
    try:
        arr = _np.asarray(x)
    except Exception:
        arr = None
    if arr is None or arr.dtype == object or arr.dtype.kind not in "biufc":
        raise _DTypeError(f"expected an array or a number, got {type(x).__name__}.", op=op)
    return arr


def _dtype(x) -> _np.dtype:
    if _is_weak(x):
        return _np.asarray(x).dtype
    return _np.dtype(x.dtype)


def _shape(x) -> tuple[int, ...]:
    return () if _is_weak(x) else tuple(x.shape)


def _result_type(*xs, op: str) -> _np.dtype:
    try:
        return _np.result_type(*(x if _is_weak(x) else _dtype(x) for x in xs))
    except (TypeError, OverflowError) as err:
        raise _DTypeError(f"no common dtype for operands: {err}", op=op) from None


def _convert(x, dtype):
    dtype = _np.dtype(dtype)
    if _is_weak(x) or isinstance(x, (_np.ndarray, _np.generic)):
        arr = _np.asarray(x)
        if arr.dtype.kind == "c" and dtype.kind != "c":
            arr = arr.real
        return arr.astype(dtype, copy=False)
    if _np.dtype(x.dtype) == dtype:
        return x
    return _prim("convert").bind(x, dtype=dtype)


def _as_array(x, op: str):
    """Like `_operand`, with Python scalars made into 0-d NumPy arrays."""
    x = _operand(x, op)
    return _np.asarray(x) if _is_weak(x) else x


def _canonical_dtype(dtype) -> _np.dtype | None:
    return None if dtype is None else _np.dtype(dtype)


# ---------------------------------------------------------------------------
# elementwise

def _is_sparse(x) -> bool:
    t = type(x)
    return t is _SparseArray or (t is _Tracer and type(x._var.type) is _SparseType)


def _sparse_module():
    """The module that takes sparse operands (`sciad.sparse`, a higher layer:
    it is handed to `set_sparse_handler` by `sciad.numpy`)."""
    if _SPARSE is None:
        raise _NotSupportedError("sparse operands need `sciad.sparse` (import sciad).",
                                 op="sparse")
    return _SPARSE


def set_sparse_handler(module) -> None:
    """Sends sparse operands of the elementwise functions, `transpose` and
    `matmul` to `module.unary_dispatch` / `module.binary_dispatch` (called
    once, by `sciad.numpy`, with `sciad.sparse`)."""
    global _SPARSE
    _SPARSE = module


def _unary(name: str, x):
    if _is_sparse(x):
        return _sparse_module().unary_dispatch(name, x)
    x = _operand(x, name)
    ufunc = UNARY[name][1]
    dt = _dtype(x)
    if isinstance(ufunc, _np.ufunc):
        try:
            dt = ufunc.resolve_dtypes((dt, None))[0]
        except Exception:
            raise _DTypeError(f"is not defined for {dt} operands.", op=name) from None
    elif dt.kind not in "fc":
        dt = _np.promote_types(dt, _np.float16)  # NumPy: uint8 -> float16, int64 -> float64
    return _prim(name).bind(_convert(x, dt))


_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
# `x op v` for an integer `v` above (True) or below (False) every value of x
_OUT_OF_RANGE = {"eq": (False, False), "ne": (True, True), "lt": (True, False),
                 "le": (True, False), "gt": (False, True), "ge": (False, True)}
_MIRROR = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _out_of_range(v, dtype: _np.dtype) -> bool | None:
    """For a Python int `v` and an integer `dtype`: True if v is above its
    range, False if below, None if it fits (or does not apply)."""
    if not (isinstance(v, int) and not isinstance(v, bool) and _is_weak(v)
            and dtype.kind in "iu"):
        return None
    info = _np.iinfo(dtype)
    return True if v > info.max else False if v < info.min else None


def _binary(name: str, x, y):
    if _is_sparse(x) or _is_sparse(y):
        return _sparse_module().binary_dispatch(name, x, y)
    x, y = _operand(x, name), _operand(y, name)
    for v, arr, op in ((y, x, name), (x, y, _MIRROR.get(name))):
        if _is_weak(arr):
            continue
        above = _out_of_range(v, _dtype(arr))
        if above is None:
            continue
        if name in _COMPARISONS:  # NumPy 2 compares with the exact Python value
            value = _OUT_OF_RANGE[op][0 if above else 1]
            return full_like(arr, value, dtype=_np.bool_)
        raise _DTypeError(f"Python integer {v} is out of bounds for {_dtype(arr)} (NumPy "
                          "raises OverflowError); convert the array to a wider dtype first.",
                          op=name)
    common = _result_type(x, y, op=name)
    try:
        dt = BINARY[name][1].resolve_dtypes((common, common, None))[0]
    except Exception:
        raise _DTypeError(f"is not defined for {common} operands.", op=name) from None
    return _prim(name).bind(_convert(x, dt), _convert(y, dt))


def _def_unary(name: str, public: str):
    def f(x, out=None):
        _no_out(out, public)
        return _unary(name, x)
    f.__name__ = f.__qualname__ = public
    f.__doc__ = f"Elementwise `numpy.{public}`."
    return f


def _def_binary(name: str, public: str):
    def f(x1, x2, out=None):
        _no_out(out, public)
        return _binary(name, x1, x2)
    f.__name__ = f.__qualname__ = public
    f.__doc__ = f"Elementwise `numpy.{public}`, with broadcasting and NumPy's promotion."
    return f


negative = _def_unary("neg", "negative")
exp = _def_unary("exp", "exp")
log = _def_unary("log", "log")
log1p = _def_unary("log1p", "log1p")
expm1 = _def_unary("expm1", "expm1")
sin = _def_unary("sin", "sin")
cos = _def_unary("cos", "cos")
tan = _def_unary("tan", "tan")
arcsin = _def_unary("arcsin", "arcsin")
arccos = _def_unary("arccos", "arccos")
arctan = _def_unary("arctan", "arctan")
sinh = _def_unary("sinh", "sinh")
cosh = _def_unary("cosh", "cosh")
tanh = _def_unary("tanh", "tanh")
sqrt = _def_unary("sqrt", "sqrt")
abs = absolute = _def_unary("abs", "abs")
sign = _def_unary("sign", "sign")
square = _def_unary("square", "square")
floor = _def_unary("floor", "floor")
ceil = _def_unary("ceil", "ceil")
isfinite = _def_unary("isfinite", "isfinite")
logical_not = _def_unary("logical_not", "logical_not")

add = _def_binary("add", "add")
subtract = _def_binary("sub", "subtract")
multiply = _def_binary("mul", "multiply")
divide = true_divide = _def_binary("div", "divide")
floor_divide = _def_binary("floor_divide", "floor_divide")
remainder = mod = _def_binary("remainder", "remainder")
power = _def_binary("pow", "power")
maximum = _def_binary("maximum", "maximum")
minimum = _def_binary("minimum", "minimum")
arctan2 = _def_binary("arctan2", "arctan2")
equal = _def_binary("eq", "equal")
not_equal = _def_binary("ne", "not_equal")
less = _def_binary("lt", "less")
less_equal = _def_binary("le", "less_equal")
greater = _def_binary("gt", "greater")
greater_equal = _def_binary("ge", "greater_equal")
logical_and = _def_binary("logical_and", "logical_and")
logical_or = _def_binary("logical_or", "logical_or")
bitwise_and = _def_binary("bitwise_and", "bitwise_and")
bitwise_or = _def_binary("bitwise_or", "bitwise_or")
bitwise_xor = _def_binary("bitwise_xor", "bitwise_xor")
invert = bitwise_not = _def_unary("invert", "invert")


def real(val):
    """The real part (the array itself for real input)."""
    val = _operand(val, "real")
    return _unary("real", val) if _dtype(val).kind == "c" else val


def imag(val):
    """The imaginary part (zeros for real input)."""
    val = _operand(val, "imag")
    return _unary("imag", val) if _dtype(val).kind == "c" else zeros_like(val)


def conj(x, out=None):
    """The complex conjugate (the array itself for real input)."""
    _no_out(out, "conj")
    x = _operand(x, "conj")
    if _dtype(x).kind == "c":
        return _unary("conj", x)
    out_dtype = _np.conjugate.resolve_dtypes((_dtype(x), None))[-1]  # bool -> int8
    return x if out_dtype == _dtype(x) else _convert(x, out_dtype)


conjugate = conj


def angle(z, deg: bool = False):
    """The argument of complex `z` (0 or pi for real `z`), in radians or degrees."""
    out = _unary("angle", z)
    return multiply(out, 180.0 / _np.pi) if deg else out


def where(condition, x=None, y=None):
    """`x` where `condition`, else `y` (NumPy's three-argument form)."""
    if x is None or y is None:
        raise _ShapeError(
            "only the three-argument form where(condition, x, y) is supported: the "
            "one-argument form returns data-dependent indices.", op="where")
    condition = _operand(condition, "where")
    if _dtype(condition) != _np.bool_:
        condition = not_equal(condition, 0)
    x, y = _operand(x, "where"), _operand(y, "where")
    dt = _result_type(x, y, op="where")
    return _prim("select").bind(_convert(condition, _np.bool_), _convert(x, dt), _convert(y, dt))


def clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None):
    """`minimum(maximum(a, a_min), a_max)`; either bound may be None."""
    _no_out(out, "clip")
    a_min = min if a_min is None else a_min
    a_max = max if a_max is None else a_max
    if a_min is None and a_max is None:
        raise _ShapeError("one of `a_min` and `a_max` must be given.", op="clip")
    out = a
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


def astype(x, dtype):
    """`x` converted to `dtype` (complex to real drops the imaginary part)."""
    x = _as_array(x, "astype")
    return _convert(x, _np.dtype(dtype))


# ---------------------------------------------------------------------------
# reductions

@_functools.lru_cache(maxsize=None)
def _acc_dtype(fn, dtype: _np.dtype) -> _np.dtype:
    return _np.dtype(fn(_np.ones(1, dtype)).dtype)


def _keep(out, shape, axes, keepdims: bool):
    if not keepdims:
        return out
    return reshape(out, tuple(1 if i in axes else d for i, d in enumerate(shape)))


def _reduce(name: str, a, axis, keepdims: bool, dtype=None):
    a = _as_array(a, name)
    axes = tuple(sorted(normalize_axes(axis, a.ndim, name)))
    if dtype is not None:
        a = _convert(a, dtype)
    out = _prim(name).bind(a, axes=axes) if axes else a
    return _keep(out, a.shape, axes, keepdims)


def _no_out(out, op: str) -> None:
    """NumPy's `out=` (at its position in NumPy's signature, so that a
    positional argument means what it means there) is refused by name."""
    if out is not None:
        raise _InvalidOptionError("`out=` is not supported: sciad values are immutable; "
                                  "use the returned array.", op=op)


def _masked(a, mask, fill, op: str):
    """`a` with `fill` where NumPy's `where=` mask (broadcast to `a`'s shape)
    is False; `a` itself for no mask."""
    if mask is None or mask is True:
        return a
    mask = broadcast_to(astype(_as_array(mask, op), _np.bool_), tuple(_shape(a)))
    return where(mask, a, _convert(fill, _dtype(a)))


def _mask_count(a, mask, axes, keepdims: bool, op: str):
    """How many elements NumPy's `where=` mask keeps in each reduced slice."""
    if mask is None or mask is True:
        return int(_np.prod([_shape(a)[i] for i in axes], dtype=_np.int64))
    mask = broadcast_to(astype(_as_array(mask, op), _np.bool_), tuple(_shape(a)))
    return _reduce("reduce_sum", astype(mask, _np.int64), axes, keepdims)


def _initial(r, initial, combine):
    return r if initial is None else combine(r, _convert(initial, _dtype(r)))


def sum(a, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None,
        where=None):
    """Sum over `axis` (all axes by default), NumPy's accumulation dtype;
    `initial` is added, `where` (a boolean mask broadcasting to `a`) keeps
    the elements it is True at."""
    _no_out(out, "sum")
    a = _as_array(a, "sum")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.sum, _dtype(a))
    r = _reduce("reduce_sum", _masked(a, where, 0, "sum"), axis, keepdims, dtype)
    return _initial(r, initial, add)


def prod(a, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None,
         where=None):
    """Product over `axis` (all axes by default); `initial` multiplies it,
    `where` keeps the elements it is True at."""
    _no_out(out, "prod")
    a = _as_array(a, "prod")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.prod, _dtype(a))
    r = _reduce("reduce_prod", _masked(a, where, 1, "prod"), axis, keepdims, dtype)
    return _initial(r, initial, multiply)


def _extremum(name, a, axis, keepdims, initial, mask, combine, op: str):
    a = _as_array(a, op)
    if mask is not None and mask is not True and initial is None:
        raise _InvalidOptionError(f"reduction operation {op!r} does not have an identity, "
                                  "so to use a where mask one has to specify 'initial' "
                                  "(as in NumPy).", op=op)
    if initial is not None:
        a = _masked(a, mask, initial, op)
    return _initial(_reduce(name, a, axis, keepdims), initial, combine)


def max(a, axis=None, out=None, keepdims: bool = False, initial=None, where=None):
    """Maximum over `axis` (all axes by default); `initial` takes part, and
    `where` (which needs `initial`) keeps the elements it is True at."""
    _no_out(out, "max")
    return _extremum("reduce_max", a, axis, keepdims, initial, where, maximum, "max")


def min(a, axis=None, out=None, keepdims: bool = False, initial=None, where=None):
    """Minimum over `axis` (all axes by default); `initial` takes part, and
    `where` (which needs `initial`) keeps the elements it is True at."""
    _no_out(out, "min")
    return _extremum("reduce_min", a, axis, keepdims, initial, where, minimum, "min")


amax, amin = max, min


def mean(a, axis=None, dtype=None, out=None, keepdims: bool = False, *, where=None):
    """Mean over `axis`; integers average in float64, as in NumPy; `where`
    (a boolean mask broadcasting to `a`) averages the elements it is True
    at."""
    _no_out(out, "mean")
    a = _as_array(a, "mean")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.mean, _dtype(a))
    axes = normalize_axes(axis, a.ndim, "mean")
    count = _mask_count(a, where, axes, keepdims, "mean")
    total = sum(a, axis=axes, dtype=dtype, keepdims=keepdims, where=where)
    return divide(total, _convert(count, _dtype(total)))


def _vector_norm(x, ord, axis, keepdims):
    if ord is None or ord == 2:
        s = x * x if _dtype(x).kind != "c" else square(abs(x))
        return sqrt(sum(s, axis=axis, keepdims=keepdims))
    ax = abs(x)
    if ord == _np.inf:
        return max(ax, axis=axis, keepdims=keepdims)
    if ord == -_np.inf:
        return min(ax, axis=axis, keepdims=keepdims)
    if ord == 0:
        return sum(astype(not_equal(x, 0), ax.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return sum(ax, axis=axis, keepdims=keepdims)
    if isinstance(ord, str):
        raise _ShapeError(f"invalid norm order {ord!r} for vectors.", op="norm")
    return power(sum(power(ax, float(ord)), axis=axis, keepdims=keepdims), 1.0 / ord)


def _matrix_norm(x, ord, axes, keepdims):
    r, c = axes
    if ord in (None, "fro"):
        s = x * x if _dtype(x).kind != "c" else square(abs(x))
        return sqrt(sum(s, axis=axes, keepdims=keepdims))
    if ord in (1, -1, _np.inf, -_np.inf):
        inner, outer = (r, c) if ord in (1, -1) else (c, r)
        colsum = sum(abs(x), axis=inner, keepdims=True)
        red = max if ord in (1, _np.inf) else min
        out = red(colsum, axis=outer, keepdims=True)
        return out if keepdims else squeeze(out, axis=axes)

    raise _NotSupportedError(
        f"matrix norm ord={ord!r} needs singular values, which sciad.numpy does not "
        "compute; use ord='fro', 1, -1, inf or -inf.", op="norm")


def norm(x, ord=None, axis=None, keepdims: bool = False):
    """`numpy.linalg.norm`: vector norms (ord None/2, 1, inf, -inf, 0, p) and
    matrix norms (None/'fro', 1, -1, inf, -inf) over `axis`."""
    x = _as_array(x, "norm")
    if _dtype(x).kind not in "fc":
        x = _convert(x, _np.float64)
    if axis is None:
        if ord is None:
            axes = tuple(range(x.ndim))
            s = x * x if _dtype(x).kind != "c" else square(abs(x))
            return sqrt(sum(s, axis=axes, keepdims=keepdims))
        axis = tuple(range(x.ndim))
        if x.ndim not in (1, 2):
            raise _ShapeError(f"ord={ord!r} needs a 1-D or 2-D array or an `axis`, got "
                              f"{x.ndim} dimensions.", op="norm")
    axes = normalize_axes(axis, x.ndim, "norm")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axes, keepdims)
    raise _ShapeError(f"`axis` must name 1 or 2 axes, got {axis}.", op="norm")


# ---------------------------------------------------------------------------
# shapes

def reshape(a, newshape=None, order: str = "C", *, shape=None):
    """`a` with a new shape of the same size (one entry may be -1), its
    elements read and placed in `order`: "C" (last index fastest; "A" is
    the same here), or "F" (first index fastest)."""
    if order == "F":
        a = _as_array(a, "reshape")
        newshape = shape if newshape is None else newshape
        newshape = (newshape,) if isinstance(newshape, (int, _np.integer)) else newshape
        return transpose(reshape(transpose(a), tuple(newshape)[::-1]))
    if order not in ("C", "A"):
        raise _InvalidOptionError(f"`order` must be 'C', 'F' or 'A', got {order!r}.",
                                  op="reshape")
    a = _as_array(a, "reshape")
    newshape = shape if newshape is None else newshape
    if isinstance(newshape, (int, _np.integer)):
        newshape = (newshape,)
    newshape = [int(d) for d in newshape]
    if newshape.count(-1) > 1:
        raise _ShapeError(f"can only infer one dimension, got {tuple(newshape)}.",
                          op="reshape")
    if -1 in newshape:
        known = int(_np.prod([d for d in newshape if d != -1], dtype=_np.int64))
        size = int(_np.prod(a.shape, dtype=_np.int64))
        if known == 0 or size % known:
            raise _ShapeError(f"cannot reshape {_type_str(a)} into shape {tuple(newshape)}.",
                              op="reshape")
        newshape[newshape.index(-1)] = size // known
    newshape = tuple(newshape)
    if newshape == tuple(a.shape):
        return a
    return _prim("reshape").bind(a, shape=newshape)


def _type_str(a) -> str:

    return _TensorType(_shape(a), _dtype(a)).str_short()


def ravel(a):
    """`a` flattened to 1-D (row-major)."""
    a = _as_array(a, "ravel")
    return reshape(a, (-1,))


def transpose(a, axes=None):
    """Axes permuted (reversed by default)."""
    if _is_sparse(a) and axes is None:
        return _sparse_module().unary_dispatch("transpose", a)
    a = _as_array(a, "transpose")
    perm = tuple(range(a.ndim))[::-1] if axes is None else \
        tuple(normalize_axis(i, a.ndim, "transpose") for i in axes)
    if perm == tuple(range(a.ndim)):
        return a
    return _prim("transpose").bind(a, perm=perm)


def swapaxes(a, axis1: int, axis2: int):
    a = _as_array(a, "swapaxes")
    perm = list(range(a.ndim))
    i, j = normalize_axis(axis1, a.ndim, "swapaxes"), normalize_axis(axis2, a.ndim, "swapaxes")
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def moveaxis(a, source, destination):
    """Moves axes `source` to positions `destination`, as NumPy does."""
    a = _as_array(a, "moveaxis")
    src = normalize_axes(source, a.ndim, "moveaxis")
    dst = normalize_axes(destination, a.ndim, "moveaxis")
    if len(src) != len(dst):
        raise _ShapeError("`source` and `destination` must have the same number of "
                          "elements.", op="moveaxis")
    order = [n for n in range(a.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(a, order)


def broadcast_to(array, shape):
    """`array` broadcast to `shape` (NumPy rules)."""
    array = _as_array(array, "broadcast_to")
    shape = (int(shape),) if isinstance(shape, (int, _np.integer)) else tuple(int(d) for d in shape)
    if shape == tuple(array.shape):
        return array
    return _prim("broadcast_to").bind(array, shape=shape)


def expand_dims(a, axis):
    """`a` with length-1 axes inserted at `axis` (an int or a tuple)."""
    a = _as_array(a, "expand_dims")
    axes = (axis,) if isinstance(axis, (int, _np.integer)) else tuple(axis)
    nd = a.ndim + len(axes)
    axes = normalize_axes(axes, nd, "expand_dims")
    it = iter(a.shape)
    return reshape(a, tuple(1 if i in axes else next(it) for i in range(nd)))


def squeeze(a, axis=None):
    """`a` without its length-1 axes (or only those in `axis`, which must be 1)."""
    a = _as_array(a, "squeeze")
    if axis is None:
        axes = tuple(i for i, d in enumerate(a.shape) if d == 1)
    else:
        axes = normalize_axes(axis, a.ndim, "squeeze")
        bad = [i for i in axes if a.shape[i] != 1]
        if bad:
            raise _ShapeError(f"cannot squeeze axis {bad[0]} of {_type_str(a)}: its size is "
                              f"{a.shape[bad[0]]}, not 1.", op="squeeze")
    return reshape(a, tuple(d for i, d in enumerate(a.shape) if i not in axes))


def concatenate(arrays: _Sequence, axis: int | None = 0, out=None):
    """Joins arrays along an existing axis (`axis=None` flattens them first)."""
    _no_out(out, "concatenate")
    arrays = [_as_array(x, "concatenate") for x in arrays]
    if not arrays:
        raise _ShapeError("needs at least one array.", op="concatenate")
    if axis is None:
        arrays, axis = [ravel(x) for x in arrays], 0
    dt = _result_type(*arrays, op="concatenate")
    arrays = [_convert(x, dt) for x in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return _prim("concatenate").bind(*arrays, axis=normalize_axis(axis, arrays[0].ndim,
                                                                "concatenate"))


def stack(arrays: _Sequence, axis: int = 0, out=None):
    """Joins same-shape arrays along a new axis."""
    _no_out(out, "stack")
    arrays = [_as_array(x, "stack") for x in arrays]
    if not arrays:
        raise _ShapeError("needs at least one array.", op="stack")
    shapes = {tuple(x.shape) for x in arrays}
    if len(shapes) != 1:
        raise _ShapeError(f"all arrays must have the same shape, got "
                          f"{', '.join(_type_str(x) for x in arrays)}.", op="stack")
    axis = normalize_axis(axis, arrays[0].ndim + 1, "stack")
    return concatenate([expand_dims(x, axis) for x in arrays], axis=axis)


def _pad_widths(pad_width, ndim: int) -> tuple[tuple[int, int], ...]:
    w = _np.asarray(pad_width, dtype=object)
    if w.ndim == 0:
        pairs = [(int(pad_width), int(pad_width))] * ndim
    elif w.ndim == 1 and len(w) == 1:
        pairs = [(int(w[0]), int(w[0]))] * ndim
    elif w.ndim == 1 and len(w) == 2:
        pairs = [(int(w[0]), int(w[1]))] * ndim
    elif w.ndim == 2 and w.shape[1] == 2 and w.shape[0] in (1, ndim):
        pairs = [(int(a), int(b)) for a, b in w] * (ndim if w.shape[0] == 1 else 1)
    else:
        raise _ShapeError(f"cannot use pad_width {pad_width!r} for an array of {ndim} "
                          "dimensions.", op="pad")
    return tuple(pairs)


_INDEX_PAD_MODES = ("edge", "reflect", "symmetric", "wrap")


def pad(array, pad_width, mode: str = "constant", constant_values=0, **kwargs):
    """`numpy.pad` with NumPy's `pad_width` forms: `mode='constant'` (one
    static scalar `constant_values`), or the modes that repeat the array's
    own elements, 'edge', 'reflect', 'symmetric' and 'wrap' (`reflect_type`
    'even'), as gathers of NumPy's padded positions (their derivative adds
    the cotangents back). Other modes and arguments are refused by name."""
    array = _as_array(array, "pad")
    widths = _pad_widths(pad_width, array.ndim)
    if mode in _INDEX_PAD_MODES:
        if _np.ndim(constant_values) or constant_values != 0 or _builtins.any(
                k != "reflect_type" or v != "even" for k, v in kwargs.items()):
            raise _NotSupportedError(f"mode={mode!r} takes no other arguments here, got "
                                     f"{sorted(kwargs) or ['constant_values']}.", op="pad")
        for axis, (lo, hi) in enumerate(widths):
            if lo or hi:
                n = array.shape[axis]
                if n == 0:
                    raise _ShapeError(f"can't extend empty axis {axis} using modes other "
                                      "than 'constant' or 'empty'.", op="pad")
                # NumPy's own padding of the positions 0..n-1 says which to take
                array = take(array, _np.pad(_np.arange(n), (lo, hi), mode=mode), axis=axis)
        return array
    if mode != "constant":
        raise _NotSupportedError(f"mode={mode!r}; 'constant', 'edge', 'reflect', 'symmetric' "
                                 "and 'wrap' are supported.", op="pad")
    if kwargs:
        raise _NotSupportedError(f"mode='constant' takes no {sorted(kwargs)}.", op="pad")
    if isinstance(constant_values, _Tracer) or _np.ndim(constant_values) != 0:
        raise _ShapeError("`constant_values` must be a static scalar.", op="pad")
    value = _np.asarray(constant_values).astype(_dtype(array)).item()
    return _prim("pad").bind(array, widths=widths, value=value)


def roll(a, shift, axis=None):
    """Elements shifted cyclically along `axis` (the flattened array by default)."""
    a = _as_array(a, "roll")
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), a.shape)
    axes = (axis,) if isinstance(axis, (int, _np.integer)) else tuple(axis)
    shifts = (shift,) * len(axes) if isinstance(shift, (int, _np.integer)) else tuple(shift)
    if len(shifts) != len(axes):
        raise _ShapeError(f"`shift` {shift} and `axis` {axis} differ in length.", op="roll")
    axes = tuple(normalize_axis(x, a.ndim, "roll") for x in axes)
    return _prim("roll").bind(a, shifts=tuple(int(s) for s in shifts), axes=axes)


def cumsum(a, axis=None, dtype=None, out=None):
    """Running sums along `axis` (of the flattened array by default), with
    NumPy's accumulation dtype (bools and small ints sum in the default
    integer). (`out=` is refused: use the result.)"""
    _no_out(out, "cumsum")
    a = _as_array(a, "cumsum")
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(axis, a.ndim, "cumsum")
    target = _canonical_dtype(dtype) or _acc_dtype(_np.cumsum, a.dtype)
    if target != a.dtype:
        a = astype(a, target)
    return _prim("cumsum").bind(a, axis=axis, reverse=False)


def _sorting(prim, a, axis, order, op: str):
    a = _as_array(a, op)
    if order is not None:
        raise _NotSupportedError("sorting by fields (`order=`) is for structured arrays, "
                                 "which sciad does not have.", op=op)
    if axis is None:
        a, axis = ravel(a), 0
    return prim.bind(a, axis=normalize_axis(axis, a.ndim, op))


def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    """`a` sorted along `axis` (the flattened array for `axis=None`). The sort
    is stable whatever `kind` asks for. Its derivative carries each tangent
    along with its value; between equal values it is one-sided."""
    return _sorting(_prim("sort"), a, axis, order, "sort")


def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    """The indices that sort `a` along `axis` (stable), as int64."""
    return _sorting(_prim("argsort"), a, axis, order, "argsort")


_TAKE_MODES = ("raise", "wrap", "clip", "promise_in_bounds")


def _in_range(indices, size: int, mode, op: str, distinct: bool = False):
    """Integer `indices` into an axis of `size`, brought into `[0, size)` by
    `mode` (see `take`): concrete ones now, traced ones by an
    `index_bounds` node that checks them when the program runs."""
    mode = "raise" if mode is None else mode
    if mode not in _TAKE_MODES:
        raise _IndexingError(f"`mode` must be one of {_TAKE_MODES}, got {mode!r}.", op=op)
    if isinstance(indices, _Tracer):
        if indices.dtype.kind not in "iu":
            what = ("a traced boolean mask selects a number of elements known only when "
                    "the program runs; use `snp.where`" if indices.dtype == _np.bool_
                    else "indices must be integers")
            raise _IndexingError(f"{what}, got {indices.type.str_short()}.", op=op)
        if mode == "promise_in_bounds":
            return indices
        return _prim("index_bounds").bind(indices, size=int(size), mode=mode,
                                      distinct=bool(distinct))
    arr = _np.asarray(indices)
    if arr.dtype == _np.bool_ or arr.dtype.kind not in "iu" and arr.size:
        raise _IndexingError(f"indices must be integers, got an array of {arr.dtype}.",
                             op=op)
    arr = arr.astype(_np.int64)
    if mode == "promise_in_bounds":
        mode = "raise"  # concrete indices are checked anyway: it costs nothing
    return asarray(normalize_indices(arr, int(size), mode, distinct, op))


def take(a, indices, axis=None, out=None, mode=None):
    """Elements of `a` at integer `indices` along `axis` (of the flattened
    array for `axis=None`), as `numpy.take`: the result has shape
    `a.shape[:axis] + indices.shape + a.shape[axis + 1:]`.

    `mode` says what an index outside the axis means: "raise" (the default,
    NumPy's: negative indices count from the end, others outside
    `[-n, n)` raise an `IndexingError`; concrete indices when the program is
    traced, traced indices when it runs), "wrap" (modulo `n`), "clip" (into
    `[0, n - 1]`), or "promise_in_bounds" (the caller guarantees
    `0 <= i < n`; nothing is checked). The derivative with respect to `a`
    adds the cotangents back at the indices (`scatter_add`); the indices
    have none. (`out=` is refused: use the result.)"""
    _no_out(out, "take")
    a = _as_array(a, "take")
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(axis, a.ndim, "take")
    i = _in_range(indices, a.shape[axis], mode, "take")
    return _prim("take").bind(a, i, axis=axis)


def take_along_axis(arr, indices, axis, mode=None):
    """`arr` picked at `indices` along `axis` (`numpy.take_along_axis`):
    `indices` has `arr`'s number of dimensions and broadcasts against it on
    the other axes; `axis=None` works on the flattened array. `mode` is
    `take`'s. With the indices from `argsort`, this sorts `arr` (and its
    derivative)."""
    arr = _as_array(arr, "take_along_axis")
    if axis is None:
        arr, axis = ravel(arr), 0
    axis = normalize_axis(axis, arr.ndim, "take_along_axis")
    nd = _builtins.len(_shape(indices))
    if nd != arr.ndim:
        raise _IndexingError(f"`indices` must have the {arr.ndim} dimensions of "
                             f"{_type_str(arr)}, got shape {_shape(indices)}.",
                             op="take_along_axis")
    i = _in_range(indices, arr.shape[axis], mode, "take_along_axis")
    outer = [d for k, d in enumerate(arr.shape) if k != axis]
    inner = [d for k, d in enumerate(i.shape) if k != axis]
    bshape = broadcast_shapes([tuple(outer), tuple(inner)], "take_along_axis")
    bshape = list(bshape)
    out_shape = tuple(bshape[:axis] + [i.shape[axis]] + bshape[axis:])
    # one gather from the flattened array at linear indices: the other axes'
    # offsets (a constant, 0 on the axes `arr` broadcasts) plus `i`'s
    strides = _np.cumprod((arr.shape[1:] + (1,))[::-1])[::-1].astype(_np.int64)
    base = _np.zeros(out_shape, _np.int64)
    for k, n in enumerate(out_shape):
        if k != axis and arr.shape[k] != 1:
            shape = [1] * len(out_shape)
            shape[k] = n
            base = base + (_np.arange(n, dtype=_np.int64) * strides[k]).reshape(shape)
    lin = add(asarray(base), multiply(broadcast_to(astype(i, _np.int64), out_shape),
                                      _np.int64(strides[axis])))
    return _prim("take").bind(ravel(arr), lin, axis=0)


def _array_index(i) -> bool:
    """An integer-array (or concrete boolean-mask) entry of an index."""
    if isinstance(i, _Tracer):
        return i.ndim > 0 or i.dtype == _np.bool_
    if isinstance(i, (list, _np.ndarray)):
        return True
    return isinstance(i, _jax.Array) and i.ndim > 0


def _split_array_index(x, idx, op: str):
    """An index with one integer-array entry, as (the rest of the index with
    that entry a full slice, the axis of the rest's result that the array
    indexes, the array, whether NumPy moves the array's axes to the front)."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    arrays = [k for k, i in enumerate(idx) if _array_index(i)]
    if _builtins.len(arrays) > 1:
        raise _IndexingError(
            "one integer-array index per indexing expression: index one axis, then the "
            "next, or use `snp.take_along_axis`.", op=op)
    (pos,) = arrays
    arr = idx[pos]
    if not isinstance(arr, _Tracer):
        arr = _np.asarray(arr)
        if arr.dtype == _np.bool_:  # a concrete mask: the positions it selects
            if arr.ndim != 1:
                raise _IndexingError(f"a boolean mask indexes one axis here; got one of "
                                     f"shape {arr.shape}.", op=op)
            arr = _np.flatnonzero(arr)
    if _builtins.any(isinstance(i, _Tracer) for k, i in enumerate(idx) if k != pos):
        raise _IndexingError("a traced scalar index and an integer-array index in one "
                             "expression are not supported: index one, then the other.",
                             op=op)
    # NumPy's rule: the static ints are advanced indices too; if they and the
    # array are not side by side, the array's axes move to the front
    advanced = [k for k, i in enumerate(idx) if k == pos or is_int(i)]
    to_front = advanced != list(range(advanced[0], advanced[-1] + 1))
    n_real = _builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    axis = 0
    for i in idx[:pos]:
        if i is Ellipsis:
            axis += x.ndim - n_real
        elif i is None or isinstance(i, slice):
            axis += 1
    rest = idx[:pos] + (slice(None),) + idx[pos + 1:]
    return rest, axis, arr, to_front


# ---------------------------------------------------------------------------
# creation

def _shape_tuple(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, _np.integer)) else tuple(int(d) for d in shape)


def full(shape, fill_value, dtype=None):
    """An array of `shape` filled with `fill_value` (which may be traced)."""
    shape = _shape_tuple(shape)
    fill_value = _operand(fill_value, "full")
    dtype = _canonical_dtype(dtype) or _dtype(fill_value)
    if isinstance(fill_value, (_Tracer, _jax.Array)) or _np.ndim(fill_value) != 0:
        return broadcast_to(_convert(fill_value, dtype), shape)
    value = _np.asarray(fill_value).astype(dtype).item()
    return _prim("full").bind(shape=shape, dtype=dtype, value=value)


def zeros(shape, dtype=float):
    return full(shape, 0, dtype)


def ones(shape, dtype=float):
    return full(shape, 1, dtype)


def full_like(a, fill_value, dtype=None, shape=None):
    a = _as_array(a, "full_like")
    return full(a.shape if shape is None else shape, fill_value,
                _canonical_dtype(dtype) or _dtype(a))


def zeros_like(a, dtype=None, shape=None):
    return full_like(a, 0, dtype, shape)


def ones_like(a, dtype=None, shape=None):
    return full_like(a, 1, dtype, shape)


def _static_number(x, op: str, what: str):
    if isinstance(x, _Tracer):
        raise _TracerError(f"`{what}` must be a static number, got a traced value "
                           f"{x.type.str_short()}.", op=op)
    x = x.item() if isinstance(x, (_np.generic, _np.ndarray)) else x
    if not isinstance(x, (int, float, complex)):
        raise _DTypeError(f"`{what}` must be a number, got {_plain(x)}.", op=op)
    return x


def arange(start, stop=None, step=None, dtype=None):
    """Evenly spaced values in [start, stop) with static bounds."""
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    start, stop, step = (_static_number(v, "arange", n) for v, n in
                         ((start, "start"), (stop, "stop"), (step, "step")))
    dtype = _canonical_dtype(dtype) or _np.result_type(start, stop, step)
    return _prim("arange").bind(start=start, stop=stop, step=step, dtype=dtype)


def linspace(start, stop, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype=None, axis: int = 0):
    """`num` evenly spaced values from `start` to `stop`, `numpy.linspace`:
    static scalar bounds make one node; array (or traced) bounds give
    `start + k * step` along a new `axis` (differentiable in the bounds);
    `retstep=True` adds the step."""
    op = "linspace"
    num = int(num)
    if num < 0:
        raise _InvalidOptionError(f"Number of samples, {num}, must be non-negative.", op=op)
    div = (num - 1) if endpoint else num
    scalar = not _builtins.any(isinstance(v, _Tracer) or _np.ndim(v) for v in (start, stop))
    if scalar and axis in (0, -1):
        start = _static_number(start, op, "start")
        stop = _static_number(stop, op, "stop")
        dtype = _canonical_dtype(dtype) or _np.result_type(start, stop, float(num))
        y = _prim("linspace").bind(start=start, stop=stop, num=num, endpoint=bool(endpoint),
                                   dtype=dtype)
        if not retstep:
            return y
        return y, (_np.float64(stop - start) / div if div > 0 else _np.float64(_np.nan))
    # NumPy's array form: start + k * step along a new axis 0, then moved
    start, stop = _as_array(start, op), _as_array(stop, op)
    dt = _np.result_type(_dtype(start), _dtype(stop), float(num))
    start, stop = _convert(start, dt), _convert(stop, dt)
    delta = subtract(stop, start)
    nd = len(_broadcast_shape_of(start, stop))
    k = _np.arange(num, dtype=dt).reshape((-1,) + (1,) * nd)
    if div > 0:
        step = divide(delta, _np.asarray(div, dt))
        y = add(multiply(k, step), start)
        if endpoint and num > 1:
            y = concatenate([y[:num - 1], expand_dims(broadcast_to(stop, y.shape[1:]), 0)])
    else:
        step = full_like(delta, _np.nan)
        y = add(multiply(k, delta), start)
    if axis != 0:
        y = moveaxis(y, 0, axis)
    dtype = _canonical_dtype(dtype)
    if dtype is not None:
        if dtype.kind in "iu":
            y = floor(y)
        y = astype(y, dtype)
    return (y, step) if retstep else y


def _broadcast_shape_of(*xs):
    return broadcast_shapes([tuple(_shape(x)) for x in xs], "linspace")


def eye(N: int, M: int | None = None, k: int = 0, dtype=float):
    """An `N x M` array with ones on the `k`-th diagonal."""
    return _prim("eye").bind(n=int(N), m=int(N if M is None else M), k=int(k),
                         dtype=_np.dtype(dtype))


def asarray(a, dtype=None):
    """`a` as an array (a list of traced values is stacked)."""
    a = _as_array(a, "asarray")
    return a if dtype is None else _convert(a, dtype)


array = asarray


# ---------------------------------------------------------------------------
# contractions

def matmul(a, b, out=None):
    """NumPy's `a @ b`: matrix product with batch broadcasting (and sparse
    matrix products, see `sciad.sparse`)."""
    _no_out(out, "matmul")
    if _is_sparse(a) or _is_sparse(b):
        return _sparse_module().binary_dispatch("matmul", a, b)
    a, b = _as_array(a, "matmul"), _as_array(b, "matmul")
    dt = _result_type(a, b, op="matmul")
    return _prim("matmul").bind(_convert(a, dt), _convert(b, dt))


def _letters(n: int, skip: str = "") -> str:
    return "".join(c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   if c not in skip)[:n]


def einsum(subscripts: str, *operands, out=None):
    """Einstein summation over `operands` (explicit or implicit form), as
    NumPy's: `...` stands for the broadcast leading or trailing axes."""
    _no_out(out, "einsum")
    spec = subscripts.replace(" ", "")
    ops = [_as_array(x, "einsum") for x in operands]
    if "..." in spec:
        spec, ops = _einsum_ellipsis(spec, ops)
    if "->" not in spec:
        letters = spec.replace(",", "")
        spec = spec + "->" + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    dt = _result_type(*ops, op="einsum")
    return _prim("einsum").bind(*(_convert(x, dt) for x in ops), spec=spec)


def _einsum_ellipsis(spec: str, ops: list) -> tuple[str, list]:
    """`spec` with each `...` replaced by letters of its own, right-aligned
    across operands as NumPy broadcasts them; an operand's size-1 axis under
    a broadcast letter is squeezed out (the letter then comes from the others)."""
    lhs, arrow, out = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops):
        raise _ShapeError(f"spec {spec!r} names {len(ins)} operands, got {len(ops)}.",
                          op="einsum")
    free = [c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba"
            if c not in spec]
    counts = [x.ndim - (len(t) - 3) if "..." in t else 0 for t, x in zip(ins, ops)]
    if _builtins.min(counts) < 0:
        raise _ShapeError(f"spec {spec!r} names more axes than an operand has "
                          f"({', '.join(str(x.shape) for x in ops)}).", op="einsum")
    n = _builtins.max(counts)
    ell = "".join(free[:n][::-1])
    sizes: dict[str, int] = {}
    for t, x, k in zip(ins, ops, counts):
        if k:
            start = t.index("...")
            for c, d in zip(ell[n - k:], x.shape[start:start + k]):
                if d != 1 and sizes.setdefault(c, d) != d:
                    raise _ShapeError(f"operands {', '.join(str(y.shape) for y in ops)} "
                                      f"do not broadcast under `...` in {spec!r}.",
                                      op="einsum")
    new_ins, new_ops = [], []
    for t, x, k in zip(ins, ops, counts):
        if "..." not in t:
            new_ins.append(t)
            new_ops.append(x)
            continue
        start = t.index("...")
        letters = list(t[:start] + ell[n - k:] + t[start + 3:])
        keep = [i for i, c in enumerate(letters)
                if not (start <= i < start + k and x.shape[i] == 1 and sizes.get(c, 1) != 1)]
        if len(keep) != len(letters):
            x = reshape(x, tuple(x.shape[i] for i in keep))
            letters = [letters[i] for i in keep]
        new_ins.append("".join(letters))
        new_ops.append(x)
    if arrow:
        out = out.replace("...", ell)
    else:
        rest = lhs.replace("...", "").replace(",", "")
        out = ell + "".join(sorted(c for c in set(rest) if rest.count(c) == 1))
    return ",".join(new_ins) + "->" + out, new_ops


def tensordot(a, b, axes=2):
    """Sum of products over the given axes of `a` and `b`."""
    a, b = _as_array(a, "tensordot"), _as_array(b, "tensordot")
    if isinstance(axes, (int, _np.integer)):
        ax_a = tuple(range(a.ndim - int(axes), a.ndim))
        ax_b = tuple(range(int(axes)))
    else:
        ax_a, ax_b = axes
        ax_a = (ax_a,) if isinstance(ax_a, (int, _np.integer)) else tuple(ax_a)
        ax_b = (ax_b,) if isinstance(ax_b, (int, _np.integer)) else tuple(ax_b)
    ax_a = normalize_axes(ax_a, a.ndim, "tensordot")
    ax_b = normalize_axes(ax_b, b.ndim, "tensordot")
    if len(ax_a) != len(ax_b):
        raise _ShapeError(f"axes {ax_a} and {ax_b} differ in number.", op="tensordot")
    la = _letters(a.ndim)
    lb = list(_letters(b.ndim, la))
    for i, j in zip(ax_a, ax_b):
        lb[j] = la[i]
    lb = "".join(lb)
    out = "".join(c for i, c in enumerate(la) if i not in ax_a) + \
        "".join(c for j, c in enumerate(lb) if j not in ax_b)
    return einsum(f"{la},{lb}->{out}", a, b)


def dot(a, b, out=None):
    """NumPy's `dot`: products of scalars, vectors and matrices; for N-D,
    a sum over the last axis of `a` and the second-to-last of `b`."""
    _no_out(out, "dot")
    a, b = _as_array(a, "dot"), _as_array(b, "dot")
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)
    if a.ndim <= 2 and b.ndim <= 2:
        return matmul(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (_builtins.max(b.ndim - 2, 0),)))


def vdot(a, b):
    """The dot product of flattened `a` and `b`, conjugating `a`."""
    return einsum("i,i->", conj(ravel(_as_array(a, "vdot"))), ravel(_as_array(b, "vdot")))


def inner(a, b):
    """Sum of products over the last axes of `a` and `b`."""
    a, b = _as_array(a, "inner"), _as_array(b, "inner")
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 1,)))


def outer(a, b, out=None):
    """The outer product of flattened `a` and `b`."""
    _no_out(out, "outer")
    return einsum("i,j->ij", ravel(_as_array(a, "outer")), ravel(_as_array(b, "outer")))


# ---------------------------------------------------------------------------
# reductions of booleans, search

def any(a, axis=None, out=None, keepdims: bool = False, *, where=None):
    """Is any element true (along `axis`; among those `where` is True at)."""
    _no_out(out, "any")
    a = _masked(astype(_as_array(a, "any"), bool), where, False, "any")
    return _reduce("reduce_max", a, axis, keepdims)


def all(a, axis=None, out=None, keepdims: bool = False, *, where=None):
    """Are all elements true (along `axis`; among those `where` is True at)."""
    _no_out(out, "all")
    a = _masked(astype(_as_array(a, "all"), bool), where, True, "all")
    return _reduce("reduce_min", a, axis, keepdims)


def searchsorted(a, v, side: str = "left", sorter=None):
    """Indices where `v` would be inserted into the sorted 1-D `a` to keep it
    sorted (NumPy's `side`), as int64."""
    a = _as_array(a, "searchsorted")
    if sorter is not None:
        a = take(a, sorter)
    v = _operand(v, "searchsorted")
    above = _out_of_range(v, _dtype(a))
    if above is not None:  # NumPy 2 compares with the exact Python value
        return full((), a.shape[0] if above else 0, _np.int64)
    dtype = _result_type(a, v, op="searchsorted")
    return _prim("searchsorted").bind(_convert(a, dtype), _convert(_as_array(v, "searchsorted"),
                                                               dtype), side=side)


# ---------------------------------------------------------------------------
# indexing

def _has_traced(idx) -> bool:
    return isinstance(idx, _Tracer) or (isinstance(idx, tuple) and _builtins.any(
        isinstance(i, _Tracer) for i in idx))


def _traced_index(x, idx, op: str):
    """An index holding traced integer scalars, split into a static index for
    the rest (traced positions as full slices) and, per traced position, the
    axis it indexes in the statically indexed result and its start (negative
    values counted from the end, as NumPy does)."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    n_real = _builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    items, axis_of = [], []
    k = out_axis = 0
    for i in idx:
        if i is Ellipsis:
            items.append(i)
            skip = x.ndim - n_real
            k += skip
            out_axis += skip
        elif isinstance(i, _Tracer):
            if i.shape != () or i.dtype.kind not in "iu":
                raise _IndexingError(
                    f"a traced index must be an integer scalar, got {i.type.str_short()} "
                    "(integer-array and boolean-mask indices are not supported here; "
                    "use `snp.where`).", op=op)
            if k >= x.ndim:
                raise _IndexingError(f"too many indices for an array of {x.ndim} "
                                     "dimensions.", op=op)
            d = x.shape[k]
            start = where(i < 0, i + d, i)
            axis_of.append((out_axis, start))
            items.append(slice(None))
            k += 1
            out_axis += 1
        elif i is None:
            items.append(i)
            out_axis += 1
        elif isinstance(i, slice):
            items.append(i)
            k += 1
            out_axis += 1
        else:  # a static int drops its axis
            items.append(i)
            k += 1
    return tuple(items), axis_of


def _dynamic_window(y, axis_of):
    """Starts (zeros except at the traced axes) and window sizes (ones there)."""
    starts = [_np.int64(0)] * y.ndim
    sizes = list(y.shape)
    for ax, start in axis_of:
        starts[ax] = astype(start, _np.int64)
        sizes[ax] = 1
    return starts, tuple(sizes)


def _no_mode(mode, op: str) -> None:
    """Refuses a `mode` other than clamping for an index without an integer
    array."""
    if mode not in (None, "clip"):

        raise _IndexingError(f"`mode` applies to integer-array indices; got mode={mode!r} "
                             "for a scalar or slice index (a traced scalar is clamped into "
                             "range, as in JAX).", op=op)


def _getitem(x, idx, mode=None):
    x = _as_array(x, "getitem")
    if _builtins.any(_array_index(i) for i in (idx if isinstance(idx, tuple) else (idx,))):
        # one integer-array index: the rest of the index, then a `take`
        rest, axis, arr, to_front = _split_array_index(x, idx, "getitem")
        y = _getitem(x, rest)
        i = _in_range(arr, y.shape[axis], mode, "getitem")
        out = _prim("take").bind(y, i, axis=axis)
        if to_front and axis:
            k = i.ndim
            out = moveaxis(out, tuple(range(axis, axis + k)), tuple(range(k)))
        return out
    _no_mode(mode, "getitem")
    if _has_traced(idx):
        # `x[i]` with a traced `i`: the static part of the index first, then a
        # window of size 1 at `i` on each traced axis, which is then dropped
        static, axis_of = _traced_index(x, idx, "getitem")
        y = _getitem(x, static)
        starts, sizes = _dynamic_window(y, axis_of)
        win = _prim("dynamic_slice").bind(y, *starts, sizes=sizes)
        keep = tuple(d for a, d in enumerate(sizes) if a not in {ax for ax, _ in axis_of})
        return reshape(win, keep)
    index = normalize_index(idx, tuple(x.shape))
    if _builtins.all(isinstance(it, tuple) and it[0] == 0 and it[1] == d and it[2] == 1
                     for it, d in zip(index.items, x.shape)) and len(index.items) == x.ndim:
        return x
    return _prim("getitem").bind(x, index=index)


class _IndexUpdate:
    """`x.at[idx]`: functional updates `set(v)` and `add(v)`."""

    __slots__ = ("x", "idx")

    def __init__(self, x, idx):
        self.x, self.idx = x, idx

    def _update(self, prim, v, op, mode=None):
        x = self.x
        idx = self.idx if isinstance(self.idx, tuple) else (self.idx,)
        if _builtins.any(_array_index(i) for i in idx):
            return self._scatter(prim is _prim("index_add"), v, op, mode)
        _no_mode(mode, op)
        if _has_traced(self.idx):
            return self._dynamic_update(prim is _prim("index_add"), v, op)
        index = normalize_index(self.idx, tuple(x.shape), op)
        target = index.out_shape(tuple(x.shape))
        v = broadcast_to(_convert(_as_array(v, op), x.dtype), target)
        return prim.bind(x, v, index=index)

    def _dynamic_update(self, add: bool, v, op):

        x = self.x
        static, axis_of = _traced_index(x, self.idx, op)
        if _builtins.any(not (isinstance(i, slice) and i == slice(None)) and i is not Ellipsis
                         for i in static):
            raise _IndexingError(
                "an update at a traced index takes traced or static ints and full "
                "slices (`:`) only, e.g. `x.at[i].set(v)` or `x.at[:, i].add(v)`.", op=op)
        starts, sizes = _dynamic_window(x, axis_of)
        traced_axes = {ax for ax, _ in axis_of}
        target = tuple(d for a, d in enumerate(sizes) if a not in traced_axes)
        v = reshape(broadcast_to(_convert(_as_array(v, op), x.dtype), target), sizes)
        if add:
            v = _prim("dynamic_slice").bind(x, *starts, sizes=sizes) + v
        return _prim("dynamic_update_slice").bind(x, v, *starts)

    def _scatter(self, add: bool, v, op, mode):

        x = self.x
        rest, axis, arr, _ = _split_array_index(x, self.idx, op)
        if _builtins.any(not (isinstance(i, slice) and i == slice(None)) and i is not Ellipsis
                         for i in rest):
            raise _IndexingError(
                "an update at an integer-array index takes full slices (`:`, `...`) "
                "besides the array, e.g. `x.at[idx].add(v)` or `x.at[:, idx].set(v)`.",
                op=op)
        i = _in_range(arr, x.shape[axis], mode, op, distinct=not add)
        target = tuple(x.shape[:axis]) + tuple(i.shape) + tuple(x.shape[axis + 1:])
        v = broadcast_to(_convert(_as_array(v, op), x.dtype), target)
        prim = _prim("scatter_add") if add else _prim("scatter_set")
        return prim.bind(x, v, i, axis=axis)

    def set(self, values, *, mode=None):
        """A copy of `x` with `x[idx] = values`. A traced integer index `i`
        (a loop counter) is clamped into range, as in JAX. Integer-array
        indices follow `snp.take`'s `mode` and must be distinct (checked)."""
        return self._update(_prim("index_set"), values, "index_set", mode)

    def add(self, values, *, mode=None):
        """A copy of `x` with `x[idx] += values`; repeated integer-array
        indices accumulate."""
        return self._update(_prim("index_add"), values, "index_add", mode)

    def get(self, *, mode=None):
        """`x[idx]`, with `snp.take`'s `mode` for an integer-array index."""
        return _getitem(self.x, self.idx, mode)


class _At:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __getitem__(self, idx):
        return _IndexUpdate(self.x, idx)


def getitem(x, idx, mode=None):
    """`x[idx]`, NumPy's indexing as `sciad.numpy` does it (`x[idx]` on a traced
    value calls this): static indexes, traced integer scalars, one integer array."""
    return _getitem(x, idx, mode)
