"""`sciad.numpy` against NumPy itself on the argument forms NumPy documents
(issue 37): interp (period, complex fp, knots), median / quantile /
percentile (methods, weights, tuple axes, keepdims, NaN), gradient
(coordinates, edge_order), cross (axisa/axisb/axisc, 2-vectors), kron, diff
(prepend/append), average (weights along axes, returned, keepdims),
convolve, trapezoid, searchsorted, cumsum, var/std (ddof past N, dtype,
correction, mean, where), the reductions' where/initial, pad's index
modes, linspace's array bounds, reshape's order. Cases come from NumPy's
docstrings and numpy/lib/tests; each runs eagerly and traced, and must
give NumPy's values, shape and dtype. Arguments sciad does not take are
refused by name.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, IndexingError, InvalidOptionError, NotSupportedError
from sciad.errors import SciadError, ShapeError, ZeroSumError

nan, inf = np.nan, np.inf
A = np.array([[10.0, 7, 4], [3, 2, 1]])
I = np.array([[1, 2, 3], [4, 5, 6]])
F = np.array([1.0, 2, 4, 7, 11, 16])
B3 = np.random.default_rng(0).standard_normal((2, 3, 4))
NANA = np.array([[10.0, nan, 4], [3, 2, 1]])
XP, FP = np.array([1.0, 2, 3]), np.array([3.0, 2, 0])
X5 = np.array([1, 2, 4, 7, 0])
S = np.array([11, 12, 13, 14, 15])

# (label, function, positional arguments, keyword arguments); arrays among
# the arguments are traced in the traced run (quantile's `q` stays static)
CASES = [
    ("interp 0-d x", "interp", (2.5, XP, FP), {}),
    ("interp doc", "interp", (np.array([0, 1, 1.5, 2.72, 3.14]), XP, FP), {}),
    ("interp right", "interp", (3.14, XP, FP), {"right": -99.0}),
    ("interp period", "interp", (np.array([-180.0, -170, -185, 185, -10, -5, 0, 365]),
                                 np.array([190.0, -190, 350, -350]),
                                 np.array([5.0, 10, 3, 4])), {"period": 360}),
    ("interp period neg, left ignored", "interp", (np.array([0.5, 3.5, -1.0]),
                                                   np.array([0.0, 1, 2]),
                                                   np.array([1.0, 2, 3])),
     {"period": -3, "left": 7.0}),
    ("interp period complex", "interp", (np.array([0.5, 3.5]), np.array([0.0, 1, 2]),
                                         np.array([1.0, 2j, 3])), {"period": 3}),
    ("interp period nan x", "interp", (np.array([nan, 0.5]), XP, FP), {"period": 2.0}),
    ("interp complex fp", "interp", (np.array([1.5, 4.0]), np.array([2.0, 3, 5]),
                                     np.array([1.0j, 0, 2 + 3j])), {}),
    ("interp ints", "interp", (np.array([0, 1, 2, 5]), np.array([1, 2, 3]),
                               np.array([3, 2, 0])), {}),
    ("interp nan, inf x", "interp", (np.array([nan, -inf, inf, 1.5]), XP, FP), {}),
    ("interp 2-D x", "interp", (np.array([[1.2, 2.5], [0.0, 9.0]]), XP, FP), {}),
    ("median", "median", (A,), {}),
    ("median axis", "median", (A,), {"axis": 0}),
    ("median keepdims", "median", (A,), {"axis": -1, "keepdims": True}),
    ("median tuple", "median", (B3,), {"axis": (0, 2)}),
    ("median nan", "median", (NANA,), {"axis": 1}),
    ("median infs", "median", (np.array([[-inf, inf], [1.0, inf]]),), {"axis": 1}),
    ("median ints", "median", (I,), {"axis": 1}),
    ("median bool", "median", (np.array([True, False]),), {}),
    ("median f32", "median", (np.float32([1, 2, 4, 5]),), {}),
    ("percentile doc", "percentile", (A, 50), {}),
    ("percentile list", "percentile", (A, [10, 50, 90]), {"axis": 1}),
    ("percentile keepdims", "percentile", (A, 50), {"axis": 1, "keepdims": True}),
    ("quantile f32 py-q", "quantile", (np.float32([1, 2, 3, 4]), 0.3), {}),
    ("quantile f32 arr-q", "quantile", (np.float32([1, 2, 3, 4]), np.array([0.3])), {}),
    ("quantile inf ends", "quantile", (np.array([-inf, 1.0, inf]), [0.25, 0.75]), {}),
    ("quantile tuple", "quantile", (B3, [0.1, 0.8]), {"axis": (2, 0)}),
    ("quantile weights", "quantile", (np.array([1.0, 2, 3, 4]), 0.5),
     {"method": "inverted_cdf", "weights": np.array([1.0, 1, 1, 5])}),
    ("quantile weights 2-D", "quantile", (A, [0.0, 0.3, 0.7, 1.0]),
     {"axis": 1, "method": "inverted_cdf", "weights": np.array([[1.0, 2, 3], [3, 0, 1]])}),
    ("quantile weights along axis", "quantile", (A, 0.5),
     {"axis": 1, "method": "inverted_cdf", "weights": np.array([1.0, 2, 3])}),
    ("quantile weights leading zeros", "quantile", (np.array([5.0, 1, 3, 2]), [0.0, 0.5]),
     {"method": "inverted_cdf", "weights": np.array([1.0, 0, 2, 0])}),
    ("quantile weights ints", "quantile", (I, 0.5),
     {"method": "inverted_cdf", "weights": np.array([[1, 2, 3], [3, 1, 1]])}),
    ("quantile weights nan", "quantile", (NANA, 0.5),
     {"axis": 1, "method": "inverted_cdf", "weights": np.ones((2, 3)), "keepdims": True}),
    ("percentile weights", "percentile", (A, [25, 60]),
     {"method": "inverted_cdf", "weights": np.ones((2, 3))}),
    ("gradient doc", "gradient", (F,), {}),
    ("gradient h", "gradient", (F, 2.0), {}),
    ("gradient x uniform", "gradient", (F, np.arange(6.0)), {}),
    ("gradient x uneven", "gradient", (F, np.array([0.0, 1, 1.5, 3.5, 4, 6])), {}),
    ("gradient x uneven eo2", "gradient", (F, np.array([0.0, 1, 1.5, 3.5, 4, 6])),
     {"edge_order": 2}),
    ("gradient x int", "gradient", (F, np.array([0, 1, 3, 4, 7, 8])), {"edge_order": 2}),
    ("gradient 2-D", "gradient", (np.array([[1.0, 2, 6], [3, 4, 5]]),), {}),
    ("gradient 2-D dx y", "gradient", (np.array([[1.0, 2, 6], [3, 4, 5]]), 2.0,
                                       np.array([1.0, 1.5, 3.5])), {}),
    ("gradient axis", "gradient", (np.array([[1.0, 2, 6], [3, 4, 5]]),), {"axis": -1}),
    ("gradient eo2", "gradient", (F, 0.5), {"edge_order": 2}),
    ("gradient ints", "gradient", (np.array([1, 2, 4, 7, 11, 16]),), {}),
    ("gradient uint8", "gradient", (np.uint8([1, 2, 4, 3]),), {}),
    ("gradient f32", "gradient", (np.float32([1, 2, 4, 7]),), {}),
    ("gradient 3-D per axis", "gradient", (B3, 1.0, 2.0, 3.0), {}),
    ("gradient complex", "gradient", (F * (1 + 2j),), {}),
    ("cross doc", "cross", (np.array([1, 2, 3]), np.array([4, 5, 6])), {}),
    ("cross 2 and 3", "cross", (np.array([1, 2]), np.array([4, 5, 6])), {}),
    ("cross 2 and 2", "cross", (np.array([1, 2]), np.array([4, 5])), {}),
    ("cross 3 and 2 many", "cross", (np.array([[1, 2, 3], [3, 4, 5]]),
                                     np.array([[4, 5], [6, 1]])), {}),
    ("cross broadcast", "cross", (np.array([[1, 2, 3], [4, 5, 6]]), np.array([1.0, 0, 0])), {}),
    ("cross axisa axisb", "cross", (np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]]),
                                    np.array([[7, 8, 9], [4, 5, 6], [1, 2, 3]])),
     {"axisa": 0, "axisb": 0}),
    ("cross axisc", "cross", (np.array([[1, 2, 3], [4, 5, 6]]),
                              np.array([[4, 5, 6], [1, 2, 3]])), {"axisc": 0}),
    ("cross axis", "cross", (B3[:, :3, :], B3[:, :3, :] ** 2), {"axis": 1}),
    ("cross complex", "cross", (np.array([1j, 2, 3]), np.array([4, 5j, 6])), {}),
    ("kron doc", "kron", (np.array([1, 10, 100]), np.array([5, 6, 7])), {}),
    ("kron nd", "kron", (np.arange(100).reshape((2, 5, 2, 5)),
                         np.arange(24).reshape((2, 3, 4))), {}),
    ("kron 0-d", "kron", (np.float64(2.0), np.array([1.0, 2])), {}),
    ("kron int8", "kron", (np.int8([100, 2]), np.int8([3, 4])), {}),
    ("diff doc", "diff", (X5,), {}),
    ("diff n2", "diff", (X5,), {"n": 2}),
    ("diff uint8 wraps", "diff", (np.uint8([1, 0]),), {}),
    ("diff n past length", "diff", (X5,), {"n": 7}),
    ("diff bool", "diff", (np.array([True, False, False, True]),), {"n": 2}),
    ("diff prepend", "diff", (X5,), {"prepend": 0}),
    ("diff append", "diff", (X5,), {"append": [3, 4]}),
    ("diff prepend 2-D", "diff", (np.array([[1, 3], [0, 5]]),),
     {"axis": 0, "prepend": np.array([[9, 9]])}),
    ("diff scalars 2-D", "diff", (np.array([[1, 3], [0, 5]]),),
     {"axis": 1, "prepend": 1.5, "append": 2}),
    ("diff f32 prepend f64", "diff", (np.float32([1, 2]),), {"prepend": np.array([0.5])}),
    ("average doc", "average", (np.arange(1, 11),), {"weights": np.arange(10, 0, -1)}),
    ("average axis weights", "average", (np.arange(6.0).reshape(3, 2),),
     {"axis": 1, "weights": [0.25, 0.75]}),
    ("average keepdims", "average", (np.arange(6.0).reshape(3, 2),),
     {"axis": 1, "keepdims": True}),
    ("average returned", "average", (np.arange(6.0).reshape(3, 2),),
     {"axis": 1, "weights": [0.25, 0.75], "returned": True}),
    ("average returned count", "average", (np.arange(6.0).reshape(3, 2),),
     {"returned": True}),
    ("average tuple weights", "average", (B3,), {"axis": (2, 0), "weights": np.ones((4, 2))}),
    ("average same-shape weights", "average", (A,),
     {"axis": 0, "weights": A, "keepdims": True}),
    ("average f32", "average", (np.float32([1, 2, 4]),), {"weights": np.float32([1, 1, 2])}),
    ("average int f32 weights", "average", (np.array([1, 2]),), {"weights": np.float32([1, 2])}),
    ("convolve doc", "convolve", (np.array([1, 2, 3]), np.array([0, 1, 0.5])), {}),
    ("convolve same", "convolve", (np.array([1, 2, 3]), np.array([0, 1, 0.5]), "same"), {}),
    ("convolve valid", "convolve", (np.array([1, 2, 3]), np.array([0, 1, 0.5]), "valid"), {}),
    ("convolve 0-d", "convolve", (np.float64(2.0), np.array([1.0, 2])), {}),
    ("convolve int mode", "convolve", (np.ones(3), np.array([1.0, 2]), 1), {}),
    ("correlate complex", "correlate", (np.array([1 + 1j, 2, 3 - 1j]), np.array([0, 1, 0.5j]),
                                        "full"), {}),
    ("trapezoid doc", "trapezoid", (np.array([1, 2, 3]),), {"x": np.array([4, 6, 8])}),
    ("trapezoid dx", "trapezoid", (np.array([1, 2, 3]),), {"dx": 2}),
    ("trapezoid 2-D x", "trapezoid", (np.arange(6.0).reshape(2, 3),),
     {"x": np.array([[0.0, 1, 3], [0, 2, 3]]), "axis": 0}),
    ("trapezoid dx array", "trapezoid", (np.arange(6.0).reshape(2, 3),),
     {"dx": np.array([[1.0], [2.0]])}),
    ("trapezoid f32", "trapezoid", (np.float32([1, 2, 3]),), {"dx": 0.5}),
    ("searchsorted doc", "searchsorted", (S, np.array([-10, 20, 12, 13])), {}),
    ("searchsorted right", "searchsorted", (S, 13), {"side": "right"}),
    ("searchsorted nan", "searchsorted", (np.array([1.0, 2, nan]), np.array([nan, 2.0, inf])),
     {}),
    ("searchsorted nan right", "searchsorted", (np.array([1.0, 2, nan, nan]),
                                                np.array([nan, 2.0, inf])), {"side": "right"}),
    ("searchsorted sorter", "searchsorted", (np.array([3, 1, 2]), np.array([2, 0, 5])),
     {"sorter": np.array([1, 2, 0])}),
    ("searchsorted int out of range", "searchsorted", (np.uint8([1, 2, 3]), -1), {}),
    ("searchsorted int above range", "searchsorted", (np.int8([1, 2]), 300), {}),
    ("cumsum doc", "cumsum", (I,), {"dtype": float}),
    ("cumsum axis", "cumsum", (I,), {"axis": -1}),
    ("cumsum bool", "cumsum", (np.array([True, True, False]),), {}),
    ("cumsum uint8", "cumsum", (np.uint8([200, 100]),), {}),
    ("cumsum 0-d", "cumsum", (np.float64(5.0),), {}),
    ("var", "var", (A,), {"ddof": 1}),
    ("var ddof = N", "var", (np.array([1.0, 2]),), {"ddof": 2}),
    ("var ddof > N", "var", (np.array([1.0, 2]),), {"ddof": 3}),
    ("std ddof > N", "std", (np.array([1.0, 2]),), {"ddof": 3}),
    ("var dtype", "var", (A,), {"dtype": np.float32}),
    ("std dtype ints", "std", (I,), {"dtype": np.float32, "axis": 0}),
    ("var complex", "var", (np.array([1 + 1j, 2, 3j]),), {}),
    ("var correction", "var", (A,), {"correction": 1, "axis": (0, 1), "keepdims": True}),
    ("std mean", "std", (A,), {"axis": 1, "keepdims": True,
                               "mean": np.mean(A, axis=1, keepdims=True)}),
    ("var int8", "var", (np.int8([100, -100]),), {}),
    ("var where", "var", (A,), {"axis": 1, "where": np.array([[1, 0, 1], [0, 0, 1]], bool),
                                "ddof": 1}),
    ("std where row", "std", (A,), {"axis": 0, "where": np.array([True, False, True]),
                                    "keepdims": True}),
    ("mean where none kept", "mean", (A,), {"axis": 1, "where": np.zeros((2, 3), bool)}),
    ("sum where initial", "sum", (A,), {"axis": 0, "where": np.array([True, False, True]),
                                        "initial": 5}),
    ("prod initial", "prod", (A,), {"axis": 1, "initial": 2}),
    ("max where initial", "max", (A,), {"axis": 1, "initial": -1,
                                        "where": np.array([[1, 0, 1], [0, 0, 1]], bool)}),
    ("all where", "all", (A > 3,), {"axis": 1, "where": np.array([[1, 0, 1], [0, 0, 0]], bool)}),
    ("pad edge", "pad", (A, ((1, 2), (0, 3))), {"mode": "edge"}),
    ("pad reflect", "pad", (A, ((1, 2), (2, 3))), {"mode": "reflect"}),
    ("pad symmetric", "pad", (np.array([1.0, 2, 3, 4]), (2, 5)), {"mode": "symmetric"}),
    ("pad wrap", "pad", (A, 2), {"mode": "wrap"}),
    ("linspace arrays", "linspace", (np.array([0.0, 1]), np.array([1.0, 3]), 4),
     {"axis": -1, "endpoint": False}),
    ("linspace arrays retstep", "linspace", (np.array([0.0, 1]), np.array([1.0, 3]), 3),
     {"retstep": True}),
    ("linspace retstep", "linspace", (2.0, 3.0, 5), {"retstep": True}),
    ("linspace int dtype", "linspace", (np.array([0, 1]), 10, 4), {"dtype": int}),
    ("reshape F", "reshape", (np.arange(6.0).reshape(2, 3), (3, 2)), {"order": "F"}),
    ("split negative index", "split", (np.arange(8.0), [-3, 5]), {}),
    ("triu 1-D", "triu", (np.arange(1.0, 4),), {}),
    ("tril 1-D", "tril", (np.arange(1.0, 4), -1), {}),
    ("heaviside nan", "heaviside", (np.array([nan, 0.0, -1]), np.array([1.0, nan, 2])), {}),
    ("logaddexp infinities", "logaddexp", (np.array([inf, -inf, -inf, 2.0]),
                                           np.array([inf, -inf, 1.0, 2.0])), {}),
]


def _same(got, want, label):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, type(want)) and len(got) == len(want), label
        for g, w in zip(got, want):
            _same(g, w, label)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.shape, got.dtype) == (want.shape, want.dtype), label
    tol = 1e-6 if want.dtype in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=label)


def _numpy(name, args, kw):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return getattr(np, name)(*args, **kw)


def _sciad(name, args, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(snp, name)(*args, **kw)


def test_documented_forms_match_numpy_eagerly():
    """The first case of each function eagerly (each op compiles on its own
    there: the whole table takes about 40 s, `-m slow`)."""
    seen = set()
    for label, name, args, kw in CASES:
        if name not in seen:
            seen.add(name)
            _same(_sciad(name, args, kw), _numpy(name, args, kw), label)


@pytest.mark.slow
def test_every_documented_form_matches_numpy_eagerly():
    for label, name, args, kw in CASES:
        _same(_sciad(name, args, kw), _numpy(name, args, kw), label)


def _is_traced(name, i, v):
    return isinstance(v, (np.ndarray, np.generic)) and not (
        i == 1 and name in ("quantile", "percentile"))


def test_documented_forms_match_numpy_traced():
    """Every case in one compiled function: its array arguments traced."""
    inputs, where = [], []
    for label, name, args, kw in CASES:
        pos = [i for i, v in enumerate(args) if _is_traced(name, i, v)]
        keys = [k for k, v in kw.items() if isinstance(v, np.ndarray)]
        where.append((len(inputs), pos, keys))
        inputs += [np.asarray(args[i]) for i in pos] + [kw[k] for k in keys]

    def run(*vals):
        out = []
        for (label, name, args, kw), (start, pos, keys) in zip(CASES, where):
            a, k = list(args), dict(kw)
            for j, i in enumerate(pos):
                a[i] = vals[start + j]
            for j, key in enumerate(keys):
                k[key] = vals[start + len(pos) + j]
            out.append(_sciad(name, a, k))
        return out

    for (label, name, args, kw), got in zip(CASES, sd.function(run)(*inputs)):
        _same(got, _numpy(name, args, kw), label)


def test_two_vector_cross_products_warn_as_numpy():
    with pytest.warns(DeprecationWarning, match="2-dimensional vectors"):
        snp.cross(np.array([1.0, 2]), np.array([3.0, 4]))


# NumPy raises; sciad raises a SciadError of the same builtin class (or says
# in its message which class NumPy raises)
ERRORS = [
    ("gradient of booleans", lambda m: m.gradient(np.array([True, False, True])), TypeError,
     DTypeError, "boolean"),
    ("gradient edge_order 3", lambda m: m.gradient(F, edge_order=3), ValueError,
     InvalidOptionError, "edge_order"),
    ("gradient too short", lambda m: m.gradient(np.array([1.0, 2]), edge_order=2), ValueError,
     ShapeError, "too small"),
    ("gradient coordinates length", lambda m: m.gradient(F, np.arange(5.0)), ValueError,
     ShapeError, "must match the length"),
    ("gradient coordinates 2-D", lambda m: m.gradient(F, np.ones((6, 1))), ValueError,
     ShapeError, "scalars or 1d"),
    ("gradient arguments", lambda m: m.gradient(A, 1.0, 2.0, 3.0), TypeError, ShapeError,
     "invalid number of arguments"),
    ("cross length", lambda m: m.cross(np.ones(4), np.ones(4)), ValueError, ShapeError,
     "must be 2 or 3"),
    ("cross 0-d", lambda m: m.cross(np.float64(1.0), np.ones(3)), ValueError, ShapeError,
     "zero dimensions"),
    ("diff 0-d", lambda m: m.diff(np.float64(1.0)), ValueError, ShapeError,
     "at least one dimensional"),
    ("diff negative n", lambda m: m.diff(X5, n=-1), ValueError, InvalidOptionError,
     "non-negative"),
    ("average zero weights", lambda m: m.average(np.array([1.0, 2]),
                                                 weights=np.array([1.0, -1])),
     ZeroDivisionError, ZeroSumError, "sum to zero"),
    ("average weights shape", lambda m: m.average(A, axis=1, weights=np.ones(2)), ValueError,
     ShapeError, "along axis"),
    ("average weights without axis", lambda m: m.average(A, weights=np.ones(3)), TypeError,
     ShapeError, "give `axis`"),
    ("quantile weights method", lambda m: m.quantile(A, 0.5, weights=np.ones((2, 3))),
     ValueError, InvalidOptionError, "inverted_cdf"),
    ("quantile negative weights", lambda m: m.quantile(A, 0.5, method="inverted_cdf",
                                                       weights=-np.ones((2, 3))),
     ValueError, InvalidOptionError, "non-negative"),
    ("quantile zero weights", lambda m: m.quantile(A, 0.5, method="inverted_cdf",
                                                   weights=np.zeros((2, 3))),
     ValueError, InvalidOptionError, "all zero"),
    ("interp period 0", lambda m: m.interp(np.ones(1), XP, FP, period=0), ValueError,
     InvalidOptionError, "non-zero"),
    ("convolve mode", lambda m: m.convolve(np.ones(3), np.ones(2), "middle"), ValueError,
     InvalidOptionError, "'valid', 'same' or 'full'"),
    ("convolve empty", lambda m: m.convolve(np.zeros(0), np.ones(2)), ValueError, ShapeError,
     "non-empty"),
    ("var ddof and correction", lambda m: m.var(A, ddof=1, correction=1), ValueError,
     InvalidOptionError, "both"),
    ("trapezoid 0-d", lambda m: m.trapezoid(np.float64(1.0)), IndexError, IndexingError,
     "at least one dimension"),
    ("max where without initial", lambda m: m.max(A, where=A > 2), ValueError,
     InvalidOptionError, "specify 'initial'"),
]


@pytest.mark.parametrize("label, f, numpy_error, error, match", ERRORS,
                         ids=[e[0] for e in ERRORS])
def test_numpys_errors(label, f, numpy_error, error, match):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        with pytest.raises(numpy_error):
            f(np)
    with pytest.raises(error, match=match) as info:
        f(snp)
    assert isinstance(info.value, SciadError)
    if numpy_error in (ValueError, IndexError, ZeroDivisionError):
        assert isinstance(info.value, numpy_error)


@pytest.mark.parametrize("call", [
    lambda: snp.median(A, out=np.zeros(3)),
    lambda: snp.quantile(A, 0.5, out=np.zeros(())),
    lambda: snp.percentile(A, 50, axis=0, out=np.zeros(3)),
    lambda: snp.quantile(A, 0.5, method="inverted_cdf", weights=A, out=np.zeros(())),
    lambda: snp.var(A, out=np.zeros(())),
    lambda: snp.std(A, 0, None, np.zeros(3)),
    lambda: snp.mean(A, out=np.zeros(())),
    lambda: snp.sum(A, out=np.zeros(())),
    lambda: snp.cumsum(A, out=np.zeros(6)),
    lambda: snp.add(A, 1.0, np.zeros((2, 3))),           # a ufunc's third positional
    lambda: snp.sqrt(A, out=np.zeros((2, 3))),
    lambda: snp.log2(A, np.zeros((2, 3))),
    lambda: snp.logaddexp(A, A, out=np.zeros((2, 3))),
    lambda: snp.isnan(A, out=np.zeros((2, 3), bool)),
    lambda: snp.conj(A, out=np.zeros((2, 3))),
    lambda: snp.take(A, [0], None, np.zeros(1)),        # NumPy's order: out before mode
    lambda: snp.clip(A, 0, 1, np.zeros((2, 3))),
    lambda: snp.concatenate([A, A], 0, np.zeros((4, 3))),
    lambda: snp.stack([A, A], 0, np.zeros((2, 2, 3))),
    lambda: snp.dot(A, A.T, np.zeros((2, 2))),
    lambda: snp.matmul(A, A.T, out=np.zeros((2, 2))),
    lambda: snp.outer(A[0], A[1], np.zeros((3, 3))),
    lambda: snp.einsum("ij->i", A, out=np.zeros(2)),
    lambda: snp.argmax(A, 0, np.zeros(3, np.int64)),    # NumPy's third positional
    lambda: snp.any(A, 0, np.zeros(3, bool)),
    lambda: snp.trace(A, 0, 0, 1, None, np.zeros(())),
])
def test_out_is_refused_by_name(call):
    with pytest.raises(InvalidOptionError, match="`out=` is not supported.*returned array"):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: snp.median(A.astype(complex)), "no order"),
    (lambda: snp.searchsorted(np.array([1j, 2]), 1j), "no order"),
])
def test_what_sciad_does_not_take_is_refused_by_name(call, match):
    with pytest.raises((NotSupportedError, DTypeError), match=match):
        call()


def test_a_traced_period_is_refused():
    """A traced period is refused (it sets the knots' shape)."""
    with pytest.raises(NotSupportedError, match="static"):
        sd.trace(lambda p: snp.interp(np.ones(1), XP, FP, period=p), np.float64(2.0))


def test_nan_compares_as_numpy():
    # NaN sorts last in NumPy: a NaN slice's median, quantiles (weighted too)
    # are NaN; searchsorted puts NaN after every number
    for f in (lambda m: m.median(NANA, axis=1),
              lambda m: m.quantile(NANA, [0.0, 1.0], axis=1, method="inverted_cdf",
                                   weights=np.array([1.0, 2, 3])),
              lambda m: m.searchsorted(np.array([1.0, inf, nan]), np.array([nan, inf, 2.0])),
              lambda m: m.gradient(np.array([1.0, nan, 3, 4, 5]))):
        _same(f(snp), f(np), "nan")


def _composites(a, xs, b, w):
    return (snp.gradient(a, xs, axis=1), snp.gradient(a, 0.5, xs, edge_order=2),
            snp.cross(a[:, :3], b[:3], axisc=0), snp.cross(a[:, :2], b[:3], axisa=1, axisb=0),
            snp.interp(xs + 0.3, xs, a[0], period=2.0),
            snp.diff(a, prepend=a[:, :1] * 2, append=1.5, n=2),
            snp.average(a, axis=(1, 0), weights=w.T, returned=True),
            snp.var(a, axis=0, ddof=1), snp.std(a, axis=1, mean=snp.mean(a, 1, keepdims=True)),
            snp.var(a, axis=1, where=w > 1.0, ddof=1), snp.mean(a, axis=0, where=w > 1.0),
            snp.trapezoid(a, dx=xs[:3, None]),
            snp.quantile(a, [0.3, 0.8], axis=1, method="inverted_cdf", weights=w),
            snp.pad(a, ((1, 2), (3, 1)), mode="reflect"), snp.pad(a, 2, mode="wrap"),
            snp.linspace(a[0], b[:, 0], 5, axis=-1), snp.reshape(a, (2, 6), order="F"))


_R = np.random.default_rng(3)
# (coordinates distinct modulo the period 2: equal knots would swap order under
# finite differences)
_ARGS = (_R.standard_normal((3, 4)), np.array([0.0, 0.7, 1.5, 2.9]),
         _R.standard_normal((4, 3)), _R.uniform(0.5, 2.0, (3, 4)))


def test_derivatives_of_coordinate_gradients():
    """`gradient`'s uneven-spacing weights, differentiated in the values and
    the coordinates."""
    sd.testing.check_rules(lambda a, xs: snp.gradient(a, xs, axis=1, edge_order=2),
                           *_ARGS[:2], second_order=False)


@pytest.mark.slow
def test_derivatives_of_the_new_arguments():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sd.testing.check_rules(_composites, *_ARGS, second_order=False)


def test_traced_weights_are_checked_when_the_program_runs():
    """Weights known only when the program runs are judged as NumPy judges
    concrete ones: a zero sum along `axis` (average) raises ZeroSumError, a
    negative weight (quantile) InvalidOptionError, through `sd.function`,
    `sd.grad`, `sd.vmap` and `to_jax` under jit; good weights give NumPy's
    values and the identity's derivative; NaN weights give NumPy's NaN."""
    import jax

    a = np.arange(6.0).reshape(3, 2)
    avg = sd.function(lambda a, w: snp.average(a, axis=1, weights=w))
    np.testing.assert_allclose(avg(a, np.array([0.25, 0.75])),
                               np.average(a, axis=1, weights=[0.25, 0.75]))
    with pytest.raises(ZeroSumError, match="average's weights sum to zero"):
        avg(a, np.array([1.0, -1.0]))
    with pytest.raises(ZeroSumError):
        sd.function(lambda a, w: snp.average(a, weights=w))(a, np.zeros((3, 2)))
    with pytest.raises(ZeroSumError):
        sd.function(sd.grad(lambda w: snp.average(a, axis=1, weights=w)[0]))(
            np.array([1.0, -1.0]))
    with pytest.raises(ZeroSumError):
        sd.function(sd.vmap(lambda w: snp.average(a, axis=1, weights=w)))(
            np.array([[0.25, 0.75], [1.0, -1.0]]))
    jf = jax.jit(sd.to_jax(lambda a, w: snp.average(a, axis=1, weights=w)))
    with pytest.raises(ZeroSumError), sd.errors.unwrapped():
        jax.block_until_ready(jf(a, np.array([1.0, -1.0])))
    g = sd.function(sd.grad(lambda w: snp.average(a, axis=1, weights=w)[0]))
    np.testing.assert_allclose(g(np.array([0.25, 0.75])), [-0.75, 0.25])
    np.testing.assert_array_equal(np.isnan(avg(a, np.array([np.nan, 1.0]))), True)
    q = sd.function(lambda x, w: snp.quantile(x, 0.5, weights=w, method="inverted_cdf"))
    x = np.arange(5.0)
    assert float(q(x, np.ones(5))) == np.quantile(x, 0.5, weights=np.ones(5),
                                                  method="inverted_cdf")
    with pytest.raises(InvalidOptionError, match="quantile's weights must be non-negative"):
        q(x, np.array([1.0, 1.0, -1.0, 1.0, 1.0]))
