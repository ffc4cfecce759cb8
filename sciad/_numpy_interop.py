"""NumPy functions on traced values: `np.sin(x)`, `np.sum(x)`, `np.fft.rfft(x)`
and `ndarray * x` on a traced `x` run the sciad function with NumPy's semantics.

NumPy's dispatch protocols (NEP 13 `__array_ufunc__`, NEP 18
`__array_function__`) hand the `Tracer` the NumPy function object being
called. `install` fills `sciad.graph._trace._numpy_dispatch` from the tables
below, keyed by that object: `numpy.sqrt` runs `sciad.numpy.sqrt`, while
`numpy.emath.sqrt` (which returns complex numbers for negative input),
another library's function that happens to be called `sqrt`, or any NumPy
function sciad lacks raises a `TracerError` that names the function in full
and suggests the sciad function to use, if there is one. Aliases are one
object in NumPy (`np.abs is np.absolute`, `np.conj is np.conjugate`,
`np.true_divide is np.divide`), so they dispatch too; `np.amax` (its own
object in NumPy 2) is listed.

The call is bound to NumPy's signature and passed on by parameter name, so
a positional argument lands where NumPy would put it (`np.sum(x, 0, None,
None, True)` passes `out=None` fourth). An argument the sciad function does
not take is dropped if it has NumPy's default value or does not change the
result (`copy`, `optimize`, `subok`, `device`), and raises otherwise
(`np.sum(x, initial=1.0)`, `np.sin(x, out=y)`).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import numpy as np

from . import fft, linalg, numpy as snp
from .errors import TracerError
from .graph import _trace
from .graph._trace import _numpy_dispatch, current_source

# NumPy's functions (`numpy.<name>`) that `sciad.numpy.<name>` implements with
# NumPy's semantics. Ufuncs first; their aliases (`abs`, `conj`, `true_divide`,
# `mod`, `bitwise_not`) are the same objects in NumPy.
NUMPY_FUNCTIONS = (
    "negative", "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "arcsin", "arccos",
    "arctan", "sinh", "cosh", "tanh", "sqrt", "absolute", "sign", "square", "floor",
    "ceil", "isfinite", "logical_not", "invert", "conjugate",
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power",
    "maximum", "minimum", "arctan2", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "logical_and", "logical_or", "bitwise_and",
    "bitwise_or", "bitwise_xor", "matmul",
    "real", "imag", "angle", "where", "clip", "astype",
    "sum", "prod", "max", "min", "amax", "amin", "mean",
    "reshape", "ravel", "transpose", "swapaxes", "moveaxis", "broadcast_to",
    "expand_dims", "squeeze", "concatenate", "stack", "pad", "roll", "diff", "flip",
    "take", "take_along_axis", "cumsum", "sort", "argsort",
    "log2", "log10", "exp2", "reciprocal", "deg2rad", "rad2deg", "radians", "degrees",
    "logaddexp", "heaviside", "logical_xor", "isnan", "isinf", "nan_to_num",
    "any", "all", "count_nonzero", "argmax", "argmin", "var", "std", "average", "median",
    "quantile", "percentile", "copy", "atleast_1d", "atleast_2d", "empty", "empty_like",
    "identity", "meshgrid", "tile", "repeat", "hstack", "vstack", "column_stack", "split",
    "fliplr", "flipud", "rot90", "tril", "triu", "diagonal", "diag", "trace", "cross",
    "kron", "polyval", "searchsorted", "digitize", "interp", "trapezoid", "gradient",
    "bincount", "convolve", "correlate", "isclose", "allclose", "array_equal",
    # creation: reached through NumPy's `like=` argument, or an array argument
    "full", "zeros", "ones", "full_like", "zeros_like", "ones_like", "arange",
    "linspace", "eye", "asarray",
    "einsum", "tensordot", "dot", "vdot", "inner", "outer",
)
# `numpy.linalg.<name>` -> `sciad.numpy.<name>`
NUMPY_LINALG_FUNCTIONS = ("norm",)
# `numpy.fft.<name>` -> `sciad.fft.<name>`: all of `sciad.fft.__all__`

# Arguments of NumPy functions that do not change the values computed.
_IGNORED = frozenset({"copy", "optimize", "subok", "device"})


def install() -> None:
    """Fills the `Tracer`'s dispatch table and installs `handle` as its handler."""
    table: dict[Any, Callable] = {}
    for namespace, names, sciad_ns in ((np, NUMPY_FUNCTIONS, snp),
                                       (np.linalg, NUMPY_LINALG_FUNCTIONS, snp),
                                       (np.fft, fft.__all__, fft)):
        for name in names:
            np_fn = getattr(namespace, name, None)
            if np_fn is None:  # not in this NumPy version (e.g. `astype` before 2.0)
                continue
            table[np_fn] = getattr(sciad_ns, name)
    _trace._numpy_dispatch.clear()
    _trace._numpy_dispatch.update(table)
    _trace._numpy_handler = handle


def handle(func, method: str, args: tuple, kwargs: dict, tracer):
    """Runs NumPy's `func` (a ufunc when `method` is not None: NEP 13's method
    name) on `args` containing `tracer` with the sciad function registered for
    it; raises `TracerError` if there is none."""
    if method is not None and method != "__call__":
        _refuse(f"{full_name(func)}.{method}", tracer, _method_hint(func, method))
    fn = _numpy_dispatch.get(func)
    if fn is None:
        _refuse(full_name(func), tracer, _suggestion(func))
    if method is not None:  # a ufunc: operands are positional, NumPy strips defaults
        if kwargs:
            _refuse_arguments(func, fn, kwargs, tracer)
        return fn(*args)
    call_args, call_kwargs = _translate(func, fn, args, kwargs, tracer)
    return fn(*call_args, **call_kwargs)


# ---------------------------------------------------------------------------
# binding NumPy's signature to the sciad function's

_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature(fn) -> inspect.Signature | None:
    try:
        return _SIGNATURES[fn]
    except KeyError:
        pass
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    _SIGNATURES[fn] = sig
    return sig


def _is_default(value, default) -> bool:
    if value is default:
        return True
    simple = (str, bool, int, float, type(None))
    return type(value) in simple and type(value) is type(default) and value == default


def _translate(func, fn, args: tuple, kwargs: dict, tracer) -> tuple[list, dict]:
    """`(args, kwargs)` of a call to NumPy's `func`, as arguments of `fn`."""
    np_sig, sd_sig = _signature(func), _signature(fn)
    if np_sig is None or sd_sig is None:
        return list(args), dict(kwargs)
    bound = np_sig.bind(*args, **kwargs)  # a TypeError here is NumPy's own
    P = inspect.Parameter
    sd_params = sd_sig.parameters
    sd_positional = [p.name for p in sd_params.values()
                     if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    call_args: list = []
    call_kwargs: dict = {}
    refused: dict = {}
    by_position = True  # pass positionally while the names line up
    for name, value in bound.arguments.items():
        p = np_sig.parameters[name]
        if p.kind is P.VAR_POSITIONAL:
            call_args.extend(value)
            continue
        if p.kind is P.VAR_KEYWORD:
            call_kwargs.update(value)
            continue
        if by_position and p.kind is not P.KEYWORD_ONLY and len(call_args) < len(
                sd_positional) and (p.kind is P.POSITIONAL_ONLY
                                    or sd_positional[len(call_args)] == name):
            call_args.append(value)
            continue
        by_position = False
        if name in sd_params and sd_params[name].kind is not P.POSITIONAL_ONLY:
            call_kwargs[name] = value
        elif not (name in _IGNORED or _is_default(value, p.default)):
            refused[name] = value
    if refused:
        _refuse_arguments(func, fn, refused, tracer)
    try:
        sd_sig.bind(*call_args, **call_kwargs)
    except TypeError:
        extra = {k: v for k, v in call_kwargs.items() if k not in sd_params}
        _refuse_arguments(func, fn, extra or call_kwargs, tracer)
    return call_args, call_kwargs


# ---------------------------------------------------------------------------
# errors


def _refuse(what: str, tracer, hint: str | None):
    raise TracerError(
        f"{what} has no sciad equivalent, so it cannot take a traced value "
        f"{tracer.type.str_short()}. " + (hint or "Use `sciad.numpy` (snp) functions "
                                          "inside traced functions."),
        op="trace", source=current_source())


def _refuse_arguments(func, fn, args: dict, tracer):
    shown = ", ".join(f"`{k}={v!r}`" if type(v) in (str, bool, int, float) else f"`{k}`"
                      for k, v in args.items())
    hint = ""
    if "out" in args:
        hint = " sciad arrays are immutable: use the returned value instead of `out=`."
    elif "dtype" in args:
        hint = " Convert with `snp.astype` instead."
    raise TracerError(
        f"{full_name(func)} on a traced value {tracer.type.str_short()} runs "
        f"`{_sciad_name(fn)}`, which does not support {shown}.{hint}",
        op="trace", source=current_source())


def _sciad_name(fn) -> str:
    module = getattr(fn, "__module__", "sciad")
    return f"{module}.{getattr(fn, '__name__', fn)}"


_NAMESPACES = ("numpy", "numpy.linalg", "numpy.fft", "numpy.emath", "numpy.random",
               "numpy.ma", "numpy.polynomial", "numpy.lib.stride_tricks")
_FULL_NAMES: dict[int, str] = {}


def full_name(func) -> str:
    """NumPy's public name of `func` (`numpy.emath.sqrt`, not the defining
    module `numpy.lib.scimath`), else its module and qualified name."""
    if not _FULL_NAMES:
        for ns_name in reversed(_NAMESPACES):  # the first namespace wins
            ns = _resolve(ns_name)
            for k, v in vars(ns).items() if ns is not None else ():
                if not k.startswith("_") and callable(v) and not isinstance(v, type):
                    _FULL_NAMES[id(v)] = f"{ns_name}.{k}"
    name = _FULL_NAMES.get(id(func))
    if name is not None and _resolve(name) is func:
        return name
    module = getattr(func, "__module__", None) or "numpy"
    return f"{module}.{getattr(func, '__qualname__', getattr(func, '__name__', func))}"


def _resolve(dotted: str):
    """`numpy.emath.sqrt` -> the object, by attribute access from `numpy`
    (`numpy.emath` is an attribute, not an importable module)."""
    parts = dotted.split(".")
    try:
        obj = importlib.import_module(parts[0])
        for i, part in enumerate(parts[1:], 1):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                obj = importlib.import_module(".".join(parts[: i + 1]))
    except ImportError:
        return None
    return obj


_REDUCE_HINTS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min"}


def _method_hint(ufunc, method: str) -> str | None:
    name = _REDUCE_HINTS.get(getattr(ufunc, "__name__", ""))
    if method == "reduce" and name:
        return f"Use `snp.{name}(x, axis=...)`."
    return None


def _suggestion(func) -> str | None:
    """What to use instead of a NumPy function sciad does not dispatch."""
    full = full_name(func)
    name = getattr(func, "__name__", "")
    same = getattr(snp, name, None) if name and not name.startswith("_") else None
    if same is not None and not callable(same):
        same = None
    if full.startswith("numpy.emath.") and same is not None:
        return (f"`snp.{name}` follows `numpy.{name}` (NaN for input outside its real "
                f"domain); for `{full}`'s complex result, convert first: "
                f"`snp.{name}(snp.astype(x, complex))`.")
    if full.startswith("numpy.linalg."):
        if callable(getattr(linalg, name, None)):
            return f"Use `sd.linalg.{name}` (its arguments differ from NumPy's)."
    if same is not None and getattr(np, name, None) is func:
        return f"`snp.{name}` covers its common uses: call it directly."
    if same is not None:
        return (f"`snp.{name}` implements `numpy.{name}`, which is a different "
                "function; call it directly if it is what you mean.")
    return None
