"""`sd.jacfwd` and `sd.jacrev`: one batched JVP / VJP over the identity basis.
Values against `jax.jacfwd`/`jax.jacrev` of the same jax.numpy code, through
matmuls, sparse and dense solves, scans, FFTs and second derivatives; the
graph's size does not grow with the Jacobian's; errors."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ShapeError

pytestmark = pytest.mark.filterwarnings("error::sciad.errors.BatchFallbackWarning")

MODES = [(sd.jacfwd, jax.jacfwd), (sd.jacrev, jax.jacrev)]
MODE_IDS = ["jacfwd", "jacrev"]


def _close(got, want, tol=1e-12):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _mlp(xp, w):
    def f(x):  # x: (4, 2)
        h = xp.tanh(w @ x) * xp.exp(-(x[:3] ** 2))
        return {"h": h, "s": (xp.sum(h * h), x.T), "const": xp.ones(3)}
    return f


@pytest.mark.parametrize("sd_jac, jax_jac", MODES, ids=MODE_IDS)
def test_matrix_input_pytree_outputs(sd_jac, jax_jac, rng):
    w, x = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    got = sd_jac(_mlp(snp, w))(x)
    with sd.config.x64_scope():
        want = jax_jac(_mlp(jnp, w))(x)
    assert got["h"].shape == (3, 2, 4, 2) and got["s"][0].shape == (4, 2)
    _close(got, want)


def _sparse_system(n):
    rows = np.concatenate([np.arange(n), np.arange(n - 1), np.arange(1, n)])
    cols = np.concatenate([np.arange(n), np.arange(1, n), np.arange(n - 1)])

    def data(xp, p):
        return xp.concatenate([2.0 + xp.exp(p), -0.5 * xp.ones(2 * (n - 1))])

    def f_sd(p, b):
        a = sd.sparse.coo_matrix((data(snp, p), (rows, cols)), shape=(n, n))
        return sd.linalg.solve(a, b * p)

    def f_jax(p, b):
        a = jnp.zeros((n, n)).at[rows, cols].add(data(jnp, p))
        return jnp.linalg.solve(a, b * p)

    return f_sd, f_jax


@pytest.mark.parametrize("sd_jac, jax_jac", MODES, ids=MODE_IDS)
def test_sparse_solve_in_the_parameter(sd_jac, jax_jac, rng):
    f_sd, f_jax = _sparse_system(6)
    p, b = rng.standard_normal(6), rng.standard_normal(6)
    got = sd_jac(f_sd)(p, b)
    with sd.config.x64_scope():
        want = jax_jac(f_jax)(p, b)
    _close(got, want)


@pytest.mark.parametrize("sd_jac, jax_jac", MODES, ids=MODE_IDS)
def test_dense_solve_and_fft(sd_jac, jax_jac, rng):
    d = rng.standard_normal((5, 5)) + 5 * np.eye(5)

    def f(x, xp, linalg, fft):
        y = linalg.solve(d + xp.diag(x), xp.sin(x))
        return xp.abs(fft.rfft(y * x)) ** 2

    x = rng.standard_normal(5)
    got = sd_jac(lambda x: f(x, snp, sd.linalg, sd.fft))(x)
    with sd.config.x64_scope():
        want = jax_jac(lambda x: f(x, jnp, jnp.linalg, jnp.fft))(x)
    _close(got, want)


@pytest.mark.parametrize("sd_jac, jax_jac", MODES, ids=MODE_IDS)
def test_scan(sd_jac, jax_jac, rng):
    def f(x, xp, scan):
        def step(c, k):
            c = c + 0.1 * xp.sin(c) * x * k
            return c, xp.sum(c ** 2)
        return scan(step, x, xp.arange(1.0, 6.0))

    x = rng.standard_normal(3)
    got = sd_jac(lambda x: f(x, snp, sd.scan))(x)
    with sd.config.x64_scope():
        want = jax_jac(lambda x: f(x, jnp, jax.lax.scan))(x)
    _close(got, want)


@pytest.mark.slow  # (the default suite's time budget)
def test_hessians(rng):
    def g(x, xp):
        return xp.sum(xp.tanh(x) ** 3) * xp.prod(xp.cos(x)) + xp.sum(x[:-1] * x[1:])

    x = rng.standard_normal(5)
    with sd.config.x64_scope():
        want = jax.hessian(lambda x: g(x, jnp))(x)
    gs = lambda x: g(x, snp)  # noqa: E731
    both = sd.function(lambda x: (sd.jacfwd(sd.jacrev(gs))(x), sd.jacrev(sd.jacfwd(gs))(x)))
    _close(both(x), (want, want))


def test_complex_follows_the_unrolled_definition(rng):
    # a complex input's basis vectors are complex units: the holomorphic
    # Jacobian for a holomorphic f (jax's `holomorphic=True`)
    z = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    f = lambda z, xp, fft: fft.fft(z * z) + xp.sin(z)  # noqa: E731
    with sd.config.x64_scope():
        want = jax.jacfwd(lambda z: f(z, jnp, jnp.fft), holomorphic=True)(z)
    _close(sd.jacfwd(lambda z: f(z, snp, sd.fft))(z), want)
    _close(sd.jacrev(lambda z: f(z, snp, sd.fft))(z), want)
    # a real input and a complex output: forward mode gives the complex Jacobian
    x = rng.standard_normal(3)
    with sd.config.x64_scope():
        want = jax.jacfwd(lambda x: jnp.exp(1j * x) * x)(x)
    _close(sd.jacfwd(lambda x: snp.exp(1j * x) * x)(x), want)


def test_outputs_that_do_not_depend_on_the_input(rng):
    x = rng.standard_normal(3)

    def f(x):
        return snp.sin(x), snp.ones((2, 2)), snp.arange(2), x[0] * 0.0 + 1.0

    for jac in (sd.jacfwd, sd.jacrev):
        j = jac(f)(x)
        assert [np.shape(a) for a in j] == [(3, 3), (2, 2, 3), (2, 3), (3,)]
        np.testing.assert_allclose(j[0], np.diag(np.cos(x)), rtol=1e-14)
        assert not np.any(j[1]) and not np.any(j[2]) and not np.any(j[3])
    assert sd.jacfwd(f)(x)[2].dtype == np.int64  # as the output (a tangent's dtype)


def test_inside_a_function_with_captured_values(rng):
    x, y = rng.standard_normal(4), rng.standard_normal(4)

    @sd.function
    def both(x, y):
        f = lambda x: snp.sin(x) * y + snp.sum(x * y)  # noqa: E731
        return sd.jacfwd(f)(x), sd.jacrev(f)(x)

    want = np.diag(np.cos(x) * y) + y[None, :]
    fwd, rev = both(x, y)
    _close(fwd, want)
    _close(rev, want)
    _close(sd.jacfwd(lambda x, y: snp.sin(x) * y, argnums=1)(x, y), np.diag(np.sin(x)))


def _chain(a):
    def f(x):
        y = snp.tanh(x) * 2.0 + snp.sin(x) * snp.exp(-(x ** 2))
        z = a @ y
        return snp.cos(z) * z + snp.log1p(x ** 2) + x ** 3 - 1.0
    return f


@pytest.mark.parametrize("jac", [sd.jacfwd, sd.jacrev], ids=MODE_IDS)
def test_graph_size_does_not_grow_with_the_jacobian(jac, rng):
    # unrolled (one JVP per column / VJP per row) this was 10,601 / 16,418 nodes
    n = 200
    f = _chain(rng.standard_normal((n, n)) / n)
    x = rng.standard_normal(n)
    t0 = time.perf_counter()
    graph = sd.trace(jac(f), x)
    assert time.perf_counter() - t0 < 2.0
    assert len(graph.nodes) < 80, len(graph.nodes)
    assert graph.outputs[0].type.shape == (n, n)
    small = sd.trace(jac(_chain(rng.standard_normal((3, 3)))), x[:3])
    assert len(graph.nodes) == len(small.nodes)


def test_gradient_of_a_dense_newton_step(rng):
    n = 200
    a = rng.standard_normal((n, n)) / n

    def residual(x, xp):
        return a @ xp.tanh(x) + x ** 3 + x - 1.0

    def loss(x, xp, solve, jacfwd):
        step = x - solve(jacfwd(lambda x: residual(x, xp))(x), residual(x, xp))
        return xp.sum(step ** 2)

    x = rng.standard_normal(n) * 0.1
    grad = sd.grad(lambda x: loss(x, snp, sd.linalg.solve, sd.jacfwd))
    assert len(sd.trace(grad, x).nodes) < 300  # unrolled: 13,262
    got = sd.function(grad)(x)
    with sd.config.x64_scope():
        want = jax.grad(lambda x: loss(x, jnp, jnp.linalg.solve, jax.jacfwd))(x)
    _close(got, want, 1e-10)


def test_errors():
    with pytest.raises(ShapeError, match="single int `argnums`"):
        sd.jacfwd(lambda x, y: x * y, argnums=(0, 1))(1.0, 2.0)
    with pytest.raises(ShapeError, match="out of range"):
        sd.jacrev(lambda x: x, argnums=1)(np.ones(2))
    a = sd.sparse.coo_matrix((np.ones(2), (np.arange(2), np.arange(2))), shape=(2, 2))
    with pytest.raises(ShapeError, match="must be a dense array"):
        sd.jacfwd(lambda a: a @ np.ones(2))(a)
