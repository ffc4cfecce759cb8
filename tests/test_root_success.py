"""`success` from `sd.optimize.root` means a root to the stated accuracy,
from near and far starts, for every method: the classic square systems of
More, Garbow and Hillstrom (ACM TOMS 7, 1981), started at their standard
point and at 10 and 100 times it. A solve that reports success must be
within `tol` (relative, with a small factor for the error estimate) of the
root it converged to (found by polishing its answer with Newton's method in
JAX); one that does not may fail, but never silently."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError

TOL = 1e-10
#: how far above `tol` an answer may be: the step test estimates the error
#: (from the last step and the fall of ||F||), and the answer's rounding adds
SLACK = 10.0


def rosenbrock(x, xp):
    return xp.stack([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])


def powell_badly_scaled(x, xp):
    return xp.stack([1e4 * x[0] * x[1] - 1.0, xp.exp(-x[0]) + xp.exp(-x[1]) - 1.0001])


def helical_valley(x, xp):
    theta = xp.arctan2(x[1], x[0]) / (2 * np.pi)
    return xp.stack([10.0 * (x[2] - 10.0 * theta),
                     10.0 * (xp.sqrt(x[0] ** 2 + x[1] ** 2) - 1.0), x[2]])


def brown_almost_linear(x, xp):
    n = x.shape[0]
    head = x[:-1] + xp.sum(x) - (n + 1)
    return xp.concatenate([head, xp.stack([xp.prod(x) - 1.0])])


def broyden_tridiagonal(x, xp):
    xp_ = xp.pad(x, 1)
    return (3.0 - 2.0 * x) * x - xp_[:-2] - 2.0 * xp_[2:] + 1.0


def discrete_bvp(x, xp):
    n = x.shape[0]
    h = 1.0 / (n + 1)
    t = np.arange(1, n + 1) * h
    xp_ = xp.pad(x, 1)
    return 2.0 * x - xp_[:-2] - xp_[2:] + 0.5 * h ** 2 * (x + t + 1.0) ** 3


def trigonometric(x, xp):
    n = x.shape[0]
    return n - xp.sum(xp.cos(x)) + np.arange(1, n + 1) * (1.0 - xp.cos(x)) - xp.sin(x)


PROBLEMS = {
    "rosenbrock": (rosenbrock, np.array([-1.2, 1.0])),
    "powell_badly_scaled": (powell_badly_scaled, np.array([0.0, 1.0])),
    "helical_valley": (helical_valley, np.array([-1.0, 0.0, 0.0])),
    "brown_almost_linear": (brown_almost_linear, np.full(5, 0.5)),
    "broyden_tridiagonal": (broyden_tridiagonal, np.full(10, -1.0)),
    "discrete_bvp": (discrete_bvp, (lambda t: t * (t - 1.0))(np.arange(1, 11) / 11.0)),
    "trigonometric": (trigonometric, np.full(5, 0.2)),
}
METHODS = ["newton", "hybr", "lm", "chord"]


def polished(fn, x):
    """The root nearest `x`: Newton's method in JAX from it (float64)."""
    F = lambda z: fn(z, jnp)
    z = jnp.asarray(x, jnp.float64)
    for _ in range(8):
        z = z - jnp.linalg.solve(jax.jacfwd(F)(z), F(z))
    return np.asarray(z), float(np.max(np.abs(F(z)))), np.linalg.cond(jax.jacfwd(F)(z))


def judged(name, method, scale):
    fn, x0 = PROBLEMS[name]
    start = x0 * scale if np.any(x0) else x0 + scale - 1.0
    res = sd.optimize.root(lambda x: fn(x, snp), start, method=method, tol=TOL, maxiter=300,
                           throw=False)
    if not bool(res.success):
        return "failed"
    x = np.asarray(res.x)
    root, resid, cond = polished(fn, x)
    assert np.all(np.isfinite(root)) and resid < 1e-8, (name, method, scale, x)
    err = np.max(np.abs(x - root)) / np.max(np.abs(root))
    # a relative error of tol in x, up to the conditioning a residual carries
    bound = SLACK * TOL * max(1.0, cond * np.finfo(float).eps / TOL)
    assert err <= bound, (name, method, scale, err, bound, int(res.nit))
    return "root"


@pytest.mark.parametrize("method", METHODS)
def test_far_start_success_is_a_root(method):
    # the cube root from 1e5 and 1e3: a test scaled by ||F(x0)|| stopped at
    # x = 45 (residual 9e4) and x = 1.26738 (error 6e-3), reporting success
    for x0 in (1e5, 1e3):
        res = sd.optimize.root(lambda x, c: x ** 3 - c, np.array([x0]), (2.0,), method=method,
                               maxiter=200)
        assert abs(float(np.ravel(res.x)[0]) - 2 ** (1 / 3)) <= SLACK * TOL * 2 ** (1 / 3)


def test_far_start_derivative_is_the_roots():
    # the implicit derivative is as right as the root (it was 1.2% off)
    def x_of(c):
        return sd.optimize.root(lambda x, c: x ** 3 - c, np.array([1e3]), (c,)).x[0]

    assert abs(float(sd.grad(x_of)(2.0)) - 2.0 ** (-2 / 3) / 3) <= 1e-9


def test_far_start_pde_is_solved_to_tol():
    # a 200-point nonlinear diffusion problem started at u0 = 500 (it was off
    # by 3.5e-7 while reporting success)
    def F(u, f):
        h = 1.0 / (u.shape[0] + 1)
        up = snp.pad(u, 1)
        k = 1.0 + up ** 2
        flux = 0.5 * (k[1:] + k[:-1]) * (up[1:] - up[:-1]) / h
        return -(flux[1:] - flux[:-1]) / h - f

    f = np.full(200, 10.0)
    near = sd.optimize.root(F, np.zeros(200), (f,), tol=1e-13).x
    far = sd.optimize.root(F, np.full(200, 500.0), (f,), maxiter=200)
    assert bool(far.success)
    assert np.max(np.abs(far.x - near)) <= SLACK * TOL * np.max(np.abs(near))


def test_root_at_zero_needs_atol():
    # no relative accuracy at x = 0: a solve that approaches 0 without
    # reaching it fails and names `atol`; with `atol`, it converges
    with pytest.raises(ConvergenceError, match="atol"):
        sd.optimize.root(lambda x: snp.arctan(x), np.array([3.0]), method="lm")
    res = sd.optimize.root(lambda x: snp.arctan(x), np.array([3.0]), method="lm", atol=1e-12)
    assert abs(float(res.x[0])) <= 1e-12


def test_linear_system_converges_in_one_newton_step():
    # the step test passes where ||F|| falls to rounding: no second factorization
    A = np.array([[4.0, 1.0], [1.0, 3.0]])
    b = np.array([1.0, 2.0])
    res = sd.optimize.root(lambda x: snp.asarray(A) @ x - b, np.array([1e3, -1e3]))
    assert bool(res.success) and int(res.nit) == 1
    np.testing.assert_allclose(res.x, np.linalg.solve(A, b), rtol=1e-12)


def test_message_says_which_test_stopped_a_success():
    # the cube root: its residual is above atol = 0, so the step test
    # stopped it; arctan(x) = 0 with atol: the residual test
    res = sd.optimize.root(lambda x, c: x ** 3 - c, np.array([1.0]), (2.0,))
    assert res.residual > 0 and "tol = 1e-10" in res.message
    assert res.message.startswith("converged by the step test")
    res = sd.optimize.root(lambda x: snp.arctan(x), np.array([3.0]), method="lm", atol=1e-12)
    assert res.message.startswith("converged by the residual test") and res.residual <= 1e-12
    # the same from a program's result (its tolerances are static), and a
    # fixed point's relative test
    res = sd.function(lambda c: sd.optimize.root(lambda x, c: x ** 3 - c, np.array([1.0]),
                                                 (c,), tol=1e-8))(2.0)
    assert res.message.startswith("converged by the step test") and "tol = 1e-08" in res.message
    res = sd.optimize.fixed_point(lambda x: snp.cos(x), np.array([1.0]))
    assert "the relative test" in res.message
    failed = sd.optimize.root(lambda x: snp.sqrt(x - 1.0) + x, np.array([2.0]), throw=False)
    assert not failed.message.startswith("converged")


def test_nan_never_converges():
    # a residual that turns NaN fails every test (NaN compares false)
    res = sd.optimize.root(lambda x: snp.sqrt(x - 1.0) + x, np.array([2.0]), throw=False)
    assert not bool(res.success)


@pytest.mark.parametrize("method", ["newton", "hybr", pytest.param("lm", marks=pytest.mark.slow),
                                    pytest.param("chord", marks=pytest.mark.slow)])
def test_classic_problem_success_means_a_root(method):
    # (the default suite: one problem; every problem and start with -m slow)
    outcomes = [judged("helical_valley", method, s) for s in (1.0, 10.0)]
    assert outcomes[0] == "root"  # from the standard start every method gets there


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_classic_problems_success_means_a_root_all_starts(name, method):
    for s in (1.0, 10.0, 100.0):
        judged(name, method, s)
