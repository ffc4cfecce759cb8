"""`sd.linalg.slogdet(A, solver="slq")`: the stochastic Lanczos quadrature
estimate of a sparse spd matrix's log-determinant and its matching gradient
estimator: exact quadrature against the dense Hutchinson average with the
same probes, the estimate within its stated standard deviation of the truth,
the gradient estimator unbiased, rules, batches, and the errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (InvalidOptionError, NonFiniteError, NotPositiveDefiniteError,
                          ShapeError, StructureError)


def _grid(m, shift):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (m, m))
    A = (sp.kron(T, sp.eye(m)) + sp.kron(sp.eye(m), T) + shift * sp.eye(m * m)).tocsr()
    A.sort_indices()
    return A, np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)), A.indices


def _M(v, r, c, n):
    return sd.sparse.coo_matrix((v, (r, c)), shape=(n, n), tags={"spd"})


def _probes(n, p, seed):
    return np.asarray(jax.random.rademacher(jax.random.key(seed), (n, p), dtype=jnp.int8),
                      float)


def test_exact_quadrature_is_the_hutchinson_average_and_its_gradient():
    """With as many Lanczos steps as unknowns the quadrature is exact: the
    estimate is `(1/p) sum_i z_i^T log(A) z_i` and its gradient `(1/p) sum_i
    (A^-1 z_i) z_i^T` on the pattern, for the same probes."""
    A, r, c = _grid(3, 0.5)
    n, p = A.shape[0], 7
    Z = _probes(n, p, seed=4)
    logA = sla.logm(A.toarray()).real
    want = np.mean(np.sum(Z * (logA @ Z), axis=0))
    f = lambda v: sd.linalg.slogdet(_M(v, r, c, n), solver="slq", probes=p, steps=n,  # noqa
                                    seed=4)[1]
    np.testing.assert_allclose(float(f(A.data)), want, rtol=1e-12)
    X = np.linalg.solve(A.toarray(), Z)
    np.testing.assert_allclose(np.asarray(sd.grad(f)(A.data)), (X @ Z.T)[r, c] / p, rtol=1e-8,
                               atol=1e-12)


def test_the_estimate_is_within_its_stated_deviation():
    A, r, c = _grid(16, 0.2)
    n = A.shape[0]
    lam = np.linalg.eigvalsh(A.toarray())
    exact = np.sum(np.log(lam))
    bound = np.sqrt(2.0 / 64) * np.linalg.norm(np.log(lam))  # sqrt(2/p) |log A|_F
    est = float(sd.linalg.slogdet(_M(A.data, r, c, n), solver="slq", seed=1)[1])
    assert abs(est - exact) < 3 * bound, (est, exact, bound)
    # more probes: closer (the deviation falls as 1/sqrt(p))
    est = float(sd.linalg.slogdet(_M(A.data, r, c, n), solver="slq", probes=1024)[1])
    assert abs(est - exact) < 3 * bound / 4


# slow: the estimator's formula is test_exact_quadrature_...'s (exact), from
# which its mean follows; this checks the mean by sampling
@pytest.mark.slow
def test_the_gradient_estimator_is_unbiased():
    """The mean of the gradient estimates over independent probes converges
    to `A^-1` on the pattern (the exact gradient), at the Monte Carlo rate."""
    A, r, c = _grid(4, 0.5)
    n = A.shape[0]
    inv = np.linalg.inv(A.toarray())
    g = sd.function(sd.grad(lambda v, seed=0: sd.linalg.slogdet(
        _M(v, r, c, n), solver="slq", probes=512, steps=n, seed=seed)[1]),
        static_argnames="seed")
    mean = np.mean([np.asarray(g(A.data, seed=s)) for s in range(4)], axis=0)
    # each entry: mean of 2048 terms x_i z_i, deviation about |A^-1 row| / sqrt(2048)
    tol = 4 * np.linalg.norm(inv, axis=1).max() / np.sqrt(2048)
    assert np.max(np.abs(mean - inv[c, r])) < tol


# slow: the registry walk checks the same rules on a smaller diagonal matrix
@pytest.mark.slow
def test_rules_on_a_diagonal_matrix_where_the_estimate_is_exact(rng):
    """On a diagonal matrix `z^T log(A) z = tr log A` for every sign vector,
    so with exact quadrature (as many steps as unknowns) the estimate is
    exact and its derivatives are the true ones: JVP, VJP, second order and
    batching checked against finite differences."""
    n = 6
    d = rng.uniform(1.0, 3.0, n)
    f = lambda d: sd.linalg.slogdet(sd.sparse.coo_matrix(  # noqa: E731
        (d, (np.arange(n), np.arange(n))), shape=(n, n), tags={"spd"}), solver="slq",
        probes=3, steps=n)[1]
    np.testing.assert_allclose(float(f(d)), np.sum(np.log(d)), rtol=1e-13)
    report = sd.testing.check_rules(f, d)
    assert report.second_order_error is not None and not report.skipped


# slow: the registry walks batch and lower the same primitives
@pytest.mark.slow
def test_a_batch_and_to_jax():
    A, r, c = _grid(3, 0.5)
    n = A.shape[0]
    f = lambda v: sd.linalg.slogdet(_M(v, r, c, n), solver="slq", probes=5, steps=n)[1]  # noqa
    vs = A.data * np.linspace(0.9, 1.1, 3)[:, None]
    want = [float(f(v)) for v in vs]
    np.testing.assert_allclose(np.asarray(sd.vmap(f)(vs)), want, rtol=1e-12)
    np.testing.assert_allclose(float(jax.jit(sd.to_jax(f))(vs[0])), want[0], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.grad(sd.to_jax(f))(vs[0])),
                               np.asarray(sd.grad(f)(vs[0])), rtol=1e-10)


def test_errors():
    A, r, c = _grid(3, 0.5)
    n = A.shape[0]
    M = _M(A.data, r, c, n)
    with pytest.raises(StructureError, match="spd"):
        sd.linalg.slogdet(sd.sparse.from_scipy(A), solver="slq")
    with pytest.raises(ShapeError, match="sparse"):
        sd.linalg.slogdet(A.toarray(), solver="slq", assume="spd")
    with pytest.raises(InvalidOptionError, match="`probes` must be a positive integer"):
        sd.linalg.slogdet(M, solver="slq", probes=0)
    with pytest.raises(InvalidOptionError, match="options of solver='slq'"):
        sd.linalg.slogdet(M, probes=8)
    with pytest.raises(NotPositiveDefiniteError, match="Ritz value"):
        sd.linalg.slogdet(_M(A.data - 5.0 * (r == c), r, c, n), solver="slq", steps=n)
    v = A.data.copy()
    v[0] = np.nan
    with pytest.raises(NonFiniteError):
        sd.linalg.slogdet(_M(v, r, c, n), solver="slq")
    with pytest.raises(NonFiniteError):
        sd.grad(lambda v: sd.linalg.slogdet(_M(v, r, c, n), solver="slq")[1])(v)


@pytest.mark.slow
def test_the_estimator_in_a_program_with_other_work():
    """The estimate composes: a marginal-likelihood-like sum with a solve."""
    A, r, c = _grid(4, 1.0)
    n = A.shape[0]
    b = np.linspace(0.0, 1.0, n)

    def f(v):
        M = _M(v, r, c, n)
        return sd.linalg.slogdet(M, solver="slq", steps=n, probes=16)[1] + snp.sum(
            b * sd.linalg.solve(M, b))

    value, grad = sd.value_and_grad(f)(A.data)
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))


def test_a_large_matrix_takes_preconditioned_conjugate_gradients():
    """Beyond `SMALL` unknowns the estimator's solves are AMG-preconditioned
    CG (nothing factored): its gradient is `(1/p) sum_i (A^-1 z_i) z_i^T` on
    the pattern, against SciPy's direct solves with the same probes."""
    import scipy.sparse.linalg as spl

    from sciad.primitives._slq import SMALL

    A, r, c = _grid(46, 0.5)
    n, p = A.shape[0], 3
    assert n > SMALL
    f = lambda v: sd.linalg.slogdet(_M(v, r, c, n), solver="slq", probes=p, steps=8)[1]  # noqa
    names = [nd.primitive.name for nd in sd.trace(sd.grad(f), A.data).nodes]
    params = [nd.params for nd in sd.trace(sd.grad(f), A.data).nodes
              if nd.primitive.name == "linalg.solve"]
    assert "linalg.solve" in names and params[0]["solver"] == "cg"
    assert params[0]["preconditioner"] == "amg"
    Z = _probes(n, p, seed=0)
    X = spl.splu(A.tocsc()).solve(Z)
    np.testing.assert_allclose(np.asarray(sd.grad(f)(A.data)), (X @ Z.T)[r, c] / p,
                               rtol=1e-7, atol=1e-10)
