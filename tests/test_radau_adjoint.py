"""Radau's discrete adjoint as one `ode.radau_adjoint` node
(`sciad.solvers.ode._radau_adjoint`): each of its three ways of solving a
step (a small dense system by LU of its `3 n` stage matrix; the forward's
kept real and complex factorizations preconditioning the simplified Newton
iteration and the transposed one; Newton-Krylov and GMRES where those fail)
gives the gradient of the steps taken, against forward mode and each other;
its failures raise under every transform (tests/test_failure_transforms.py)
and free every factor."""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import NonFiniteError
from sciad.solvers import _batch_split
from sciad.solvers.ode import _radau_adjoint
from helpers import nodes_named

RATES = np.array([0.04, 3e7, 1e4])


def _robertson(t, y, k):
    return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2, k[1] * y[1] ** 2])


def _robertson_grad(jac: str, t1: float = 4e5):
    return sd.function(sd.grad(lambda k: sd.ode.odeint(
        _robertson, np.array([1.0, 0.0, 0.0]), np.array([0.0, t1]), k, solver="radau",
        jac=jac, rtol=1e-6, atol=1e-10)[-1, 0]))


def _chain(t, y, k):
    # a stiff nonlinear chain of 40 states: dense iteration matrices above
    # DIRECT_SIZE (the split path), and a sparse pattern
    return -k[0] * y + k[1] * y ** 2 * snp.roll(y, 1) \
        - 30.0 * (2.0 * y - snp.roll(y, -1) - snp.roll(y, 1))


def _chain_loss(k, jac):
    ys = sd.ode.odeint(_chain, np.linspace(0.5, 1.0, 40), np.array([0.0, 0.5, 2.0]), k,
                       solver="radau", jac=jac, rtol=1e-7, atol=1e-10)
    return snp.sum(ys ** 2)


@pytest.mark.slow  # ~5 s
def test_robertson_sparse_agrees_with_the_small_dense_path():
    """Robertson to 4e5 (long steps of a field whose Jacobian varies a lot
    across them): its 3 states solved directly (`_direct`, dense) and by the
    split path (`jac="sparse"`, most of whose late steps the simplified
    iteration cannot finish and Newton-Krylov does) give the same gradient,
    to well within the stages' tolerance."""
    assert 3 * 3 <= _radau_adjoint.DIRECT_SIZE
    before = _batch_split.live_handles()
    dense = np.asarray(_robertson_grad("dense")(RATES))
    sparse = np.asarray(_robertson_grad("sparse")(RATES))
    np.testing.assert_allclose(sparse, dense, rtol=1e-7)
    assert _batch_split.live_handles() == before


@pytest.mark.slow  # ~16 s (sparse); the registry's radau_adjoint and radau_tangent run by default
@pytest.mark.parametrize("jac", ["dense", "sparse"])
def test_split_path_against_forward_mode(jac):
    """40 states (past `DIRECT_SIZE`): the reverse pass's gradient and the
    forward sensitivities of the same steps (the step replay's, a separate
    linearisation) agree to the stages' tolerance."""
    assert 3 * 40 > _radau_adjoint.DIRECT_SIZE
    k = np.array([1.0, 0.3])
    grad = np.asarray(sd.grad(lambda k: _chain_loss(k, jac))(k))
    fwd = np.asarray(sd.jacfwd(lambda k: _chain_loss(k, jac))(k))
    np.testing.assert_allclose(grad, fwd, rtol=1e-8)


@pytest.mark.slow  # ~13 s: the retry path alone (the Newton-Krylov fallback)
def test_the_krylov_retry_gives_the_same_gradient(monkeypatch):
    """With the first try made to fail at every step (no transposed
    iteration allowed), every step takes the second (fresh factorizations,
    Newton-Krylov, GMRES): the same gradient, and every factor freed."""
    k = np.array([1.0, 0.3])
    before = _batch_split.live_handles()
    want = np.asarray(sd.grad(lambda k: _chain_loss(k, "sparse"))(k))
    monkeypatch.setattr(_radau_adjoint, "ADJOINT_MAXITER", 0)
    monkeypatch.setattr(_radau_adjoint, "ADJOINT_RTOL", 0.0)
    # (a new field: its program lowered with the patched constants)
    got = np.asarray(sd.grad(lambda k: snp.sum(sd.ode.odeint(
        lambda t, y, k: _chain(t, y, k) + 0.0, np.linspace(0.5, 1.0, 40),
        np.array([0.0, 0.5, 2.0]), k, solver="radau", jac="sparse", rtol=1e-7,
        atol=1e-10) ** 2))(k))
    np.testing.assert_allclose(got, want, rtol=1e-8)
    assert _batch_split.live_handles() == before


def _nan_derivative(t, y, k):
    # finite values; a NaN Jacobian at the final time only (0 times the
    # derivative of sqrt at 0), where the reverse pass's last stage is
    return -k * y + 0.01 * snp.roll(y, 1) + 0.0 * snp.sqrt((1.0 - t) * y ** 2)


@pytest.mark.slow  # ~6 s: three hundred failing gradients
def test_failing_reverse_passes_free_their_factors_and_memory_stays_flat():
    """A reverse pass that meets a NaN derivative raises (naming the step
    and what to do), and three hundred of them, alone and batched, leave no
    kept factor live and the process's memory flat."""
    from helpers import rss_mib

    def loss(k):
        return snp.sum(sd.ode.odeint(_nan_derivative, np.ones(20), np.array([0.0, 0.5, 1.0]),
                                     k, solver="radau", jac="sparse") ** 2)

    forward = sd.function(loss)
    assert np.isfinite(float(forward(1.0)))
    calls = [sd.function(sd.grad(loss)), sd.function(sd.vmap(sd.grad(loss)))]
    args = [np.asarray(1.0), np.array([1.0, 1.2])]
    with pytest.raises(NonFiniteError, match="not finite at the step from t = "):
        calls[0](args[0])
    with pytest.raises(NonFiniteError):
        calls[1](args[1])
    before, mem = _batch_split.live_handles(), rss_mib()
    for i in range(300):
        with pytest.raises(NonFiniteError):
            calls[i % 2](args[i % 2])
    assert _batch_split.live_handles() == before
    assert rss_mib() - mem < 30.0


def test_many_directions_are_one_pass_over_the_steps():
    """`jacfwd` (a batch of tangents) and `jacrev` (a batch of cotangents)
    of a Radau solve are one `ode.radau_tangent` / `ode.radau_adjoint` node
    with `directions`, which solves every direction with the same stages
    and factorizations: not a `map` of one pass per direction, each
    factoring again (traced only)."""
    def ys(k):
        return sd.ode.odeint(_chain, np.linspace(0.5, 1.0, 40), np.array([0.0, 0.5]), k,
                             solver="radau", jac="sparse")[1, :3]

    k = np.array([1.0, 0.3])
    for transform, name in ((sd.jacfwd, "ode.radau_tangent"),
                            (sd.jacrev, "ode.radau_adjoint")):
        graph = sd.trace(transform(ys), k)
        (node,) = nodes_named(graph, name)
        assert node.params["directions"]
        assert not nodes_named(graph, "map")


@pytest.mark.slow  # ~15 s
@pytest.mark.parametrize("jac", ["dense", "sparse"])
def test_jacrev_and_jacfwd_agree(jac):
    """The Jacobian of ten outputs in two parameters by a batch of reverse
    passes and by a batch of forward ones (each one node over the steps)
    agree to the solves' tolerance."""
    def ys(k):
        return sd.ode.odeint(_chain, np.linspace(0.5, 1.0, 40), np.array([0.0, 0.5, 2.0]), k,
                             solver="radau", jac=jac, rtol=1e-8, atol=1e-11)[1:, :5].ravel()

    k = np.array([1.0, 0.3])
    jf = np.asarray(sd.jacfwd(ys)(k))
    jr = np.asarray(sd.jacrev(ys)(k))
    np.testing.assert_allclose(jr, jf, rtol=0, atol=1e-9 * np.abs(jf).max())


@pytest.mark.parametrize("solver, jac", [
    ("radau", "dense"), ("bdf", "dense"),
    pytest.param("radau", "sparse", marks=pytest.mark.slow),  # (~3 s: the split path)
    pytest.param("bdf", "sparse", marks=pytest.mark.slow)])
def test_a_non_finite_derivative_in_the_consts_alone_raises(solver, jac):
    """A step whose Newton solve converges (the field's Jacobian in the
    state is finite) but whose derivative with respect to the consts is not
    (0 times that of sqrt at 0): the gradient raises `NonFiniteError`
    naming the step, for Radau as for BDF, instead of NaN; forward mode
    through the same steps too."""
    def field(t, y, k):
        return -k[0] * y + 0.01 * snp.roll(y, 1) + 0.0 * snp.sqrt(k[1] - 1.0)

    def loss(k):
        ys = sd.ode.odeint(field, np.linspace(0.5, 1.5, 6), np.array([0.0, 0.5, 1.0]), k,
                           solver=solver, jac=jac)
        return snp.sum(ys ** 2)

    k = np.array([2.0, 1.0])
    assert np.isfinite(float(sd.function(loss)(k)))
    with pytest.raises(NonFiniteError, match="not finite"):
        sd.function(sd.grad(loss))(k)
    assert np.all(np.isfinite(sd.function(sd.grad(loss))(np.array([2.0, 1.5]))))
