"""The Krylov backend (`sciad.solvers.iterative`) at the edges of floating
point: b = 0 (a whole right-hand side or some columns), right-hand sides near
1e-16 (an adjoint solve at an optimum), 1e+-155 and 1e+-300 (squared norms
under- and overflow), a single nonzero entry (a localized source), the
identity (BiCGStab solves it in half a step), and solutions out of range,
which must be reported, not returned as converged. Directly, and through
`sd.linalg.solve` and its gradients, for CG, GMRES and BiCGStab."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.solvers.iterative import _iterative as iterative

METHODS = ("cg", "gmres", "bicgstab")
N = 6
RTOL = 1e-10


def _matrix(rng, method):
    """SPD for CG, else SPD plus a skew part: well conditioned, not symmetric."""
    B = rng.standard_normal((N, N))
    A = B @ B.T / N + 2 * np.eye(N)
    if method != "cg":
        C = rng.standard_normal((N, N))
        A = A + 0.5 * (C - C.T)
    return A


def _sparse(method):
    """A tridiagonal CSR matrix with its scale spread over 1e+-3, so that
    Jacobi has work to do: `D T D` for CG (SPD), else `D^2 T` with an upwind
    term in `T`."""
    upwind = 0.0 if method == "cg" else 0.7
    T = sp.diags([-1.0 - upwind, 4.0, -1.0 + upwind], [-1, 0, 1], shape=(N, N))
    D = sp.diags(np.logspace(-1.5, 1.5, N))
    M = sp.csr_array(D @ T @ D if method == "cg" else D @ D @ T)
    M.sort_indices()
    return M


def _columns(rng):
    """Right-hand sides as columns: zero, ~1e-16, 1e-155, 1e+155, 1e-300,
    1e+300, one nonzero entry, ordinary, one nonzero entry of 1e-16."""
    v = rng.standard_normal(N)
    e = np.eye(N)[2]
    return np.stack([0 * v, 1e-16 * v / np.linalg.norm(v), 1e-155 * v, 1e155 * v,
                     1e-300 * v, 1e300 * v, e, v, 1e-16 * e], axis=1)


def _assert_solves(x, A, b, rtol=1e-8):
    """Columnwise: `x` matches a LAPACK solve (which squares nothing) to
    `rtol` of its largest entry; zero columns give exactly zero."""
    x = np.asarray(x)
    want = np.linalg.solve(A, b)
    for j in range(b.shape[1]):
        if not b[:, j].any():
            assert np.all(x[:, j] == 0), (j, x[:, j])
            continue
        scale = np.max(np.abs(want[:, j]))
        err = np.max(np.abs(x[:, j] - want[:, j])) / scale
        assert err <= rtol, (j, scale, err)


def _solve_columns(method):
    """`solve` on each column of `b` (a vmap of the one-vector solve), jitted,
    returning the per-column `(x, converged, relative_residual, steps)`."""
    def f(A, b):
        def one(col):
            return iterative.solve(lambda v: jnp.matmul(A, v, precision="highest"), col,
                                   method=method, rtol=RTOL, atol=0.0, maxiter=None)
        return jax.vmap(one, in_axes=1, out_axes=(1, 0, 0, 0))(b)
    return jax.jit(f)


@pytest.mark.parametrize("method", METHODS)
def test_direct_solve_at_the_edges_of_floating_point(rng, method):
    A, b = _matrix(rng, method), _columns(rng)
    with jax.enable_x64(True):
        f = _solve_columns(method)  # compiled once: every call below has these shapes
        x, ok, rel, steps = map(np.asarray, f(jnp.asarray(A), jnp.asarray(b)))
        assert ok.all(), (ok, rel)
        assert np.all(rel <= RTOL)
        _assert_solves(x, A, b)
        # b = 0: x = 0 exactly, converged, relative residual 0, no steps
        assert (rel[0], steps[0]) == (0.0, 0)
        assert np.all(steps[1:] > 0)

        # The identity: BiCGStab's half step solves it (s = 0, so t = 0).
        x, ok, rel, steps = map(np.asarray, f(jnp.eye(N), jnp.asarray(b)))
        assert ok.all(), (ok, rel)
        np.testing.assert_allclose(x, b, rtol=1e-14)

        # A scaled by 2**+-600 (so that its squares would underflow or
        # overflow): converged and accurate where the solution is in range,
        # reported (not returned as converged) where it is not.
        for s in (2.0**600, 2.0**-600):
            x, ok, rel, _ = map(np.asarray, f(jnp.asarray(s * A), jnp.asarray(b)))
            with np.errstate(over="ignore", under="ignore"):
                big = np.max(np.abs(np.linalg.solve(A, b)), axis=0) / s
            fits = (big > 1e-290) & (big < 1e300) | ~b.any(axis=0)
            assert 0 < fits.sum() < b.shape[1]
            np.testing.assert_array_equal(ok, fits)
            _assert_solves(x[:, fits], s * A, b[:, fits])


@pytest.mark.parametrize("method", ["cg"] + [pytest.param(m, marks=pytest.mark.slow)
                                            for m in METHODS if m != "cg"])
def test_public_solve_and_gradient_at_a_tiny_residual(rng, method):
    """`sd.linalg.solve` on a dense and a sparse (Jacobi-preconditioned)
    matrix with those columns, and its gradient where the loss's gradient
    with respect to the solution is 1e-16 in one entry and exactly 0 in the
    other entries (dense), or exactly 0 throughout (sparse): the adjoint
    solves get those right-hand sides (at an optimum they are ~1e-16)."""
    A, b = _matrix(rng, method), _columns(rng)
    M = _sparse(method)

    def loss(A, d, b, eye):
        S = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        X1 = sd.linalg.solve(A, b, solver=method, tol=RTOL)
        X2 = sd.linalg.solve(S, b, solver=method, tol=RTOL, preconditioner="jacobi")
        x3 = sd.linalg.solve(eye, 0.0 * b[:, 0], solver=method)  # I x = 0
        return 1e-16 * X1[2, 7] + 0.0 * snp.sum(X2), (X1, X2, x3)

    (_, (X1, X2, x3)), (gA, gd) = sd.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        A, M.data, b, np.eye(N))
    _assert_solves(X1, A, b)
    _assert_solves(X2, M.toarray(), b)
    np.testing.assert_array_equal(np.asarray(x3), np.zeros(N))

    # dL/dA = -lam x^T with lam = A^-T dL/dx
    lam = np.linalg.solve(A.T, 1e-16 * np.eye(N)[2])
    want = -np.outer(lam, np.linalg.solve(A, b[:, 7]))
    np.testing.assert_allclose(np.asarray(gA), want, rtol=1e-8, atol=0)
    np.testing.assert_array_equal(np.asarray(gd), np.zeros_like(M.data))


def test_the_first_residual_is_not_folded_into_a_constant_at_compile_time():
    """lineax's first residual is `u - A y0`; with `y0` a zero XLA can see,
    `A y0` is a gather of constants that XLA's constant folding evaluates
    entry by entry at compile time (measured: 49 s for 2 * 10^7 stored
    entries, 1.2 s with the barrier). The zero goes in behind an
    optimization barrier (without it the compiled program has one gather
    fewer: the product folded away at compile time)."""
    import re

    import jax
    import scipy.sparse as sp

    m = 30
    A = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], shape=(m * m, m * m)).tocsr()
    A.sort_indices()

    def solve(d, b):
        S = sd.sparse.csr_matrix((d, A.indices, A.indptr), shape=A.shape)
        return sd.linalg.solve(S, b, solver="cg", tol=1e-10)

    with jax.enable_x64(True):
        lowered = jax.jit(sd.to_jax(solve)).lower(A.data, np.ones(m * m))
    assert re.search(r"stablehlo\.optimization_barrier %\S+ : tensor<900xf64>",
                     lowered.as_text()), "the first iterate is not behind a barrier"
