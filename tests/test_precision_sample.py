"""`sd.linalg.precision_sample` and the sparse Cholesky factor under it:
the kernels against dense linear algebra, samples whose covariance is
exactly `Q^-1`, derivatives (check_rules to second order, against JAX's
dense Cholesky), batches, `to_jax` and JAX's transforms of it, and the
errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, NonFiniteError, NotPositiveDefiniteError, ShapeError
from sciad.graph import Pattern
from sciad.solvers.direct import _fill_cholesky as fc


def _precision(rng, n=9, density=0.3, symmetric=True):
    """A random sparse spd matrix (diagonally dominant); not `symmetric`: its
    symmetric part is, and some entries have no stored mirror."""
    R = sp.random(n, n, density, random_state=np.random.RandomState(rng.integers(2**31)))
    R.data = rng.uniform(-1.0, 1.0, R.nnz)
    S = R + R.T if symmetric else R
    A = (S + sp.diags(np.asarray(abs(S + S.T).sum(axis=1)).ravel() + 0.5)).tocoo()
    return A.row, A.col, A.data, n


def _Q(v, rows, cols, n):
    return sd.sparse.coo_matrix((v, (rows, cols)), shape=(n, n))


def _dense_sample(v, rows, cols, n, z, perm):
    """The same sample by JAX's dense Cholesky: `P^T chol(P S P^T)^-T z`, `S`
    the symmetric part (an independent reference, derivatives included)."""
    A = jnp.zeros((n, n)).at[rows, cols].add(v)
    S = 0.5 * (A + A.T)
    inv = np.argsort(perm)
    L = jnp.linalg.cholesky(S[inv][:, inv])
    y = jax.scipy.linalg.solve_triangular(L, z, lower=True, trans="T")
    return y[perm]


# ---------------------------------------------------------------------------
# the kernels


def test_the_kernels_are_dense_linear_algebra(rng):
    rows, cols, v, n = _precision(rng, n=30, density=0.1)
    pattern, dest = Pattern.from_coo((n, n), rows, cols)
    d = np.zeros(pattern.nnz)
    np.add.at(d, dest, v)
    an = fc.layout(pattern)
    e = np.zeros(an.size)
    np.add.at(e, an.slot, an.weight * d)

    def lower(x):
        M = np.zeros((n, n))
        M[an.rows, an.cols] = x
        return M

    on = lower(np.ones(an.size)) != 0
    inv = np.argsort(an.perm)
    B = sp.csr_matrix((v, (rows, cols)), shape=(n, n)).toarray()[np.ix_(inv, inv)]
    np.testing.assert_allclose(lower(e) + np.tril(lower(e), -1).T, B, atol=1e-15)
    l, status = fc.chol(an, e)
    L = lower(l)
    assert status == 0
    np.testing.assert_allclose(L, np.linalg.cholesky(B), atol=1e-13)
    x, y, c = (rng.standard_normal(an.size) for _ in range(3))
    X, Y, C = lower(x), lower(y), lower(c)
    # the tangent map solves tril(X L^T + L X^T) = E; the adjoint is its transpose
    T = lower(fc.tangent(an, l, x))
    np.testing.assert_allclose(np.tril(T @ L.T + L @ T.T), np.tril(X + X.T - np.diag(x[:n])),
                               atol=1e-12)
    assert abs(y @ fc.tangent(an, l, x) - fc.adjoint(an, l, y) @ x) < 1e-11
    np.testing.assert_allclose(lower(fc.symprod(an, x, y)), np.tril(X @ Y.T + Y @ X.T) * on,
                               atol=1e-13)
    np.testing.assert_allclose(lower(fc.symmul(an, c, y)), ((C + C.T) @ Y) * on, atol=1e-13)
    b = rng.standard_normal((n, 3))
    np.testing.assert_allclose(fc.trisolve(an, l, b, False), np.linalg.solve(L, b), atol=1e-13)
    np.testing.assert_allclose(fc.trisolve(an, l, b, True), np.linalg.solve(L.T, b), atol=1e-13)
    bad = e.copy()
    bad[3] = -1.0
    assert fc.chol(an, bad)[1] == 4 and fc.chol(an, np.where(e == e[0], np.nan, e))[1] == 1
    # the kernels take the fill's closure for granted: it is checked once per
    # structure (a fill missing an entry of a column's clique is refused)
    assert fc.closed(n, an.Sp, an.Si) == 0
    j = int(np.flatnonzero(np.diff(an.Sp) >= 2)[0])  # a column with two rows below it
    cut = an.Si.copy()
    k = int(cut[an.Sp[j]])  # the first row below j: its column must hold the next
    row = int(cut[an.Sp[j] + 1])
    at = np.flatnonzero(cut[an.Sp[k]:an.Sp[k + 1]] == row)
    cut[an.Sp[k] + at] = k + 1 if row != k + 1 else k + 2  # a wrong row in column k
    assert fc.closed(n, an.Sp, cut) != 0


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_samples_covariance_is_the_inverse_exactly(rng, symmetric):
    """`x` is linear in `z`: the samples of the identity's columns have
    `X X^T = Q^-1` (of `Q`'s symmetric part) to rounding."""
    rows, cols, v, n = _precision(rng, symmetric=symmetric)
    X = np.asarray(sd.linalg.precision_sample(_Q(v, rows, cols, n), np.eye(n)))
    A = sp.csr_matrix((v, (rows, cols)), shape=(n, n)).toarray()
    np.testing.assert_allclose(X @ X.T, np.linalg.inv(0.5 * (A + A.T)), atol=1e-13)
    z = rng.standard_normal(n)
    np.testing.assert_allclose(np.asarray(sd.linalg.precision_sample(_Q(v, rows, cols, n), z)),
                               X @ z, atol=1e-13)


def test_a_grid_precision_at_a_realistic_size(rng):
    """A 2-D SPDE-type precision `(kappa^2 - Laplacian)` on 40 x 40: the
    sample solves `L^T P x = z` with the factor of `P Q P^T`."""
    m = 40
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (m, m))
    Q = (sp.kron(T, sp.eye(m)) + sp.kron(sp.eye(m), T) + 0.1 * sp.eye(m * m)).tocoo()
    z = rng.standard_normal((m * m, 2))
    x = np.asarray(sd.linalg.precision_sample(_Q(Q.data, Q.row, Q.col, m * m), z))
    # Q x = P^T L z: check with the factor's own pieces
    an = fc.layout(Pattern.from_coo(Q.shape, Q.row, Q.col)[0])
    inv = np.argsort(an.perm)
    Lf = np.linalg.cholesky(Q.toarray()[np.ix_(inv, inv)])
    np.testing.assert_allclose(Q @ x, (Lf @ z)[an.perm], rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# derivatives


@pytest.mark.slow  # (the registry walk checks every rule to second order; below, JAX's)
def test_check_rules_to_second_order(rng):
    rows, cols, v, n = _precision(rng, n=7, symmetric=False)
    z = rng.standard_normal((n, 2))
    report = sd.testing.check_rules(lambda v, z: sd.linalg.precision_sample(
        _Q(v, rows, cols, n), z), v, z)
    assert report.second_order_error is not None and not report.skipped


def test_derivatives_are_jax_dense_choleskys(rng):
    """The gradient and a Hessian-vector product of a sample's functional,
    against the same sample written with JAX's dense Cholesky."""
    rows, cols, v, n = _precision(rng, n=8, symmetric=False)
    z = rng.standard_normal(n)
    w = rng.standard_normal(n)
    perm = fc.layout(Pattern.from_coo((n, n), rows, cols)[0]).perm

    def ours(v):
        return snp.sum(w * snp.sin(sd.linalg.precision_sample(_Q(v, rows, cols, n), z)))

    def ref(v):
        return jnp.sum(w * jnp.sin(_dense_sample(v, rows, cols, n, z, perm)))

    t = rng.standard_normal(v.size)
    np.testing.assert_allclose(np.asarray(sd.grad(ours)(v)), jax.grad(ref)(v), atol=1e-12)
    hvp = sd.jvp(sd.grad(ours), (v,), (t,))[1]
    want = jax.jvp(jax.grad(ref), (v,), (t,))[1]
    np.testing.assert_allclose(np.asarray(hvp), want, atol=1e-11)
    # the symmetric part is factored: Q[i, j] and Q[j, i] take equal halves
    sym_rows, sym_cols, sv, _ = _precision(rng, n=8)
    g = np.asarray(sd.grad(lambda v: snp.sum(sd.linalg.precision_sample(
        _Q(v, sym_rows, sym_cols, n), z) ** 2))(sv))
    G = sp.csr_matrix((g, (sym_rows, sym_cols)), shape=(n, n)).toarray()
    np.testing.assert_allclose(G, G.T, atol=1e-14)


def test_a_batch_and_jaxs_transforms_of_to_jax(rng):
    rows, cols, v, n = _precision(rng, n=6)
    z = rng.standard_normal(n)
    perm = fc.layout(Pattern.from_coo((n, n), rows, cols)[0]).perm
    f = lambda v, z: sd.linalg.precision_sample(_Q(v, rows, cols, n), z)  # noqa: E731
    vs = v * rng.uniform(0.9, 1.1, (3, v.size))
    zs = rng.standard_normal((3, n))
    want = np.stack([_dense_sample(a, rows, cols, n, b, perm) for a, b in zip(vs, zs)])
    np.testing.assert_allclose(np.asarray(sd.vmap(f)(vs, zs)), want, atol=1e-13)
    np.testing.assert_allclose(np.asarray(sd.vmap(f, in_axes=(None, 0))(v, zs)),
                               np.stack([_dense_sample(v, rows, cols, n, b, perm) for b in zs]),
                               atol=1e-13)
    g = sd.to_jax(lambda v: snp.sum(f(v, z) ** 3))
    ref = lambda v: jnp.sum(_dense_sample(v, rows, cols, n, z, perm) ** 3)  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.jacfwd(g))(v), jax.grad(ref)(v), atol=1e-12)
    T = jnp.eye(v.size)[:3]
    np.testing.assert_allclose(jax.vmap(lambda t: jax.jvp(g, (v,), (t,))[1])(T),
                               jax.vmap(lambda t: jax.jvp(ref, (v,), (t,))[1])(T), atol=1e-12)


@pytest.mark.slow  # (second order through to_jax: compile-heavy)
def test_jaxs_hessian_of_to_jax(rng):
    rows, cols, v, n = _precision(rng, n=6)
    z = rng.standard_normal(n)
    perm = fc.layout(Pattern.from_coo((n, n), rows, cols)[0]).perm
    g = sd.to_jax(lambda v: snp.sum(sd.linalg.precision_sample(_Q(v, rows, cols, n), z) ** 3))
    ref = lambda v: jnp.sum(_dense_sample(v, rows, cols, n, z, perm) ** 3)  # noqa: E731
    np.testing.assert_allclose(jax.hessian(g)(v), jax.hessian(ref)(v), atol=1e-10)


# ---------------------------------------------------------------------------
# errors


def test_what_is_not_positive_definite_raises_naming_the_column(rng):
    rows, cols, v, n = _precision(rng, n=5)
    bad = np.where((rows == 2) & (cols == 2), -3.0, v)
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        sd.linalg.precision_sample(_Q(bad, rows, cols, n), np.ones(n))
    with pytest.raises(NotPositiveDefiniteError):
        sd.grad(lambda v: snp.sum(sd.linalg.precision_sample(_Q(v, rows, cols, n),
                                                             np.ones(n))))(bad)
    nan = v.copy()
    nan[0] = np.nan  # (the pivot test `> 0` fails for NaN too; the finite check says so)
    with pytest.raises(NonFiniteError, match="NaN"):
        sd.linalg.precision_sample(_Q(nan, rows, cols, n), np.ones(n))


def test_float32_and_empty_matrices(rng):
    rows, cols, v, n = _precision(rng, n=6)
    z = rng.standard_normal(n)
    x32 = sd.linalg.precision_sample(_Q(v.astype(np.float32), rows, cols, n), z.astype(np.float32))
    assert x32.dtype == np.float32
    np.testing.assert_allclose(np.asarray(x32), np.asarray(
        sd.linalg.precision_sample(_Q(v, rows, cols, n), z)), rtol=1e-5)
    empty = sd.sparse.coo_matrix((np.zeros(0), (np.zeros(0, int), np.zeros(0, int))),
                                 shape=(0, 0))
    assert sd.linalg.precision_sample(empty, np.zeros((0, 3))).shape == (0, 3)
    spd = sd.sparse.coo_matrix((np.zeros(0), (np.zeros(0, int), np.zeros(0, int))),
                               shape=(0, 0), tags={"spd"})  # (the factor's other readers)
    assert float(sd.linalg.slogdet(spd)[1]) == 0.0
    assert sd.linalg.selected_inverse(spd, on="factor").shape == (0, 0)


def test_bad_input_is_refused(rng):
    rows, cols, v, n = _precision(rng, n=5)
    Q = _Q(v, rows, cols, n)
    with pytest.raises(ShapeError, match="sparse precision"):
        sd.linalg.precision_sample(np.eye(3), np.ones(3))
    with pytest.raises(ShapeError, match=r"\(5,\) or \(5, k\)"):
        sd.linalg.precision_sample(Q, np.ones(4))
    with pytest.raises(ShapeError, match="square"):
        sd.linalg.precision_sample(sd.sparse.coo_matrix((np.ones(2), ([0, 1], [0, 1])),
                                                        shape=(2, 3)), np.ones(2))
    with pytest.raises(DTypeError, match="real"):
        sd.linalg.precision_sample(Q, np.ones(n) * 1j)


def test_a_failure_leaves_no_factor_held():
    """A sample that fails between two solves with one SuperLU factor held:
    its host call ends what the program holds before it raises."""
    from sciad.solvers.direct import _sparse_direct

    r, c = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])

    def f(v):
        M = _Q(v, r, c, 2)
        x, _ = sd.linalg.solve(M, snp.ones(2), solver="splu", throw=False)
        s = sd.linalg.precision_sample(_Q(v + 0.0 * x[0], r, c, 2), snp.ones(2))
        y, _ = sd.linalg.solve(M, s, solver="splu", throw=False)
        return snp.sum(y)

    g = sd.function(f)
    held = _sparse_direct.held()
    for _ in range(5):
        with pytest.raises(NotPositiveDefiniteError):
            g(np.array([1.0, 2.0, 2.0, 1.0]))
    assert _sparse_direct.held() == held
