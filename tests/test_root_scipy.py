"""`sd.optimize.root` as SciPy's `scipy.optimize.root` is used: `fun`
returning a list or tuple, and SciPy's globalized methods `"hybr"` (Powell's
dogleg) and `"lm"` (Levenberg-Marquardt), which survive a singular Jacobian
at the start (SciPy's pressure-network test, `x0 = [2, 0, 2, 0]`, where
Newton stops), with the same implicit derivatives at the root."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, InvalidOptionError, ShapeError

K, QTOT = np.full(4, 0.5), 4.0


def pressure_network(q, qtot, k):
    """SciPy's test problem (scipy/optimize/tests/test_minpack.py): flows
    `q` in parallel pipes, `P_i = k_i q_i^2`, equal pressures, total flow."""
    p = k * q ** 2
    return snp.concatenate([p[1:] - p[0], snp.sum(q)[None] - qtot])


def pressure_network_np(q, qtot, k):
    p = k * q ** 2
    return np.hstack((p[1:] - p[0], q.sum() - qtot))


X0 = np.array([2.0, 0.0, 2.0, 0.0])  # the Jacobian has rank 3 there


def test_newton_stops_on_the_singular_start():
    with pytest.raises(ConvergenceError, match="singular"):
        sd.optimize.root(pressure_network, X0, (QTOT, K))


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_globalized_methods_solve_the_pressure_network_as_scipy(method):
    want = scipy.optimize.root(pressure_network_np, X0, (QTOT, K), method=method).x
    res = sd.optimize.root(pressure_network, X0, (QTOT, K), method=method)
    assert res.success and res.status == 0
    np.testing.assert_allclose(res.x, np.ones(4), atol=1e-9)
    np.testing.assert_allclose(res.x, want, atol=1e-7)


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_unequal_pipes_against_scipy(method):
    k = np.array([0.5, 1.0, 2.0, 0.25])
    want = scipy.optimize.root(pressure_network_np, X0, (QTOT, k), method=method, tol=1e-13).x
    got = sd.optimize.root(pressure_network, X0, (QTOT, k), method=method).x
    np.testing.assert_allclose(got, want, rtol=1e-8)


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_derivatives_at_the_root_are_the_implicit_ones(method):
    """d x*/d k from the root node's rule, after a start where the Jacobian is
    singular, against central differences of SciPy's roots."""
    def flows(k):
        return sd.optimize.root(pressure_network, X0, (QTOT, k), method=method).x

    k = np.array([0.5, 1.0, 2.0, 0.25])
    jac = np.asarray(sd.jacfwd(flows)(k))
    h = 1e-6
    fd = np.stack([(scipy.optimize.root(pressure_network_np, X0, (QTOT, k + h * e),
                                        method="hybr", tol=1e-14).x
                    - scipy.optimize.root(pressure_network_np, X0, (QTOT, k - h * e),
                                          method="hybr", tol=1e-14).x) / (2 * h)
                   for e in np.eye(4)], axis=1)
    np.testing.assert_allclose(jac, fd, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_the_rules_after_a_singular_start_pass_check_rules(method):
    # JVP against central differences, VJP by the dot-product test, second
    # order and batching, through the node that the trust region solved
    def flows(k):
        return sd.optimize.root(pressure_network, X0, (QTOT, k), method=method).x

    sd.testing.check_rules(flows, np.array([0.5, 1.0, 2.0, 0.25]))


def test_lm_survives_where_newton_overshoots():
    # arctan: Newton from |x0 - root| > 1.39 diverges; the trust region does not
    root = np.tan(0.5)
    for method in ("hybr", "lm"):
        res = sd.optimize.root(lambda x: snp.arctan(x) - 0.5, np.array([root + 3.0]),
                               method=method)
        assert abs(float(res.x[0]) - root) <= 1e-10 * root
        # a root at x = 0 has no relative accuracy: `atol` bounds ||F|| there
        res = sd.optimize.root(lambda x: snp.arctan(x), np.array([3.0]), method=method,
                               atol=1e-12)
        assert abs(float(res.x[0])) <= 1e-12 and float(res.residual) <= 1e-12


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_no_root_is_a_convergence_error_or_a_failed_result(method):
    def f(x):
        return x ** 2 + 1.0
    with pytest.raises(ConvergenceError, match="did not converge"):
        sd.optimize.root(f, np.array([0.7]), method=method)
    res = sd.optimize.root(f, np.array([0.7]), method=method, throw=False)
    assert not res.success and res.status != 0


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_globalized_methods_take_only_the_dense_jacobian(method):
    with pytest.raises(InvalidOptionError, match="jac='dense'"):
        sd.optimize.root(pressure_network, X0, (QTOT, K), method=method, jac="sparse")


def test_fun_may_return_a_list_or_a_tuple_as_in_scipy():
    def as_list(x):
        return [x[0] ** 2 - 1.0, x[1] - x[0]]

    def as_tuple(x, a):
        return (x[0] * x[1] - a, x[0] - 2.0 * x[1])

    want = scipy.optimize.root(lambda x: [x[0] ** 2 - 1, x[1] - x[0]], [2.0, 0.0]).x
    np.testing.assert_allclose(sd.optimize.root(as_list, np.array([2.0, 0.0])).x, want,
                               rtol=1e-9)
    x = sd.optimize.root(as_tuple, np.array([1.0, 1.0]), (2.0,), method="hybr").x
    np.testing.assert_allclose(x, [2.0, 1.0], rtol=1e-9)
    # the derivative flows through the list's entries
    g = sd.grad(lambda a: sd.optimize.root(as_tuple, np.array([1.0, 1.0]), (a,)).x[0])(2.0)
    np.testing.assert_allclose(g, 0.5, rtol=1e-8)  # x0 = sqrt(2 a)


def test_a_list_of_equal_arrays_stacks_and_a_ragged_one_is_refused():
    x = sd.optimize.root(lambda x: [x[:2] - 1.0, x[2:] + 1.0], np.zeros(4)).x
    np.testing.assert_allclose(x, [1.0, 1.0, -1.0, -1.0])
    with pytest.raises(ShapeError, match="different shapes"):
        sd.optimize.root(lambda x: [x[:1] - 1.0, x[1:] + 1.0], np.zeros(3))


@pytest.mark.parametrize("kw, match", [
    (dict(jac=True), "jac=True or a Jacobian function is not taken"),
    (dict(jac=lambda x: np.eye(2)), "jac=True or a Jacobian function is not taken"),
    (dict(callback=print), "`callback` is not taken"),
    (dict(options={"xtol": 1e-8}), "`options`"),
])
def test_scipy_options_sciad_does_not_take_are_refused_by_name(kw, match):
    with pytest.raises(InvalidOptionError, match=match):
        sd.optimize.root(lambda x: x - 1.0, np.zeros(2), **kw)


def test_hybr_and_lm_flatten_x0_as_scipy():
    # SciPy's test_pressure_network_with_gradient starts from [[2, 0, 2, 0]]
    x0 = np.array([[2.0, 0.0, 2.0, 0.0]])
    for method in ("hybr", "lm"):
        want = scipy.optimize.root(pressure_network_np, x0, (QTOT, K), method=method).x
        got = sd.optimize.root(pressure_network, x0, (QTOT, K), method=method).x
        assert np.shape(got) == np.shape(want) == (4,)
        np.testing.assert_allclose(got, want, atol=1e-7)
    # SciPy's args: a single non-tuple argument is wrapped
    x = sd.optimize.root(lambda x, a: x ** 2 - a, [1.0], args=2.0, method="hybr").x
    np.testing.assert_allclose(x, [np.sqrt(2.0)], rtol=1e-10)


def test_the_result_carries_fun_as_scipy():
    res = sd.optimize.root(pressure_network, X0, (QTOT, K), method="hybr")
    want = scipy.optimize.root(pressure_network_np, X0, (QTOT, K), method="hybr")
    assert np.shape(res.fun) == np.shape(want.fun) == (4,)
    np.testing.assert_allclose(res.fun, pressure_network_np(np.asarray(res.x), QTOT, K),
                               atol=1e-15)
    lst = sd.optimize.root(lambda x: [x[0] - 1.0, x[1] + 2.0], np.zeros(2))
    np.testing.assert_allclose(lst.fun, [0.0, 0.0], atol=1e-12)
    fp = sd.optimize.fixed_point(lambda x: 0.5 * x + 1.0, np.zeros(3))
    np.testing.assert_allclose(fp.fun, 0.5 * np.asarray(fp.x) + 1.0 - np.asarray(fp.x),
                               atol=1e-15)
    # inside a trace it is None: the traced graph holds one copy of `fun`
    def loss(a):
        res = sd.optimize.root(lambda x, a: x ** 2 - a, np.ones(2), (a,))
        assert res.fun is None
        return res.x[0]

    np.testing.assert_allclose(sd.grad(loss)(2.0), 0.5 / np.sqrt(2.0), rtol=1e-6)


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_powell_badly_scaled_at_the_default_budget(method):
    # SciPy's lm solves it in 55 evaluations (of 300: 100 (n + 1)); sciad's lm
    # failed at maxiter=50 (93 iterations needed without MINPACK's scaling)
    def f(x):
        return snp.stack([1e4 * x[0] * x[1] - 1.0, snp.exp(-x[0]) + snp.exp(-x[1]) - 1.0001])

    ref = scipy.optimize.root(lambda x: np.asarray(f(x)), [0.0, 1.0], method=method)
    res = sd.optimize.root(f, np.array([0.0, 1.0]), method=method)
    assert ref.success and res.success and res.nit <= 100 * 3
    np.testing.assert_allclose(res.x, [1.098159329699e-05, 9.106146739867], rtol=1e-9)
