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

The functions take NumPy's documented arguments, at NumPy's positions, and
give NumPy's values, shapes and dtypes for them (tests/test_numpy_semantics.py
checks them against NumPy): `diff`'s `prepend`/`append`, `interp`'s
`period`, `gradient`'s coordinate arrays and `edge_order`, the thirteen
`quantile`/`percentile` methods and `weights` (with "inverted_cdf"),
`cross`'s `axisa`/`axisb`/`axisc`, `average`'s `returned`/`keepdims`,
`var`/`std`'s `correction`/`mean`/`where`, the reductions' `where` and
`initial`. An argument sciad does not take is
refused by name: `out=` everywhere (an `InvalidOptionError`: sciad's arrays
are values; use the returned one). Where sciad does not follow NumPy:

- complex values have no order: `sort`, `median`, `quantile` and
  `searchsorted` refuse them (NumPy orders them lexicographically);
- values that set a shape or a branch are static: `quantile`'s `q`,
  `interp`'s `period`, `repeat`'s counts (weights may be traced: they are
  checked as NumPy checks them, negative or summing to zero, when the
  program runs);
- NumPy's `TypeError` for `gradient`'s wrong number of spacings and for
  `average`'s weights without `axis` is a `ShapeError` here (a ValueError);
- the NaN-ignoring functions (`nanmedian`, `nanquantile`, ...) are not here.
"""

from __future__ import annotations

import builtins as _builtins
import types as _types
import warnings as _warnings
from typing import Any as _Any

import numpy as _np

from . import _ops
from . import primitives as _P
from .errors import DTypeError as _DTypeError, NotSupportedError as _NotSupportedError
from .errors import InvalidOptionError as _InvalidOptionError, ShapeError as _ShapeError
from .errors import IndexingError as _IndexingError, ZeroSumError as _ZeroSumError
from .graph import Tracer as _Tracer
from .primitives._weights import weights_check_p as _weights_check_p
from ._ops import normalize_axes as _normalize_axes, normalize_axis as _normalize_axis
from ._ops import _At, _acc_dtype, _as_array, _convert, _dtype, _getitem, _is_sparse
from ._ops import _no_out, _operand, _result_type, _shape, _type_str
from ._ops import broadcast_shapes as _broadcast_shapes
# the functions the op layer (`sciad._ops`) implements, with NumPy's semantics,
# are this module's: rules use them there, users here
from ._ops import (
    negative as negative,
    exp as exp,
    log as log,
    log1p as log1p,
    expm1 as expm1,
    sin as sin,
    cos as cos,
    tan as tan,
    arcsin as arcsin,
    arccos as arccos,
    arctan as arctan,
    sinh as sinh,
    cosh as cosh,
    tanh as tanh,
    sqrt as sqrt,
    abs as abs,
    absolute as absolute,
    sign as sign,
    square as square,
    floor as floor,
    ceil as ceil,
    isfinite as isfinite,
    logical_not as logical_not,
    add as add,
    subtract as subtract,
    multiply as multiply,
    divide as divide,
    true_divide as true_divide,
    floor_divide as floor_divide,
    remainder as remainder,
    mod as mod,
    power as power,
    maximum as maximum,
    minimum as minimum,
    arctan2 as arctan2,
    equal as equal,
    not_equal as not_equal,
    less as less,
    less_equal as less_equal,
    greater as greater,
    greater_equal as greater_equal,
    logical_and as logical_and,
    logical_or as logical_or,
    bitwise_and as bitwise_and,
    bitwise_or as bitwise_or,
    bitwise_xor as bitwise_xor,
    invert as invert,
    bitwise_not as bitwise_not,
    real as real,
    imag as imag,
    conj as conj,
    conjugate as conjugate,
    angle as angle,
    where as where,
    clip as clip,
    astype as astype,
    sum as sum,
    prod as prod,
    max as max,
    min as min,
    amax as amax,
    amin as amin,
    mean as mean,
    norm as norm,
    reshape as reshape,
    ravel as ravel,
    transpose as transpose,
    swapaxes as swapaxes,
    moveaxis as moveaxis,
    broadcast_to as broadcast_to,
    expand_dims as expand_dims,
    squeeze as squeeze,
    concatenate as concatenate,
    stack as stack,
    pad as pad,
    roll as roll,
    cumsum as cumsum,
    sort as sort,
    argsort as argsort,
    take as take,
    take_along_axis as take_along_axis,
    full as full,
    zeros as zeros,
    ones as ones,
    full_like as full_like,
    zeros_like as zeros_like,
    ones_like as ones_like,
    arange as arange,
    linspace as linspace,
    eye as eye,
    asarray as asarray,
    array as array,
    matmul as matmul,
    einsum as einsum,
    tensordot as tensordot,
    dot as dot,
    vdot as vdot,
    inner as inner,
    outer as outer,
    any as any,
    all as all,
    searchsorted as searchsorted,
)

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
# differences and flips (by indexing)

def diff(a, n: int = 1, axis: int = -1, prepend=None, append=None):
    """The `n`-th forward difference along `axis`, `numpy.diff`: `prepend`
    and `append` (scalars, broadcast to one slice, or arrays) are joined to
    `a` along `axis` first; booleans differ by `!=`; unsigned integers wrap
    as NumPy's.

    ```python
    snp.diff(np.array([1, 2, 4, 7, 0]), prepend=0)   # [ 1  1  2  3 -7]
    ```
    """
    op = "diff"
    if isinstance(n, bool) or not isinstance(n, (int, _np.integer)):
        raise _InvalidOptionError(f"order `n` must be an integer, got {n!r}.", op=op)
    if n < 0:
        raise _InvalidOptionError(f"order must be non-negative but got {n}.", op=op)
    a = _as_array(a, op)
    if n == 0:
        return a
    if a.ndim == 0:
        raise _ShapeError("diff requires input that is at least one dimensional.", op=op)
    axis = _normalize_axis(axis, a.ndim, op)
    def joined(extra):
        e = _as_array(extra, op)
        if e.ndim == 0:
            e = broadcast_to(e, tuple(1 if k == axis else d for k, d in enumerate(a.shape)))
        return e

    parts = ([] if prepend is None else [joined(prepend)]) + [a] + \
        ([] if append is None else [joined(append)])
    if len(parts) > 1:
        a = concatenate(parts, axis=axis)
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


# ---------------------------------------------------------------------------
# more of NumPy, written with the ops above (their derivatives follow)

_LN2, _LN10 = float(_np.log(2.0)), float(_np.log(10.0))  # weak: they keep x's dtype


def log2(x, out=None):
    """Elementwise base-2 logarithm."""
    _no_out(out, "log2")
    return divide(log(_as_array(x, "log2")), _LN2)


def log10(x, out=None):
    """Elementwise base-10 logarithm."""
    _no_out(out, "log10")
    return divide(log(_as_array(x, "log10")), _LN10)


def exp2(x, out=None):
    """Elementwise `2 ** x`."""
    _no_out(out, "exp2")
    return exp(multiply(_ufunc_float(_as_array(x, "exp2"), op="exp2"), _LN2))


def reciprocal(x, out=None):
    """Elementwise `1 / x` (integer division for integers, as in NumPy)."""
    _no_out(out, "reciprocal")
    x = _as_array(x, "reciprocal")
    return divide(_np.ones((), x.dtype), x) if _is_inexact(x) else \
        floor_divide(_np.ones((), x.dtype), x)


def deg2rad(x, out=None):
    """Degrees to radians."""
    _no_out(out, "deg2rad")
    return multiply(_ufunc_float(_as_array(x, "deg2rad"), op="deg2rad"), _np.pi / 180.0)


def rad2deg(x, out=None):
    """Radians to degrees."""
    _no_out(out, "rad2deg")
    return multiply(_ufunc_float(_as_array(x, "rad2deg"), op="rad2deg"), 180.0 / _np.pi)


radians, degrees = deg2rad, rad2deg


def logaddexp(x1, x2, out=None):
    """`log(exp(x1) + exp(x2))` without overflow."""
    _no_out(out, "logaddexp")
    x1, x2 = _ufunc_float(_operand(x1, "logaddexp"), _operand(x2, "logaddexp"),
                          op="logaddexp")
    hi = maximum(x1, x2)
    # NumPy's: equal values (infinities too) give x + log(2), not inf - inf
    gap = where(equal(x1, x2), _np.zeros((), hi.dtype), subtract(x1, x2))
    return add(hi, log1p(exp(negative(abs(gap)))))


def heaviside(x1, x2, out=None):
    """0 where `x1 < 0`, `x2` where `x1 == 0`, 1 where `x1 > 0`."""
    _no_out(out, "heaviside")
    x1, x2 = _ufunc_float(_operand(x1, "heaviside"), _operand(x2, "heaviside"),
                          op="heaviside")
    x1 = _as_array(x1, "heaviside")
    step = where(less(x1, 0), zeros_like(x1), where(equal(x1, 0), x2, ones_like(x1)))
    return where(isnan(x1), x1, step)                    # NaN stays NaN, as NumPy's


def logical_xor(x1, x2, out=None):
    """Elementwise exclusive or of truth values."""
    _no_out(out, "logical_xor")
    return not_equal(astype(_as_array(x1, "logical_xor"), bool),
                     astype(_as_array(x2, "logical_xor"), bool))


def isnan(x, out=None):
    """Elementwise: is `x` NaN."""
    _no_out(out, "isnan")
    x = _as_array(x, "isnan")
    return not_equal(x, x) if _is_inexact(x) else zeros_like(x, dtype=bool)


def isinf(x, out=None):
    """Elementwise: is `x` infinite."""
    _no_out(out, "isinf")
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


def argmax(a, axis=None, out=None, *, keepdims: bool = False):
    """The index of the (first) largest value, flattened or along `axis`."""
    _no_out(out, "argmax")
    return _arg_extremum(a, axis, keepdims, max, "argmax")


def argmin(a, axis=None, out=None, *, keepdims: bool = False):
    """The index of the (first) smallest value, flattened or along `axis`."""
    _no_out(out, "argmin")
    return _arg_extremum(a, axis, keepdims, min, "argmin")


def _ddof(ddof, correction, op: str):
    if correction is None:
        return ddof
    if ddof != 0:
        raise _InvalidOptionError("`ddof` and `correction` (its NumPy 2 name) were both "
                                  "given; pass one.", op=op)
    return correction


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=None,
        mean=None, correction=None):
    """Variance over `axis` (an int, a tuple, or None: all),
    `sum(|a - mean|^2) / max(N - ddof, 0)`, `numpy.var`: integers and bools
    in float64, `dtype` the dtype it is computed and returned in, complex
    values give a real variance, `ddof >= N` gives inf (or NaN) as NumPy's;
    `correction` is `ddof`'s NumPy 2 name, `mean` a precomputed mean of
    `keepdims=True` shape (its derivative flows too), `where` a boolean mask
    (broadcasting to `a`) of the elements taken. `out=` is refused: use the
    result.

    ```python
    snp.var(np.array([[1.0, 2], [3, 4]]), axis=0, ddof=1)   # [2. 2.]
    ```
    """
    _no_out(out, "var")
    ddof = _ddof(ddof, correction, "var")
    a = _as_array(a, "var")
    axes = _normalize_axes(axis, a.ndim, "var")
    dtype = _np.dtype(dtype) if dtype is not None else None
    # NumPy's `_var`: the mean in `dtype` (float64 for integers and bools), the
    # deviations in their promoted dtype, their squares summed in `dtype`,
    # over the elements `where` keeps, divided by max(count - ddof, 0)
    mdtype = dtype if dtype is not None or _is_inexact(a) else _np.dtype(_np.float64)
    m = _mean(a, axes, mdtype, where) if mean is None else _as_array(mean, "var")
    d = subtract(a, m)
    sq = multiply(d, conj(d)) if d.dtype.kind == "c" else multiply(d, d)
    if sq.dtype.kind == "c":
        sq = real(sq)
    total = sum(sq, axis=axes, dtype=dtype if dtype is None or dtype.kind != "c" else
                _np.finfo(dtype).dtype, keepdims=keepdims, where=where)
    count = _ops._mask_count(a, where, axes, keepdims, "var")
    if isinstance(count, int):
        return divide(total, _np.asarray(_builtins.max(count - ddof, 0), total.dtype))
    return divide(total, _convert(maximum(subtract(count, ddof), 0), total.dtype))


def _mean(a, axes, dtype, mask):
    return mean(a, axis=axes, dtype=dtype, keepdims=True, where=mask)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=None,
        mean=None, correction=None):
    """Standard deviation over `axis`, `sqrt(var(...))` with `var`'s
    arguments (its derivative is infinite where the values are all equal).

    ```python
    snp.std(np.array([1.0, 2, 3, 4]))   # 1.118...
    ```
    """
    _no_out(out, "std")
    return sqrt(var(a, axis=axis, dtype=dtype, ddof=_ddof(ddof, correction, "std"),
                    keepdims=keepdims, where=where, mean=mean))


def _weights_against(w, a, axes, op: str):
    """NumPy's `weights` against `a`: of `a`'s shape, or (with `axes`, a
    tuple) of `a`'s shape along those axes, then reshaped to broadcast
    against `a`."""
    if tuple(w.shape) == tuple(a.shape):
        return w
    if axes is None:
        raise _ShapeError(f"weights of shape {w.shape} differ from `a`'s {a.shape}: give "
                          "`axis` (NumPy raises TypeError here).", op=op)
    if tuple(w.shape) != tuple(a.shape[k] for k in axes):
        raise _ShapeError(f"weights of shape {w.shape} must be the shape of `a` {a.shape} "
                          f"along axis {axes}.", op=op)
    w = transpose(w, tuple(int(k) for k in _np.argsort(axes)))
    return reshape(w, tuple(d if k in axes else 1 for k, d in enumerate(a.shape)))


def average(a, axis=None, weights=None, returned: bool = False, *, keepdims: bool = False):
    """The mean over `axis` (an int, a tuple, or None: all), weighted by
    `weights` if given, `numpy.average`: weights of `a`'s shape, or of the
    shape of `a` along `axis` (in `axis`'s order); float64 for integer and
    bool data; `returned=True` adds the sum of the weights (the count
    without weights), broadcast to the result's shape. Concrete weights
    that sum to zero raise `ZeroSumError` (NumPy's `ZeroDivisionError`),
    traced ones when the program runs.

    ```python
    snp.average(np.arange(6.0).reshape(3, 2), axis=1, weights=[0.25, 0.75])  # [0.75 2.75 4.75]
    ```
    """
    op = "average"
    a = _as_array(a, op)
    axes = None if axis is None else _normalize_axes(axis, a.ndim, op)
    if weights is None:
        avg = mean(a, axis=axes, keepdims=keepdims)
        n_in, n_out = (int(_np.prod(sh, dtype=_np.int64)) for sh in (a.shape, avg.shape))
        scl = _np.asarray(n_in / n_out if n_out else _np.nan, avg.dtype)
    else:
        w = _as_array(weights, op)
        if a.dtype.kind in "iub":
            rdtype = _np.result_type(a.dtype, w.dtype, _np.float64)
        else:
            rdtype = _np.result_type(a.dtype, w.dtype)
        w = _weights_against(w, a, axes, op)
        if isinstance(w, _Tracer):  # (checked when the program runs)
            w = _weights_check_p.bind(w, axes=tuple(range(w.ndim)) if axes is None else axes,
                                      nonzero_sum=True, of="average")
        scl = sum(w, axis=axes, dtype=rdtype, keepdims=keepdims)
        if not isinstance(scl, _Tracer) and (_np.asarray(scl) == 0).any():
            raise _ZeroSumError("weights sum to zero, can't be normalized (NumPy's "
                                "ZeroDivisionError).", op=op)
        prod_ = multiply(_convert(a, rdtype), _convert(w, rdtype))
        avg = divide(sum(prod_, axis=axes, keepdims=keepdims), scl)
    if not returned:
        return avg
    if tuple(_shape(scl)) != tuple(avg.shape):
        scl = broadcast_to(scl, avg.shape)
    return avg, scl


def _sorted_slices(a, axis, out, op: str):
    """`a` as NumPy's `median` and `quantile` see it: the axes that `axis`
    names (a tuple, one axis, or all for None) flattened into one last axis
    and sorted along it (NaN last; the last axis, where XLA sorts fastest),
    and the shape `keepdims` gives the result."""
    _no_out(out, op)
    a = _as_array(a, op)
    if a.dtype.kind == "c":
        raise _DTypeError(f"complex values have no order (NumPy's {op} sorts them "
                          f"lexicographically, sciad does not), got {_type_str(a)}.",
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
    if q.ndim > 2:
        raise _ShapeError(f"`q` must be a scalar or 1-d, got shape {q.shape}.", op=op)
    if weights is not None:
        if method != "inverted_cdf":
            raise _InvalidOptionError(f"only method='inverted_cdf' supports weights (as in "
                                      f"NumPy), got method={method!r}.", op=op)
        return _weighted_quantile(a, q, axis, out, weights, keepdims, op)
    s, nan, keep_shape = _sorted_slices(a, axis, out, op)
    n = s.shape[-1]
    if n == 0:

        raise _IndexingError("an empty slice has no quantiles (NumPy raises too).", op=op)
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


def _weighted_quantile(a, q, axis, out, weights, keepdims, op: str):
    """NumPy's weighted `inverted_cdf` quantiles: the first sorted value whose
    share of the total weight (the cumulative weights over their sum, cast
    to `q`'s float dtype) reaches `q`, leading zero weights skipped. The
    derivative is the picked value's (none in the weights: a step)."""
    _no_out(out, op)
    a, w = _as_array(a, op), _as_array(weights, op)
    if a.dtype.kind == "c":
        raise _DTypeError(f"complex values have no order, got {_type_str(a)}.", op=op)
    axes = _normalize_axes(axis, a.ndim, op)
    w = broadcast_to(_weights_against(w, a, None if axis is None else axes, op),
                     tuple(a.shape))
    if isinstance(w, _Tracer):  # (checked when the program runs)
        w = _weights_check_p.bind(w, nonnegative=True, of=op)
    elif (_np.asarray(w) < 0).any():
        raise _InvalidOptionError("weights must be non-negative.", op=op)
    shape = tuple(a.shape)
    kept = tuple(k for k in range(a.ndim) if k not in axes)
    count = int(_np.prod([shape[k] for k in axes], dtype=_np.int64))
    if count == 0:
        raise _IndexingError("an empty slice has no quantiles (NumPy raises too).", op=op)
    rest = tuple(shape[k] for k in kept)
    af, wf = (reshape(transpose(v, kept + axes), rest + (count,)) for v in (a, w))
    order = argsort(af, axis=-1)
    s, ws = take_along_axis(af, order, axis=-1), take_along_axis(wf, order, axis=-1)
    cdf = cumsum(ws, axis=-1, dtype=_np.float64)
    total = cdf[..., count - 1:]
    if not isinstance(total, _Tracer) and not (
            _np.isfinite(_np.asarray(total)) & (_np.asarray(total) > 0)).all():
        raise _InvalidOptionError("weights included NaN, inf or were all zero (in a slice).",
                                  op=op)
    cdf = divide(cdf, total)
    if q.dtype.kind == "f":
        cdf = astype(cdf, q.dtype)
    cdf = where(equal(cdf, 0), _np.asarray(-1, cdf.dtype), cdf)
    qf = _np.asarray(q).ravel()
    idx = sum(astype(less(expand_dims(cdf, -2), qf[:, None]), _np.int64), axis=-1)
    idx = minimum(idx, _np.int64(count - 1))
    result = take_along_axis(s, idx, axis=-1)                  # rest + (nq,)
    if _is_inexact(af):
        result = _nan_where(expand_dims(any(isnan(af), axis=-1), -1), result)
    result = moveaxis(result, -1, 0)
    result = reshape(result, q.shape + rest)
    if keepdims:
        result = reshape(result, q.shape + tuple(1 if k in axes else d
                                                 for k, d in enumerate(shape)))
    return result


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
    equal values one-sided). `weights` (of `a`'s shape, or of its shape
    along `axis`; non-negative) go with method="inverted_cdf" only, as in
    NumPy: concrete weights that are negative, or sum to zero, inf or NaN
    in a slice, raise `InvalidOptionError`; traced ones are not checked.
    (`overwrite_input` changes nothing; `out=` is refused: use the result.)

    ```python
    snp.quantile(np.array([1.0, 2, 3, 4]), [0.25, 0.5])         # [1.75 2.5]
    snp.quantile(np.array([1.0, 2, 3, 4]), 0.3, method="lower")  # 1.0
    snp.quantile(np.array([1.0, 2, 3, 4]), 0.5, method="inverted_cdf",
                 weights=np.array([1.0, 1, 1, 5]))              # 4.0
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
    # NumPy's `ary[lo:hi]` for each pair of edges (negative ones count from the end)
    spans = [range(n)[lo:hi] for lo, hi in zip(edges, edges[1:])]
    return [_getitem(ary, head + (slice(r.start, r.start + len(r)),)) for r in spans]


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


def _tri(m, k, lower: bool, op: str):
    m = _as_array(m, op)
    if m.ndim == 0:
        raise _ShapeError("input must be at least 1-d.", op=op)
    # NumPy's: a 1-D `m` is each row of a square matrix
    rows, cols = (m.shape[-2], m.shape[-1]) if m.ndim > 1 else (m.shape[0], m.shape[0])
    return where(_tri_mask(rows, cols, k, lower), m, zeros((), m.dtype))


def tril(m, k: int = 0):
    """`m` with the entries above the `k`-th diagonal zeroed (last two axes;
    a 1-D `m` is each row of a square matrix, as in NumPy)."""
    return _tri(m, k, True, "tril")


def triu(m, k: int = 0):
    """`m` with the entries below the `k`-th diagonal zeroed (last two axes;
    a 1-D `m` is each row of a square matrix, as in NumPy)."""
    return _tri(m, k, False, "triu")


def diagonal(a, offset: int = 0, axis1: int = 0, axis2: int = 1):
    """The `offset` diagonal of `a` over `axis1`, `axis2` (appended last)."""
    if _is_sparse(a):
        if offset or (axis1, axis2) != (0, 1):
            raise _DTypeError("a sparse matrix's diagonal takes no offset or axes.",
                              op="diagonal")
        return _sparse.diagonal(a)
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
        raise _ShapeError(f"input must be 1-D or 2-D, got {_type_str(v)}.", op="diag")
    n = v.shape[0] + _builtins.abs(k)
    i = _np.arange(v.shape[0])
    pos = (i * n + i + k) if k >= 0 else ((i - k) * n + i)
    return reshape(zeros(n * n, v.dtype).at[pos].set(v), (n, n))


def trace(a, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype=None, out=None):
    """The sum along a diagonal (in `dtype`, NumPy's accumulation dtype by
    default)."""
    _no_out(out, "trace")
    return sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def cross(a, b, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis=None):
    """The cross product of 3-vectors (or 2-vectors: their z component, or
    with a 3-vector a 3-vector) along `axisa` of `a` and `axisb` of `b`,
    `numpy.cross`: the other axes broadcast, the result's vectors lie along
    `axisc`; `axis` sets all three. Two 2-vectors give a scalar each (NumPy 2
    deprecates 2-vectors, with a `DeprecationWarning` here too).

    ```python
    snp.cross(np.array([1, 2, 3]), np.array([4, 5, 6]))   # [-3  6 -3]
    ```
    """
    op = "cross"
    a, b = _as_array(a, op), _as_array(b, op)
    if axis is not None:
        axisa = axisb = axisc = axis
    if a.ndim < 1 or b.ndim < 1:
        raise _ShapeError(f"needs arrays of vectors, got {_type_str(a)} and {_type_str(b)} "
                          "(at least one has zero dimensions).", op=op)
    a = moveaxis(a, _normalize_axis(axisa, a.ndim, op), -1)
    b = moveaxis(b, _normalize_axis(axisb, b.ndim, op), -1)
    na, nb = a.shape[-1], b.shape[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise _ShapeError(f"incompatible dimensions for cross product (dimension must be 2 or "
                          f"3), got {_type_str(a)} and {_type_str(b)} with the vectors last.",
                          op=op)
    if na == 2 or nb == 2:
        _warnings.warn("Arrays of 2-dimensional vectors are deprecated (as in NumPy 2.0). "
                       "Use arrays of 3-dimensional vectors instead.", DeprecationWarning,
                       stacklevel=2)
    dtype = _np.promote_types(a.dtype, b.dtype)
    a, b = _convert(a, dtype), _convert(b, dtype)
    a0, a1 = a[..., 0], a[..., 1]
    b0, b1 = b[..., 0], b[..., 1]
    z = subtract(multiply(a0, b1), multiply(a1, b0))
    if na == 2 and nb == 2:
        return z
    if na == 3 and nb == 3:
        a2, b2 = a[..., 2], b[..., 2]
        x = subtract(multiply(a1, b2), multiply(a2, b1))
        y = subtract(multiply(a2, b0), multiply(a0, b2))
    elif na == 2:
        b2 = b[..., 2]
        x, y = multiply(a1, b2), negative(multiply(a0, b2))
    else:
        a2 = a[..., 2]
        x, y = negative(multiply(a2, b1)), multiply(a2, b0)
    shape = _broadcast_shapes((tuple(a0.shape), tuple(b0.shape)), op)
    x, y, z = (broadcast_to(v, shape) for v in (x, y, z))
    out = stack([x, y, z], axis=-1)
    return moveaxis(out, -1, _normalize_axis(axisc, out.ndim, op))


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
        raise _ShapeError(f"`bins` must be 1-D, got {_type_str(bins)}.", op="digitize")
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
    increasing, not checked; any order with `period`, a static number: the
    knots repeat with it, and `left`/`right` are ignored, as in NumPy) at
    `x`, `numpy.interp`: float64 results
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
    x, xp, fp = (_as_array(v, op) for v in (x, xp, fp))
    for name, v in (("x", x), ("xp", xp)):
        if v.dtype.kind == "c":
            raise _DTypeError(f"`{name}` must be real, got {_type_str(v)}.", op=op)
    if xp.ndim != 1 or fp.ndim != 1 or xp.shape != fp.shape or xp.shape[0] == 0:
        raise _ShapeError(f"`xp` and `fp` must be 1-D of one non-zero length, got "
                          f"{_type_str(xp)} and {_type_str(fp)}.", op=op)
    dtype = _np.dtype(_np.complex128 if fp.dtype.kind == "c" else _np.float64)
    x, xp, fp = _convert(x, _np.float64), _convert(xp, _np.float64), _convert(fp, dtype)
    if period is not None:
        # NumPy's: `x` and `xp` taken modulo |period|, the knots sorted, the
        # last knot repeated a period below the first and the first a period
        # above the last; `left` and `right` are ignored
        if isinstance(period, _Tracer):
            raise _NotSupportedError(f"`period` must be a static number, got a traced "
                                     f"{_type_str(period)}.", op=op)
        period = float(_np.asarray(period))
        if period == 0:
            raise _InvalidOptionError("period must be a non-zero value.", op=op)
        period = _builtins.abs(period)
        left = right = None
        x, xp = remainder(x, period), remainder(xp, period)
        order = argsort(xp)
        xp, fp = take(xp, order), take(fp, order)
        n = xp.shape[0]
        xp = concatenate([subtract(xp[n - 1:], period), xp, add(xp[:1], period)])
        fp = concatenate([fp[n - 1:], fp, fp[:1]])
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


def trapezoid(y, x=None, dx=1.0, axis: int = -1):
    """The trapezoidal rule along `axis`, `numpy.trapezoid`: sample points
    `x` (1-D along `axis`, or broadcasting with `y`) or spacing `dx` (a
    scalar, or an array broadcasting with the segments), NumPy's
    `sum(d * (y[1:] + y[:-1]) / 2)`.

    ```python
    snp.trapezoid(np.array([1.0, 2, 3]), x=np.array([4.0, 6, 8]))   # 8.0
    ```
    """
    op = "trapezoid"
    y = _as_array(y, op)
    if y.ndim == 0:
        raise _IndexingError("`y` must have at least one dimension (NumPy raises "
                             "IndexError).", op=op)
    axis = _normalize_axis(axis, y.ndim, op)
    if x is None:
        d = _operand(dx, op)
    else:
        x = _as_array(x, op)
        if x.ndim == 1:
            d = diff(x)
            d = reshape(d, tuple(d.shape[0] if k == axis else 1 for k in range(y.ndim)))
        else:
            d = diff(x, axis=axis)
    head = (slice(None),) * axis
    pair = add(y[head + (slice(1, None),)], y[head + (slice(None, -1),)])
    return sum(divide(multiply(d, pair), 2.0), axis=axis)


def _ndim(x) -> int:
    return x.ndim if isinstance(x, _Tracer) else _np.ndim(x)


def _spacing(h, n: int, ax: int, op: str):
    """One axis's spacing as `numpy.gradient` takes it: a scalar, or the
    differences of 1-D coordinates (a scalar where concrete and uniform)."""
    h = _operand(h, op)
    if _ndim(h) == 0:
        return h, True
    h = _as_array(h, op)
    if h.ndim != 1:
        raise _ShapeError(f"distances must be either scalars or 1d, got {_type_str(h)}.",
                          op=op)
    if h.shape[0] != n:
        raise _ShapeError(f"when 1d, distances must match the length of the corresponding "
                          f"dimension: axis {ax} has {n}, got {_type_str(h)}.", op=op)
    if h.dtype.kind in "iub":
        h = astype(h, _np.float64)
    dx = diff(h)
    if not isinstance(dx, _Tracer):
        arr = _np.asarray(dx)
        if arr.size and (arr == arr[0]).all():
            return _np.asarray(arr[0]), True
    return dx, False


def gradient(f, *varargs, axis=None, edge_order: int = 1):
    """`numpy.gradient`: second-order central differences inside and
    one-sided differences of order `edge_order` (1 or 2) at the ends, per
    axis (`axis`: an int, a tuple, or None: all). `varargs` are the
    spacings: none (1), one scalar for all axes, or one per axis, each a
    scalar or the 1-D coordinates of the points along it (uneven spacing:
    NumPy's weights). Integers give float64; one axis gives an array, more a
    tuple. Differentiable in `f` and in the spacings or coordinates.

    ```python
    f = np.array([1.0, 2, 4, 7, 11, 16])
    snp.gradient(f, np.array([0.0, 1, 1.5, 3.5, 4, 6]))   # [1. 3. 3.5 6.7 6.9 2.5]
    ```
    """
    op = "gradient"
    f = _as_array(f, op)
    if f.dtype == _np.bool_:
        raise _DTypeError("boolean values have no differences (NumPy's boolean subtract "
                          "raises TypeError); convert them to numbers.", op=op)
    if f.ndim == 0 and not varargs and axis is None:
        return ()  # NumPy's: no axes, no gradients
    f = _float(f)
    otype = f.dtype
    axes = _normalize_axes(axis, f.ndim, op)
    if len(set(axes)) != len(axes):
        raise _ShapeError(f"repeated axis in {axis}.", op=op)
    if not varargs:
        hs = [(1.0, True)] * len(axes)
    elif len(varargs) == 1 and _ndim(varargs[0]) == 0:
        hs = [(_operand(varargs[0], op), True)] * len(axes)
    elif len(varargs) == len(axes):
        hs = [_spacing(h, f.shape[ax], ax, op) for h, ax in zip(varargs, axes)]
    else:
        raise _ShapeError(f"invalid number of arguments: {len(varargs)} spacings for "
                          f"{len(axes)} axes (NumPy raises TypeError).", op=op)
    if edge_order not in (1, 2):
        raise _InvalidOptionError(f"`edge_order` must be 1 or 2, got {edge_order!r}.", op=op)
    out = []
    for ax, (h, uniform) in zip(axes, hs):
        n = f.shape[ax]
        if n < edge_order + 1:
            raise _ShapeError(f"Shape of array too small to calculate a numerical gradient: "
                              f"axis {ax} has {n} points, at least {edge_order + 1} are "
                              f"needed for edge_order={edge_order}.", op=op)
        head = (slice(None),) * ax

        def s(i, _head=head):  # one index, or a slice, along the axis
            return f[_head + (i,)]

        def along(v, _ax=ax):  # 1-D spacings along the axis
            return reshape(v, tuple(v.shape[0] if k == _ax else 1 for k in range(f.ndim)))

        if uniform:
            inner = divide(subtract(s(slice(2, None)), s(slice(None, -2))), multiply(2.0, h))
        else:
            dx1, dx2 = along(h[:-1]), along(h[1:])
            wa = divide(negative(dx2), multiply(dx1, add(dx1, dx2)))
            wb = divide(subtract(dx2, dx1), multiply(dx1, dx2))
            wc = divide(dx1, multiply(dx2, add(dx1, dx2)))
            inner = add(add(multiply(wa, s(slice(None, -2))), multiply(wb, s(slice(1, -1)))),
                        multiply(wc, s(slice(2, None))))
        if edge_order == 1:
            lo = divide(subtract(s(1), s(0)), h if uniform else h[0])
            hi = divide(subtract(s(-1), s(-2)), h if uniform else h[-1])
        else:
            if uniform:
                a, b, c = divide(-1.5, h), divide(2.0, h), divide(-0.5, h)
            else:
                d1, d2 = h[0], h[1]
                a = divide(negative(add(multiply(2.0, d1), d2)), multiply(d1, add(d1, d2)))
                b = divide(add(d1, d2), multiply(d1, d2))
                c = divide(negative(d1), multiply(d2, add(d1, d2)))
            lo = add(add(multiply(a, s(0)), multiply(b, s(1))), multiply(c, s(2)))
            if uniform:
                a, b, c = divide(0.5, h), divide(-2.0, h), divide(1.5, h)
            else:
                d1, d2 = h[-2], h[-1]
                a = divide(d2, multiply(d1, add(d1, d2)))
                b = divide(negative(add(d2, d1)), multiply(d1, d2))
                c = divide(add(multiply(2.0, d2), d1), multiply(d2, add(d1, d2)))
            hi = add(add(multiply(a, s(-3)), multiply(b, s(-2))), multiply(c, s(-1)))
        g = concatenate([expand_dims(_convert(lo, otype), ax), _convert(inner, otype),
                         expand_dims(_convert(hi, otype), ax)], axis=ax)
        out.append(g)
    return out[0] if len(out) == 1 else tuple(out)


def bincount(x, weights=None, minlength: int = 0, *, length: int | None = None):
    """Counts (or summed `weights`) of each non-negative integer in `x`. The
    result's length is static: `max(x) + 1` (at least `minlength`) for
    concrete `x`; for traced `x`, pass `length` (values at or above it are an
    `IndexingError` when the program runs)."""
    if isinstance(x, _Tracer):
        if length is None:
            raise _IndexingError("traced values need a static `length=` (the result's "
                                 "length would depend on their maximum).", op="bincount")
        n = int(length)
        xi = x
    else:
        xi = _np.asarray(x)
        if xi.size and xi.min() < 0:
            raise _IndexingError("`x` must be non-negative.", op="bincount")
        n = _builtins.max(int(xi.max()) + 1 if xi.size else 0, int(minlength))
        if length is not None:
            n = int(length)
    w = ones(_shape(x), _np.int64) if weights is None else _float(_as_array(weights,
                                                                              "bincount"))
    return zeros(n, w.dtype).at[xi].add(w)


def _one_d(a, op: str):
    """`a` as `numpy.convolve` takes it: a 0-d value as one element; 1-D and
    non-empty."""
    a = _as_array(a, op)
    if a.ndim == 0:
        a = reshape(a, (1,))
    if a.ndim != 1 or not a.shape[0]:
        raise _ShapeError(f"needs non-empty 1-D arrays, got {_type_str(a)}.", op=op)
    return a


def _conv_mode(mode, op: str) -> str:
    names = ("valid", "same", "full")
    if isinstance(mode, (int, _np.integer)) and not isinstance(mode, bool) and \
            0 <= mode <= 2:
        return names[int(mode)]
    if mode not in names:
        raise _InvalidOptionError(f"`mode` must be 'valid', 'same' or 'full' (or NumPy's 0, "
                                  f"1, 2), got {mode!r}.", op=op)
    return mode


def convolve(a, v, mode: str = "full"):
    """The discrete linear convolution of 1-D `a` and `v` (modes "full",
    "same", "valid", as in NumPy), as one gather of sliding windows and a
    contraction: suited to short kernels (use `sciad.fft` for long ones)."""
    a, v = _one_d(a, "convolve"), _one_d(v, "convolve")
    mode = _conv_mode(mode, "convolve")
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
    a, v = _one_d(a, "correlate"), _one_d(v, "correlate")
    mode = _conv_mode(mode, "correlate")
    return convolve(a, flip(conj(v)), mode) if a.shape[0] >= v.shape[0] else \
        flip(convolve(flip(a), conj(v), mode))


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
    T.todense = T.toarray = lambda self: _sparse.todense(self)
    T.diagonal = lambda self, offset=0, axis1=0, axis2=1: diagonal(self, offset, axis1, axis2)
    T.data = property(lambda self: _sparse.data(self))
    T.mT = property(lambda self: swapaxes(self, -1, -2))
    T.real = property(real)
    T.imag = property(imag)
    T.at = property(_At)


_install_tracer_methods()


# sparse operands of the op layer's functions go to `sciad.sparse` (imported last,
# same layer: it installs this module's functions as its arrays' operators)
from . import sparse as _sparse  # noqa: E402

_ops.set_sparse_handler(_sparse)

# the op layer's public functions are `sciad.numpy`'s: tracebacks, the NumPy
# dispatch table (`sciad._numpy_interop`) and error hints name them so
for _name, _fn in list(globals().items()):
    if isinstance(_fn, _types.FunctionType) and _fn.__module__ == _ops.__name__ \
            and not _name.startswith("_"):
        _fn.__module__ = __name__
del _name, _fn

# `snp.fft`, as `numpy.fft` (`sciad.fft` is built on the op layer, not on this module)
from . import fft as fft  # noqa: E402
