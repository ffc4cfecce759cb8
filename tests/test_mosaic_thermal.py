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
