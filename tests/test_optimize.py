"""sd.optimize.minimize: SciPy's optimizers on sciad's compiled value and gradient."""

import gc
import weakref

import numpy as np
import pytest
import scipy.optimize

import sciad as sd
import sciad.numpy as snp
import sciad.optimize  # noqa: F401
from sciad.errors import (DTypeError, InvalidOptionError, NonFiniteError, NotSupportedError,
                          ShapeError)

_TIGHT = {
    "L-BFGS-B": {"gtol": 1e-12, "ftol": 1e-15, "maxiter": 2000},
    "BFGS": {"gtol": 1e-10, "maxiter": 2000},
}


def rosen(x):
    return snp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@pytest.mark.parametrize("method", ["L-BFGS-B", "BFGS"])
@pytest.mark.parametrize("n", [2, 10])
def test_rosenbrock_reaches_minimum(method, n):
    x0 = np.array([-1.2, 1.0]) if n == 2 else np.zeros(n)
    res = sd.optimize.minimize(rosen, x0, method=method, options=_TIGHT[method])
    assert res.success, res.message
    assert isinstance(res.x, np.ndarray) and res.x.shape == (n,)
    np.testing.assert_allclose(res.x, np.ones(n), rtol=1e-6)
    assert res.fun < 1e-12
    assert res.nit > 10 and res.nfev >= res.nit


@pytest.mark.parametrize("method", ["L-BFGS-B", "BFGS"])
def test_matches_scipy_with_numpy_gradient(method):
    """Same iterates, iteration and evaluation counts as SciPy driven by
    NumPy's Rosenbrock and its hand-written gradient."""
    x0 = np.array([-1.2, 1.0, 0.5, -0.3])
    ours, theirs = [], []
    res = sd.optimize.minimize(rosen, x0, method=method, callback=ours.append)
    ref = scipy.optimize.minimize(scipy.optimize.rosen, x0, jac=scipy.optimize.rosen_der,
                                  method=method, callback=lambda x: theirs.append(x.copy()))
    assert (res.nit, res.nfev) == (ref.nit, ref.nfev)
    assert len(ours) == len(theirs) == ref.nit
    # rounding differences (XLA's vs NumPy's sums) grow along the curved valley,
    # then shrink again as both converge to the same point
    ours, theirs = np.array(ours), np.array(theirs)
    np.testing.assert_allclose(ours[:10], theirs[:10], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-7)
    np.testing.assert_allclose(res.jac, ref.jac, rtol=0, atol=1e-6)
    assert res.fun == pytest.approx(ref.fun, rel=1e-6, abs=1e-10)


@pytest.mark.parametrize("method", ["Newton-CG", "trust-ncg", "trust-krylov", "trust-exact"])
def test_second_order_methods_use_sciad_curvature(method):
    x0 = np.array([-1.2, 1.0, 0.8])
    ours = sd.optimize.minimize(rosen, x0, method=method, tol=1e-8)
    assert ours.success, ours.message
    np.testing.assert_allclose(ours.x, np.ones(3), rtol=1e-6)
    curvature = ({"hess": scipy.optimize.rosen_hess} if method == "trust-exact"
                 else {"hessp": scipy.optimize.rosen_hess_prod})
    ref = scipy.optimize.minimize(scipy.optimize.rosen, x0, jac=scipy.optimize.rosen_der,
                                  method=method, tol=1e-8, **curvature)
    assert ours.nit == ref.nit
    assert ours.get("nhev") == ref.get("nhev")


def test_value_only_method():
    c = np.array([0.3, -1.5])
    res = sd.optimize.minimize(lambda x: snp.sum((x - c) ** 2), np.zeros(2),
                               method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-14})
    assert res.success
    assert "jac" not in res
    np.testing.assert_allclose(res.x, c, atol=1e-8)


def _quadratic_problem(rng):
    A = rng.standard_normal((3, 3))
    Q = A @ A.T + 3 * np.eye(3)
    a = rng.standard_normal(3)
    B = rng.standard_normal((2, 2))
    W = rng.uniform(0.5, 2.0, (2, 2))
    s = 0.7

    def f(p):
        d = p["v"] - a
        return (0.5 * d @ (Q @ d) + snp.sum(W * (p["M"] - B) ** 2)
                + (p["t"][0] - s) ** 2 * (1.0 + snp.sum(d * d)))

    return f, a, B, s


@pytest.mark.parametrize("method", ["L-BFGS-B", "BFGS", "CG"])
def test_pytree_x0_quadratic(rng, method):
    f, a, B, s = _quadratic_problem(rng)
    x0 = {"v": np.zeros(3), "M": np.zeros((2, 2)), "t": (np.float32(0.0),)}
    res = sd.optimize.minimize(f, x0, method=method, tol=1e-12)
    assert res.success, res.message
    assert set(res.x) == {"v", "M", "t"} and isinstance(res.x["t"], tuple)
    assert res.x["v"].shape == (3,) and res.x["M"].shape == (2, 2) and res.x["t"][0].shape == ()
    assert res.x["M"].dtype == np.float64 and res.x["t"][0].dtype == np.float32
    np.testing.assert_allclose(res.x["v"], a, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(res.x["M"], B, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(res.x["t"][0], s, rtol=1e-6)
    assert set(res.jac) == {"v", "M", "t"} and res.jac["M"].shape == (2, 2)
    np.testing.assert_allclose(res.jac["v"], 0.0, atol=1e-6)


@pytest.mark.parametrize("method", ["L-BFGS-B", "TNC", "SLSQP", "trust-constr"])
def test_bounds_active(method):
    c = {"a": np.array([2.0, -3.0, 0.5]), "b": np.array(-1.0)}

    def f(p):
        return snp.sum((p["a"] - c["a"]) ** 2) + (p["b"] - c["b"]) ** 2

    x0 = {"a": np.full(3, 0.5), "b": np.array(0.5)}
    lower = {"a": 0.0, "b": None}
    upper = {"a": np.array([1.0, 1.0, 1.0]), "b": 0.25}
    res = sd.optimize.minimize(f, x0, method=method, bounds=(lower, upper), tol=1e-10)
    # the minimizer clipped into the box: a = clip(c_a, 0, 1), b unconstrained below
    np.testing.assert_allclose(res.x["a"], [1.0, 0.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(res.x["b"], -1.0, atol=1e-6)
    grad_field = "grad" if method == "trust-constr" else "jac"
    np.testing.assert_allclose(res[grad_field]["a"], [-2.0, 6.0, 0.0], atol=1e-5)


def test_bounds_forms_agree():
    c = np.array([[2.0, -3.0], [0.5, 4.0]])

    def f(x):
        return snp.sum((x - c) ** 2)

    expected = np.clip(c, 0.0, 1.0)
    forms = [
        (0.0, 1.0),
        (np.zeros((2, 2)), np.ones((1, 2))),                 # broadcast to the leaf
        scipy.optimize.Bounds(0.0, np.ones(4)),              # over the flattened x0
        [(0.0, 1.0)] * 4,                                    # SciPy's per-element pairs
    ]
    for bounds in forms:
        res = sd.optimize.minimize(f, np.full((2, 2), 0.5), bounds=bounds)
        np.testing.assert_allclose(res.x, expected, atol=1e-8)
    # None means unbounded on that side
    res = sd.optimize.minimize(f, np.full((2, 2), 0.5), bounds=(None, 1.0))
    np.testing.assert_allclose(res.x, np.minimum(c, 1.0), atol=1e-8)
    # SciPy pairs with None, per element
    res = sd.optimize.minimize(f, np.full((2, 2), 0.5),
                               bounds=[(None, 1.0), (0.0, None), (None, None), (0.0, 3.0)])
    np.testing.assert_allclose(res.x, [[1.0, 0.0], [0.5, 3.0]], atol=1e-8)


def test_x0_outside_bounds_is_clipped():
    seen = []
    res = sd.optimize.minimize(lambda x: snp.sum(snp.log(x) ** 2), np.array([-1.0, 5.0]),
                               bounds=(0.5, 2.0), callback=seen.append, tol=1e-12)
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-6)
    assert res.success
    assert np.all(seen[0] >= 0.5) and np.all(seen[0] <= 2.0)
    assert np.all(seen[0] >= 0.5) and np.all(seen[0] <= 2.0)


@pytest.mark.parametrize("method", ["L-BFGS-B", "BFGS"])
def test_callback_once_per_iteration_with_pytrees(method):
    seen = []

    def f(p):
        return rosen(snp.concatenate([p["x"], p["y"]]))

    x0 = {"x": np.array([-1.2]), "y": np.array([1.0, 0.5])}
    res = sd.optimize.minimize(f, x0, method=method, callback=seen.append)
    assert res.nit > 5
    assert len(seen) == res.nit
    for it in seen:
        assert set(it) == {"x", "y"} and it["x"].shape == (1,) and it["y"].shape == (2,)
        assert isinstance(it["x"], np.ndarray)
    np.testing.assert_allclose(seen[-1]["y"], res.x["y"])
    # each iterate is its own array, not a view SciPy overwrites later
    assert not np.allclose(seen[0]["x"], seen[-1]["x"])


def test_callback_stop_iteration():
    calls = []

    def callback(x):
        calls.append(x)
        if len(calls) == 3:
            raise StopIteration

    res = sd.optimize.minimize(rosen, np.array([-1.2, 1.0]), method="BFGS", callback=callback)
    assert len(calls) == 3 and res.nit == 3
    assert not res.success and res.status == 99


def test_args_passed_through_without_retracing():
    traces = []

    def f(x, target, weight):
        traces.append(1)  # runs only while tracing
        return weight * snp.sum((x - target) ** 2)

    t1, t2 = np.array([1.0, 2.0, 3.0]), np.array([-4.0, 0.5, 6.0])
    res = sd.optimize.minimize(f, np.zeros(3), args=(t1, 2.0))
    np.testing.assert_allclose(res.x, t1, atol=1e-8)
    n = len(traces)
    assert n >= 1
    res = sd.optimize.minimize(f, np.ones(3), args=(t2, 3.0))
    np.testing.assert_allclose(res.x, t2, atol=1e-8)
    assert len(traces) == n  # new values, same signature: no retrace
    sd.optimize.minimize(f, np.ones(4), args=(np.zeros(4), 3.0))
    assert len(traces) > n  # a new shape does retrace


def test_one_compiled_call_per_evaluation(monkeypatch):
    """Value and gradient come from one call, and SciPy's first evaluation
    reuses the check at x0."""
    calls = []
    compiled = sd.optimize._compiled

    def counting(f, spec, kind):
        fn = compiled(f, spec, kind)
        return lambda *a: (calls.append(kind), fn(*a))[1]

    monkeypatch.setattr(sd.optimize, "_compiled", counting)
    res = sd.optimize.minimize(rosen, np.array([-1.2, 1.0]), method="BFGS")
    assert res.success and res.njev == res.nfev
    assert calls == ["value_and_grad"] * res.nfev


def test_single_argument_need_not_be_a_tuple():
    res = sd.optimize.minimize(lambda x, t: snp.sum((x - t) ** 2), 0.0, args=np.array(2.5))
    assert res.x.shape == () and res.x == pytest.approx(2.5)


def test_cache_does_not_keep_f_alive():
    def f(x):
        return snp.sum((x - 1.0) ** 2)

    sd.optimize.minimize(f, np.zeros(2))
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None


# ---------------------------------------------------------------------------
# errors


def test_complex_x0_refused():
    with pytest.raises(DTypeError, match=r"x0\['z'\] is complex.*real and imaginary"):
        sd.optimize.minimize(lambda p: snp.sum(snp.abs(p["z"]) ** 2),
                             {"z": np.ones(2, complex)})


def test_integer_x0_refused():
    with pytest.raises(DTypeError, match=r"x0\[1\] must be a float array, got int64"):
        sd.optimize.minimize(lambda p: p[0] ** 2, (np.array(1.0), np.array(1)))


@pytest.mark.parametrize("out, shown", [
    (lambda x: x ** 2, r"got f64\[3\]"),
    (lambda x: (snp.sum(x), x), "got a tuple"),
    (lambda x: snp.sum(x) * (1 + 1j), r"got c128\[\]"),
])
def test_non_scalar_output_refused(out, shown):
    with pytest.raises(ShapeError, match=r"optimize.minimize: `f` must return a real scalar.*"
                                         + shown):
        sd.optimize.minimize(out, np.ones(3))


def test_non_finite_value_at_x0():
    with pytest.raises(FloatingPointError, match="objective is nan at x0"):
        sd.optimize.minimize(lambda x: snp.sum(snp.log(x)), -np.ones(3))


def test_non_finite_gradient_at_x0():
    with pytest.raises(NonFiniteError, match=r"gradient is not finite at x0: 1 of 3.*"
                                             r"x0\['b'\]\[1\]"):
        sd.optimize.minimize(lambda p: p["a"] ** 2 + snp.sum(snp.sqrt(p["b"])),
                             {"a": 1.0, "b": np.array([1.0, 0.0])})


@pytest.mark.parametrize("bounds, match", [
    (({"b": 0.0}, None), r"`lower` .* must be None, a number, or a pytree with x0's structure"),
    (({"a": np.array([0.0, 3.0])}, 2.0), r"lower bound of x0\['a'\]\[1\] is above its upper "
                                         r"bound: 3.0 > 2.0"),
    (({"a": np.zeros(3)}, None), r"lower for x0\['a'\] has shape \(3,\).*\(2,\)"),
    ((None, {"a": (1.0, 2.0)}), r"upper for x0\['a'\] is a tuple"),
    (({"a": np.nan}, None), r"lower bound of x0\['a'\]\[0\] is NaN"),
    (scipy.optimize.Bounds(np.zeros(3), 1.0), r"`Bounds.lb` has shape \(3,\); give a number "
                                              "or 2 values"),
    ([(0.0, 1.0)] * 2, r"`lower` .* pytree with x0's structure"),
    ([(0.0, 1.0)] * 3, r"must be a pair `\(lower, upper\)`.*got list of length 3"),
])
def test_bad_bounds(bounds, match):
    # a bound's value (NaN, lower above upper) is an invalid option, its shape a ShapeError
    cls = InvalidOptionError if "bound of" in match else ShapeError
    with pytest.raises(cls, match=match):
        sd.optimize.minimize(lambda p: snp.sum(p["a"] ** 2), {"a": np.ones(2)}, bounds=bounds)


def test_ambiguous_pairs_refused():
    with pytest.raises(InvalidOptionError, match="ambiguous"):
        sd.optimize.minimize(lambda p: p[0] ** 2 + p[1] ** 2, (1.0, 2.0),
                             bounds=((0.0, 1.0), (2.0, 3.0)))


def test_scipy_pairs_must_match_size():
    with pytest.raises(ShapeError, match=r"lower for x0 is a tuple.*must number x0.size = 3"):
        sd.optimize.minimize(lambda x: snp.sum(x ** 2), np.ones(3), bounds=[(0.0, 1.0)] * 2)


def test_bounds_with_unbounded_method_refused():
    with pytest.raises(NotSupportedError, match="method 'BFGS' does not take bounds"):
        sd.optimize.minimize(lambda x: snp.sum(x ** 2), np.ones(2), method="BFGS",
                             bounds=(0.0, 1.0))


def test_unknown_method_refused():
    with pytest.raises(InvalidOptionError, match="unknown method 'lbfgs'"):
        sd.optimize.minimize(lambda x: snp.sum(x ** 2), np.ones(2), method="lbfgs")
