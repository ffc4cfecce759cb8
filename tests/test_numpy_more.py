"""The NumPy functions simulation scripts reach for beyond the core ops
(statistics, stacking and splitting, triangles and diagonals, interpolation,
quadrature, finite differences, convolution), against NumPy itself.

They are written with sciad's ops, so their derivatives come from those ops'
rules; `check_rules` checks them together. Every case runs in one compiled
function, so the whole table compiles once.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import IndexingError, InvalidOptionError, ShapeError

_R = np.random.default_rng(5)
A = _R.standard_normal((3, 4))
XP = np.sort(_R.uniform(0.0, 1.0, 6))
FP = _R.standard_normal(6)
XQ = np.linspace(-0.2, 1.2, 9)
W = np.arange(1.0, 5.0)


def _cases(xp):
    """name -> a function of `A` written against the module `xp`."""
    return {
        "log2": lambda a: xp.log2(xp.abs(a)),
        "log10": lambda a: xp.log10(xp.abs(a)),
        "exp2": lambda a: xp.exp2(a),
        "reciprocal": lambda a: xp.reciprocal(a),
        "deg2rad": lambda a: (xp.deg2rad(a), xp.radians(a), xp.rad2deg(a), xp.degrees(a)),
        "logaddexp": lambda a: xp.logaddexp(a, 2 * a),
        "heaviside": lambda a: xp.heaviside(xp.floor(a), 0.5),
        "logical_xor": lambda a: xp.logical_xor(a > 0, a < 1),
        "isnan-isinf": lambda a: (xp.isnan(xp.log(a)), xp.isinf(1 / xp.floor(a))),
        "nan_to_num": lambda a: xp.nan_to_num(xp.log(a) / xp.floor(a)),
        "any-all": lambda a: (xp.any(a > 1, axis=0), xp.all(a > -1),
                              xp.count_nonzero(a > 0, axis=1)),
        "argmax": lambda a: (xp.argmax(a, axis=1), xp.argmin(a),
                             xp.argmax(xp.floor(a), axis=0, keepdims=True),
                             xp.argmin(a, keepdims=True)),
        "var-std": lambda a: (xp.var(a, axis=1, ddof=1), xp.std(a), xp.var(a, keepdims=True)),
        "average": lambda a: xp.average(a, axis=1, weights=W),
        "median": lambda a: (xp.median(a, axis=0), xp.median(a),
                             xp.median(xp.log(a), axis=(1, 0), keepdims=True),
                             xp.median(xp.log(a), axis=1)),
        "quantile": lambda a: (xp.quantile(a, [0.1, 0.75], axis=1, keepdims=True),
                               xp.percentile(a, 30),
                               xp.quantile(xp.log(a), [0.2, 0.9], axis=0, method="hazen"),
                               xp.percentile(a, 30, axis=(1, 0), method="nearest",
                                             keepdims=True)),
        "meshgrid": lambda a: (*xp.meshgrid(a[0], a[1, :3]),
                               *xp.meshgrid(a[0], a[1, :3], a[2, :2], indexing="ij")),
        "tile": lambda a: (xp.tile(a, (2, 1, 3)), xp.tile(a[0], 2)),
        "repeat": lambda a: (xp.repeat(a, [1, 0, 2], axis=0), xp.repeat(a, 2)),
        "stack": lambda a: (xp.hstack([a, a[:, :1]]), xp.vstack([a, a[0]]),
                            xp.column_stack([a[0], a.T])),
        "split": lambda a: (*xp.split(a, [1, 3, 9], axis=1), *xp.split(a, 2, axis=1)),
        "flip": lambda a: (xp.fliplr(a), xp.flipud(a)),
        "rot90": lambda a: (xp.rot90(a), xp.rot90(a, 2), xp.rot90(a, 3), xp.rot90(a, -1)),
        "triangles": lambda a: (xp.tril(a, -1), xp.triu(a, 1)),
        "diagonal": lambda a: (xp.diagonal(a, 1), xp.diagonal(a, -1), xp.diag(a),
                               xp.diag(a[0], 1), xp.diag(a[0], -2), xp.trace(a, 1)),
        "cross-kron": lambda a: (xp.cross(a[:, :3], a[:, 1:]), xp.kron(a[:2, :2], a)),
        "polyval": lambda a: xp.polyval(a[0], a[1]),
        "trapezoid": lambda a: (xp.trapezoid(a), xp.trapezoid(a, dx=0.5, axis=0),
                                xp.trapezoid(a, x=np.arange(4.0) ** 2)),
        "gradient": lambda a: (*xp.gradient(a, 0.5), xp.gradient(a, axis=1, edge_order=2)),
        "convolve": lambda a: (xp.convolve(a[0], a[1, :3]), xp.convolve(a[0], a[1, :3], "same"),
                               xp.convolve(a[0], a[1, :2], "valid"),
                               xp.correlate(a[0], a[1, :3], "full")),
        "isclose": lambda a: (xp.isclose(a, a + 1e-9), xp.allclose(a, a * 1.1),
                              xp.array_equal(a, a)),
        "atleast": lambda a: (xp.atleast_1d(a[0, 0]), xp.atleast_2d(a[0])),
        "interp": lambda a: (xp.interp(XQ, XP, FP), xp.interp(a, XP, FP, left=-1.0),
                             xp.digitize(XQ, XP), xp.searchsorted(XP, a, side="right")),
        "bincount": lambda a: xp.bincount(np.array([0, 3, 3, 5]), a[0]),
    }


def test_functions_match_numpy():
    names = list(_cases(np))
    with np.errstate(all="ignore"):
        wants = [_cases(np)[n](A) for n in names]
    gots = sd.function(lambda a: [_cases(snp)[n](a) for n in names])(A)
    for name, got, want in zip(names, gots, wants):
        got = got if isinstance(got, (tuple, list)) else [got]
        want = want if isinstance(want, (tuple, list)) else [want]
        assert len(got) == len(want), name
        for x, y in zip(got, want):
            y = np.asarray(y)
            assert (np.shape(x), np.asarray(x).dtype) == (y.shape, y.dtype), name
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int16, np.int64, np.bool_])
def test_float_functions_take_numpys_dtypes(dtype):
    # float32 stays float32, small integers compute in float16/float32, as
    # NumPy's ufuncs do (eagerly: no compile)
    x = np.arange(1, 4).astype(dtype)
    cases = [(f, (x,)) for f in ("log2", "log10", "exp2", "deg2rad", "rad2deg")]
    if dtype is not np.bool_:
        cases += [("logaddexp", (x, x)), ("logaddexp", (x, 1.5)),
                  ("heaviside", (x - 2, 0.5)), ("heaviside", (x - 2, x))]
    for name, args in cases:
        got, want = getattr(snp, name)(*args), getattr(np, name)(*args)
        assert got.dtype == want.dtype, (name, dtype, got.dtype, want.dtype)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3,
                                   err_msg=name)


@pytest.mark.slow
def test_derivatives_of_the_composites():
    # (no ties, points off the interpolation knots: derivatives are smooth there)
    def f(a, xq, xp, fp):
        return (snp.logaddexp(a, 2 * a), snp.std(a, axis=0), snp.median(a, axis=1),
                snp.quantile(a, 0.3), snp.average(a, axis=1, weights=W),
                snp.quantile(a, [0.2, 0.7], axis=(1, 0), method="median_unbiased"),
                snp.percentile(a, 40, axis=0, method="midpoint", keepdims=True),
                snp.median(a, axis=(0, 1)),
                snp.interp(xq, xp, fp), snp.trapezoid(a ** 2, x=xp[:4]),
                snp.gradient(a * a[0], 0.3, axis=1), snp.convolve(a[0], a[1, :2]),
                snp.kron(a[:2, :2], a[0]), snp.cross(a[:, :3], a[:, 1:]),
                snp.polyval(a[0], a[1]), snp.trace(a @ a.T), snp.tril(a) + snp.rot90(a).T,
                snp.repeat(a, 2, axis=1), snp.log10(a ** 2) + snp.exp2(a))
    # (second order: each primitive used here is checked at second order in the
    # registry walk, tests/test_autodiff.py)
    sd.testing.check_rules(f, A, XQ[1:-1] + 1e-3, XP, FP, second_order=False)


_METHODS = ("inverted_cdf", "averaged_inverted_cdf", "closest_observation",
            "interpolated_inverted_cdf", "hazen", "weibull", "linear", "median_unbiased",
            "normal_unbiased", "lower", "higher", "midpoint", "nearest")


def test_median_and_quantiles_are_numpys():
    # NaN in a slice makes its median and quantiles NaN (they had dropped
    # it: 12.5 for [10, 15, nan, 3]); every method, tuple axes, keepdims,
    # infinities, and NumPy's result dtypes; in one compiled function
    x = np.array([10.0, 15.0, np.nan, 3.0])
    d = np.where(_R.uniform(size=(4, 3, 5)) < 0.1, np.inf, _R.standard_normal((4, 3, 5)))
    d[1, 2, 3] = np.nan
    ints, bools = np.arange(12).reshape(3, 4) % 5, np.array([True, False, True])

    def run(xp, x, d, ints, bools):
        quantiles = [(x, 0.2, None, "linear", False)]
        quantiles += [(d, [0.1, 0.5, 1.0], (0, 2), m, True) for m in _METHODS]
        quantiles += [(d, 0.3, None, "linear", False), (d, 1, 1, "linear", False),
                      (d, [[0.2, 1.0]], (2, 0), "linear", True),
                      (d, np.float32(0.3), (), "hazen", False),
                      (d.astype(np.float32), [0.3], -1, "midpoint", False),
                      (d.astype(np.float32), 0.3, -1, "weibull", False),
                      (ints, 0.3, 0, "linear", False), (ints, 0.3, 0, "lower", False),
                      (bools, 0.5, None, "nearest", False)]
        medians = [(x, None), (d, (0, 2)), (d, None), (d[:, :, 1], 0), (ints, None),
                   (xp.stack([x[0], x[1] / 0.0]), None), (xp.stack([-x[1] / 0, x[1] / 0]), None),
                   (d[:0, 0], 0)]
        return ([xp.quantile(a, q, axis=axis, method=m, keepdims=k)
                 for a, q, axis, m, k in quantiles]
                + [xp.median(a, axis=axis, keepdims=True) for a, axis in medians]
                + [xp.percentile(d, [30, 99.5], axis=(2, 1))])

    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="empty slice"):
        wants = run(np, x, d, ints, bools)
    gots = sd.function(lambda *a: run(snp, *a))(x, d, ints, bools)
    assert np.isnan(gots[0]) and np.isnan(gots[len(_METHODS) + 10])  # x's, NumPy's too
    for i, (got, want) in enumerate(zip(gots, wants)):
        assert np.asarray(got).dtype == want.dtype, i
        # to a few ulps: compiled, XLA may fuse `lo + diff * t` into one FMA
        eps = np.finfo(want.dtype).eps if want.dtype.kind == "f" else 0.0
        np.testing.assert_allclose(got, want, rtol=4 * eps, atol=0, err_msg=str(i))


def test_a_nan_median_is_a_constant_and_a_clean_slice_differentiates():
    # a slice holding NaN has the median NaN, a constant (derivative zero);
    # a clean slice's is a half on each middle value
    a = np.array([[10.0, 15.0, np.nan, 3.0], [10.0, 15.0, 3.0, 4.0]])
    value, grad = sd.value_and_grad(lambda a: snp.sum(snp.median(a, axis=1) * np.array(
        [1.0, 2.0])))(a)
    assert np.isnan(value)
    np.testing.assert_array_equal(grad, [[0, 0, 0, 0], [1, 0, 0, 1]])
    g = sd.grad(lambda a: snp.median(a[1]) + snp.quantile(a[1], 0.4, method="lower"))(a)
    np.testing.assert_array_equal(g, [[0, 0, 0, 0], [0.5, 0, 0, 1.5]])


def test_interp_is_numpys_at_knots_infinities_and_one_knot():
    # next to infinite `fp` the exact knots had become NaN ([1, nan, inf,
    # nan, nan]), and one knot had ignored `left` and `right`
    inf, nan = np.inf, np.nan
    x = np.array([-inf, -1.0, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.2, 4, 4.5, 5, 6, inf, nan])
    cases = [(x[4:13:2], np.arange(1.0, 6.0), np.array([1.0, 2, inf, inf, 4]), None, None),
             (x, np.arange(1.0, 6.0), np.array([1.0, -inf, inf, 3, nan]), None, None),
             (x, np.array([0.0, 1, 1, 2, 4]), np.array([inf, 1, 1, 2, -inf]), -7.0, 8.0),
             (x, np.array([0.0, 0, 1]), np.array([1, 2, 3]), nan, inf),
             (x, np.array([-inf, 0, 1, inf]), np.array([0.0, 1, 4, 9]), None, None),
             (np.array([0.0, 1, 2, nan]), np.array([1.0]), np.array([5.0]), -1.0, 9.0),
             (x, np.arange(1.0, 6.0), np.array([1 + 1j, 2 - 1j, inf, complex(1, inf),
                                                complex(nan, 2)]), None, None),
             (x.astype(np.float32)[:-1].reshape(3, 5), np.arange(5, dtype=np.float32),
              np.arange(5, dtype=np.float32) ** 2, None, None)]
    assert np.array_equal(snp.interp(*cases[0][:3]), [1, 2, inf, inf, 4])
    f = sd.function(lambda *a: [snp.interp(x, xp, fp, left, right)
                                for (x, xp, fp), (_, _, _, left, right) in zip(a, cases)])
    gots = f(*[c[:3] for c in cases])
    for (x, xp, fp, left, right), got in zip(cases, gots):
        want = np.interp(x, xp, fp, left, right)
        assert np.asarray(got).dtype == want.dtype and got.shape == want.shape
        # (to an ulp: compiled, XLA may fuse the line's product and sum)
        np.testing.assert_allclose(got, want, rtol=4e-16, atol=0)
    with pytest.raises(sd.errors.DTypeError, match="`left` is complex"):
        snp.interp(x, np.arange(3.0), np.arange(3.0), left=1j)


def test_interp_derivatives_away_from_the_knots_are_finite_differences():
    # points inside finite segments, beside points at a knot next to an
    # infinite value, at infinity and NaN: the loss of the finite values has
    # the derivatives of central differences, none of them NaN
    xp, fp = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0.0, 1.0, 4.0, np.inf, 9.0, 3.0])
    x = np.array([0.3, 1.6, 4.25, 4.7, 2.0, 3.0, np.nan, np.inf, 2.5])
    used = np.array([1.0, 2.0, -1.0, 0.5, 0, 0, 0, 0, 0])   # the finite values' points

    def loss(x, xp, fp):
        y = snp.interp(x, xp, fp)
        return snp.sum(snp.where(used != 0, y, 0.0) * used)

    grads = sd.grad(loss, argnums=(0, 1, 2))(x, xp, fp)
    loss, h = sd.function(loss), 1e-6
    for k, (g, a) in enumerate(zip(grads, (x, xp, fp))):
        assert not np.any(np.isnan(g)), k
        for i in np.flatnonzero(np.isfinite(a)):
            e = np.zeros_like(a)
            e[i] = h
            up, down = ([x, xp, fp] for _ in range(2))
            up[k], down[k] = a + e, a - e
            fd = (float(loss(*up)) - float(loss(*down))) / (2 * h)
            np.testing.assert_allclose(g[i], fd, rtol=1e-6, atol=1e-8, err_msg=f"{k} {i}")


def test_digitize_takes_decreasing_bins_as_numpy():
    # decreasing bins had been searched as increasing ones ([0 0 0 4 ...]
    # for NumPy's [4 3 3 2 ...]); concrete ones, and traced ones
    x = np.array([-1.0, 0, 0.5, 1, 2.5, 3, 4, np.nan])
    f = sd.function(lambda x, b: [snp.digitize(x, b), snp.digitize(x, b, right=True)])
    for bins in (np.arange(4.0), np.arange(4.0)[::-1].copy(), np.array([2.0, 2, 1])):
        for got in (f(x, bins), [snp.digitize(x, bins), snp.digitize(x, bins, right=True)]):
            for g, right in zip(got, (False, True)):
                assert np.asarray(g).dtype == np.int64
                np.testing.assert_array_equal(g, np.digitize(x, bins, right=right))
    with pytest.raises(ShapeError, match="monotonically increasing or decreasing"):
        snp.digitize(x, np.array([0.0, 2, 1]))


def test_interp_gradient_matches_jax():
    def f(x, xp, fp, m=snp):
        return m.sum(m.interp(x, xp, fp) ** 2)

    args = (XQ + 1e-3, XP, FP)
    with sd.config.x64_scope():
        want = jax.grad(lambda *a: f(*a, m=jax.numpy), argnums=(0, 1, 2))(*args)
    for g, w in zip(sd.grad(f, argnums=(0, 1, 2))(*args), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_bincount_with_traced_values_needs_a_length():
    f = sd.function(lambda i, w: snp.bincount(i, w, length=6))
    np.testing.assert_allclose(f(np.array([0, 3, 3, 5]), W), np.bincount([0, 3, 3, 5], W,
                                                                          minlength=6))
    with pytest.raises(IndexingError, match="out of bounds"):
        f(np.array([0, 6, 3, 5]), W)
    with pytest.raises(IndexingError, match="length="):
        sd.trace(lambda i: snp.bincount(i), np.array([0, 1]))


@pytest.mark.parametrize("f, err, match", [
    (lambda a: snp.repeat(a, a[0, :3].astype(np.int64), axis=0), ShapeError, "static"),
    (lambda a: snp.split(a, 3, axis=1), ShapeError, "equal division"),
    (lambda a: snp.quantile(a, 1.5), ShapeError, r"\[0, 1\]"),
    (lambda a: snp.quantile(a, np.nan), ShapeError, r"\[0, 1\]"),
    (lambda a: snp.percentile(a, [50, np.nan]), ShapeError, r"\[0, 100\]"),
    (lambda a: snp.quantile(a, a[0, 0]), ShapeError, "static"),
    (lambda a: snp.quantile(a, 0.5, method="nearst"), ShapeError, "not one of NumPy's"),
    (lambda a: snp.quantile(a, 0.5, weights=a), InvalidOptionError, "inverted_cdf"),
    (lambda a: snp.median(a, out=a[0]), InvalidOptionError, "out="),
    (lambda a: snp.median(a.astype(np.complex128)), sd.errors.DTypeError, "no order"),
    (lambda a: snp.quantile(a > 0, 0.5), sd.errors.DTypeError, "booleans"),
    (lambda a: snp.quantile(a[:0], 0.5), IndexingError, "empty slice"),
    (lambda a: snp.median(a, axis=(0, 0)), ShapeError, "repeated axis"),
    (lambda a: snp.sum(a, axis=1.0), ShapeError, "`axis` must be an integer, got 1.0"),
    (lambda a: snp.take(a, 0, axis=(0,)), ShapeError, "takes one axis"),
    (lambda a: snp.gradient(a, np.arange(3.0)), ShapeError, "invalid number of arguments"),
    (lambda a: snp.convolve(a, a[0]), ShapeError, "1-D"),
    (lambda a: snp.cross(a, a), ShapeError, "dimension must be 2 or 3"),
    (lambda a: snp.argmax(a[:, :0], axis=1), ShapeError, "empty"),
])
def test_errors_name_the_function(f, err, match):
    with pytest.raises(err, match=match):
        sd.trace(f, A)


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "var", "std"])
def test_reductions_take_numpys_positional_out(name):
    """The fourth positional argument of NumPy's `sum`, `mean`, `var`, ...
    (the third of `max`, `min`) is `out`: refused by name, never read as
    `keepdims` or `ddof`."""
    a = np.arange(6.0).reshape(2, 3)
    pos = (0, np.zeros(3)) if name in ("max", "min") else (0, None, np.zeros(3))
    with pytest.raises(sd.errors.InvalidOptionError, match="`out=` is not supported"):
        getattr(snp, name)(a, *pos)
    np.testing.assert_allclose(getattr(snp, name)(a, 0, keepdims=True),
                               getattr(np, name)(a, 0, keepdims=True))
