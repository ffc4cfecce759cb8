"""NumPy-like functions on traced (and concrete) arrays; import as `snp`.

```python
import sciad.numpy as snp

def energy(u, h):
    du = snp.diff(u) / h
    return 0.5 * h * snp.sum(du * du)
```

Semantics follow NumPy: broadcasting, dtype promotion (NEP 50: Python
scalars are "weak" and take the array's dtype), accumulation dtypes of
`sum`/`mean`, and `keepdims`. Inside a traced function each call adds nodes
to the graph; outside one, the call runs eagerly on JAX and returns a JAX
array. Indexes are static (ints, slices, `None`, `...`), traced integer
scalars (clamped into range, as in JAX: loop counters), or one integer
array per expression, concrete or traced (NumPy's placement of the result's
axes; out-of-range entries raise an `IndexingError` unless `mode` says
"wrap" or "clip"; a concrete boolean mask is its integer positions).
`x.at[idx].set(v)` and `.add(v)` are functional updates. Shapes are static:
functions whose result's shape depends on values (`unique`, `nonzero`, a
traced mask) are not here.
"""

from __future__ import annotations

import builtins as _builtins
import functools as _functools
from typing import Any as _Any, Sequence as _Sequence

import jax as _jax
import numpy as _np

from . import primitives as _P
from .errors import DTypeError as _DTypeError, NotSupportedError as _NotSupportedError
from .errors import InvalidOptionError as _InvalidOptionError, ShapeError as _ShapeError
from .errors import plain as _plain
from .graph import Tracer as _Tracer
from .graph._types import SparseArray as _SparseArray, SparseType as _SparseType
from .primitives._elementwise import BINARY as _BINARY, UNARY as _UNARY
from .primitives._indexing import _is_int
from .primitives._take import normalize_indices as _normalize_indices
from .primitives._util import broadcast_shapes as _broadcast_shapes
from .primitives._util import normalize_axes as _normalize_axes
from .primitives._util import normalize_axis as _normalize_axis

pi = _np.pi
e = _np.e
inf = _np.inf
nan = _np.nan
newaxis = None
bool_ = _np.bool_
int32, int64 = _np.int32, _np.int64
float32, float64 = _np.float32, _np.float64
complex64, complex128 = _np.complex64, _np.complex128

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
    return _P.convert_p.bind(x, dtype=dtype)


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
    from . import sparse

    return sparse


def _unary(name: str, x):
    if _is_sparse(x):
        return _sparse_module().unary_dispatch(name, x)
    x = _operand(x, name)
    ufunc = _UNARY[name][1]
    dt = _dtype(x)
    if isinstance(ufunc, _np.ufunc):
        try:
            dt = ufunc.resolve_dtypes((dt, None))[0]
        except Exception:
            raise _DTypeError(f"is not defined for {dt} operands.", op=name) from None
    elif dt.kind not in "fc":
        dt = _np.promote_types(dt, _np.float16)  # NumPy: uint8 -> float16, int64 -> float64
    return _P.unary_primitives[name].bind(_convert(x, dt))


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
        dt = _BINARY[name][1].resolve_dtypes((common, common, None))[0]
    except Exception:
        raise _DTypeError(f"is not defined for {common} operands.", op=name) from None
    return _P.binary_primitives[name].bind(_convert(x, dt), _convert(y, dt))


def _def_unary(name: str, public: str):
    def f(x):
        return _unary(name, x)
    f.__name__ = f.__qualname__ = public
    f.__doc__ = f"Elementwise `numpy.{public}`."
    return f


def _def_binary(name: str, public: str):
    def f(x1, x2):
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


def conj(x):
    """The complex conjugate (the array itself for real input)."""
    x = _operand(x, "conj")
    if _dtype(x).kind == "c":
        return _unary("conj", x)
    out_dtype = _np.conjugate.resolve_dtypes((_dtype(x), None))[-1]  # bool -> int8
    return x if out_dtype == _dtype(x) else _convert(x, out_dtype)


conjugate = conj


def angle(z, deg: bool = False):
    """The argument of complex `z` (0 or pi for real `z`), in radians or degrees."""
    out = _unary("angle", z)
    return multiply(out, 180.0 / pi) if deg else out


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
    return _P.select_p.bind(_convert(condition, _np.bool_), _convert(x, dt), _convert(y, dt))


def clip(a, a_min=None, a_max=None, *, min=None, max=None):
    """`minimum(maximum(a, a_min), a_max)`; either bound may be None."""
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
    axes = tuple(sorted(_normalize_axes(axis, a.ndim, name)))
    if dtype is not None:
        a = _convert(a, dtype)
    out = _P.reduce_primitives[name].bind(a, axes=axes) if axes else a
    return _keep(out, a.shape, axes, keepdims)


def _no_out(out, op: str) -> None:
    """NumPy's `out=` (at its position in NumPy's signature, so that a
    positional argument means what it means there) is refused by name."""
    if out is not None:
        raise _NotSupportedError("`out=` is not supported: sciad values are immutable; "
                                 "use the returned array.", op=op)


def sum(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Sum over `axis` (all axes by default), NumPy's accumulation dtype."""
    _no_out(out, "sum")
    a = _as_array(a, "sum")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.sum, _dtype(a))
    return _reduce("reduce_sum", a, axis, keepdims, dtype)


def prod(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Product over `axis` (all axes by default)."""
    _no_out(out, "prod")
    a = _as_array(a, "prod")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.prod, _dtype(a))
    return _reduce("reduce_prod", a, axis, keepdims, dtype)


def max(a, axis=None, out=None, keepdims: bool = False):
    """Maximum over `axis` (all axes by default)."""
    _no_out(out, "max")
    return _reduce("reduce_max", a, axis, keepdims)


def min(a, axis=None, out=None, keepdims: bool = False):
    """Minimum over `axis` (all axes by default)."""
    _no_out(out, "min")
    return _reduce("reduce_min", a, axis, keepdims)


amax, amin = max, min


def mean(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Mean over `axis`; integers average in float64, as in NumPy."""
    _no_out(out, "mean")
    a = _as_array(a, "mean")
    dtype = _canonical_dtype(dtype) or _acc_dtype(_np.mean, _dtype(a))
    axes = _normalize_axes(axis, a.ndim, "mean")
    count = int(_np.prod([a.shape[i] for i in axes], dtype=_np.int64))
    total = sum(a, axis=axes, dtype=dtype, keepdims=keepdims)
    return divide(total, _np.asarray(count, dtype))


def _vector_norm(x, ord, axis, keepdims):
    if ord is None or ord == 2:
        s = x * x if _dtype(x).kind != "c" else square(abs(x))
        return sqrt(sum(s, axis=axis, keepdims=keepdims))
    ax = abs(x)
    if ord == inf:
        return max(ax, axis=axis, keepdims=keepdims)
    if ord == -inf:
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
    if ord in (1, -1, inf, -inf):
        inner, outer = (r, c) if ord in (1, -1) else (c, r)
        colsum = sum(abs(x), axis=inner, keepdims=True)
        red = max if ord in (1, inf) else min
        out = red(colsum, axis=outer, keepdims=True)
        return out if keepdims else squeeze(out, axis=axes)
    from .errors import NotSupportedError

    raise NotSupportedError(
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
    axes = _normalize_axes(axis, x.ndim, "norm")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axes, keepdims)
    raise _ShapeError(f"`axis` must name 1 or 2 axes, got {axis}.", op="norm")


# ---------------------------------------------------------------------------
# shapes

def reshape(a, newshape=None, *, shape=None):
    """`a` with a new shape of the same size (one entry may be -1)."""
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
    return _P.reshape_p.bind(a, shape=newshape)


def _type_str(a) -> str:
    from .graph import TensorType

    return TensorType(_shape(a), _dtype(a)).str_short()


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
        tuple(_normalize_axis(i, a.ndim, "transpose") for i in axes)
    if perm == tuple(range(a.ndim)):
        return a
    return _P.transpose_p.bind(a, perm=perm)


def swapaxes(a, axis1: int, axis2: int):
    a = _as_array(a, "swapaxes")
    perm = list(range(a.ndim))
    i, j = _normalize_axis(axis1, a.ndim, "swapaxes"), _normalize_axis(axis2, a.ndim, "swapaxes")
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def moveaxis(a, source, destination):
    """Moves axes `source` to positions `destination`, as NumPy does."""
    a = _as_array(a, "moveaxis")
    src = _normalize_axes(source, a.ndim, "moveaxis")
    dst = _normalize_axes(destination, a.ndim, "moveaxis")
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
    return _P.broadcast_to_p.bind(array, shape=shape)


def expand_dims(a, axis):
    """`a` with length-1 axes inserted at `axis` (an int or a tuple)."""
    a = _as_array(a, "expand_dims")
    axes = (axis,) if isinstance(axis, (int, _np.integer)) else tuple(axis)
    nd = a.ndim + len(axes)
    axes = _normalize_axes(axes, nd, "expand_dims")
    it = iter(a.shape)
    return reshape(a, tuple(1 if i in axes else next(it) for i in range(nd)))


def squeeze(a, axis=None):
    """`a` without its length-1 axes (or only those in `axis`, which must be 1)."""
    a = _as_array(a, "squeeze")
    if axis is None:
        axes = tuple(i for i, d in enumerate(a.shape) if d == 1)
    else:
        axes = _normalize_axes(axis, a.ndim, "squeeze")
        bad = [i for i in axes if a.shape[i] != 1]
        if bad:
            raise _ShapeError(f"cannot squeeze axis {bad[0]} of {_type_str(a)}: its size is "
                              f"{a.shape[bad[0]]}, not 1.", op="squeeze")
    return reshape(a, tuple(d for i, d in enumerate(a.shape) if i not in axes))


def concatenate(arrays: _Sequence, axis: int | None = 0):
    """Joins arrays along an existing axis (`axis=None` flattens them first)."""
    arrays = [_as_array(x, "concatenate") for x in arrays]
    if not arrays:
        raise _ShapeError("needs at least one array.", op="concatenate")
    if axis is None:
        arrays, axis = [ravel(x) for x in arrays], 0
    dt = _result_type(*arrays, op="concatenate")
    arrays = [_convert(x, dt) for x in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return _P.concatenate_p.bind(*arrays, axis=_normalize_axis(axis, arrays[0].ndim,
                                                                "concatenate"))


def stack(arrays: _Sequence, axis: int = 0):
    """Joins same-shape arrays along a new axis."""
    arrays = [_as_array(x, "stack") for x in arrays]
    if not arrays:
        raise _ShapeError("needs at least one array.", op="stack")
    shapes = {tuple(x.shape) for x in arrays}
    if len(shapes) != 1:
        raise _ShapeError(f"all arrays must have the same shape, got "
                          f"{', '.join(_type_str(x) for x in arrays)}.", op="stack")
    axis = _normalize_axis(axis, arrays[0].ndim + 1, "stack")
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


def pad(array, pad_width, mode: str = "constant", constant_values=0):
    """Constant padding (`mode='constant'` only), NumPy's `pad_width` forms."""
    if mode != "constant":
        from .errors import NotSupportedError

        raise NotSupportedError(f"mode={mode!r}; only 'constant' is supported.", op="pad")
    array = _as_array(array, "pad")
    if isinstance(constant_values, _Tracer) or _np.ndim(constant_values) != 0:
        raise _ShapeError("`constant_values` must be a static scalar.", op="pad")
    widths = _pad_widths(pad_width, array.ndim)
    value = _np.asarray(constant_values).astype(_dtype(array)).item()
    return _P.pad_p.bind(array, widths=widths, value=value)


def roll(a, shift, axis=None):
    """Elements shifted cyclically along `axis` (the flattened array by default)."""
    a = _as_array(a, "roll")
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), a.shape)
    axes = (axis,) if isinstance(axis, (int, _np.integer)) else tuple(axis)
    shifts = (shift,) * len(axes) if isinstance(shift, (int, _np.integer)) else tuple(shift)
    if len(shifts) != len(axes):
        raise _ShapeError(f"`shift` {shift} and `axis` {axis} differ in length.", op="roll")
    axes = tuple(_normalize_axis(x, a.ndim, "roll") for x in axes)
    return _P.roll_p.bind(a, shifts=tuple(int(s) for s in shifts), axes=axes)


def diff(a, n: int = 1, axis: int = -1):
    """The `n`-th forward difference along `axis`."""
    a = _as_array(a, "diff")
    if n < 0:
        raise _ShapeError(f"order `n` must be non-negative, got {n}.", op="diff")
    axis = _normalize_axis(axis, a.ndim, "diff")
    hi = tuple(slice(1, None) if i == axis else slice(None) for i in range(a.ndim))
    lo = tuple(slice(None, -1) if i == axis else slice(None) for i in range(a.ndim))
    for _ in range(n):
        a = subtract(_getitem(a, hi), _getitem(a, lo)) if a.dtype != _np.bool_ \
            else not_equal(_getitem(a, hi), _getitem(a, lo))
    return a


def flip(m, axis=None):
    """`m` with the order of its elements reversed along `axis` (all axes by
    default)."""
    m = _as_array(m, "flip")
    axes = _normalize_axes(axis, m.ndim, "flip")
    return _getitem(m, tuple(slice(None, None, -1) if i in axes else slice(None)
                             for i in range(m.ndim)))


def cumsum(a, axis=None, dtype=None):
    """Running sums along `axis` (of the flattened array by default), with
    NumPy's accumulation dtype (bools and small ints sum in the default
    integer)."""
    a = _as_array(a, "cumsum")
    if axis is None:
        a, axis = ravel(a), 0
    axis = _normalize_axis(axis, a.ndim, "cumsum")
    target = _canonical_dtype(dtype) or _acc_dtype(_np.cumsum, a.dtype)
    if target != a.dtype:
        a = astype(a, target)
    return _P.cumsum_p.bind(a, axis=axis, reverse=False)


def _sorting(prim, a, axis, order, op: str):
    a = _as_array(a, op)
    if order is not None:
        raise _NotSupportedError("sorting by fields (`order=`) is for structured arrays, "
                                 "which sciad does not have.", op=op)
    if axis is None:
        a, axis = ravel(a), 0
    return prim.bind(a, axis=_normalize_axis(axis, a.ndim, op))


def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    """`a` sorted along `axis` (the flattened array for `axis=None`). The sort
    is stable whatever `kind` asks for. Its derivative carries each tangent
    along with its value; between equal values it is one-sided."""
    return _sorting(_P.sort_p, a, axis, order, "sort")


def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    """The indices that sort `a` along `axis` (stable), as int64."""
    return _sorting(_P.argsort_p, a, axis, order, "argsort")


_TAKE_MODES = ("raise", "wrap", "clip", "promise_in_bounds")


def _in_range(indices, size: int, mode, op: str, distinct: bool = False):
    """Integer `indices` into an axis of `size`, brought into `[0, size)` by
    `mode` (see `take`): concrete ones now, traced ones by an
    `index_bounds` node that checks them when the program runs."""
    from .errors import IndexingError

    mode = "raise" if mode is None else mode
    if mode not in _TAKE_MODES:
        raise IndexingError(f"`mode` must be one of {_TAKE_MODES}, got {mode!r}.", op=op)
    if isinstance(indices, _Tracer):
        if indices.dtype.kind not in "iu":
            what = ("a traced boolean mask selects a number of elements known only when "
                    "the program runs; use `snp.where`" if indices.dtype == _np.bool_
                    else "indices must be integers")
            raise IndexingError(f"{what}, got {indices.type.str_short()}.", op=op)
        if mode == "promise_in_bounds":
            return indices
        return _P.index_bounds_p.bind(indices, size=int(size), mode=mode,
                                      distinct=bool(distinct))
    arr = _np.asarray(indices)
    if arr.dtype == _np.bool_ or arr.dtype.kind not in "iu" and arr.size:
        raise IndexingError(f"indices must be integers, got an array of {arr.dtype}.",
                            op=op)
    arr = arr.astype(_np.int64)
    if mode == "promise_in_bounds":
        mode = "raise"  # concrete indices are checked anyway: it costs nothing
    return asarray(_normalize_indices(arr, int(size), mode, distinct, op))


def take(a, indices, axis=None, mode=None):
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
    have none."""
    a = _as_array(a, "take")
    if axis is None:
        a, axis = ravel(a), 0
    axis = _normalize_axis(axis, a.ndim, "take")
    i = _in_range(indices, a.shape[axis], mode, "take")
    return _P.take_p.bind(a, i, axis=axis)


def take_along_axis(arr, indices, axis, mode=None):
    """`arr` picked at `indices` along `axis` (`numpy.take_along_axis`):
    `indices` has `arr`'s number of dimensions and broadcasts against it on
    the other axes; `axis=None` works on the flattened array. `mode` is
    `take`'s. With the indices from `argsort`, this sorts `arr` (and its
    derivative)."""
    from .errors import IndexingError

    arr = _as_array(arr, "take_along_axis")
    if axis is None:
        arr, axis = ravel(arr), 0
    axis = _normalize_axis(axis, arr.ndim, "take_along_axis")
    nd = _builtins.len(_shape(indices))
    if nd != arr.ndim:
        raise IndexingError(f"`indices` must have the {arr.ndim} dimensions of "
                            f"{arr.type.str_short()}, got shape {_shape(indices)}.",
                            op="take_along_axis")
    i = _in_range(indices, arr.shape[axis], mode, "take_along_axis")
    outer = [d for k, d in enumerate(arr.shape) if k != axis]
    inner = [d for k, d in enumerate(i.shape) if k != axis]
    bshape = _broadcast_shapes([tuple(outer), tuple(inner)], "take_along_axis")
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
    return _P.take_p.bind(ravel(arr), lin, axis=0)


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
    from .errors import IndexingError

    idx = idx if isinstance(idx, tuple) else (idx,)
    arrays = [k for k, i in enumerate(idx) if _array_index(i)]
    if _builtins.len(arrays) > 1:
        raise IndexingError(
            "one integer-array index per indexing expression: index one axis, then the "
            "next, or use `snp.take_along_axis`.", op=op)
    (pos,) = arrays
    arr = idx[pos]
    if not isinstance(arr, _Tracer):
        arr = _np.asarray(arr)
        if arr.dtype == _np.bool_:  # a concrete mask: the positions it selects
            if arr.ndim != 1:
                raise IndexingError(f"a boolean mask indexes one axis here; got one of "
                                    f"shape {arr.shape}.", op=op)
            arr = _np.flatnonzero(arr)
    if _builtins.any(isinstance(i, _Tracer) for k, i in enumerate(idx) if k != pos):
        raise IndexingError("a traced scalar index and an integer-array index in one "
                            "expression are not supported: index one, then the other.",
                            op=op)
    # NumPy's rule: the static ints are advanced indices too; if they and the
    # array are not side by side, the array's axes move to the front
    advanced = [k for k, i in enumerate(idx) if k == pos or _is_int(i)]
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
    return _P.full_p.bind(shape=shape, dtype=dtype, value=value)


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
        from .errors import TracerError

        raise TracerError(f"`{what}` must be a static number, got a traced value "
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
    return _P.arange_p.bind(start=start, stop=stop, step=step, dtype=dtype)


def linspace(start, stop, num: int = 50, endpoint: bool = True, dtype=None):
    """`num` evenly spaced values from `start` to `stop` (static bounds)."""
    start = _static_number(start, "linspace", "start")
    stop = _static_number(stop, "linspace", "stop")
    dtype = _canonical_dtype(dtype) or _np.result_type(start, stop, float(num))
    return _P.linspace_p.bind(start=start, stop=stop, num=int(num), endpoint=bool(endpoint),
                              dtype=dtype)


def eye(N: int, M: int | None = None, k: int = 0, dtype=float):
    """An `N x M` array with ones on the `k`-th diagonal."""
    return _P.eye_p.bind(n=int(N), m=int(N if M is None else M), k=int(k),
                         dtype=_np.dtype(dtype))


def asarray(a, dtype=None):
    """`a` as an array (a list of traced values is stacked)."""
    a = _as_array(a, "asarray")
    return a if dtype is None else _convert(a, dtype)


array = asarray


# ---------------------------------------------------------------------------
# contractions

def matmul(a, b):
    """NumPy's `a @ b`: matrix product with batch broadcasting (and sparse
    matrix products, see `sciad.sparse`)."""
    if _is_sparse(a) or _is_sparse(b):
        return _sparse_module().binary_dispatch("matmul", a, b)
    a, b = _as_array(a, "matmul"), _as_array(b, "matmul")
    dt = _result_type(a, b, op="matmul")
    return _P.matmul_p.bind(_convert(a, dt), _convert(b, dt))


def _letters(n: int, skip: str = "") -> str:
    return "".join(c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   if c not in skip)[:n]


def einsum(subscripts: str, *operands):
    """Einstein summation over `operands` (explicit or implicit form, no `...`)."""
    spec = subscripts.replace(" ", "")
    if "..." in spec:
        from .errors import NotSupportedError

        raise NotSupportedError("ellipsis (`...`) subscripts are not supported; name "
                                "every axis.", op="einsum")
    if "->" not in spec:
        letters = spec.replace(",", "")
        spec = spec + "->" + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ops = [_as_array(x, "einsum") for x in operands]
    dt = _result_type(*ops, op="einsum")
    return _P.einsum_p.bind(*(_convert(x, dt) for x in ops), spec=spec)


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
    ax_a = _normalize_axes(ax_a, a.ndim, "tensordot")
    ax_b = _normalize_axes(ax_b, b.ndim, "tensordot")
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


def dot(a, b):
    """NumPy's `dot`: products of scalars, vectors and matrices; for N-D,
    a sum over the last axis of `a` and the second-to-last of `b`."""
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


def outer(a, b):
    """The outer product of flattened `a` and `b`."""
    return einsum("i,j->ij", ravel(_as_array(a, "outer")), ravel(_as_array(b, "outer")))


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
    from .errors import IndexingError

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
                raise IndexingError(
                    f"a traced index must be an integer scalar, got {i.type.str_short()} "
                    "(integer-array and boolean-mask indices are not supported here; "
                    "use `snp.where`).", op=op)
            if k >= x.ndim:
                raise IndexingError(f"too many indices for an array of {x.ndim} "
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
        from .errors import IndexingError

        raise IndexingError(f"`mode` applies to integer-array indices; got mode={mode!r} "
                            "for a scalar or slice index (a traced scalar is clamped into "
                            "range, as in JAX).", op=op)


def _getitem(x, idx, mode=None):
    x = _as_array(x, "getitem")
    if _builtins.any(_array_index(i) for i in (idx if isinstance(idx, tuple) else (idx,))):
        # one integer-array index: the rest of the index, then a `take`
        rest, axis, arr, to_front = _split_array_index(x, idx, "getitem")
        y = _getitem(x, rest)
        i = _in_range(arr, y.shape[axis], mode, "getitem")
        out = _P.take_p.bind(y, i, axis=axis)
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
        win = _P.dynamic_slice_p.bind(y, *starts, sizes=sizes)
        keep = tuple(d for a, d in enumerate(sizes) if a not in {ax for ax, _ in axis_of})
        return reshape(win, keep)
    index = _P.normalize_index(idx, tuple(x.shape))
    if _builtins.all(isinstance(it, tuple) and it[0] == 0 and it[1] == d and it[2] == 1
                     for it, d in zip(index.items, x.shape)) and len(index.items) == x.ndim:
        return x
    return _P.getitem_p.bind(x, index=index)


class _IndexUpdate:
    """`x.at[idx]`: functional updates `set(v)` and `add(v)`."""

    __slots__ = ("x", "idx")

    def __init__(self, x, idx):
        self.x, self.idx = x, idx

    def _update(self, prim, v, op, mode=None):
        x = self.x
        idx = self.idx if isinstance(self.idx, tuple) else (self.idx,)
        if _builtins.any(_array_index(i) for i in idx):
            return self._scatter(prim is _P.index_add_p, v, op, mode)
        _no_mode(mode, op)
        if _has_traced(self.idx):
            return self._dynamic_update(prim is _P.index_add_p, v, op)
        index = _P.normalize_index(self.idx, tuple(x.shape), op)
        target = index.out_shape(tuple(x.shape))
        v = broadcast_to(_convert(_as_array(v, op), x.dtype), target)
        return prim.bind(x, v, index=index)

    def _dynamic_update(self, add: bool, v, op):
        from .errors import IndexingError

        x = self.x
        static, axis_of = _traced_index(x, self.idx, op)
        if _builtins.any(not (isinstance(i, slice) and i == slice(None)) and i is not Ellipsis
                         for i in static):
            raise IndexingError(
                "an update at a traced index takes traced or static ints and full "
                "slices (`:`) only, e.g. `x.at[i].set(v)` or `x.at[:, i].add(v)`.", op=op)
        starts, sizes = _dynamic_window(x, axis_of)
        traced_axes = {ax for ax, _ in axis_of}
        target = tuple(d for a, d in enumerate(sizes) if a not in traced_axes)
        v = reshape(broadcast_to(_convert(_as_array(v, op), x.dtype), target), sizes)
        if add:
            v = _P.dynamic_slice_p.bind(x, *starts, sizes=sizes) + v
        return _P.dynamic_update_slice_p.bind(x, v, *starts)

    def _scatter(self, add: bool, v, op, mode):
        from .errors import IndexingError

        x = self.x
        rest, axis, arr, _ = _split_array_index(x, self.idx, op)
        if _builtins.any(not (isinstance(i, slice) and i == slice(None)) and i is not Ellipsis
                         for i in rest):
            raise IndexingError(
                "an update at an integer-array index takes full slices (`:`, `...`) "
                "besides the array, e.g. `x.at[idx].add(v)` or `x.at[:, idx].set(v)`.",
                op=op)
        i = _in_range(arr, x.shape[axis], mode, op, distinct=not add)
        target = tuple(x.shape[:axis]) + tuple(i.shape) + tuple(x.shape[axis + 1:])
        v = broadcast_to(_convert(_as_array(v, op), x.dtype), target)
        prim = _P.scatter_add_p if add else _P.scatter_set_p
        return prim.bind(x, v, i, axis=axis)

    def set(self, values, *, mode=None):
        """A copy of `x` with `x[idx] = values`. A traced integer index `i`
        (a loop counter) is clamped into range, as in JAX. Integer-array
        indices follow `snp.take`'s `mode` and must be distinct (checked)."""
        return self._update(_P.index_set_p, values, "index_set", mode)

    def add(self, values, *, mode=None):
        """A copy of `x` with `x[idx] += values`; repeated integer-array
        indices accumulate."""
        return self._update(_P.index_add_p, values, "index_add", mode)

    def get(self, *, mode=None):
        """`x[idx]`, with `snp.take`'s `mode` for an integer-array index."""
        return _getitem(self.x, self.idx, mode)


class _At:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __getitem__(self, idx):
        return _IndexUpdate(self.x, idx)


# ---------------------------------------------------------------------------
# more of NumPy, written with the ops above (their derivatives follow)

_LN2, _LN10 = float(_np.log(2.0)), float(_np.log(10.0))  # weak: they keep x's dtype


def log2(x):
    """Elementwise base-2 logarithm."""
    return divide(log(_as_array(x, "log2")), _LN2)


def log10(x):
    """Elementwise base-10 logarithm."""
    return divide(log(_as_array(x, "log10")), _LN10)


def exp2(x):
    """Elementwise `2 ** x`."""
    return exp(multiply(_ufunc_float(_as_array(x, "exp2"), op="exp2"), _LN2))


def reciprocal(x):
    """Elementwise `1 / x` (integer division for integers, as in NumPy)."""
    x = _as_array(x, "reciprocal")
    return divide(_np.ones((), x.dtype), x) if _is_inexact(x) else \
        floor_divide(_np.ones((), x.dtype), x)


def deg2rad(x):
    """Degrees to radians."""
    return multiply(_ufunc_float(_as_array(x, "deg2rad"), op="deg2rad"), _np.pi / 180.0)


def rad2deg(x):
    """Radians to degrees."""
    return multiply(_ufunc_float(_as_array(x, "rad2deg"), op="rad2deg"), 180.0 / _np.pi)


radians, degrees = deg2rad, rad2deg


def logaddexp(x1, x2):
    """`log(exp(x1) + exp(x2))` without overflow."""
    x1, x2 = _ufunc_float(_operand(x1, "logaddexp"), _operand(x2, "logaddexp"),
                          op="logaddexp")
    hi = maximum(x1, x2)
    return add(hi, log1p(exp(negative(abs(subtract(x1, x2))))))


def heaviside(x1, x2):
    """0 where `x1 < 0`, `x2` where `x1 == 0`, 1 where `x1 > 0`."""
    x1, x2 = _ufunc_float(_operand(x1, "heaviside"), _operand(x2, "heaviside"),
                          op="heaviside")
    x1 = _as_array(x1, "heaviside")
    return where(less(x1, 0), zeros_like(x1), where(equal(x1, 0), x2, ones_like(x1)))


def logical_xor(x1, x2):
    """Elementwise exclusive or of truth values."""
    return not_equal(astype(_as_array(x1, "logical_xor"), bool),
                     astype(_as_array(x2, "logical_xor"), bool))


def isnan(x):
    """Elementwise: is `x` NaN."""
    x = _as_array(x, "isnan")
    return not_equal(x, x) if _is_inexact(x) else zeros_like(x, dtype=bool)


def isinf(x):
    """Elementwise: is `x` infinite."""
    x = _as_array(x, "isinf")
    if not _is_inexact(x):
        return zeros_like(x, dtype=bool)
    return logical_and(logical_not(isfinite(x)), logical_not(isnan(x)))


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """NaN to `nan`, infinities to `posinf`/`neginf` (the dtype's largest
    finite values by default)."""
    x = _as_array(x, "nan_to_num")
    if not _is_inexact(x):
        return x
    if x.dtype.kind == "c":
        return add(nan_to_num(real(x), nan=nan, posinf=posinf, neginf=neginf),
                   multiply(nan_to_num(imag(x), nan=nan, posinf=posinf, neginf=neginf), 1j))
    big = _np.finfo(x.dtype).max
    x = where(isnan(x), _np.asarray(nan, x.dtype), x)
    x = where(equal(x, _np.inf), _np.asarray(big if posinf is None else posinf, x.dtype), x)
    return where(equal(x, -_np.inf), _np.asarray(-big if neginf is None else neginf, x.dtype),
                 x)


def _is_inexact(x) -> bool:
    return _dtype(x).kind in "fc"


def _ufunc_float(*xs, op: str):
    """The operands in the dtype a NumPy float ufunc (`sqrt`, `logaddexp`,
    ...) computes in: their promoted dtype (weak Python scalars included),
    then float16 for int8 and bools, float32 for int16, float64 for wider
    ints."""
    dtype = _acc_dtype(_np.sqrt, _result_type(*xs, op=op))
    out = [_convert(x, dtype) for x in xs]
    return out[0] if len(out) == 1 else out


def _float(x):
    """`x` as NumPy's statistics, interpolation and differences see it:
    integers and bools become float64."""
    return x if _is_inexact(x) else astype(x, _np.float64)


def any(a, axis=None, keepdims: bool = False):
    """Is any element true (along `axis`)."""
    return _reduce("reduce_max", astype(_as_array(a, "any"), bool), axis, keepdims)


def all(a, axis=None, keepdims: bool = False):
    """Are all elements true (along `axis`)."""
    return _reduce("reduce_min", astype(_as_array(a, "all"), bool), axis, keepdims)


def count_nonzero(a, axis=None, keepdims: bool = False):
    """How many elements are nonzero (along `axis`), as int64."""
    return sum(astype(astype(_as_array(a, "count_nonzero"), bool), _np.int64), axis=axis,
               keepdims=keepdims)


def _arg_extremum(a, axis, keepdims, reducer, op):
    a = _as_array(a, op)
    shape, flat = a.shape, axis is None
    if flat:
        a, axis = ravel(a), 0
    axis = _normalize_axis(axis, a.ndim, op)
    n = a.shape[axis]
    if n == 0:
        raise _ShapeError(f"attempt to get {op} of an empty sequence.", op=op)
    ext = reducer(a, axis=axis, keepdims=True)
    hit = equal(a, ext)
    if _is_inexact(a):  # NaN wins, as in NumPy
        hit = logical_or(hit, isnan(a))
    pos = reshape(arange(n, dtype=_np.int64), tuple(n if k == axis else 1
                                                     for k in range(a.ndim)))
    first = min(where(hit, pos, _np.int64(n)), axis=axis, keepdims=keepdims)
    return reshape(first, (1,) * len(shape)) if keepdims and shape is not None and \
        flat else first


def argmax(a, axis=None, keepdims: bool = False):
    """The index of the (first) largest value, flattened or along `axis`."""
    return _arg_extremum(a, axis, keepdims, max, "argmax")


def argmin(a, axis=None, keepdims: bool = False):
    """The index of the (first) smallest value, flattened or along `axis`."""
    return _arg_extremum(a, axis, keepdims, min, "argmin")


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False):
    """Variance over `axis`, `sum(|a - mean|^2) / (N - ddof)`."""
    _no_out(out, "var")
    a = _as_array(a, "var")
    axes = _normalize_axes(axis, a.ndim, "var")
    d = subtract(a, mean(a, axis=axes, dtype=dtype, keepdims=True))
    sq = multiply(d, conj(d)) if d.dtype.kind == "c" else multiply(d, d)
    if sq.dtype.kind == "c":
        sq = real(sq)
    count = int(_np.prod([a.shape[i] for i in axes], dtype=_np.int64))
    return divide(sum(sq, axis=axes, keepdims=keepdims), _np.asarray(count - ddof, sq.dtype))


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False):
    """Standard deviation over `axis` (its derivative is infinite where the
    values are all equal)."""
    _no_out(out, "std")
    return sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def average(a, axis=None, weights=None):
    """Mean over `axis`, weighted by `weights` if given (as in NumPy, 1-D
    weights run along a single `axis`)."""
    a = _as_array(a, "average")
    if weights is None:
        return mean(a, axis=axis)
    w = _as_array(weights, "average")
    if w.shape != a.shape:
        if axis is None or w.ndim != 1 or not isinstance(axis, (int, _np.integer)):
            raise _ShapeError(f"weights of shape {w.shape} differ from {a.shape}: pass "
                              "1-D weights with a single `axis`.", op="average")
        ax = _normalize_axis(axis, a.ndim, "average")
        w = reshape(w, tuple(w.shape[0] if k == ax else 1 for k in range(a.ndim)))
        w = broadcast_to(w, a.shape)
    return divide(sum(multiply(a, w), axis=axis), sum(w, axis=axis))


def _sorted_slices(a, axis, out, op: str):
    """`a` as NumPy's `median` and `quantile` see it: the axes that `axis`
    names (a tuple, one axis, or all for None) flattened into one last axis
    and sorted along it (NaN last; the last axis, where XLA sorts fastest),
    and the shape `keepdims` gives the result."""
    if out is not None:
        raise _NotSupportedError("`out=`: sciad's arrays are values, not buffers; use the "
                                 "result.", op=op)
    a = _as_array(a, op)
    if a.dtype.kind == "c":
        raise _DTypeError(f"complex values have no order (NumPy's {op} sorts them "
                          f"lexicographically, sciad does not), got {a.type.str_short()}.",
                          op=op)
    shape, axes = a.shape, _normalize_axes(axis, a.ndim, op)
    kept = tuple(k for k in range(a.ndim) if k not in axes)
    count = int(_np.prod([shape[k] for k in axes], dtype=_np.int64))
    if kept + axes != tuple(range(a.ndim)):
        a = transpose(a, kept + axes)
    flat = reshape(a, tuple(shape[k] for k in kept) + (count,))
    # NumPy's rule: a slice holding NaN (sorted last) gives NaN. Seen on the
    # unsorted values: a use of the sorted ones' last would keep `sort` in a
    # gradient beside the `argsort` its derivative takes (twice the time).
    nan = any(isnan(flat), axis=-1) if _is_inexact(flat) and count else None
    return sort(flat, axis=-1), nan, tuple(1 if k in axes else d for k, d in enumerate(shape))


def _nan_where(nan, result):
    """`result`, NaN where `nan` (a slice held NaN): a constant, whose
    derivative is zero."""
    return result if nan is None else where(nan, _np.asarray(_np.nan, result.dtype), result)


def median(a, axis=None, out=None, overwrite_input: bool = False, keepdims: bool = False):
    """The median over `axis` (an int, a tuple of ints, or None: all),
    `numpy.median`: the middle of the sorted values, or the mean of the two
    middle ones; NaN in a slice makes its median NaN, and an empty slice's
    is NaN. (`overwrite_input` changes nothing: sciad's arrays are values.)
    Its derivative is that of the middle value(s), through `sort` (zero for
    a NaN result).

    ```python
    snp.median(np.array([[10.0, 7, 4], [3, 2, 1]]), axis=(0, 1))   # 3.5
    snp.median(np.array([10.0, np.nan, 4]))                         # nan, as NumPy's
    ```
    """
    s, nan, keep_shape = _sorted_slices(a, axis, out, "median")
    n = s.shape[-1]
    half = n // 2
    result = _nan_where(nan, mean(s[..., half - 1 + n % 2:half + 1], axis=-1))
    return reshape(result, keep_shape) if keepdims else result


def _discrete_index(index, take_previous):
    """NumPy's `_discrete_interpolation_to_boundaries`: the integer index
    next to `index`, the previous one where `take_previous(gamma, index)`."""
    previous = _np.floor(index)
    pick = _np.where(take_previous(index - previous, index), previous, previous + 1)
    return _np.maximum(pick.astype(_np.intp), 0)


def _hyndman_fan(alpha: float, beta: float):
    return lambda n, q: n * q + (alpha + q * (1 - alpha - beta)) - 1


def _fractional(gamma, index):
    return gamma


# NumPy's quantile methods (`numpy.quantile`'s `method`): the virtual index
# into the sorted slice of `n` values for the quantiles `q` (static), and how
# `gamma`, its fractional part, is adjusted; None where the index is an
# integer and the method picks that element (no interpolation)
_QUANTILE_METHODS = {
    "inverted_cdf": (lambda n, q: _discrete_index(n * q - 1, lambda g, i: g == 0), None),
    "averaged_inverted_cdf": (lambda n, q: n * q - 1,
                              lambda g, i: _np.where(g == 0, 0.5, 1.0)),
    "closest_observation": (lambda n, q: _discrete_index(
        n * q - 1 - 0.5, lambda g, i: (g == 0) & (_np.floor(i) % 2 == 1)), None),
    "interpolated_inverted_cdf": (_hyndman_fan(0, 1), _fractional),
    "hazen": (_hyndman_fan(0.5, 0.5), _fractional),
    "weibull": (_hyndman_fan(0, 0), _fractional),
    "linear": (lambda n, q: (n - 1) * q, _fractional),
    "median_unbiased": (_hyndman_fan(1 / 3.0, 1 / 3.0), _fractional),
    "normal_unbiased": (_hyndman_fan(3 / 8.0, 3 / 8.0), _fractional),
    "lower": (lambda n, q: _np.floor((n - 1) * q).astype(_np.intp), None),
    "higher": (lambda n, q: _np.ceil((n - 1) * q).astype(_np.intp), None),
    "midpoint": (lambda n, q: 0.5 * (_np.floor((n - 1) * q) + _np.ceil((n - 1) * q)),
                 lambda g, i: _np.where(i % 1 == 0, 0.0, 0.5)),
    "nearest": (lambda n, q: _np.around((n - 1) * q).astype(_np.intp), None),
}


def _quantile(a, q, axis, out, method, keepdims, weights, weak: bool, op: str):
    """`numpy.quantile`'s computation on quantiles `q` already in [0, 1]
    (`weak`: they were a Python scalar, whose dtype yields to `a`'s)."""
    if method not in _QUANTILE_METHODS:
        raise _ShapeError(f"method={method!r} is not one of NumPy's methods "
                          f"{list(_QUANTILE_METHODS)}.", op=op)
    if weights is not None:
        raise _NotSupportedError("`weights=` (NumPy's, for method='inverted_cdf' only) is "
                                 "not supported; for a weighted mean use `average`.", op=op)
    if q.ndim > 2:
        raise _ShapeError(f"`q` must be a scalar or 1-d, got shape {q.shape}.", op=op)
    s, nan, keep_shape = _sorted_slices(a, axis, out, op)
    n = s.shape[-1]
    if n == 0:
        from .errors import IndexingError

        raise IndexingError("an empty slice has no quantiles (NumPy raises too).", op=op)
    virtual, fix_gamma = _QUANTILE_METHODS[method]
    index = _np.asanyarray(virtual(n, q))
    rest = s.shape[:-1]

    def at(indices, values):  # the sorted values at static indices, `index`'s shape first
        picked = take(values, _np.asarray(indices).astype(_np.intp).ravel(), axis=-1)
        picked = reshape(picked, rest + index.shape)
        if not (rest and index.shape):
            return picked
        return moveaxis(picked, tuple(range(len(rest), picked.ndim)), tuple(range(index.ndim)))

    if fix_gamma is None or (method == "linear" and index.dtype.kind in "iub"):
        result = at(index, s)
    else:
        if s.dtype == _np.bool_:
            raise _DTypeError(f"method={method!r} interpolates between values, and NumPy's "
                              "booleans have no subtraction; use a method that picks a "
                              "value ('lower', 'nearest', ...) or convert to numbers.", op=op)
        # NumPy's `_get_indexes`, `_get_gamma` and `_lerp`, on static indices:
        # past the ends both neighbours are the end value
        previous = _np.array(_np.floor(index))
        after = _np.array(previous + 1)
        previous[index >= n - 1], after[index >= n - 1] = -1, -1
        previous[index < 0], after[index < 0] = 0, 0
        gamma = _np.asanyarray(fix_gamma(index - previous, index), dtype=index.dtype)
        # a Python-scalar `q` yields to `a`'s dtype (NEP 50), an array does not
        tdtype = (s.dtype if _is_inexact(s) else _np.dtype(_np.float64)) if weak else \
            gamma.dtype
        lo, hi = at(previous, s), at(after, s)
        shape = index.shape + (1,) * len(rest)
        # NumPy's `_lerp`: the difference in `a`'s dtype, from the nearer end,
        # `1 - t` in `t`'s own precision
        upper = (gamma >= 0.5).reshape(shape)
        t, u = (_np.asarray(x, tdtype).reshape(shape) for x in (gamma, 1 - gamma))
        # (functions, not operators: eagerly these are JAX arrays, whose
        # operators promote as JAX does, int64 * float32 to float32)
        diff = subtract(hi, lo)
        result = where(upper, subtract(hi, multiply(diff, u)), add(lo, multiply(diff, t)))
    result = _nan_where(nan, result)
    return reshape(result, index.shape + keep_shape) if keepdims else result


def _static_quantiles(q, op: str):
    if isinstance(q, _Tracer):
        raise _ShapeError(f"quantiles must be static numbers (they set which sorted values "
                          f"are used), got a traced {q.type.str_short()}.", op=op)
    return _np.asanyarray(q)


def quantile(a, q, axis=None, out=None, overwrite_input: bool = False, method: str = "linear",
             keepdims: bool = False, *, weights=None):
    """Quantiles `q` (static, in [0, 1]) over `axis` (an int, a tuple of
    ints, or None: all), `numpy.quantile`: every NumPy `method`, NumPy's
    result dtype, NaN in a slice makes its quantiles NaN. A scalar `q` gives
    the reduced shape; an array of `q`s adds its axes in front. The
    derivative is that of the sorted values interpolated (`sort`'s: between
    equal values one-sided). (`overwrite_input` changes nothing; `weights`
    is not supported.)

    ```python
    snp.quantile(np.array([1.0, 2, 3, 4]), [0.25, 0.5])         # [1.75 2.5]
    snp.quantile(np.array([1.0, 2, 3, 4]), 0.3, method="lower")  # 1.0
    ```
    """
    qs = _static_quantiles(q, "quantile")
    if not ((qs >= 0) & (qs <= 1)).all():
        raise _ShapeError(f"quantiles must be in [0, 1], got {q}.", op="quantile")
    return _quantile(a, qs, axis, out, method, keepdims, weights,
                     type(q) in (int, float), "quantile")


def percentile(a, q, axis=None, out=None, overwrite_input: bool = False,
               method: str = "linear", keepdims: bool = False, *, weights=None):
    """Percentiles `q` (static, in [0, 100]), `numpy.percentile`: `quantile`
    of `q / 100`.

    ```python
    snp.percentile(np.array([1.0, 2, 3, 4]), 50)   # 2.5
    ```
    """
    qs = _np.true_divide(_static_quantiles(q, "percentile"), 100)
    if not ((qs >= 0) & (qs <= 1)).all():
        raise _ShapeError(f"percentiles must be in [0, 100], got {q}.", op="percentile")
    return _quantile(a, _np.asanyarray(qs), axis, out, method, keepdims, weights,
                     type(q) in (int, float), "percentile")


def copy(a):
    """`a` itself: sciad's arrays are values, never mutated in place."""
    return _as_array(a, "copy")


def atleast_1d(*arys):
    """Each array with at least one dimension."""
    out = [reshape(a, (1,)) if _as_array(a, "atleast_1d").ndim == 0 else _as_array(a, "")
           for a in arys]
    return out[0] if len(out) == 1 else out


def atleast_2d(*arys):
    """Each array with at least two dimensions (a 1-D one as a row)."""
    out = []
    for a in arys:
        a = _as_array(a, "atleast_2d")
        out.append(reshape(a, (1,) * (2 - a.ndim) + tuple(a.shape)) if a.ndim < 2 else a)
    return out[0] if len(out) == 1 else out


def empty(shape, dtype=float):
    """An array of `shape` (zeros: there is no uninitialized memory here)."""
    return zeros(shape, dtype)


def empty_like(prototype, dtype=None, shape=None):
    """`zeros_like` (see `empty`)."""
    return zeros_like(prototype, dtype=dtype, shape=shape)


def identity(n: int, dtype=float):
    """The `n x n` identity matrix."""
    return eye(n, dtype=dtype)


def meshgrid(*xi, indexing: str = "xy", sparse: bool = False, copy: bool = True):
    """Coordinate arrays from 1-D coordinate vectors (`indexing="xy"`:
    Cartesian, the first two axes swapped; `"ij"`: matrix indexing)."""
    if indexing not in ("xy", "ij"):
        raise _InvalidOptionError(f"`indexing` must be 'xy' or 'ij', got {indexing!r}.",
                                  op="meshgrid")
    xs = [ravel(_as_array(x, "meshgrid")) for x in xi]
    nd = len(xs)
    shape = [x.shape[0] for x in xs]
    if indexing == "xy" and nd > 1:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for k, x in enumerate(xs):
        ax = k
        if indexing == "xy" and nd > 1 and k < 2:
            ax = 1 - k
        s = [1] * nd
        s[ax] = x.shape[0]
        g = reshape(x, tuple(s))
        out.append(g if sparse else broadcast_to(g, tuple(shape)))
    return out


def tile(A, reps):
    """`A` repeated `reps` times along each axis (`numpy.tile`)."""
    A = _as_array(A, "tile")
    reps = (int(reps),) if isinstance(reps, (int, _np.integer)) else tuple(int(r) for r in reps)
    nd = _builtins.max(A.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    A = reshape(A, (1,) * (nd - A.ndim) + tuple(A.shape))
    # broadcast each axis against a new one of size r before it, then merge
    inter = []
    for r, d in zip(reps, A.shape):
        inter += [r, d]
    g = broadcast_to(reshape(A, tuple(v for d in A.shape for v in (1, d))), tuple(inter))
    return reshape(g, tuple(r * d for r, d in zip(reps, A.shape)))


def repeat(a, repeats, axis=None):
    """Each element repeated `repeats` times (static: an int, or one per
    element along `axis`)."""
    a = _as_array(a, "repeat")
    if axis is None:
        a, axis = ravel(a), 0
    axis = _normalize_axis(axis, a.ndim, "repeat")
    if isinstance(repeats, _Tracer):
        raise _ShapeError("`repeats` must be static: the result's length depends on it.",
                          op="repeat")
    reps = _np.broadcast_to(_np.asarray(repeats, _np.int64), (a.shape[axis],))
    if (reps < 0).any():
        raise _ShapeError(f"`repeats` must be non-negative, got {repeats}.", op="repeat")
    return take(a, _np.repeat(_np.arange(a.shape[axis]), reps), axis=axis)


def hstack(tup):
    """Arrays joined along the second axis (the first for 1-D arrays)."""
    arrs = atleast_1d(*tup) if len(tup) > 1 else [atleast_1d(*tup)]
    return concatenate(arrs, axis=0 if arrs[0].ndim == 1 else 1)


def vstack(tup):
    """Arrays joined along the first axis (1-D arrays as rows)."""
    arrs = atleast_2d(*tup) if len(tup) > 1 else [atleast_2d(*tup)]
    return concatenate(arrs, axis=0)


def column_stack(tup):
    """1-D arrays as columns (2-D ones as they are), joined along axis 1."""
    cols = []
    for a in tup:
        a = _as_array(a, "column_stack")
        cols.append(reshape(a, (a.shape[0] if a.ndim else 1, 1)) if a.ndim < 2 else a)
    return concatenate(cols, axis=1)


def split(ary, indices_or_sections, axis: int = 0):
    """`ary` split along `axis` into equal sections (an int, which must
    divide the axis) or at static indices."""
    ary = _as_array(ary, "split")
    axis = _normalize_axis(axis, ary.ndim, "split")
    n = ary.shape[axis]
    if isinstance(indices_or_sections, (int, _np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise _ShapeError(f"array split does not result in an equal division: "
                              f"{n} into {k}.", op="split")
        cuts = [n // k * j for j in range(1, k)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    edges = [0] + cuts + [n]
    head = (slice(None),) * axis
    return [_getitem(ary, head + (slice(_builtins.min(lo, n), _builtins.max(
        _builtins.min(hi, n), _builtins.min(lo, n))),)) for lo, hi in zip(edges, edges[1:])]


def fliplr(m):
    """`m` reversed along its second axis."""
    return flip(m, 1)


def flipud(m):
    """`m` reversed along its first axis."""
    return flip(m, 0)


def rot90(m, k: int = 1, axes=(0, 1)):
    """`m` rotated by 90 degrees `k` times in the plane of `axes`."""
    m = _as_array(m, "rot90")
    a0, a1 = (_normalize_axis(a, m.ndim, "rot90") for a in axes)
    if a0 == a1:
        raise _ShapeError("`axes` must be two different axes.", op="rot90")
    k %= 4
    if k == 0:
        return m
    if k == 2:
        return flip(flip(m, a0), a1)
    perm = list(range(m.ndim))
    perm[a0], perm[a1] = perm[a1], perm[a0]
    return transpose(flip(m, a1), perm) if k == 1 else flip(transpose(m, perm), a1)


def _tri_mask(n, m, k, lower: bool):
    i = _np.arange(n)[:, None]
    j = _np.arange(m)[None, :]
    return (j <= i + k) if lower else (j >= i + k)


def tril(m, k: int = 0):
    """`m` with the entries above the `k`-th diagonal zeroed (last two axes)."""
    m = _as_array(m, "tril")
    return where(_tri_mask(m.shape[-2], m.shape[-1], k, True), m, zeros((), m.dtype))


def triu(m, k: int = 0):
    """`m` with the entries below the `k`-th diagonal zeroed (last two axes)."""
    m = _as_array(m, "triu")
    return where(_tri_mask(m.shape[-2], m.shape[-1], k, False), m, zeros((), m.dtype))


def diagonal(a, offset: int = 0, axis1: int = 0, axis2: int = 1):
    """The `offset` diagonal of `a` over `axis1`, `axis2` (appended last)."""
    from .errors import DTypeError

    if _is_sparse(a):
        if offset or (axis1, axis2) != (0, 1):
            raise DTypeError("a sparse matrix's diagonal takes no offset or axes.",
                             op="diagonal")
        return _sparse_module().diagonal(a)
    a = _as_array(a, "diagonal")
    a1, a2 = (_normalize_axis(x, a.ndim, "diagonal") for x in (axis1, axis2))
    rest = [k for k in range(a.ndim) if k not in (a1, a2)]
    t = transpose(a, tuple(rest) + (a1, a2))
    n, m = t.shape[-2], t.shape[-1]
    i = _np.arange(_builtins.max(0, _builtins.min(n, m - offset) if offset >= 0
                                 else _builtins.min(n + offset, m)))
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    flat = reshape(t, tuple(t.shape[:-2]) + (n * m,))
    return take(flat, rows * m + cols, axis=flat.ndim - 1)


def diag(v, k: int = 0):
    """The `k`-th diagonal of a 2-D `v`, or a 2-D array with the 1-D `v` on
    its `k`-th diagonal."""
    v = _as_array(v, "diag")
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise _ShapeError(f"input must be 1-D or 2-D, got {v.type.str_short()}.", op="diag")
    n = v.shape[0] + _builtins.abs(k)
    i = _np.arange(v.shape[0])
    pos = (i * n + i + k) if k >= 0 else ((i - k) * n + i)
    return reshape(zeros(n * n, v.dtype).at[pos].set(v), (n, n))


def trace(a, offset: int = 0, axis1: int = 0, axis2: int = 1):
    """The sum along a diagonal."""
    return sum(diagonal(a, offset, axis1, axis2), axis=-1)


def cross(a, b, axis: int = -1):
    """The cross product of 3-vectors along `axis` (of both)."""
    a, b = _as_array(a, "cross"), _as_array(b, "cross")
    a, b = moveaxis(a, axis, -1), moveaxis(b, axis, -1)
    if a.shape[-1] != 3 or b.shape[-1] != 3:
        raise _ShapeError(f"needs 3-vectors along `axis`, got {a.type.str_short()} and "
                          f"{b.type.str_short()}.", op="cross")
    a0, a1, a2 = (a[..., k] for k in range(3))
    b0, b1, b2 = (b[..., k] for k in range(3))
    return stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def kron(a, b):
    """The Kronecker product."""
    a, b = _as_array(a, "kron"), _as_array(b, "kron")
    nd = _builtins.max(a.ndim, b.ndim)
    a = reshape(a, (1,) * (nd - a.ndim) + tuple(a.shape))
    b = reshape(b, (1,) * (nd - b.ndim) + tuple(b.shape))
    ia = tuple(v for d in a.shape for v in (d, 1))
    ib = tuple(v for d in b.shape for v in (1, d))
    prod_ = multiply(reshape(a, ia), reshape(b, ib))
    return reshape(prod_, tuple(x * y for x, y in zip(a.shape, b.shape)))


def polyval(p, x):
    """The polynomial with coefficients `p` (highest power first) at `x`."""
    p = _as_array(p, "polyval")
    x = _as_array(x, "polyval")
    y = zeros_like(x, dtype=_result_type(p, x, op="polyval"))
    for k in range(p.shape[0]):
        y = add(multiply(y, x), p[k])
    return y


def searchsorted(a, v, side: str = "left", sorter=None):
    """Indices where `v` would be inserted into the sorted 1-D `a` to keep it
    sorted (NumPy's `side`), as int64."""
    a = _as_array(a, "searchsorted")
    if sorter is not None:
        a = take(a, sorter)
    dtype = _result_type(a, v, op="searchsorted")
    return _P.searchsorted_p.bind(_convert(a, dtype), _convert(_as_array(v, "searchsorted"),
                                                               dtype), side=side)


def digitize(x, bins, right: bool = False):
    """The index of the bin of each `x` in monotonic `bins`, increasing or
    decreasing (`numpy.digitize`), as int64. Concrete `bins` that are
    neither raise, as in NumPy; traced ones are taken as decreasing where
    `bins[-1] < bins[0]`, else as increasing.

    ```python
    snp.digitize(np.array([0.5, 2.5]), np.array([0.0, 1, 2, 3]))   # [1 3]
    snp.digitize(np.array([0.5, 2.5]), np.array([3.0, 2, 1, 0]))   # [3 1]
    ```
    """
    bins = _as_array(bins, "digitize")
    if bins.ndim != 1:
        raise _ShapeError(f"`bins` must be 1-D, got {bins.type.str_short()}.", op="digitize")
    side, n = "left" if right else "right", bins.shape[0]
    if not isinstance(bins, _Tracer):
        steps = _np.diff(_np.asarray(bins))
        if (steps >= 0).all():
            return searchsorted(bins, x, side=side)
        if not (steps <= 0).all():
            raise _ShapeError("`bins` must be monotonically increasing or decreasing (NumPy's "
                              "rule).", op="digitize")
    # decreasing: NumPy's `len(bins) - searchsorted(bins[::-1], x)`
    down = subtract(_np.int64(n), searchsorted(flip(bins), x, side=side))
    if not isinstance(bins, _Tracer):
        return down
    return where(less(bins[n - 1], bins[0]), down, searchsorted(bins, x, side=side))


def _interp_line(x, xp, fp, reciprocal: bool):
    """NumPy's `arr_interp` at `x` between the first and last of `n >= 2`
    increasing knots `xp` (float64; `fp` real), `reciprocal`: the slope as
    `arr_interp_complex` forms it, times `1 / dx`.

    Where the point's segment is finite it is `slope * (x - x_a) + f_a`, anchored
    at the segment's left knot (at the right one on the last knot): exact at
    the knots, whose derivative in `x` is the right-hand slope (the left-hand
    one at the last knot). Elsewhere (a segment with an infinite or NaN
    value) the value is NumPy's: `f_j` at a knot, else the line from the
    left, or the right where that is NaN, or `f_j` where both are NaN and
    `f_j == f_(j+1)`; its derivative is zero (the value is not finite), and
    the masks keep its infinities out of every other point's derivative."""
    n = xp.shape[0]
    j = searchsorted(xp, x, side="right") - 1                 # -1 .. n - 1
    last = equal(j, n - 1)
    j = clip(j, 0, n - 2)
    x0, x1 = take(xp, j, mode="promise_in_bounds"), take(xp, j + 1, mode="promise_in_bounds")
    f0, f1 = take(fp, j, mode="promise_in_bounds"), take(fp, j + 1, mode="promise_in_bounds")
    inside = logical_and(greater_equal(x, xp[0]), less_equal(x, xp[n - 1]))   # NaN: False
    width, rise = subtract(x1, x0), subtract(f1, f0)
    # (the masks by `finite` and `good` drop the NaN cotangents, 0 * inf, that
    # the unused lines of the other points would send back)
    finite = logical_and(logical_and(isfinite(rise), isfinite(width)), greater(width, 0))
    width = where(finite, width, 1.0)
    slope = multiply(rise, divide(1.0, width)) if reciprocal else divide(rise, width)
    good = logical_and(logical_and(inside, finite), isfinite(slope))
    xa, fa = where(last, x1, x0), where(last, f1, f0)
    line = add(multiply(where(good, slope, 0.0), subtract(x, xa)), fa)
    # NumPy's value where the segment is not finite (a constant here)
    x, x0, x1, f0, f1 = (_P.stop_gradient(v) for v in (x, x0, x1, f0, f1))
    raw = divide(subtract(f1, f0), subtract(x1, x0))
    first = add(multiply(raw, subtract(x, x0)), f0)
    other = add(multiply(raw, subtract(x, x1)), f1)
    other = where(logical_and(isnan(other), equal(f0, f1)), f0, other)
    knot = logical_and(inside, logical_or(last, equal(x, x0)))
    return where(good, line, where(knot, fa, where(isnan(first), other, first)))


def _from_parts(re, im):
    """`re + i im` (float64 parts) with either part infinite or NaN: `im * 1j`
    alone would make the real part NaN (`inf * 0`), so the imaginary part's
    infinities and NaN are added as complex constants."""
    c = _np.dtype(_np.complex128)
    finite = isfinite(im)
    out = add(_convert(re, c), multiply(_convert(where(finite, im, 0.0), c), c.type(1j)))
    special = where(isnan(im), c.type(complex(0.0, _np.nan)),
                    where(greater(im, 0), c.type(complex(0.0, _np.inf)),
                          c.type(complex(0.0, -_np.inf))))
    return add(out, where(finite, c.type(0), special))


def interp(x, xp, fp, left=None, right=None, period=None):
    """Piecewise-linear interpolation of the points `(xp, fp)` (`xp`
    increasing, not checked) at `x`, `numpy.interp`: float64 results
    (complex128 for complex `fp`), `fp[0]`/`fp[-1]` (or `left`/`right`)
    outside, `fp[j]` exactly at a knot `xp[j]`, NumPy's values next to
    infinite `fp`, NaN at a NaN `x`; one knot gives `left`, `fp[0]`, `right`.

    Differentiable in `x`, `xp`, `fp`, `left` and `right`. At a knot the
    derivative in `x` is the right-hand segment's slope (the left-hand one
    at the last knot); where the value is not finite it is zero, and an
    infinite `fp` does not reach the derivative at any other point.

    ```python
    snp.interp(np.array([1.0, 2, 3, 4, 5]), np.array([1.0, 2, 3, 4, 5]),
               np.array([1.0, 2, np.inf, np.inf, 4]))      # [1. 2. inf inf 4.]
    snp.interp(np.array([0.0, 1, 2]), np.array([1.0]), np.array([5.0]),
               left=-1.0, right=9.0)                       # [-1. 5. 9.]
    ```
    """
    op = "interp"
    if period is not None:
        raise _NotSupportedError("`period` is not supported; map `x` and `xp` into one "
                                 "period and repeat the end knots yourself.", op=op)
    x, xp, fp = (_as_array(v, op) for v in (x, xp, fp))
    for name, v in (("x", x), ("xp", xp)):
        if v.dtype.kind == "c":
            raise _DTypeError(f"`{name}` must be real, got {v.type.str_short()}.", op=op)
    if xp.ndim != 1 or fp.ndim != 1 or xp.shape != fp.shape or xp.shape[0] == 0:
        raise _ShapeError(f"`xp` and `fp` must be 1-D of one non-zero length, got "
                          f"{xp.type.str_short()} and {fp.type.str_short()}.", op=op)
    dtype = _np.dtype(_np.complex128 if fp.dtype.kind == "c" else _np.float64)
    x, xp, fp = _convert(x, _np.float64), _convert(xp, _np.float64), _convert(fp, dtype)
    ends = []
    for name, v, default in (("left", left, fp[0]), ("right", right, fp[xp.shape[0] - 1])):
        if v is None:
            ends.append(default)
            continue
        v = _as_array(v, op)
        if v.dtype.kind == "c" and dtype.kind != "c":
            raise _DTypeError(f"`{name}` is complex, but `fp` is real (NumPy refuses it "
                              "too): pass a real value, or complex `fp`.", op=op)
        ends.append(_convert(v, dtype))
    n = xp.shape[0]
    if n == 1:  # NumPy's: even a NaN `x` takes `fp[0]`
        inner = broadcast_to(fp[0], x.shape)
    elif dtype.kind == "c":  # each part on its own, with NumPy's complex slope
        inner = _from_parts(_interp_line(x, xp, real(fp), True),
                            _interp_line(x, xp, imag(fp), True))
        inner = where(isnan(x), _convert(x, dtype), inner)
    else:
        inner = where(isnan(x), x, _interp_line(x, xp, fp, False))
    return where(less(x, xp[0]), ends[0], where(greater(x, xp[n - 1]), ends[1], inner))


def trapezoid(y, x=None, dx: float = 1.0, axis: int = -1):
    """The trapezoidal rule along `axis`, with sample points `x` or spacing
    `dx`."""
    y = _as_array(y, "trapezoid")
    axis = _normalize_axis(axis, y.ndim, "trapezoid")
    head = (slice(None),) * axis
    avg = (y[head + (slice(1, None),)] + y[head + (slice(None, -1),)]) / 2.0
    if x is None:
        return sum(avg, axis=axis) * dx
    x = _as_array(x, "trapezoid")
    d = diff(x, axis=-1 if x.ndim == 1 else axis)
    if x.ndim == 1:
        d = reshape(d, tuple(d.shape[0] if k == axis else 1 for k in range(y.ndim)))
    return sum(avg * d, axis=axis)


def gradient(f, *varargs, axis=None, edge_order: int = 1):
    """Second-order central differences inside, one-sided (first or second
    order, `edge_order`) at the ends, per axis (`numpy.gradient`); `varargs`
    are scalar spacings (one for all axes, or one per axis)."""
    f = _float(_as_array(f, "gradient"))
    axes = _normalize_axes(axis, f.ndim, "gradient")
    if _builtins.any(isinstance(h, _Tracer) or _np.ndim(h) for h in varargs):
        raise _NotSupportedError("spacings must be static scalars (coordinate arrays are "
                                 "not supported).", op="gradient")
    hs = [1.0] * len(axes) if not varargs else [float(varargs[0])] * len(axes) \
        if len(varargs) == 1 else [float(h) for h in varargs]
    if len(hs) != len(axes):
        raise _ShapeError(f"{len(varargs)} spacings for {len(axes)} axes.", op="gradient")
    if edge_order not in (1, 2):
        raise _ShapeError("`edge_order` must be 1 or 2.", op="gradient")
    out = []
    for ax, h in zip(axes, hs):
        n = f.shape[ax]
        if n < edge_order + 1:
            raise _ShapeError(f"axis {ax} has {n} points: at least {edge_order + 1} are "
                              f"needed for edge_order={edge_order}.", op="gradient")

        def s(i, _ax=ax):  # one index, or a slice, along the axis
            return f[(slice(None),) * _ax + (i,)]

        inner = (s(slice(2, None)) - s(slice(0, -2))) / (2.0 * h)
        if edge_order == 1:
            lo = (s(1) - s(0)) / h
            hi = (s(-1) - s(-2)) / h
        else:
            lo = (-1.5 * s(0) + 2.0 * s(1) - 0.5 * s(2)) / h
            hi = (0.5 * s(-3) - 2.0 * s(-2) + 1.5 * s(-1)) / h
        out.append(concatenate([expand_dims(lo, ax), inner, expand_dims(hi, ax)], axis=ax))
    return out[0] if len(out) == 1 else out


def bincount(x, weights=None, minlength: int = 0, *, length: int | None = None):
    """Counts (or summed `weights`) of each non-negative integer in `x`. The
    result's length is static: `max(x) + 1` (at least `minlength`) for
    concrete `x`; for traced `x`, pass `length` (values at or above it are an
    `IndexingError` when the program runs)."""
    from .errors import IndexingError

    if isinstance(x, _Tracer):
        if length is None:
            raise IndexingError("traced values need a static `length=` (the result's "
                                "length would depend on their maximum).", op="bincount")
        n = int(length)
        xi = x
    else:
        xi = _np.asarray(x)
        if xi.size and xi.min() < 0:
            raise IndexingError("`x` must be non-negative.", op="bincount")
        n = _builtins.max(int(xi.max()) + 1 if xi.size else 0, int(minlength))
        if length is not None:
            n = int(length)
    w = ones(_shape(x), _np.int64) if weights is None else _float(_as_array(weights,
                                                                              "bincount"))
    return zeros(n, w.dtype).at[xi].add(w)


def convolve(a, v, mode: str = "full"):
    """The discrete linear convolution of 1-D `a` and `v` (modes "full",
    "same", "valid", as in NumPy), as one gather of sliding windows and a
    contraction: suited to short kernels (use `sciad.fft` for long ones)."""
    a, v = _as_array(a, "convolve"), _as_array(v, "convolve")
    if a.ndim != 1 or v.ndim != 1 or not a.shape[0] or not v.shape[0]:
        raise _ShapeError(f"needs two non-empty 1-D arrays, got {a.type.str_short()} and "
                          f"{v.type.str_short()}.", op="convolve")
    if mode not in ("full", "same", "valid"):
        raise _ShapeError(f"`mode` must be 'full', 'same' or 'valid', got {mode!r}.",
                          op="convolve")
    if v.shape[0] > a.shape[0]:
        a, v = v, a
    n, m = a.shape[0], v.shape[0]
    dtype = _result_type(a, v, op="convolve")
    ap = pad(_convert(a, dtype), (m - 1, m - 1))
    full_len = n + m - 1
    start = {"full": 0, "same": (m - 1) // 2, "valid": m - 1}[mode]
    length = {"full": full_len, "same": n, "valid": n - m + 1}[mode]
    idx = (start + _np.arange(length))[:, None] + _np.arange(m)[None, :]
    win = take(ap, idx)
    return einsum("ij,j->i", win, flip(_convert(v, dtype)))


def correlate(a, v, mode: str = "valid"):
    """The cross-correlation of 1-D `a` and `v` (`numpy.correlate`)."""
    v = _as_array(v, "correlate")
    return convolve(a, flip(conj(v)), mode) if _as_array(a, "correlate").shape[0] >= \
        v.shape[0] else flip(convolve(flip(_as_array(a, "")), conj(v), mode))


def isclose(a, b, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    """Elementwise `|a - b| <= atol + rtol |b|` (infinities equal themselves)."""
    a, b = _float(_as_array(a, "isclose")), _float(_as_array(b, "isclose"))
    close = less_equal(abs(subtract(a, b)), add(atol, multiply(rtol, abs(b))))
    close = logical_or(logical_and(close, isfinite(subtract(a, b))), equal(a, b))
    if equal_nan:
        close = logical_or(close, logical_and(isnan(a), isnan(b)))
    return close


def allclose(a, b, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    """Are all elements `isclose`."""
    return all(isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


def array_equal(a1, a2, equal_nan: bool = False):
    """Same shape and elements."""
    a1, a2 = _as_array(a1, "array_equal"), _as_array(a2, "array_equal")
    if a1.shape != a2.shape:
        return asarray(False)
    eq = equal(a1, a2)
    if equal_nan:
        eq = logical_or(eq, logical_and(isnan(a1), isnan(a2)))
    return all(eq)


# ---------------------------------------------------------------------------
# methods and operators of traced values

def _swap(f):
    return lambda self, other: f(other, self)


def _install_tracer_methods() -> None:
    T = _Tracer
    ops: dict[str, _Any] = {
        "__add__": add, "__radd__": _swap(add),
        "__sub__": subtract, "__rsub__": _swap(subtract),
        "__mul__": multiply, "__rmul__": _swap(multiply),
        "__truediv__": divide, "__rtruediv__": _swap(divide),
        "__floordiv__": floor_divide, "__rfloordiv__": _swap(floor_divide),
        "__mod__": remainder, "__rmod__": _swap(remainder),
        "__pow__": power, "__rpow__": _swap(power),
        "__matmul__": matmul, "__rmatmul__": _swap(matmul),
        "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
        "__eq__": equal, "__ne__": not_equal,
        "__and__": bitwise_and, "__rand__": _swap(bitwise_and),
        "__or__": bitwise_or, "__ror__": _swap(bitwise_or),
        "__xor__": bitwise_xor, "__rxor__": _swap(bitwise_xor),
        "__invert__": invert,
        "__neg__": negative, "__pos__": lambda self: self, "__abs__": abs,
        "__getitem__": lambda self, idx: _getitem(self, idx),
        "sum": sum, "mean": mean, "max": max, "min": min, "prod": prod,
        "ravel": ravel, "flatten": ravel, "squeeze": squeeze, "astype": astype,
        "conj": conj, "conjugate": conj, "cumsum": cumsum,
        "sort": sort, "argsort": argsort, "take": take, "argmax": argmax, "argmin": argmin,
        "any": any, "all": all, "var": var, "std": std, "trace": trace, "repeat": repeat,
        "copy": copy, "clip": clip, "dot": dot, "swapaxes": swapaxes,
        "reshape": lambda self, *shape, **kw: reshape(
            self, shape[0] if len(shape) == 1 else shape, **kw),
        "transpose": lambda self, *axes: transpose(
            self, None if not axes else axes[0] if len(axes) == 1 and
            not isinstance(axes[0], (int, _np.integer)) else axes),
    }
    for name, fn in ops.items():
        setattr(T, name, fn)
    T.T = property(lambda self: transpose(self))
    # sparse matrices (the methods refuse dense values with a clear message)
    T.todense = T.toarray = lambda self: _sparse_module().todense(self)
    T.diagonal = lambda self, offset=0, axis1=0, axis2=1: diagonal(self, offset, axis1, axis2)
    T.data = property(lambda self: _sparse_module().data(self))
    T.mT = property(lambda self: swapaxes(self, -1, -2))
    T.real = property(real)
    T.imag = property(imag)
    T.at = property(_At)


_install_tracer_methods()


# `snp.fft`, as `numpy.fft` (imported last: it imports this module)
from . import fft as fft  # noqa: E402
from ._numpy_interop import install as _install_numpy_interop  # noqa: E402

# `np.sin(x)`, `np.sum(x)`, `np.fft.rfft(x)` on a traced `x` run the functions
# above (and sciad.fft's), matched by NumPy function object, not by name
_install_numpy_interop()
