"""BDF's discrete adjoint as one `ode.bdf_adjoint` node
(`sciad.solvers.ode._bdf_adjoint`): both of its ways of solving a step's
transposed iteration matrix (the step's own matrix factored, where that is
cheap: a narrow band, a small dense matrix; else KLU's factor kept over steps
preconditioning an iteration, with a fresh one where that fails) give the
same gradient as its reference (the pass in sciad ops, each step's matrix
solved by a `linalg.solve` node); a batch of cotangents is one pass; its
failures raise and free every factor. The exactness of the pass against the
derivative of the steps taken is tests/test_stiff_methods.py's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, NonFiniteError
from sciad.primitives import _ode_adjoint, _ode_bdf_adjoint
from sciad.solvers import _batch_split
from sciad.solvers.direct import _band
from sciad.solvers.ode import _bdf_adjoint, _kept_klu
from helpers import nodes_named

TS = np.array([0.0, 0.05, 0.3])
Y0 = np.linspace(0.5, 1.5, 24)


def _chain(t, y, k):  # a stiff nonlinear 1-D reaction-diffusion chain
    lap = snp.pad(y, 1)[:-2] - 2.0 * y + snp.pad(y, 1)[2:]
    return 400.0 * k[0] * lap - k[1] * y ** 3 + 0.1 * snp.sin(t)


def _loss(jac):
    def loss(k, y0):
        ys = sd.ode.odeint(_chain, y0, TS, k, solver="bdf", jac=jac, rtol=1e-7, atol=1e-10)
        return snp.sum(ys[1:] ** 2) + ys[2, 3]
    return loss


def _in_ops(monkeypatch):
    """Makes BDF's reverse mode the pass in sciad ops (the node's reference)."""
    def reference(primals, outs, ct, params, ct_states=None):
        wanted = _ode_adjoint._wanted(primals[:-2], params)
        return _ode_bdf_adjoint._in_ops(primals, outs, ct, params, wanted, ct_states)

    monkeypatch.setattr(_ode_bdf_adjoint, "bdf_vjp", reference)


def _grad(jac):
    # (a new function each time: its program lowered with the current path)
    loss = _loss(jac)
    return sd.function(sd.grad(lambda k, y0: loss(k, y0) + 0.0, argnums=(0, 1)))


@pytest.mark.parametrize("path", ["band", "klu", pytest.param("dense", marks=pytest.mark.slow)])
def test_the_node_gives_its_references_gradient(monkeypatch, path):
    """The node's gradient (in the field's parameters and the initial state)
    against the same pass in sciad ops on the same steps: to rounding where
    each step's own matrix is factored (a band, dense), to the iteration's
    tolerance where KLU's kept factor preconditions it."""
    if path == "klu":
        if not _kept_klu.usable(np.float64):
            pytest.skip("needs klujax and sciad's C++ extension")
        monkeypatch.setattr(_band, "usable", lambda dtype: False)
    jac = "dense" if path == "dense" else "sparse"
    k = np.array([1.0, 2.0])
    before = _batch_split.live_handles()
    got = _grad(jac)(k, Y0)
    with monkeypatch.context() as m:
        _in_ops(m)
        want = _grad(jac)(k, Y0)
    rtol = 1e-7 if path == "klu" else 1e-11
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol,
                                   atol=rtol * np.abs(np.asarray(w)).max())
    assert _batch_split.live_handles() == before


def _dae(t, y, k):
    # the chain with its last value algebraic (0 = y_last - 1 - 0.1 k_1 y_0)
    f = _chain(t, y, k)
    return snp.concatenate([f[:-1], (y[-1] - 1.0 - 0.1 * k[1] * y[0])[None]])


@pytest.mark.parametrize("path", [pytest.param("band", marks=pytest.mark.slow), "klu"])
def test_a_dae_through_the_node(monkeypatch, path):
    """An index-1 DAE (a sparse singular mass matrix, its algebraic row scaled
    by `1 / c` in the iteration matrix): the node's gradient against its
    reference's, both paths. To 1e-7 on both: the two gradients' programs
    run the forward loop compiled apart, whose fused multiply-adds XLA may
    contract differently, and this DAE's step control turns such rounding
    into about 1e-8 (the pass's exactness on the same steps is the ODE
    test's above, to 1e-11)."""
    import scipy.sparse as sp

    if path == "klu":
        if not _kept_klu.usable(np.float64):
            pytest.skip("needs klujax and sciad's C++ extension")
        monkeypatch.setattr(_band, "usable", lambda dtype: False)
    mass = sp.diags(np.r_[np.ones(Y0.size - 1), 0.0]).tocsr()
    k = np.array([1.0, 2.0])
    y0 = Y0.copy()
    y0[-1] = 1.0 + 0.1 * k[1] * y0[0]  # (consistent)

    def grad():
        def loss(k):
            ys = sd.ode.odeint(_dae, y0, TS, k, solver="bdf", jac="sparse", mass=mass,
                               rtol=1e-7, atol=1e-10)
            return snp.sum(ys[1:] ** 2)
        return sd.function(sd.grad(loss))

    got = np.asarray(grad()(k))
    with monkeypatch.context() as m:
        _in_ops(m)
        want = np.asarray(grad()(k))
    np.testing.assert_allclose(got, want, rtol=1e-7)


def _recorded():
    """A sparse solve of `_chain` recorded as the gradient's forward pass
    records it: `(field, consts, pattern, result, marks)`."""
    from sciad.graph._types import Pattern
    from sciad.solvers.ode import _bdf

    k = jnp.array([1.0, 2.0])
    field = lambda cs, t, y: _chain(t, y, cs[0])  # noqa: E731
    i = np.arange(Y0.size)
    pattern = Pattern.from_coo((Y0.size,) * 2, np.concatenate([i, i[1:], i[:-1]]),
                               np.concatenate([i, i[:-1], i[1:]]))[0]
    r = jax.jit(lambda y0: _bdf.integrate(lambda t, y: field((k,), t, y), y0, jnp.asarray(TS),
                                          rtol=1e-7, atol=1e-10, max_steps=2000,
                                          jac="sparse", pattern=pattern, dense=True,
                                          history=True))(jnp.asarray(Y0))
    steps = int(r.accepted)
    marks = jnp.asarray(np.searchsorted(np.asarray(r.grid)[:steps + 1], TS), jnp.int32)
    return field, (k,), pattern, r, marks


def _pass(recorded):
    """The pass over a recorded solve, called directly (two directions):
    `(cotangents of the consts, of y0, status, t_failed, nlu)`."""
    field, consts, pattern, r, marks = recorded
    ct = jnp.asarray(np.random.default_rng(0).normal(size=(2, TS.size, Y0.size)))
    return jax.jit(lambda ct: _bdf_adjoint.adjoint(field, consts, r.grid, marks, r.states,
                                                   r.history, ct, jac="sparse",
                                                   pattern=pattern))(ct)


def test_kept_factors_are_made_again_only_where_needed(monkeypatch):
    """With KLU's kept factor, the pass factors a fraction of its steps (where
    `c` moved or the iteration slowed), and its two directions agree with the
    pass that factors every step's own matrix (the banded one), on the same
    recorded steps."""
    if not _kept_klu.usable(np.float64):
        pytest.skip("needs klujax and sciad's C++ extension")
    recorded = _recorded()
    steps = int(recorded[3].accepted)
    cbar, ybar, status, _, nlu = _pass(recorded)
    assert int(status) == 0 and int(nlu) == steps  # (the band: every step its own)
    monkeypatch.setattr(_band, "usable", lambda dtype: False)
    before = _batch_split.live_handles()
    cbar2, ybar2, status2, _, nlu2 = _pass(recorded)
    assert int(status2) == 0 and 0 < int(nlu2) < steps / 2, (int(nlu2), steps)
    np.testing.assert_allclose(np.asarray(ybar2), np.asarray(ybar), rtol=1e-7,
                               atol=1e-8 * np.abs(np.asarray(ybar)).max())
    np.testing.assert_allclose(np.asarray(cbar2[0]), np.asarray(cbar[0]), rtol=1e-7)
    assert _batch_split.live_handles() == before


def test_a_step_the_kept_factor_cannot_finish_is_done_again_fresh(monkeypatch):
    """Every step's first try (the kept factor) stopped after its first
    iteration: each takes the second (the step's own Jacobian, factored),
    which gives the same gradient; with no iteration allowed at all, the pass
    fails with `ConvergenceError`, naming the step, and frees its factors."""
    if not _kept_klu.usable(np.float64):
        pytest.skip("needs klujax and sciad's C++ extension")
    monkeypatch.setattr(_band, "usable", lambda dtype: False)
    k = np.array([1.0, 2.0])
    want = _grad("sparse")(k, Y0)
    before = _batch_split.live_handles()
    monkeypatch.setattr(_bdf_adjoint, "SLOW_RATE", 1e-300)
    got = _grad("sparse")(k, Y0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-8)
    monkeypatch.setattr(_bdf_adjoint, "ADJOINT_MAXITER", 0)
    monkeypatch.setattr(_bdf_adjoint, "ADJOINT_RTOL", 0.0)
    with pytest.raises(ConvergenceError, match="could not solve the transposed iteration "
                                               "matrix .* of the step to t = "):
        _grad("sparse")(k, Y0)
    assert _batch_split.live_handles() == before


def _nan_derivative(t, y, k):
    # finite values; a NaN Jacobian at the final time only (0 times the
    # derivative of sqrt at 0), where the reverse pass reads the last step's
    return -k * y + 0.01 * snp.roll(y, 1) + 0.0 * snp.sqrt((1.0 - t) * y ** 2)


@pytest.mark.slow  # ~8 s each: a hundred failing gradients
@pytest.mark.parametrize("path", ["band", "klu"])
def test_failing_reverse_passes_raise_alone_and_batched_and_free_their_factors(
        monkeypatch, path):
    """A pass that meets a NaN derivative raises `NonFiniteError` naming the
    step, alone and in a batch (`sd.vmap` of the gradient), and a hundred of
    them leave no factor live and the process's memory flat."""
    from helpers import rss_mib

    if path == "klu":
        if not _kept_klu.usable(np.float64):
            pytest.skip("needs klujax and sciad's C++ extension")
        monkeypatch.setattr(_band, "usable", lambda dtype: False)

    def loss(k):
        return snp.sum(sd.ode.odeint(_nan_derivative, np.ones(20), np.array([0.0, 0.5, 1.0]),
                                     k, solver="bdf", jac="sparse") ** 2)

    assert np.isfinite(float(sd.function(loss)(1.0)))
    calls = [sd.function(sd.grad(loss)), sd.function(sd.vmap(sd.grad(loss)))]
    args = [np.asarray(1.0), np.array([1.0, 1.2])]
    with pytest.raises(NonFiniteError, match="not finite at the step to t = 1"):
        calls[0](args[0])
    with pytest.raises(NonFiniteError):
        calls[1](args[1])
    before, mem = _batch_split.live_handles(), rss_mib()
    for i in range(100):
        with pytest.raises(NonFiniteError):
            calls[i % 2](args[i % 2])
    assert _batch_split.live_handles() == before
    assert rss_mib() - mem < 30.0


def test_many_cotangents_are_one_pass_and_agree_with_forward_mode():
    """`jacrev` (a batch of cotangents) of a BDF solve is one `ode.bdf_adjoint`
    node with `directions`, every direction solved with the same
    factorizations, not a `map` of passes; its Jacobian agrees with
    `jacfwd`'s (the forward pass on the same steps)."""
    def ys(k):
        return sd.ode.odeint(_chain, Y0, TS, k, solver="bdf", jac="sparse", rtol=1e-8,
                             atol=1e-11)[1:, :4].ravel()

    k = np.array([1.0, 2.0])
    graph = sd.trace(sd.jacrev(ys), k)
    (node,) = nodes_named(graph, "ode.bdf_adjoint")
    assert node.params["directions"] and not nodes_named(graph, "map")
    jr = np.asarray(sd.jacrev(ys)(k))
    jf = np.asarray(sd.jacfwd(ys)(k))
    np.testing.assert_allclose(jr, jf, rtol=0, atol=1e-9 * np.abs(jf).max())


@pytest.mark.slow  # ~5 s (and test_batching's sweep batches the node)
def test_a_batch_of_gradients_whose_solves_take_different_steps():
    """`sd.vmap` of the gradient over parameters whose solves take different
    numbers of steps: each example's gradient, as alone."""
    loss = _loss("sparse")
    ks = np.array([[1.0, 2.0], [0.5, 3.0]])
    got = np.asarray(sd.function(sd.vmap(sd.grad(lambda k: loss(k, Y0))))(ks))
    for k, g in zip(ks, got):
        np.testing.assert_allclose(g, np.asarray(sd.grad(lambda k: loss(k, Y0))(k)),
                                   rtol=1e-10)


@pytest.mark.parametrize("solver,path", [("bdf", "band"),
                                         pytest.param("radau", "band", marks=pytest.mark.slow),
                                         pytest.param("bdf", "klu", marks=pytest.mark.slow),
                                         pytest.param("radau", "klu", marks=pytest.mark.slow)])
def test_float32_gradients(monkeypatch, solver, path):
    """The discrete adjoints in float32, whose rounding cannot reach the
    iterations' float64 tolerances (1e-9: BDF's kept factor and Radau's
    transposed stage systems failed every step before they were floored at
    the dtype's rounding): the float64 gradient to float32's accuracy."""
    if path == "klu":
        if not _kept_klu.usable(np.float64):
            pytest.skip("needs klujax and sciad's C++ extension")
        monkeypatch.setattr(_band, "usable", lambda dtype: False)
    k = np.array([1.0, 2.0])

    def grad(dtype):
        y0, ts = np.linspace(0.5, 1.5, 30).astype(dtype), TS.astype(dtype)
        return np.asarray(sd.grad(lambda k: snp.sum(sd.ode.odeint(
            _chain, y0, ts, k, solver=solver, jac="sparse", rtol=1e-4,
            atol=1e-6) ** 2))(k.astype(dtype)))

    got = grad(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, grad(np.float64), rtol=1e-3)
