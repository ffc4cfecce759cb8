"""bench/mosaic.py's thermal task (Mosaic's `thermal_mesh`, rebuilt from its
definition): the sciad program reproduces Mosaic's shipped reference
compliances, its gradient is SciPy's hand-written adjoint's, and its
derivative rules pass check_rules."""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd


@pytest.mark.parametrize("which, i", [("agreement", 0), ("agreement", 3), ("baseline", 2),
                                      ("baseline", 4)])
def test_the_compliance_is_mosaics_reference(mosaic, which, i):
    ref = mosaic.REFERENCES[which]
    if which == "agreement":
        task = mosaic.Thermal(16)
        rho = np.full(task.n_cells, np.float32(ref["sweep"][i]), np.float64)
    else:
        task = mosaic.Thermal(ref["sweep"][i])
        rho = mosaic.random_density(task.nx, task.ny).astype(np.float64)
    got = float(sd.function(task.compliance)(rho))
    # (the references are float32)
    np.testing.assert_allclose(got, ref["C"][i], rtol=2e-7)
    np.testing.assert_allclose(got, task.scipy_value_and_grad(rho, grad=False)[0], rtol=1e-12)


def test_the_gradient_is_the_hand_written_adjoints_and_passes_check_rules(mosaic):
    task = mosaic.Thermal(6)
    rho = mosaic.random_density(task.nx, task.ny).astype(np.float64)
    value, grad = sd.function(sd.value_and_grad(task.compliance))(rho)
    want_value, want_grad = task.scipy_value_and_grad(rho)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-10,
                               atol=1e-12 * np.abs(want_grad).max())
    report = sd.testing.check_rules(task.compliance, rho)
    assert report.jvp_error < 1e-6 and report.vjp_error < 1e-10
    assert report.second_order_error < 1e-6


def test_the_density_of_a_conductivity_inverts_the_law(mosaic):
    """What the recovery in the conductivity maps back with: `density` is
    the SIMP law's inverse on [1e-3, 1], `density_derivative` its
    derivative (central differences)."""
    task = mosaic.Thermal(4)
    rho = np.linspace(1e-3, 1.0, 9)
    k = np.asarray(task.law(rho))
    # (near rho = 1e-3, k - k_min is 1e-9 of k: the inverse keeps ~1e-10 of rho)
    np.testing.assert_allclose(task.density(k), rho, rtol=1e-9)
    h = 1e-6 * k
    fd = (task.density(k + h) - task.density(k - h)) / (2 * h)
    np.testing.assert_allclose(task.density_derivative(k[1:-1]), fd[1:-1], rtol=1e-6)


@pytest.mark.slow  # (one to two minutes: Mosaic's recovery, six runs of up to 200 evaluations)
def test_gauss_newton_on_the_conductivity_converges_where_the_density_does_not(mosaic):
    rows = {(r["target"], r["method"]): r for r in mosaic.recovery()}
    for target in ("Mosaic's target", "consistent target"):
        in_k = rows[(target, "Gauss-Newton on the conductivity")]
        in_rho = rows[(target, "Gauss-Newton (Jacobian)")]
        assert in_k["converged"] and not in_rho["converged"]
        assert in_k["final"] <= in_rho["final"]
    consistent = rows[("consistent target", "Gauss-Newton on the conductivity")]
    assert consistent["final"] < 1e-6 and consistent["rho_error"] < 5e-3
    # Mosaic's target is out of reach (its flux differs): the box's best fit
    assert 30 < rows[("Mosaic's target", "Gauss-Newton on the conductivity")]["final"] < 45
