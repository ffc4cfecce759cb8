"""IMEX solvers (`kencarp3/4/5`): a field given as `(f_nonstiff, f_stiff)`,
the first part stepped explicitly and the second implicitly. Solutions
against SciPy, the step counts of a linear stiff part (the chord iterations'
rounding stop), the rules (`check_rules` on constant steps), the adjoints
against each other and against differences, and the errors of a wrong
split."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, ShapeError

N = 16
X = np.linspace(0.0, 1.0, N)
Y0 = np.exp(-40.0 * (X - 0.3) ** 2)
TS = np.linspace(0.0, 0.5, 4)


def laplacian(y, xp):
    """Neumann boundaries, `(N + 1)^2` scaled: stiff (eigenvalues to ~-1e3)."""
    return xp.concatenate([y[1:2] - y[:1], y[2:] - 2 * y[1:-1] + y[:-2],
                           y[-2:-1] - y[-1:]]) * (N + 1) ** 2


def reaction(t, y, k):
    return k * y * (1 - y)


def diffusion(t, y, k):
    return laplacian(y, snp)


def reference(k, ts=TS):
    return scipy.integrate.solve_ivp(lambda t, y: laplacian(y, np) + k * y * (1 - y),
                                     (ts[0], ts[-1]), Y0, "Radau", ts, rtol=1e-12,
                                     atol=1e-12).y.T


@pytest.mark.parametrize("solver", [
    "kencarp3", pytest.param("kencarp5", marks=pytest.mark.slow), "tsit5"])
def test_kencarp_solutions_agree_with_scipy(solver):
    """KenCarp3 and 5 on diffusion (implicit) with a logistic reaction
    (explicit) against SciPy's Radau (KenCarp4: the tests below); a pair
    given to a solver that is not IMEX (tsit5) is its sum. (KenCarp5 runs
    the same IMEX stages with another tableau: slow.)"""
    ys = sd.ode.odeint((reaction, diffusion), Y0, TS, 2.0, solver=solver, rtol=1e-8,
                       atol=1e-10)
    np.testing.assert_allclose(np.asarray(ys), reference(2.0), rtol=0, atol=5e-8)


def test_a_linear_stiff_part_takes_few_steps():
    """A stage of a linear stiff part converges in one chord iteration, and
    the next update is at the rounding level of KenCarp's stage variable (`h
    f`, measured against atol): that is convergence, not divergence
    (diffrax's `VeryChord` failed such stages, and the steps shrank to 1e-8:
    `max_steps` on this problem). With sparse Newton systems, which hold
    the stiff part's pattern only (the dense ones: the tests below)."""
    def solve():
        return sd.ode.odeint((lambda t, y, k: 0.0 * y, diffusion), Y0, TS, 2.0,
                             solver="kencarp4", rtol=1e-6, jac="sparse", throw=False)

    graph = sd.trace(lambda: solve().ys)
    (node,) = [n for n in graph.nodes if n.primitive.name == "ode.odeint"]
    assert node.params["pattern"].nnz == 3 * N - 2 and len(node.params["body"].outputs) == 2
    ref = scipy.integrate.solve_ivp(lambda t, y: laplacian(y, np), (0, TS[-1]), Y0, "Radau",
                                    TS, rtol=1e-12, atol=1e-12).y.T
    res = solve()
    assert res.success and res.steps < 60, res.steps  # (Kvaerno4: 130)
    np.testing.assert_allclose(np.asarray(res.ys), ref, rtol=0, atol=2e-5)


def _imex_example(k, y0):
    """A split forced linear system on constant steps: smooth in its inputs."""
    return sd.ode.odeint((lambda t, y, k: snp.sin(t) * y[::-1], lambda t, y, k: -k * y), y0,
                         np.array([0.0, 0.3, 0.6]), k, solver="kencarp4", adaptive=False,
                         dt0=0.15)


@pytest.mark.slow  # ~12 s to first order; odeint's rules run by default with other solvers
@pytest.mark.parametrize("second_order", [False, True])
def test_kencarp_rules(second_order):
    """`check_rules` on the IMEX node: the JVP (an IMEX odeint of the
    sensitivities, the split kept) against differences, the discrete
    adjoint against it, and (slow) second order."""
    rng = np.random.default_rng(0)
    sd.testing.check_rules(_imex_example, rng.uniform(1.0, 2.0, 2), rng.normal(size=2),
                           batch=False, second_order=second_order)


def _loss(k, y0, adjoint="checkpoint"):
    ys = sd.ode.odeint((reaction, diffusion), y0, TS, k, solver="kencarp4", rtol=1e-9,
                       atol=1e-11, adjoint=adjoint)
    return snp.sum(ys[-1] ** 2 + ys[1])


@pytest.mark.slow  # (the rules on constant steps: test_kencarp_rules)
def test_kencarp_adjoint_against_differences_and_forward_mode():
    """The checkpointed adjoint (the KenCarp stages replayed, solving for the
    stiff part) against central differences and forward mode."""
    g_k, g_y0 = sd.grad(_loss, argnums=(0, 1))(2.0, Y0)
    f = sd.function(_loss)
    v = np.random.default_rng(1).normal(size=N)
    h = 1e-5
    np.testing.assert_allclose(float(g_k), (f(2.0 + h, Y0) - f(2.0 - h, Y0)) / (2 * h),
                               rtol=1e-6)
    np.testing.assert_allclose(float(np.dot(g_y0, v)),
                               (f(2.0, Y0 + h * v) - f(2.0, Y0 - h * v)) / (2 * h), rtol=1e-5)
    _, dk = sd.jvp(_loss, (2.0, Y0), (1.0, np.zeros(N)))
    np.testing.assert_allclose(float(dk), float(g_k), rtol=1e-9)


@pytest.mark.slow
def test_kencarp_interpolated_adjoint():
    """The continuous adjoint against the interpolated forward solution
    integrates the summed field by Kvaerno4: to its accuracy against the
    discrete adjoint. (Backsolve would integrate the diffusion backwards:
    it blows up, and is refused with that diagnosis.)"""
    g = float(sd.grad(_loss)(2.0, Y0))
    np.testing.assert_allclose(float(sd.grad(lambda k: _loss(k, Y0, "interpolated"))(2.0)),
                               g, rtol=1e-5)


@pytest.mark.parametrize("f, error, match", [
    ((reaction, diffusion, diffusion), DTypeError, "pair of functions"),
    ((reaction, 3.0), DTypeError, "pair of functions"),
    ((reaction, lambda t, y, k: y[:3]), ShapeError, r"`f\[1\]` must return arrays"),
])
def test_a_wrong_split_is_a_trace_time_error(f, error, match):
    with pytest.raises(error, match=match):
        sd.trace(lambda y0: sd.ode.odeint(f, y0, TS, 2.0, solver="kencarp4"), Y0)
