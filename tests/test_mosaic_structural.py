"""bench/mosaic.py's structural task (Mosaic's `structural_mesh`, rebuilt from
its definition): the sciad program reproduces Mosaic's shipped reference
compliances (the traction load; TopOpt.jl's nodal load is the one that
misses them), its gradient is SciPy's hand-written adjoint's and central
differences', and Mosaic's Adam topology optimisation lowers the compliance
at a tiny size while keeping the volume."""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd


@pytest.mark.parametrize("which, i", [("agreement", 0), ("agreement", 4), ("baseline", 0),
                                      ("baseline", 3)])
def test_the_compliance_is_mosaics_reference(mosaic, which, i):
    ref = mosaic.STRUCTURAL_REFERENCES[which]
    N, rho0 = (8, ref["sweep"][i]) if which == "agreement" else (ref["sweep"][i], 0.5)
    task = mosaic.Structural(N, 2, 4)
    rho = np.full(task.n_cells, np.float32(rho0), np.float64)
    got = float(sd.function(task.compliance)(rho))
    # (the references are float32: 6e-8 relative)
    np.testing.assert_allclose(got, ref["C"][i], rtol=1e-7)
    np.testing.assert_allclose(got, task.scipy_value_and_grad(rho, grad=False)[0], rtol=1e-12)
    # TopOpt.jl's nodal load is a different load: 0.4 - 0.6 % off
    nodal = mosaic.Structural(N, 2, 4, load="nodal").scipy_value_and_grad(rho, grad=False)[0]
    assert 3e-3 < nodal / ref["C"][i] - 1 < 7e-3


def test_the_corner_load_is_the_same_in_both_conventions(mosaic):
    a = mosaic.Structural(4, 2, 2, corner=True)
    assert np.count_nonzero(a.f) == 4 and np.isclose(a.f.sum(), mosaic.F_TOTAL)
    b = mosaic.Structural(4, 2, 2, load="nodal")
    assert np.isclose(b.f.sum(), -mosaic.F_TOTAL)


@pytest.mark.parametrize("corner", [False, True])
def test_the_gradient_is_the_hand_written_adjoints(mosaic, corner):
    task = mosaic.Structural(6, 2, 3, corner=corner)
    rho = mosaic.random_density(6, 2, 3).astype(np.float64)
    value, grad = sd.function(sd.value_and_grad(task.compliance))(rho)
    want_value, want_grad = task.scipy_value_and_grad(rho)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-10,
                               atol=1e-12 * np.abs(want_grad).max())


def test_the_gradient_passes_mosaics_fd_check(mosaic):
    out = mosaic.structural_fd_check(eps_values=(1e-1, 1e-3))
    # the truncation error falls as eps^2 and the directions agree
    assert out[1e-3]["rel"] < 1e-6 and out[1e-3]["one_minus_cos"] < 1e-12
    assert out[1e-3]["rel"] < 1e-2 * out[1e-1]["rel"]


def test_topopt_lowers_the_compliance_and_keeps_the_volume(mosaic):
    res = mosaic.topopt(nx=8, ny=2, nz=4, iters=150)
    assert res["final"] < 0.8 * res["initial"]
    assert abs(res["final_vol"] - 0.5) < 5e-3
    assert np.all((res["rho"] >= 1e-3) & (res["rho"] <= 1.0))


@pytest.mark.parametrize("which", ["thermal", "structural"])
def test_the_torchfem_peer_computes_the_same_compliance(mosaic, monkeypatch, which):
    # the peer bench/mosaic.py times (where torch-fem is installed: it is not
    # in the extras): the same value and gradient as sciad's program
    pytest.importorskip("torchfem")
    import os

    monkeypatch.syspath_prepend(os.path.dirname(mosaic.__file__))
    from _torchfem import TorchFemStructural, TorchFemThermal

    task = mosaic.Thermal(16) if which == "thermal" else mosaic.Structural(6, 2, 3)
    peer = (TorchFemThermal if which == "thermal" else TorchFemStructural)(task)
    rho = np.clip(0.5 + 0.1 * np.random.default_rng(3).standard_normal(task.n_cells), 0.05, 0.95)
    value, grad = peer.value_and_grad(rho)
    want_value, want_grad = sd.function(sd.value_and_grad(task.compliance))(rho)
    # (torch-fem's Newton iteration stops at a relative residual of 1e-8)
    np.testing.assert_allclose(value, float(want_value), rtol=1e-7)
    np.testing.assert_allclose(grad, np.asarray(want_grad), rtol=1e-6,
                               atol=1e-8 * np.abs(want_grad).max())
