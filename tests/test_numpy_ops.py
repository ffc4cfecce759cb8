"""`sciad.numpy` against NumPy itself.

Every op runs through `sd.function` (traced, verified, lowered, compiled by
XLA) on random inputs and must equal NumPy's result: the same shape, the same
dtype (NumPy's promotion, NEP 50 weak Python scalars included) and the same
values to tight tolerance. A subset also runs eagerly (an `snp` function
called on NumPy arrays outside any trace).

Each distinct signature compiles, so cases share inputs' shapes where they
can, and functions used by hypothesis tests are built once (module level) so
that repeated shapes hit `sd.function`'s cache.
"""

from __future__ import annotations

import functools
import os
import warnings

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, IndexingError, ShapeError, TracerError

THIS_FILE = os.path.basename(__file__)

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)
BOOL = np.dtype(np.bool_)

HYPOTHESIS = settings(max_examples=20, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture,
                                             HealthCheck.too_slow])


# ---------------------------------------------------------------------------
# helpers


def _tolerance(dtype: np.dtype) -> dict:
    if dtype in (F32, C64):
        return dict(rtol=1e-5, atol=1e-5)
    return dict(rtol=1e-12, atol=1e-12)


def check(actual, expected, what: str = "") -> None:
    """`actual` (a sciad result) equals NumPy's `expected`: shape, dtype, values.
    Tuples and lists are compared item by item."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), actual
        for i, (a, e) in enumerate(zip(actual, expected)):
            check(a, e, f"{what}[{i}]")
        return
    expected = np.asarray(expected)
    assert isinstance(actual, (jax.Array, np.ndarray, np.generic)), type(actual)
    got = np.asarray(actual)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, NumPy {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, NumPy {expected.dtype}"
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, err_msg=what, **_tolerance(expected.dtype))
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def compiled(f, *args):
    """`f(*args)` through `sd.function`: traced, verified, lowered, XLA-compiled."""
    fn = sd.function(f)
    out = fn(*args)
    assert fn.trace_count == 1
    for leaf in jax.tree_util.tree_leaves(out):
        assert isinstance(leaf, jax.Array), type(leaf)
    return out


def compare(expr, *args, eager: bool = False) -> None:
    """`expr(snp, *args)` compiled (and eagerly, if asked) equals `expr(np, *args)`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        expected = expr(np, *args)
        check(compiled(lambda *a: expr(snp, *a), *args), expected, "compiled")
        if eager:
            check(expr(snp, *args), expected, "eager")


def rand(rng, shape, dtype, low: float = -2.0, high: float = 2.0):
    """Random values of `dtype`; complex ones have both parts in [low, high)."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        return np.asarray(rng.integers(int(low), int(high), shape, endpoint=True)).astype(dtype)
    x = rng.uniform(low, high, shape)
    if dtype.kind == "c":
        x = x + 1j * rng.uniform(low, high, shape)
    return np.asarray(x).astype(dtype)


def nonzero(rng, shape, dtype, low: float = 0.5, high: float = 2.0):
    """Random values away from zero (magnitude in [low, high), either sign)."""
    dtype = np.dtype(dtype)
    mag = rng.uniform(low, high, shape)
    if dtype.kind == "c":
        return np.asarray(mag * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))).astype(dtype)
    if dtype.kind in "iu":
        return np.asarray(rng.integers(1, 6, shape) * rng.choice([-1, 1], shape)).astype(dtype)
    return np.asarray(mag * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def dtype_id(dt) -> str:
    return np.dtype(dt).name


# ---------------------------------------------------------------------------
# unary elementwise

# name -> (low, high) of the real inputs' domain
UNARY = {
    "negative": (-3, 3), "exp": (-3, 3), "log": (0.1, 3), "log1p": (-0.9, 3),
    "expm1": (-3, 3), "sin": (-3, 3), "cos": (-3, 3), "tan": (-1.2, 1.2),
    "arcsin": (-0.95, 0.95), "arccos": (-0.95, 0.95), "arctan": (-3, 3),
    "sinh": (-3, 3), "cosh": (-3, 3), "tanh": (-3, 3), "sqrt": (0.0, 4),
    "abs": (-3, 3), "sign": (-3, 3), "square": (-3, 3), "floor": (-3, 3),
    "ceil": (-3, 3), "isfinite": (-3, 3), "logical_not": (-3, 3), "real": (-3, 3),
    "imag": (-3, 3), "conj": (-3, 3), "angle": (-3, 3),
}
NO_COMPLEX_UNARY = {"floor", "ceil"}


def _unary_input(rng, name, dtype):
    low, high = UNARY[name]
    if np.dtype(dtype).kind == "c":
        x = rand(rng, (3, 4), dtype, -1.5, 1.5)
    else:
        x = rand(rng, (3, 4), dtype, low, high)
    if name in ("sign", "abs", "logical_not", "angle", "floor", "ceil"):
        x[0, 0] = 0  # the special value of these ops
    if name in ("floor", "ceil"):
        x[0, 1], x[0, 2] = 2.0, -2.0  # integral values stay put
    if name in ("isfinite", "logical_not"):
        x[1, 0], x[1, 1], x[1, 2] = np.inf, -np.inf, np.nan
    return x


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name):
    # float32, float64 and complex128 inputs in one compiled function
    dtypes = [F32, F64] + ([] if name in NO_COMPLEX_UNARY else [C128])
    xs = [_unary_input(rng, name, dt) for dt in dtypes]
    fn = getattr(snp, name)
    out = compiled(lambda *a: [fn(x) for x in a], *xs)
    for dt, x, o in zip(dtypes, xs, out):
        check(o, getattr(np, name)(x), f"{name}({dt.name})")
    check(fn(xs[1]), getattr(np, name)(xs[1]), f"eager {name}(float64)")


@pytest.mark.parametrize("name", ["negative", "exp", "sin", "arctan", "sqrt", "abs", "sign",
                                  "square", "floor", "isfinite", "logical_not", "real",
                                  "imag", "conj", "angle"])
def test_unary_of_int64_follows_numpy_dtype(rng, name):
    # sin/exp/sqrt/angle of int64 compute in float64; the others stay int64 (or bool)
    x = rng.integers(0 if name == "sqrt" else -5, 6, (2, 5))
    compare(lambda m, a: getattr(m, name)(a), x, eager=True)



@pytest.mark.parametrize("dtype", [F32, F64, C128], ids=dtype_id)
def test_angle_in_degrees(rng, dtype):
    x = rand(rng, (5,), dtype)
    x[0] = -1  # 180 degrees
    compare(lambda m, a: m.angle(a, deg=True), x)


@pytest.mark.parametrize("dtype", [
    F32,
    F64, C128,
], ids=dtype_id)
def test_angle_in_degrees_eager(rng, dtype):
    x = rand(rng, (5,), dtype)
    x[0] = -1
    check(snp.angle(x, deg=True), np.angle(x, deg=True))


@pytest.mark.parametrize("expr, eager", [
    pytest.param(lambda a: snp.floor(a), True, id="floor"),
    pytest.param(lambda a: snp.ceil(a), True, id="ceil"),
    pytest.param(lambda a: snp.maximum(a, a), True, id="maximum"),
    pytest.param(lambda a: snp.minimum(a, 1.0), True, id="minimum"),
    pytest.param(lambda a: snp.less(a, a), True, id="less"),
    pytest.param(lambda a: snp.greater_equal(a, 0.5), True, id="greater_equal"),
    pytest.param(lambda a: snp.floor_divide(a, a), True, id="floor_divide"),
    pytest.param(lambda a: snp.remainder(a, 2), True, id="remainder"),
    pytest.param(lambda a: snp.max(a), True, id="max"),
    pytest.param(lambda a: snp.min(a, axis=0), True, id="min"),
    pytest.param(lambda a: snp.clip(a, 0, 1), True, id="clip"),
    pytest.param(lambda a: a <= 1, False, id="operator-less_equal"),
    pytest.param(lambda a: 0 >= a, False, id="operator-reflected"),
    pytest.param(lambda a: a > a, False, id="operator-greater"),
])
def test_orderings_reject_complex(rng, expr, eager):
    x = rand(rng, (3,), C128)
    with pytest.raises(DTypeError, match="complex"):
        sd.function(expr)(x)
    if eager:
        with pytest.raises(DTypeError, match="complex"):
            expr(x)


# ---------------------------------------------------------------------------
# binary elementwise, with broadcasting

ARITH = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "arctan2",
         "floor_divide", "remainder"]
COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
           "logical_and", "logical_or"]
ORDERED = {"maximum", "minimum", "arctan2", "floor_divide", "remainder", "less", "less_equal",
           "greater", "greater_equal"}


def _binary_names(dtype) -> tuple[str, ...]:
    names = ARITH + COMPARE
    if np.dtype(dtype).kind == "c":
        names = [n for n in names if n not in ORDERED]
    return tuple(names)


@functools.cache
def _binary_fn(names: tuple[str, ...]):
    def all_binary(x, y, base, p, q):
        out = {}
        for n in names:
            if n == "power":
                out[n] = snp.power(base, y)
            elif n in COMPARE:
                out[n] = getattr(snp, n)(p, q)
            else:
                out[n] = getattr(snp, n)(x, y)
        return out
    return sd.function(all_binary)


def _binary_inputs(rng, shapes, dtype):
    sx, sy = shapes
    x, y = nonzero(rng, sx, dtype), nonzero(rng, sy, dtype)
    if np.dtype(dtype).kind in "iu":
        y = np.abs(y)  # no negative integer powers (NumPy refuses them)
    base = x if np.dtype(dtype).kind == "c" else np.abs(x)  # real powers of positives
    # comparison operands drawn from a few values, so ties and zeros occur
    p = (rng.integers(-2, 3, sx) * 0.5).astype(dtype) if np.dtype(dtype).kind != "i" else \
        rng.integers(-2, 3, sx).astype(dtype)
    q = (rng.integers(-2, 3, sy) * 0.5).astype(dtype) if np.dtype(dtype).kind != "i" else \
        rng.integers(-2, 3, sy).astype(dtype)
    if np.dtype(dtype).kind == "c":
        p = p + 0.5j * rng.integers(-1, 2, sx)
        q = q + 0.5j * rng.integers(-1, 2, sy)
    return x, y, base, p, q


def _check_binary(out, names, x, y, base, p, q, what):
    assert set(out) == set(names)
    for n in names:
        if n == "power":
            expected = np.power(base, y)
        elif n in COMPARE:
            expected = getattr(np, n)(p, q)
        else:
            expected = getattr(np, n)(x, y)
        check(out[n], expected, f"{n} {what}")


# broadcasting does not depend on the dtype, so random shapes run in float64;
# the other dtypes run on one broadcasting pair of shapes
@HYPOTHESIS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
       seed=st.integers(0, 2**32 - 1))
def test_binary_broadcasting(shapes, seed):
    rng = np.random.default_rng(seed)
    args = _binary_inputs(rng, shapes.input_shapes, F64)
    names = _binary_names(F64)
    out = _binary_fn(names)(*args)
    assert np.shape(out[names[0]]) == shapes.result_shape
    _check_binary(out, names, *args, what=str(shapes.input_shapes))


@pytest.mark.parametrize("dtype", [F32, I64, C64, C128], ids=dtype_id)
def test_binary_dtypes(rng, dtype):
    args = _binary_inputs(rng, ((2, 1, 4), (3, 1)), dtype)
    names = _binary_names(dtype)
    _check_binary(_binary_fn(names)(*args), names, *args, what=dtype.name)


@pytest.mark.parametrize("name", ARITH + COMPARE)
def test_binary_eager(rng, name):
    x, y, base, p, q = _binary_inputs(rng, ((3, 1), (4,)), F64)
    a, b = {"power": (base, y)}.get(name, (p, q) if name in COMPARE else (x, y))
    check(getattr(snp, name)(a, b), getattr(np, name)(a, b), name)


# operators on traced values: x is (3, 4), y is (4,), W a NumPy constant
W = np.random.default_rng(7).standard_normal((4, 2))
V = np.random.default_rng(8).standard_normal((2, 3))
C = np.random.default_rng(9).standard_normal((3, 4))

OPERATORS = [  # (id, expression, uses an ordering)
    ("x + y", lambda x, y: x + y, False),
    ("x - y", lambda x, y: x - y, False),
    ("x * y", lambda x, y: x * y, False),
    ("x / y", lambda x, y: x / y, False),
    ("abs(x) ** y", lambda x, y: abs(x) ** y, False),
    ("-x", lambda x, y: -x, False),
    ("+x", lambda x, y: +x, False),
    ("abs(x)", lambda x, y: abs(x), False),
    ("2.0 * x", lambda x, y: 2.0 * x, False),
    ("x * 3", lambda x, y: x * 3, False),
    ("x ** 2", lambda x, y: x ** 2, False),
    ("abs(x) ** 0.5", lambda x, y: abs(x) ** 0.5, False),
    ("2.0 ** x", lambda x, y: 2.0 ** x, False),
    ("1 / x", lambda x, y: 1 / x, False),
    ("x / 2", lambda x, y: x / 2, False),
    ("2 - x", lambda x, y: 2 - x, False),
    ("x - 0.5", lambda x, y: x - 0.5, False),
    ("1 + y + x", lambda x, y: 1 + y + x, False),
    ("C * x", lambda x, y: C * x, False),
    ("C + x", lambda x, y: C + x, False),
    ("C - x", lambda x, y: C - x, False),
    ("C / x", lambda x, y: C / x, False),
    ("C ** 2 * x", lambda x, y: C ** 2 * x, False),
    ("x @ W", lambda x, y: x @ W, False),
    ("V @ x", lambda x, y: V @ x, False),
    ("x.T @ x", lambda x, y: x.T @ x, False),
    ("x @ y", lambda x, y: x @ y, False),
    ("x == y", lambda x, y: x == y, False),
    ("x != y", lambda x, y: x != y, False),
    ("x == 1.0", lambda x, y: x == 1.0, False),
    ("C == x", lambda x, y: C == x, False),
    ("x < y", lambda x, y: x < y, True),
    ("x <= 0.5", lambda x, y: x <= 0.5, True),
    ("x > y", lambda x, y: x > y, True),
    ("0.5 >= x", lambda x, y: 0.5 >= x, True),
    ("1 < x", lambda x, y: 1 < x, True),
    ("C < x", lambda x, y: C < x, True),
    ("C >= x", lambda x, y: C >= x, True),
]


@pytest.mark.parametrize("dtype", [F32, F64, C128], ids=dtype_id)
def test_operators(rng, dtype):
    # all the expressions in one compiled function; each is compared on its own
    cases = [(name, f) for name, f, ordered in OPERATORS if not (ordered and dtype.kind == "c")]
    x, y = nonzero(rng, (3, 4), dtype), nonzero(rng, (4,), dtype)
    x[0, :2] = y[:2]  # ties for == and friends
    x[1, 0] = 1.0
    out = compiled(lambda a, b: [f(a, b) for _, f in cases], x, y)
    for (name, f), o in zip(cases, out):
        check(o, f(x, y), name)


# ---------------------------------------------------------------------------
# dtype promotion (NEP 50: Python scalars are weak, NumPy scalars are not)

PROMOTIONS = [  # (id, expression, dtypes of the two inputs)
    ("f32 + python float", lambda m, a, b: m.add(a, 2.5), (F32, F32)),
    ("python float * f32", lambda m, a, b: m.multiply(0.1, a), (F32, F32)),
    ("f32 + f64 array", lambda m, a, b: m.add(a, b), (F32, F64)),
    ("f32 + f64 numpy scalar", lambda m, a, b: m.add(a, np.float64(0.1)), (F32, F32)),
    ("i32 + python float", lambda m, a, b: m.add(a, 2.5), (I32, I32)),
    ("i32 + python int", lambda m, a, b: m.add(a, 3), (I32, I32)),
    ("i32 * i64", lambda m, a, b: m.multiply(a, b), (I32, I64)),
    ("i32 + f32", lambda m, a, b: m.add(a, b), (I32, F32)),
    ("i64 + f32", lambda m, a, b: m.subtract(a, b), (I64, F32)),
    ("f32 * 1j", lambda m, a, b: m.multiply(a, 1j), (F32, F32)),
    ("c64 + f64 array", lambda m, a, b: m.add(a, b), (C64, F64)),
    ("i64 / i64", lambda m, a, b: m.divide(a, b), (I64, I64)),
    ("i32 / python int", lambda m, a, b: m.divide(a, 2), (I32, I32)),
    ("2 ** i32", lambda m, a, b: m.power(2, m.abs(a)), (I32, I32)),
    ("bool + python int", lambda m, a, b: m.add(m.greater(a, 0), 1), (F32, F32)),
    ("i64 // i64", lambda m, a, b: m.floor_divide(a, b), (I64, I64)),
    ("i64 % i64", lambda m, a, b: m.remainder(a, b), (I64, I64)),
    ("f32 < python float", lambda m, a, b: m.less(a, 0.3), (F32, F32)),
    ("f32 maximum f64", lambda m, a, b: m.maximum(a, b), (F32, F64)),
    ("i32 where f32", lambda m, a, b: m.where(m.greater(a, 0), a, b), (I32, F32)),
]


@pytest.mark.parametrize("expr, dtypes", [pytest.param(f, d, id=i) for i, f, d in PROMOTIONS])
def test_dtype_promotion(rng, expr, dtypes):
    a, b = (nonzero(rng, (3,), dt) for dt in dtypes)
    compare(expr, a, b, eager=True)


def test_promotion_headline_cases(rng):
    f32, f64 = rand(rng, (4,), F32), rand(rng, (4,), F64)
    i32, i64 = nonzero(rng, (4,), I32), nonzero(rng, (4,), I64)
    out = compiled(lambda a, b, c, d: (a + 1.5, a + b, c + 1.5, a * 1j, d / d), f32, f64, i32, i64)
    assert [o.dtype for o in out] == [F32, F64, F64, C64, F64]
    eager = (snp.add(f32, 1.5), snp.add(f32, f64), snp.add(i32, 1.5), snp.multiply(f32, 1j),
             snp.divide(i64, i64))
    assert [np.asarray(o).dtype for o in eager] == [F32, F64, F64, C64, F64]
    for o, e in zip(out, (f32 + 1.5, f32 + f64, i32 + 1.5, f32 * 1j, i64 / i64)):
        check(o, e)


# ---------------------------------------------------------------------------
# where, clip, astype


@pytest.mark.parametrize("expr, dtypes", [
    pytest.param(lambda m, c, a, b: m.where(c, a, b), (BOOL, F64, F32), id="3-arg-broadcast"),
    pytest.param(lambda m, c, a, b: m.where(c, a, 0.0), (BOOL, F32, F32), id="python-scalar-y"),
    pytest.param(lambda m, c, a, b: m.where(c, 1, 2.5), (BOOL, F32, F32), id="two-scalars"),
    pytest.param(lambda m, c, a, b: m.where(c, a, b), (I64, C128, F64), id="int-condition"),
    pytest.param(lambda m, c, a, b: m.where(a > 0, a, -a), (BOOL, F64, F64), id="from-compare"),
])
def test_where(rng, expr, dtypes):
    c = rng.integers(0, 2, (4,)).astype(dtypes[0])
    a, b = rand(rng, (3, 4), dtypes[1]), rand(rng, (3, 1), dtypes[2])
    compare(expr, c, a, b, eager=True)


@pytest.mark.parametrize("expr, dtype", [
    pytest.param(lambda m, a, b: m.clip(a, -0.5, 0.5), F64, id="both"),
    pytest.param(lambda m, a, b: m.clip(a, -0.5, 0.5), F32, id="both-f32"),
    pytest.param(lambda m, a, b: m.clip(a, -0.5, None), F64, id="lower"),
    pytest.param(lambda m, a, b: m.clip(a, None, 0.5), F64, id="upper"),
    pytest.param(lambda m, a, b: m.clip(a, max=0.25), F32, id="max-keyword"),
    pytest.param(lambda m, a, b: m.clip(a, b, 1.0), F64, id="array-bound"),
    pytest.param(lambda m, a, b: m.clip(a, 1, 3), I64, id="int"),
    pytest.param(lambda m, a, b: m.clip(a, 0.5, 3), I64, id="int-float-bound"),
])
def test_clip(rng, expr, dtype):
    a = rand(rng, (3, 4), dtype, -4, 4)
    b = rand(rng, (4,), dtype, -1, 0)
    compare(expr, a, b, eager=True)


@pytest.mark.parametrize("src", [F64, C128, I64], ids=dtype_id)
@pytest.mark.parametrize("dst", [F32, F64, C64, I32, BOOL], ids=dtype_id)
def test_astype(rng, src, dst):
    x = rand(rng, (2, 3), src, -4, 4)
    x.flat[0] = 0
    compare(lambda m, a: m.astype(a, dst), x, eager=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        check(compiled(lambda a: a.astype(dst), x), x.astype(dst))


# ---------------------------------------------------------------------------
# reductions

REDUCTIONS = ["sum", "mean", "max", "min", "prod"]
AXES = [None, 0, -1, (0, 2), (-1, 0)]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions(rng, name, axis):
    x = rand(rng, (3, 4, 5), F64, 0.5, 1.5)
    compare(lambda m, a: (getattr(m, name)(a, axis=axis),
                          getattr(m, name)(a, axis=axis, keepdims=True)), x)


@pytest.mark.parametrize("name, dtype", [
    pytest.param(n, d, id=f"{n}-{d.name}") for n in REDUCTIONS for d in (F32, C128, I32, I64, BOOL)
    if not (d.kind == "c" and n in ("max", "min"))])  # those reject complex (tested above)
def test_reduction_dtypes(rng, name, dtype):
    # NumPy's accumulation dtypes: sum/prod of int32 and bool give int64,
    # mean of integers and bools gives float64
    x = rand(rng, (3, 4), dtype, -3, 3) if dtype.kind != "f" else rand(rng, (3, 4), dtype, 0.5, 1.5)
    compare(lambda m, a: (getattr(m, name)(a), getattr(m, name)(a, axis=1, keepdims=True)),
            x, eager=dtype.kind in "bi")


def test_reduction_dtype_argument(rng):
    x = rand(rng, (3, 4), F32)
    i = rand(rng, (3, 4), I32, -3, 3)
    compare(lambda m, a, b: (m.sum(a, dtype=np.float64), m.mean(a, axis=0, dtype=np.float64),
                             m.sum(b, axis=1, dtype=np.float32), m.prod(b, dtype=np.int64),
                             m.mean(b, dtype=np.float32)),
            x, i, eager=True)


@pytest.mark.parametrize("name, dtype", [("sum", I32), ("prod", I32), ("sum", np.dtype(np.int8)),
                                         ("sum", BOOL)], ids=str)
def test_reduction_with_small_integer_dtype(rng, name, dtype):
    x = rand(rng, (3, 4), I32, 1, 3)
    compare(lambda m, a: getattr(m, name)(a, axis=1, dtype=dtype), x)


def test_reduction_methods(rng):
    x = rand(rng, (3, 4), F64)
    check(compiled(lambda a: (a.sum(axis=0), a.mean(), a.max(axis=-1, keepdims=True), a.min(),
                              a.prod(axis=(0, 1))), x),
          (x.sum(axis=0), x.mean(), x.max(axis=-1, keepdims=True), x.min(), x.prod(axis=(0, 1))))


@functools.cache
def _reductions_fn():
    def f(x, axis, keepdims):
        return {n: getattr(snp, n)(x, axis=axis, keepdims=keepdims) for n in REDUCTIONS} | {
            "norm": snp.norm(x, axis=axis if axis is None or isinstance(axis, int) or
                             len(axis) <= 2 else axis[:2], keepdims=keepdims)}
    return sd.function(f, static_argnames=("axis", "keepdims"))


@HYPOTHESIS
@given(data=st.data())
def test_reductions_random_shapes(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), label="shape")
    axis = data.draw(st.none() | hnp.valid_tuple_axes(len(shape), min_size=1) |
                     st.integers(-len(shape), len(shape) - 1), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x = rand(rng, shape, F64, 0.5, 1.5)
    out = _reductions_fn()(x, axis=axis, keepdims=keepdims)
    for n in REDUCTIONS:
        check(out[n], getattr(np, n)(x, axis=axis, keepdims=keepdims), n)
    norm_axis = axis if axis is None or isinstance(axis, int) or len(axis) <= 2 else axis[:2]
    check(out["norm"], np.linalg.norm(x, axis=norm_axis, keepdims=keepdims), "norm")


VECTOR_ORDS = [None, 1, 2, np.inf, -np.inf, 0, 3]


@pytest.mark.parametrize("dtype", [F32, F64, C128, I64], ids=dtype_id)
def test_vector_norm(rng, dtype):
    x = rand(rng, (7,), dtype, -3, 3)
    x[2] = 0  # ord=0 counts the nonzeros
    out = compiled(lambda a: [(snp.norm(a, ord=o), snp.norm(a, ord=o, keepdims=True))
                              for o in VECTOR_ORDS], x)
    for o, got in zip(VECTOR_ORDS, out):
        check(got, (np.linalg.norm(x, ord=o), np.linalg.norm(x, ord=o, keepdims=True)),
              f"ord={o}")
        check(snp.norm(x, ord=o), np.linalg.norm(x, ord=o), f"eager ord={o}")


@pytest.mark.parametrize("axis", [0, -1, 1])
def test_vector_norm_along_axis_of_matrix(rng, axis):
    x = rand(rng, (3, 4), F64)
    ords = [None, 1, np.inf, 0, 3]
    out = compiled(lambda a: [(snp.norm(a, ord=o, axis=axis),
                               snp.norm(a, ord=o, axis=axis, keepdims=True)) for o in ords], x)
    for o, got in zip(ords, out):
        check(got, (np.linalg.norm(x, ord=o, axis=axis),
                    np.linalg.norm(x, ord=o, axis=axis, keepdims=True)), f"ord={o}")


MATRIX_ORDS = [None, "fro", 1, -1, np.inf, -np.inf]


@pytest.mark.parametrize("ord", MATRIX_ORDS, ids=str)
def test_matrix_norm(rng, ord):
    x = rand(rng, (4, 3), F64)
    axes = [None, (0, 1), (1, 0), (-1, -2)]
    out = compiled(lambda a: [(snp.norm(a, ord=ord, axis=ax),
                               snp.norm(a, ord=ord, axis=ax, keepdims=True)) for ax in axes], x)
    for ax, got in zip(axes, out):
        check(got, (np.linalg.norm(x, ord=ord, axis=ax),
                    np.linalg.norm(x, ord=ord, axis=ax, keepdims=True)), f"axis={ax}")


@pytest.mark.parametrize("ord", MATRIX_ORDS, ids=str)
def test_matrix_norm_complex_and_eager(rng, ord):
    x = rand(rng, (3, 5), C128)
    expected = np.linalg.norm(x, ord=ord)
    check(compiled(lambda a: snp.norm(a, ord=ord), x), expected)
    check(snp.norm(x, ord=ord, axis=(0, 1)), np.linalg.norm(x, ord=ord, axis=(0, 1)), "eager")


def test_norm_of_3d_array(rng):
    x = rand(rng, (2, 3, 4), F64)
    check(compiled(lambda a: (snp.norm(a), snp.norm(a, keepdims=True), snp.norm(a, axis=1),
                              snp.norm(a, ord=1, axis=(0, 2)),
                              snp.norm(a, ord=-np.inf, axis=(2, 1), keepdims=True)), x),
          (np.linalg.norm(x), np.linalg.norm(x, keepdims=True), np.linalg.norm(x, axis=1),
           np.linalg.norm(x, ord=1, axis=(0, 2)),
           np.linalg.norm(x, ord=-np.inf, axis=(2, 1), keepdims=True)))


def test_norm_rejects_singular_value_orders(rng):
    with pytest.raises(sd.errors.NotSupportedError, match="singular values"):
        sd.function(lambda a: snp.norm(a, ord=2))(rand(rng, (3, 3), F64))


# ---------------------------------------------------------------------------
# shapes

SHAPE_CASES = [  # (id, expression, input shapes, dtype)
    ("reshape", lambda m, a: m.reshape(a, (4, 6)), [(2, 3, 4)], F64),
    ("reshape-infer", lambda m, a: m.reshape(a, (4, -1)), [(2, 3, 4)], F64),
    ("reshape-int", lambda m, a: m.reshape(a, -1), [(2, 3, 4)], C128),
    ("reshape-method", lambda m, a: m.ravel(a.reshape(-1, 2, 3)[0]), [(2, 3, 4)], F32),
    ("ravel", lambda m, a: m.ravel(a), [(2, 3, 4)], F64),
    ("ravel-of-transpose", lambda m, a: m.ravel(a.T), [(2, 3, 4)], F64),
    ("transpose", lambda m, a: m.transpose(a), [(2, 3, 4)], F64),
    ("transpose-axes", lambda m, a: m.transpose(a, (1, -1, 0)), [(2, 3, 4)], F64),
    ("transpose-method", lambda m, a: m.negative(a.transpose(2, 0, 1)), [(2, 3, 4)], F64),
    (".T", lambda m, a: m.negative(a.T), [(2, 3, 4)], F64),
    (".mT", lambda m, a: m.negative(a.mT), [(2, 3, 4)], F64),
    ("swapaxes", lambda m, a: m.swapaxes(a, 0, -1), [(2, 3, 4)], F64),
    ("moveaxis", lambda m, a: m.moveaxis(a, 0, -1), [(2, 3, 4)], F64),
    ("moveaxis-tuples", lambda m, a: m.moveaxis(a, (0, 1), (2, 0)), [(2, 3, 4)], F64),
    ("broadcast_to", lambda m, a: m.broadcast_to(a, (5, 3, 4)), [(3, 1)], F64),
    ("broadcast_to-int-shape", lambda m, a: m.broadcast_to(a, 4), [(1,)], F64),
    ("expand_dims-int", lambda m, a: m.expand_dims(a, 1), [(3, 4)], F64),
    ("expand_dims-tuple", lambda m, a: m.expand_dims(a, (0, -1)), [(3, 4)], F64),
    ("squeeze", lambda m, a: m.squeeze(a), [(1, 3, 1, 2)], F64),
    ("squeeze-axis", lambda m, a: m.squeeze(a, axis=-2), [(1, 3, 1, 2)], F64),
    ("squeeze-axes", lambda m, a: m.squeeze(a, axis=(0, 2)), [(1, 3, 1, 2)], F64),
    ("concatenate-0", lambda m, a, b: m.concatenate([a, b], axis=0), [(2, 3), (4, 3)], F64),
    ("concatenate-1", lambda m, a, b: m.concatenate([b.T, a.T, b.T], axis=1),
     [(2, 3), (4, 3)], F64),
    ("concatenate--1", lambda m, a, b: m.concatenate((a.T, b.T), axis=-1), [(2, 3), (4, 3)],
     F64),
    ("concatenate-None", lambda m, a, b: m.concatenate([a, b], axis=None), [(2, 3), (4,)], F64),
    ("concatenate-mixed", lambda m, a, b: m.concatenate([a, b.astype(np.int32)]),
     [(3,), (2,)], F32),
    ("concatenate-complex", lambda m, a, b: m.concatenate([a, b * 1j]), [(3,), (2,)], F64),
    ("stack-0", lambda m, a, b: m.stack([a, b, a]), [(3, 4), (3, 4)], F64),
    ("stack--1", lambda m, a, b: m.stack([a, b], axis=-1), [(3, 4), (3, 4)], F64),
    ("stack-mixed", lambda m, a, b: m.stack([a, b.astype(np.float32)], axis=1),
     [(3, 4), (3, 4)], C128),
    ("pad-int", lambda m, a: m.pad(a, 1), [(2, 3)], F64),
    ("pad-pair", lambda m, a: m.pad(a, (1, 2)), [(2, 3)], F64),
    ("pad-per-axis", lambda m, a: m.pad(a, ((0, 1), (2, 0))), [(2, 3)], F64),
    ("pad-constant", lambda m, a: m.pad(a, ((1, 1), (0, 2)), constant_values=2.5), [(2, 3)],
     F32),
    ("pad-int-array", lambda m, a: m.pad(a.astype(np.int64), 2, constant_values=7), [(4,)],
     F64),
    ("roll-None", lambda m, a: m.roll(a, 5), [(2, 3, 4)], F64),
    ("roll-int", lambda m, a: m.roll(a, -2, axis=1), [(2, 3, 4)], F64),
    ("roll-big", lambda m, a: m.roll(a, 11, axis=-1), [(2, 3, 4)], F64),
    ("roll-tuple", lambda m, a: m.roll(a, (1, -3), axis=(0, 2)), [(2, 3, 4)], F64),
    ("roll-tuple-one-shift", lambda m, a: m.roll(a, 2, axis=(0, 2)), [(2, 3, 4)], C128),
    ("diff", lambda m, a: m.diff(a), [(3, 5)], F64),
    ("diff-n2", lambda m, a: m.diff(a, n=2), [(3, 5)], F64),
    ("diff-axis", lambda m, a: m.diff(a, axis=0), [(3, 5)], F64),
    ("diff-n2-axis", lambda m, a: m.diff(a, n=2, axis=0), [(4, 5)], C128),
    ("diff-int", lambda m, a: m.diff(a.astype(np.int64) ** 2), [(6,)], F64),
    ("diff-bool", lambda m, a: m.diff(a > 0), [(6,)], F64),
]


@pytest.mark.parametrize("expr, shapes, dtype",
                         [pytest.param(f, s, d, id=i) for i, f, s, d in SHAPE_CASES])
def test_shapes(rng, expr, shapes, dtype):
    args = [rand(rng, s, dtype, -3, 3) for s in shapes]
    compare(expr, *args, eager=True)


# ---------------------------------------------------------------------------
# creation

CREATION = [  # (id, expression)
    ("zeros", lambda m: m.zeros((2, 3))),
    ("zeros-int32", lambda m: m.zeros(3, dtype=np.int32)),
    ("ones", lambda m: m.ones((2, 3))),
    ("ones-f32", lambda m: m.ones(4, np.float32)),
    ("full-float", lambda m: m.full((2, 3), 1.5)),
    ("full-int", lambda m: m.full(3, 7)),
    ("full-complex", lambda m: m.full((2,), 1 + 2j)),
    ("full-dtype", lambda m: m.full((2,), 2, dtype=np.float32)),
    ("arange-int", lambda m: m.arange(5)),
    ("arange-start-stop-step", lambda m: m.arange(2, 11, 3)),
    ("arange-negative-step", lambda m: m.arange(5, -3, -2)),
    ("arange-float-step", lambda m: m.arange(0, 1, 0.1)),
    ("arange-float-negative-step", lambda m: m.arange(1.0, -1.0, -0.3)),
    ("arange-float-start", lambda m: m.arange(1.5, 4)),
    ("arange-dtype", lambda m: m.arange(0, 5, dtype=np.float32)),
    ("arange-empty", lambda m: m.arange(5, 1)),
    ("arange-float-stop", lambda m: m.arange(5.0)),
    ("arange-float-stop-2", lambda m: m.arange(0, 2.5)),
    ("linspace", lambda m: m.linspace(0, 1, 7)),
    ("linspace-no-endpoint", lambda m: m.linspace(-2.0, 3, 6, endpoint=False)),
    ("linspace-f32", lambda m: m.linspace(0, 1, 5, dtype=np.float32)),
    ("linspace-one", lambda m: m.linspace(2, 3, 1)),
    ("linspace-complex", lambda m: m.linspace(0, 1 + 1j, 4)),
    ("linspace-int-dtype", lambda m: m.linspace(-5, 5, 4, dtype=np.int64)),
    ("eye", lambda m: m.eye(3)),
    ("eye-M-k", lambda m: m.eye(3, 5, k=1)),
    ("eye-negative-k", lambda m: m.eye(4, 2, k=-1)),
    ("eye-int", lambda m: m.eye(3, dtype=np.int32)),
]


def _creation_params():
    for case in CREATION:
        if hasattr(case, "marks"):  # already a pytest.param
            yield pytest.param(case.values[1], id=case.values[0], marks=case.marks)
        else:
            yield pytest.param(case[1], id=case[0])


@pytest.mark.parametrize("make", list(_creation_params()))
def test_creation(rng, make):
    expected = make(np)
    x = rand(rng, (), F64)
    out, shifted = compiled(lambda a: (make(snp), a + make(snp)), x)
    check(out, expected, "compiled")
    check(shifted, x + expected, "compiled, plus a traced input")
    check(make(snp), expected, "eager")


@pytest.mark.parametrize("dtype", [F32, I64, C128], ids=dtype_id)
@pytest.mark.parametrize("make", [
    pytest.param(lambda m, a: m.zeros_like(a), id="zeros_like"),
    pytest.param(lambda m, a: m.ones_like(a), id="ones_like"),
    pytest.param(lambda m, a: m.full_like(a, 2.7), id="full_like"),
    pytest.param(lambda m, a: m.full_like(a, 3, dtype=np.float64), id="full_like-dtype"),
    pytest.param(lambda m, a: m.zeros_like(a, shape=(3,)), id="zeros_like-shape"),
])
def test_creation_like(rng, make, dtype):
    x = rand(rng, (2, 3), dtype)
    compare(lambda m, a: (make(m, a), m.add(a, make(m, a))), x, eager=True)


def test_full_with_traced_fill_value(rng):
    v = rand(rng, (), F32)
    compare(lambda m, a: m.full((2, 3), a), v)


# ---------------------------------------------------------------------------
# contractions

A34, B45, V4 = (3, 4), (4, 5), (4,)
CONTRACTIONS = [  # (id, expression, input shapes, dtype)
    ("matmul-1d-1d", lambda m, a, b: m.matmul(a, b), [V4, V4], F64),
    ("matmul-1d-2d", lambda m, a, b: m.matmul(a, b), [V4, B45], F64),
    ("matmul-2d-1d", lambda m, a, b: m.matmul(a, b), [A34, V4], F64),
    ("matmul-2d-2d-f32", lambda m, a, b: m.matmul(a, b), [A34, B45], F32),
    ("matmul-2d-2d-c128", lambda m, a, b: m.matmul(a, b), [A34, B45], C128),
    ("matmul-3d-2d", lambda m, a, b: m.matmul(a, b), [(2, 3, 4), B45], F64),
    ("matmul-batch-broadcast", lambda m, a, b: m.matmul(a, b), [(2, 1, 3, 4), (5, 4, 2)], F64),
    ("matmul-mixed-dtype", lambda m, a, b: m.matmul(a.astype(np.float32), b.astype(np.int64)),
     [A34, B45], F64),
    ("dot-2d", lambda m, a, b: m.dot(a, b), [A34, B45], C128),
    ("dot-1d", lambda m, a, b: m.dot(a, b), [V4, V4], F64),
    ("dot-nd", lambda m, a, b: m.dot(a, b), [(2, 3, 4), (5, 4, 2)], F64),
    ("dot-1d-3d", lambda m, a, b: m.dot(a, b), [V4, (5, 4, 2)], F64),
    ("dot-scalar", lambda m, a, b: m.dot(a, 2.0), [A34, V4], F32),
    ("vdot-complex", lambda m, a, b: m.vdot(a, b), [A34, A34], C128),
    ("vdot-real", lambda m, a, b: m.vdot(a, b), [A34, (4, 3)], F64),
    ("inner", lambda m, a, b: m.inner(a, b), [A34, (2, 5, 4)], F64),
    ("inner-complex", lambda m, a, b: m.inner(a, b), [V4, V4], C128),
    ("outer", lambda m, a, b: m.outer(a, b), [A34, V4], F64),
    ("tensordot-int", lambda m, a, b: m.tensordot(a, b, 1), [A34, B45], F64),
    ("tensordot-default", lambda m, a, b: m.tensordot(a, b), [(2, 3, 4), (3, 4, 5)], F64),
    ("tensordot-0", lambda m, a, b: m.tensordot(a, b, 0), [A34, V4], F64),
    ("tensordot-pairs", lambda m, a, b: m.tensordot(a, b, axes=([0, 2], [1, 0])),
     [(2, 3, 4), (4, 2, 5)], F64),
    ("tensordot-int-pair", lambda m, a, b: m.tensordot(a, b, axes=(1, 0)), [A34, B45], C128),
    ("einsum-explicit", lambda m, a, b: m.einsum("ij,jk->ik", a, b), [A34, B45], F64),
    ("einsum-implicit", lambda m, a, b: m.einsum("ij,jk", a, b), [A34, B45], F64),
    ("einsum-implicit-order", lambda m, a, b: m.einsum("jk,ij", a, b), [B45, A34], F64),
    ("einsum-implicit-transpose", lambda m, a, b: m.einsum("ji", a), [A34, V4], F64),
    ("einsum-trace", lambda m, a, b: m.einsum("ii->", a), [(4, 4), V4], F64),
    ("einsum-trace-implicit", lambda m, a, b: m.einsum("ii", a), [(4, 4), V4], C128),
    ("einsum-diagonal", lambda m, a, b: m.einsum("ii->i", a), [(4, 4), V4], F64),
    ("einsum-3-operands", lambda m, a, b: m.einsum("ij,jk,kl->il", a, b, b.T), [A34, B45],
     F64),
    ("einsum-3-mixed", lambda m, a, b: m.einsum("ij,jk,k->i", a.astype(np.float32), b,
                                                np.arange(5)), [A34, B45], F64),
]


@pytest.mark.parametrize("expr, shapes, dtype",
                         [pytest.param(f, s, d, id=i) for i, f, s, d in CONTRACTIONS])
def test_contractions(rng, expr, shapes, dtype):
    args = [rand(rng, s, dtype) for s in shapes]
    compare(expr, *args, eager=True)


def test_vdot_conjugates_the_first_argument(rng):
    a, b = rand(rng, (3,), C128), rand(rng, (3,), C128)
    out = compiled(lambda x, y: (snp.vdot(x, y), snp.vdot(y, x)), a, b)
    check(out[0], np.sum(np.conj(a) * b))
    check(out[1], np.sum(np.conj(b) * a))
    assert abs(complex(out[0]) - complex(out[1])) > 1e-3  # really not symmetric


# ---------------------------------------------------------------------------
# indexing

GET_INDICES = [
    0, -1, (1, 2), (-1, -2, -3), slice(None, None, -1), slice(5, 1, -2), slice(1, None, 2),
    (slice(None), slice(4, 0, -3)), (Ellipsis, 0), (None, 1), (slice(None), None, 2),
    (0, Ellipsis, None, slice(None, None, -2)), (Ellipsis,), (slice(-100, 100),),
    (slice(3, 1),), (1, slice(None, None, -2), -1), (None, Ellipsis, None),
    (slice(None, -100, -1),), (slice(2, -100, -1),), (slice(100, None, -1),),
    (slice(-3, None, -1), 1), (snp.newaxis, Ellipsis, slice(1, -1)),
]


@pytest.mark.parametrize("idx", GET_INDICES, ids=repr)
def test_getitem(rng, idx):
    x = rand(rng, (4, 5, 6), F64)
    check(compiled(lambda a: a[idx], x), x[idx])


@pytest.mark.parametrize("idx", [slice(-100, None, -1), slice(-5, None, -1)], ids=repr)
def test_getitem_negative_step_from_before_the_start(rng, idx):
    x = rand(rng, (4,), F64)
    check(compiled(lambda a: a[idx], x), x[idx])


def _np_set(x, idx, v):
    x = x.copy()
    x[idx] = v
    return x


def _np_add(x, idx, v):
    x = x.copy()
    x[idx] += v
    return x


AT_INDICES = [0, -1, (1, 2), (-1, slice(None, None, 2)), slice(None, None, -1),
              slice(3, 0, -2), (Ellipsis, 1), (None, 1), (slice(1, 3), None, -2),
              (Ellipsis, slice(4, None, -3))]


@pytest.mark.parametrize("idx", AT_INDICES, ids=repr)
def test_at_set_and_add(rng, idx):
    x = rand(rng, (4, 5, 6), F64)
    target = x[idx].shape
    v = rand(rng, target[-1:], F64)  # broadcast along the leading axes
    out = compiled(lambda a, w: (a.at[idx].set(w), a.at[idx].add(w), a.at[idx].set(2.5),
                                 a.at[idx].add(-1), a.at[idx].set(v)), x, v)
    check(out[0], _np_set(x, idx, v), "set")
    check(out[1], _np_add(x, idx, v), "add")
    check(out[2], _np_set(x, idx, 2.5), "set scalar")
    check(out[3], _np_add(x, idx, -1), "add scalar")
    check(out[4], _np_set(x, idx, v), "set constant")


def test_at_updates_cast_to_the_array_dtype(rng):
    i = np.arange(10)
    f = rand(rng, (10,), F32)
    z = rand(rng, (3,), C128)
    out = compiled(lambda a, b, c: (a.at[2:5].set(2.7), b.at[::2].add(1.0),
                                    b.at[None, 1:3].set(np.ones((1, 2))), c.at[1].set(1 + 2j),
                                    c.at[::-1].add(b[:3]), a.at[-1].add(3)), i, f, z)
    check(out[0], _np_set(i, slice(2, 5), 2.7))
    check(out[1], _np_add(f, slice(None, None, 2), 1.0))
    check(out[2], _np_set(f, (None, slice(1, 3)), np.ones((1, 2))))
    check(out[3], _np_set(z, 1, 1 + 2j))
    check(out[4], _np_add(z, slice(None, None, -1), f[:3]))
    check(out[5], _np_add(i, -1, 3))


def test_iteration_and_len_of_tracers(rng):
    x = rand(rng, (3, 2), F64)
    check(compiled(lambda a: snp.stack([r * k for k, r in enumerate(a)] + [a[len(a) - 1]]), x),
          np.stack([r * k for k, r in enumerate(x)] + [x[len(x) - 1]]))


# ---------------------------------------------------------------------------
# NumPy functions on tracers dispatch to sciad.numpy


def test_numpy_functions_on_tracers_run_sciad(rng):
    x = rand(rng, (3, 4), F64, 0.1, 2)
    f = lambda a: (np.sin(a), np.sqrt(a), np.abs(-a), np.sum(a, axis=0), np.mean(a),  # noqa
                   np.linalg.norm(a, 1), np.where(a > 1, a, 0.0), np.reshape(a, (2, 6)),
                   np.concatenate([a, C]), np.power(a, 2), np.maximum(a, 1.0),
                   np.conjugate(a), np.max(a, axis=1))
    check(compiled(f, x), f(x))


@pytest.mark.parametrize("f", [
    pytest.param(lambda a: np.cumprod(a), id="cumprod"),
    pytest.param(lambda a: np.add.reduce(a), id="ufunc-method"),
    pytest.param(lambda a: np.sin(a, out=np.empty(3)), id="out-argument"),
    pytest.param(lambda a: np.asarray(a), id="asarray"),
])
def test_numpy_functions_without_sciad_equivalent_raise_tracer_error(rng, f):
    with pytest.raises(TracerError, match="sciad|snp"):
        sd.function(f)(rand(rng, (3,), F64))


def test_dispatch_is_by_numpy_function_not_by_name(rng):
    # numpy.emath.sqrt is called `sqrt` too, but returns complex numbers for
    # negative input: it must not run snp.sqrt (NaN there)
    x = np.array([-4.0, 1.0, 9.0])
    with pytest.raises(TracerError) as excinfo:
        sd.function(lambda a: np.emath.sqrt(a))(x)
    text = str(excinfo.value)
    assert "numpy.emath.sqrt has no sciad equivalent" in text
    assert "snp.sqrt(snp.astype(x, complex))" in text
    assert THIS_FILE in text
    np.testing.assert_allclose(
        sd.function(lambda a: snp.sqrt(snp.astype(a, complex)))(x), np.emath.sqrt(x))

    # the aliases NumPy gives one function object, and numpy.fft, still dispatch
    y = rand(rng, (2, 4), F64, 0.1, 2)
    f = lambda a: (np.sqrt(a), np.sum(a, axis=1), np.fft.rfft(a), np.absolute(-a),  # noqa
                   np.abs(-a), np.conj(a), np.true_divide(a, 3.0), np.mod(a, 0.7),
                   np.amax(a, axis=0), np.amin(a), np.bitwise_not(a > 1), a @ np.ones(4),
                   np.matmul(np.ones(2), a))
    check(compiled(f, y), f(y))
    g = sd.trace(f, y)
    assert {n.primitive.name for n in g.nodes} >= {"sqrt", "reduce_sum", "fft", "abs",
                                                   "div", "remainder", "reduce_max",
                                                   "reduce_min", "invert", "matmul"}


def sqrt(x):
    """Another library's `sqrt`, dispatched the NumPy way (NEP 18)."""
    return x.__array_function__(sqrt, (type(x),), (x,), {})


def test_a_foreign_function_named_like_a_numpy_one_is_not_run_as_it(rng):
    with pytest.raises(TracerError) as excinfo:
        sd.trace(lambda a: sqrt(a), rand(rng, (3,), F64, 0.1, 2))
    text = str(excinfo.value)
    assert f"{__name__}.sqrt has no sciad equivalent" in text
    assert "`snp.sqrt` implements `numpy.sqrt`, which is a different function" in text


def test_numpy_arguments_are_bound_by_numpys_signature(rng):
    x = rand(rng, (3, 4), F64)
    # positionally, NumPy's fourth argument of `sum` is `out`, sciad's `keepdims`
    f = lambda a: (np.sum(a, 0, None, None, True), np.mean(a, 1, keepdims=True),  # noqa
                   np.reshape(a, shape=(4, 3)), np.einsum("ij->j", a, optimize=True),
                   np.pad(a, 1, constant_values=2.0), np.clip(a, -1.0, 1.0))
    check(compiled(f, x), f(x))
    for bad, shown in [(lambda a: np.concatenate([a, a], dtype=np.float32), "`dtype`"),
                       (lambda a: np.sin(a, dtype=np.float32), "`dtype`")]:
        with pytest.raises(TracerError, match=f"runs `sciad.numpy.[a-z]+`, which does "
                                              f"not support {shown}"):
            sd.trace(bad, x)
    with pytest.raises(TracerError, match="numpy.linalg.solve has no sciad equivalent.*"
                                          "sd.linalg.solve"):
        sd.trace(lambda a: np.linalg.solve(a[:, :3], a[:, 3]), x)


def test_every_numpy_namesake_is_dispatched_or_left_out_on_purpose():
    from sciad._numpy_interop import NUMPY_FUNCTIONS
    from sciad.graph._trace import _numpy_dispatch

    # not dispatched: `norm` is `numpy.linalg.norm` (dispatched as such);
    # `array`'s first parameter is `object`, and a traced value never reaches it
    left_out = {"norm", "array"}
    public = {k for k, v in vars(snp).items() if callable(v) and not k.startswith("_")
              and getattr(v, "__module__", None) == "sciad.numpy"}
    namesakes = {k for k in public if callable(getattr(np, k, None))}
    for name in sorted(namesakes - left_out):
        assert _numpy_dispatch.get(getattr(np, name)) is getattr(snp, name), name
    assert set(NUMPY_FUNCTIONS) <= namesakes
    assert _numpy_dispatch[np.linalg.norm] is snp.norm
    for name in sd.fft.__all__:
        assert _numpy_dispatch[getattr(np.fft, name)] is getattr(sd.fft, name)
    assert all(not isinstance(k, str) for k in _numpy_dispatch)


# ---------------------------------------------------------------------------
# errors


def _bad_matmul(a, b):
    return a @ b


_BAD_MATMUL_LINE = _bad_matmul.__code__.co_firstlineno + 1


def test_matmul_shape_error_names_types_and_user_line():
    fn = sd.function(_bad_matmul)
    with pytest.raises(ShapeError, match=r"matmul.*f64\[3,4\].*f64\[5,2\]") as excinfo:
        fn(np.ones((3, 4)), np.ones((5, 2)))
    message = str(excinfo.value)
    assert "matmul" in message
    assert "f64[3,4]" in message and "f64[5,2]" in message
    assert f"{THIS_FILE}:{_BAD_MATMUL_LINE}" in message
    assert fn.trace_count == 0  # failed at trace time, nothing compiled


def test_broadcast_shape_error_names_both_types():
    with pytest.raises(ShapeError, match=r"f64\[3\].*f64\[4\]") as excinfo:
        sd.function(lambda a, b: a + b)(np.ones(3), np.ones(4))
    assert "add" in str(excinfo.value)
    assert THIS_FILE in str(excinfo.value)
    with pytest.raises(ShapeError, match=r"f64\[2,3\].*f64\[4\]"):
        snp.multiply(np.ones((2, 3)), np.ones(4))  # eagerly


@pytest.mark.parametrize("f", [
    pytest.param(lambda a: a.reshape(4, 2), id="explicit"),
    pytest.param(lambda a: snp.reshape(a, (4, -1)), id="inferred"),
    pytest.param(lambda a: snp.reshape(a, (-1, -1)), id="two-unknowns"),
])
def test_reshape_to_wrong_size_raises_shape_error(f):
    with pytest.raises(ShapeError, match="reshape"):
        sd.function(f)(np.ones(6))


@pytest.mark.parametrize("f", [
    pytest.param(lambda a: a[3], id="past-the-end"),
    pytest.param(lambda a: a[-4], id="negative"),
    pytest.param(lambda a: a[0, 0], id="too-many-indices"),
    pytest.param(lambda a: a.at[5].set(0.0), id="at-set"),
])
def test_index_out_of_bounds_raises_indexing_error(f):
    with pytest.raises(IndexingError, match="out of bounds|too many"):
        sd.function(f)(np.ones(3))


def test_index_error_names_the_user_line():
    with pytest.raises(IndexingError) as excinfo:
        sd.function(lambda a: a[3])(np.ones(3))
    assert THIS_FILE in str(excinfo.value)


@pytest.mark.parametrize("f", [
    pytest.param(lambda a: a[a > 0], id="traced-mask"),
    pytest.param(lambda a: a[a[0]], id="traced-float-scalar"),
    pytest.param(lambda a: a[np.array([0.0, 2.0])], id="float-array"),
    pytest.param(lambda a: a[snp.ones(2)], id="traced-float-array"),
])
def test_advanced_indexing_raises_indexing_error(f):
    with pytest.raises(IndexingError):
        sd.function(f)(np.ones(3))


def test_python_control_flow_on_tracer_raises_tracer_error():
    def f(x):
        if snp.sum(x) > 0:
            return x
        return -x

    with pytest.raises(TracerError, match="sd.cond") as excinfo:
        sd.function(f)(np.ones(3))
    assert THIS_FILE in str(excinfo.value)


# ---------------------------------------------------------------------------
# NumPy's corner cases: wide Python ints, bitwise operators, integer division by zero


def test_out_of_range_python_int_raises_like_numpy():
    x = np.arange(3, dtype=np.int32)
    with pytest.raises(OverflowError):
        x + 2**40
    with pytest.raises(DTypeError, match=r"add.*2\*\*40|add.*1099511627776.*out of bounds"):
        sd.function(lambda a: a + 2**40)(x)
    with pytest.raises(DTypeError, match="out of bounds for uint8"):
        sd.function(lambda a: -3 * a)(x.astype(np.uint8))


def test_comparison_with_out_of_range_python_int():
    x = np.arange(3, dtype=np.int32)
    u = np.arange(3, dtype=np.uint8)
    out = compiled(lambda a, b: (a < 2**40, b < -3, 2**40 <= a, -3 != b, b == 300), x, u)
    check(out, (x < 2**40, u < -3, 2**40 <= x, -3 != u, u == 300))


def test_bitwise_operators_on_integers():
    a, b = np.array([3, 6, 0]), np.array([5, 3, 1])
    out = compiled(lambda x, y: (~x, x & y, x | y, x ^ y, 6 & y, ~(x > 2) | (y > 2)), a, b)
    check(out, (~a, a & b, a | b, a ^ b, 6 & b, ~(a > 2) | (b > 2)))


def test_integer_floor_divide_by_zero():
    a, b = np.array([-7, 7, 0]), np.zeros(3, np.int64)
    with np.errstate(divide="ignore"):
        expected = a // b
    with np.errstate(divide="ignore"):
        expected_mod = a % b
    check(compiled(lambda x, y: (x // y, x % y), a, b), (expected, expected_mod))


@pytest.mark.parametrize("name, x", [("conj", np.array([True, False])),
                                     ("angle", np.array([0, 3], np.uint8))])
def test_small_dtype_corners(name, x):
    check(compiled(getattr(snp, name), x), getattr(np, name)(x))


# ---------------------------------------------------------------------------
# integer-array indexing, scatters, running sums, sorting

_A345 = np.random.default_rng(7).standard_normal((3, 4, 5))


@pytest.mark.parametrize("index", [
    pytest.param(([2, 0, 2],), id="list"),
    pytest.param((slice(None), np.array([1, -1])), id="second-axis-negative"),
    pytest.param((Ellipsis, np.array([[0, 4], [1, 1]])), id="2d-last-axis"),
    pytest.param((1, np.array([0, 2])), id="int-then-array"),
    pytest.param((np.array([0, 2]), 1), id="array-then-int"),
    pytest.param((np.array([1, 0]), slice(None), 2), id="apart-moves-to-front"),
    pytest.param((1, slice(1, 3), np.array([[0], [3]])), id="apart-2d"),
    pytest.param((None, slice(None), [3, 0]), id="new-axis"),
    pytest.param((np.array([True, False, True]),), id="mask"),
    pytest.param((slice(None, None, -1), np.array([], np.int64)), id="empty"),
])
def test_integer_array_index_matches_numpy(index):
    out = sd.function(lambda a: a[index])(_A345)
    want = _A345[index]
    assert out.shape == want.shape
    np.testing.assert_array_equal(out, want)


def test_traced_integer_array_index_matches_numpy():
    i = np.array([[3, -1], [0, 2]])
    f = sd.function(lambda a, i: (a[:, i], a[0, :, i], snp.take(a, i), a.at[1, i].get()))
    for got, want in zip(f(_A345, i), (_A345[:, i], _A345[0, :, i], np.take(_A345, i),
                                       _A345[1, i])):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["wrap", "clip"])
def test_take_modes_match_numpy(mode):
    i = np.array([-7, -1, 0, 4, 9])
    want = np.take(_A345, i, axis=1, mode=mode)
    np.testing.assert_array_equal(sd.function(
        lambda a, i: snp.take(a, i, axis=1, mode=mode))(_A345, i), want)
    np.testing.assert_array_equal(sd.function(
        lambda a: snp.take(a, i, axis=1, mode=mode))(_A345), want)


def test_out_of_bounds_integer_array_index_raises():
    # concrete indices when traced, traced ones when they run; never a clamp
    with pytest.raises(IndexingError, match="index 4 is out of bounds") as excinfo:
        sd.function(lambda a: a[:, [0, 4]])(_A345)
    assert THIS_FILE in str(excinfo.value)
    f = sd.function(lambda a, i: snp.take(a, i, axis=2) * 2.0)
    with pytest.raises(IndexingError, match="index -6 is out of bounds.*size 5") as excinfo:
        f(_A345, np.array([1, -6]))
    assert THIS_FILE in str(excinfo.value)
    np.testing.assert_array_equal(f(_A345, np.array([1, -5])), 2 * _A345[..., [1, 0]])
    with pytest.raises(IndexingError, match="out of bounds"):
        sd.grad(lambda a, i: snp.sum(a[i] ** 2))(_A345, np.array([3]))


def test_scatter_add_accumulates_repeated_indices():
    i = np.array([4, 1, 4, 4])
    v = np.arange(12.0).reshape(3, 4)
    want = _A345[:, 0].copy()
    np.add.at(want, (slice(None), i), v)
    f = sd.function(lambda a, v, i: a[:, 0].at[:, i].add(v))
    np.testing.assert_allclose(f(_A345, v, i), want, rtol=1e-15)
    # the cotangent of v is the output's cotangent taken at the indices, repeats included
    g = sd.grad(lambda v, w: snp.sum(w * snp.zeros((3, 5)).at[:, i].add(v)))(v, _A345[:, 0])
    np.testing.assert_array_equal(g, _A345[:, 0][:, i])
    sd.testing.check_rules(lambda a, v: a.at[:, i].add(snp.sin(v)), _A345[:, 0], v)


def test_scatter_set_matches_numpy_and_refuses_repeats():
    a = _A345[0]
    want = a.copy()
    want[[2, 0, -1]] = 7.0
    np.testing.assert_array_equal(sd.function(lambda a: a.at[[2, 0, -1]].set(7.0))(a), want)
    with pytest.raises(IndexingError, match="distinct.*1 index value repeats"):
        sd.function(lambda a: a.at[[3, 0, -4]].set(7.0))(a)  # -4 is 0 again
    f = sd.function(lambda a, i: a.at[i].set(snp.zeros((2, 5))))
    with pytest.raises(IndexingError, match="distinct.*index 1 repeats"):
        f(a, np.array([1, 1]))
    np.testing.assert_array_equal(f(a, np.array([1, 2]))[1:3], 0.0)
    # the overwritten entries of x get no cotangent; v's are taken at the indices
    sd.testing.check_rules(lambda x, v: x.at[:, [4, 0]].set(v * x[:, :2]), a, a[:, :2])


def test_index_updates_refuse_what_they_cannot_do():
    with pytest.raises(IndexingError, match="full slices"):
        sd.trace(lambda a: a.at[0, [1, 2]].add(1.0), _A345)
    with pytest.raises(IndexingError, match="one integer-array index"):
        sd.trace(lambda a: a[[0, 1], [1, 2]], _A345)
    with pytest.raises(IndexingError, match="boolean mask"):
        sd.trace(lambda a: snp.take(a, a > 0), _A345)
    with pytest.raises(IndexingError, match="mode"):
        sd.trace(lambda a: snp.take(a, [0], mode="fill"), _A345)
    with pytest.raises(IndexingError, match="`mode` applies to integer-array"):
        sd.trace(lambda a: a.at[0].set(1.0, mode="wrap"), _A345)


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_cumsum_sort_argsort_flip_take_along_axis_match_numpy(axis):
    a = np.round(_A345 * 3)  # repeated values: the stable order matters
    ints = np.arange(60, dtype=np.int32).reshape(3, 4, 5) % 7

    def f(a, ints):
        order = snp.argsort(a, axis=axis)
        return (snp.cumsum(a, axis=axis), snp.cumsum(ints, axis=axis),
                snp.cumsum(a > 0, axis=axis), snp.sort(a, axis=axis), order,
                snp.take_along_axis(a, order, axis=axis), snp.flip(a, axis=axis))

    ax = axis
    wants = (np.cumsum(a, axis=ax), np.cumsum(ints, axis=ax), np.cumsum(a > 0, axis=ax),
             np.sort(a, axis=ax, kind="stable"), np.argsort(a, axis=ax, kind="stable"),
             np.take_along_axis(a, np.argsort(a, axis=ax, kind="stable"), axis=ax),
             np.flip(a, axis=ax))
    for got, want in zip(sd.function(f)(a, ints), wants):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_take_along_axis_broadcasts_like_numpy():
    a, i = _A345[:, :1], np.array([[[0], [3]]])  # (3, 1, 5) against (1, 2, 1)
    for axis in (1, 2):
        idx = i if axis == 1 else np.swapaxes(np.array([[[0, 4]]]), 1, 1)
        want = np.take_along_axis(np.broadcast_to(a, (3, 4, 5)) if axis == 1 else a, idx,
                                  axis=axis)
        got = sd.function(lambda a, j, axis=axis: snp.take_along_axis(
            snp.broadcast_to(a, (3, 4, 5)) if axis == 1 else a, j, axis))(a, idx)
        np.testing.assert_array_equal(got, want)
    want = np.take_along_axis(_A345[:, :1, :], np.array([[[2]], [[0]]]), axis=0)
    np.testing.assert_array_equal(sd.function(lambda a: snp.take_along_axis(
        a, np.array([[[2]], [[0]]]), 0))(_A345[:, :1, :]), want)


def test_sort_gradient_matches_jax():
    x = np.random.default_rng(3).standard_normal((4, 6))
    w = np.linspace(-1.0, 2.0, 6)

    def f(x, xnp=snp):
        return xnp.sum(w * xnp.sort(x, axis=1) ** 2) + xnp.sum(xnp.cumsum(x, axis=0) ** 3)

    with sd.config.x64_scope():
        want = jax.grad(lambda x: f(x, jax.numpy))(x)
    np.testing.assert_allclose(sd.grad(f)(x), want, rtol=1e-13)
    sd.testing.check_rules(lambda x: snp.sort(x, axis=0) * w, x)


def test_numpy_functions_dispatch_on_traced_values():
    i = np.array([2, 0])
    f = sd.function(lambda a: (np.take(a, i, axis=1), np.sort(a), np.argsort(a, axis=0),
                               np.cumsum(a, axis=2), np.flip(a, 1),
                               np.take_along_axis(a, np.zeros((1, 1, 1), int), 0)))
    wants = (np.take(_A345, i, axis=1), np.sort(_A345), np.argsort(_A345, axis=0),
             np.cumsum(_A345, axis=2), np.flip(_A345, 1), np.take_along_axis(_A345, np.zeros((1, 1, 1), int), 0))
    for got, want in zip(f(_A345), wants):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow  # (the default suite's time budget)
def test_gathers_and_scatters_inside_a_checkpointed_scan():
    # semi-Lagrangian advection on a periodic grid: each step gathers the
    # state at the departure points (traced indices) and scatters a source
    n, steps = 16, 12
    rng = np.random.default_rng(11)
    u0, c = rng.standard_normal(n), rng.uniform(0.2, 0.8, n)
    src = np.array([3, 9, 3])

    def run(u0, c, xnp, scan, **kw):
        def body(u, k):
            shift = xnp.floor(c * 3.0).astype(np.int64)          # integer part
            frac = c * 3.0 - shift
            j = (xnp.arange(n) - shift) % n
            u = (1 - frac) * xnp.take(u, j) + frac * xnp.take(u, (j - 1) % n)
            u = u.at[src].add(0.1 * xnp.sin(u[src]) * k)
            return u, xnp.sort(u)[-1]
        u, tops = scan(body, u0, xnp.linspace(0.0, 1.0, steps), **kw)
        return xnp.sum(u ** 2) + xnp.sum(xnp.cumsum(tops))

    with sd.config.x64_scope():
        jf = lambda u0, c: run(u0, c, jax.numpy, jax.lax.scan)  # noqa: E731
        want, want_g = jf(u0, c), jax.grad(jf, argnums=(0, 1))(u0, c)
    for kw in ({}, {"checkpoints": 3}):
        sf = lambda u0, c, kw=kw: run(u0, c, snp, sd.scan, **kw)  # noqa: E731
        np.testing.assert_allclose(sd.function(sf)(u0, c), want, rtol=1e-13)
        g = sd.grad(sf, argnums=(0, 1))(u0, c)
        np.testing.assert_allclose(g[0], want_g[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g[1], want_g[1], rtol=1e-12, atol=1e-14)
