"""`sd.linalg.eigsh`: k eigenpairs of a sparse symmetric matrix by ARPACK on
the host, differentiated implicitly with the cotangent kept on the pattern."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ConvergenceError, DTypeError, DegenerateEigenvalueError,
                          InvalidOptionError, ShapeError)

M = 20  # a 20 x 20 grid: n = 400


def _grid(m):
    """The static part of a 2-D Dirichlet Laplacian on an m x m grid: the
    edges between neighbours, and each node's number of boundary sides."""
    idx = np.arange(m * m).reshape(m, m)
    ep = np.concatenate([idx[:, :-1].ravel(), idx[:-1, :].ravel()])
    eq = np.concatenate([idx[:, 1:].ravel(), idx[1:, :].ravel()])
    degree = np.bincount(np.concatenate([ep, eq]), minlength=m * m)
    return ep, eq, 4 - degree


def _laplacian_coo(c, m, xp):
    """`-div(c grad u)` with node coefficients `c` (m*m of them), as COO
    `(data, (rows, cols))` with `data` in `xp` ops: edge weights `(c_p + c_q)
    / 2`, boundary sides weighted `c_p`. Symmetric positive definite; its
    pattern does not depend on `c`."""
    ep, eq, bnd = _grid(m)
    we = (c[ep] + c[eq]) / 2
    i = np.arange(m * m)
    return (xp.concatenate([-we, -we, we, we, c * bnd]),
            (np.concatenate([ep, eq, ep, eq, i]), np.concatenate([eq, ep, ep, eq, i])))


def laplacian(c, m=M):
    """`_laplacian_coo` as a sciad sparse matrix."""
    return sd.sparse.coo_matrix(_laplacian_coo(c, m, snp), shape=(m * m, m * m))


def laplacian_scipy(c, m=M):
    """`_laplacian_coo` as a SciPy CSR matrix."""
    return sp.coo_matrix(_laplacian_coo(c, m, np), shape=(m * m, m * m)).tocsr()


@pytest.fixture
def coef(rng):
    return 1.0 + 0.5 * rng.uniform(size=M * M)


def _assert_same_vectors(v, ref, tol=1e-7):
    # eigenvectors agree up to sign
    signs = np.sign(np.sum(v * ref, axis=0))
    np.testing.assert_allclose(v, ref * signs, atol=tol)


@pytest.mark.parametrize("mode", ["SA", "shift-invert"])
def test_values_and_vectors_match_scipy_and_numpy(coef, mode):
    kw = dict(which="SA") if mode == "SA" else dict(sigma=0.0)
    w, v = sd.linalg.eigsh(laplacian(coef), k=4, **kw)
    w, v = np.asarray(w), np.asarray(v)
    a = laplacian_scipy(coef)
    ref_w, ref_v = spla.eigsh(a, k=4, **(kw if mode == "SA" else dict(sigma=0.0,
                                                                        which="LM")))
    order = np.argsort(ref_w)
    ref_w, ref_v = ref_w[order], ref_v[:, order]
    dense_w, dense_v = np.linalg.eigh(a.toarray())
    assert w.shape == (4,) and v.shape == (400, 4)
    assert np.all(np.diff(w) > 0)
    np.testing.assert_allclose(w, ref_w, rtol=1e-10)
    np.testing.assert_allclose(w, dense_w[:4], rtol=1e-10)
    _assert_same_vectors(v, ref_v)
    _assert_same_vectors(v, dense_v[:, :4])
    np.testing.assert_allclose(a @ v, v * w, atol=1e-9)
    # the sign convention: each vector's largest entry is positive
    assert np.all(v[np.argmax(np.abs(v), axis=0), np.arange(4)] > 0)


def _tridiag(n, shift=0.0):
    """The 1-D Laplacian tridiag(-1, 2, -1) minus `shift` I, as a sciad and a
    SciPy sparse matrix (`shift=1.5` makes it indefinite)."""
    i = np.arange(n)
    data = np.concatenate([np.full(n, 2.0 - shift), -np.ones(2 * n - 2)])
    ij = (np.concatenate([i, i[:-1], i[1:]]), np.concatenate([i, i[1:], i[:-1]]))
    return (sd.sparse.coo_matrix((data, ij), shape=(n, n)),
            sp.coo_matrix((data, ij), shape=(n, n)).tocsr())


def test_the_default_is_scipys_largest_magnitude():
    # the call: the three smallest came back where SciPy gives the
    # three largest (its default which="LM"), on a matrix and an operator
    a, ref = _tridiag(40)
    want = spla.eigsh(ref, k=3)[0]
    assert want[0] > 3.9
    np.testing.assert_allclose(sd.linalg.eigsh(a, k=3)[0], want, rtol=1e-12)
    op = sd.linalg.operator(lambda x: sd.sparse.matmul(a, x), (40, 40))
    np.testing.assert_allclose(sd.linalg.eigsh(op, k=3)[0], want, rtol=1e-12)


@pytest.mark.parametrize("sigma", [None, 0.3])
@pytest.mark.parametrize("which", ["LM", "SM", "LA", "SA", "BE"])
def test_every_which_matches_scipy_values_and_order(which, sigma):
    # indefinite, so that "LM" is not "LA" nor "SM" "SA"; with `sigma`,
    # `which` refers to 1 / (w - sigma), as in SciPy; ascending, as SciPy's
    a, ref = _tridiag(40, shift=1.5)
    w, v = sd.linalg.eigsh(a, k=5, which=which, sigma=sigma)
    # (SciPy's reference from a fixed start: from ARPACK's random one, "SM"
    # with sigma=0.3 once stopped at 4 of 5 eigenpairs after 401 iterations)
    want = spla.eigsh(ref, k=5, which=which, sigma=sigma, v0=np.linspace(1.0, 2.0, 40))[0]
    np.testing.assert_allclose(w, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref @ np.asarray(v), np.asarray(v) * np.asarray(w), atol=1e-9)
    np.testing.assert_allclose(np.asarray(v).T @ np.asarray(v), np.eye(5), atol=1e-10)


def _both_ends(a, d, vectors=True):
    """A loss of "BE" (two low, two high) eigenpairs of `a + t diag(d)`."""
    def f(t):
        w, v = sd.linalg.eigsh(a + t * d, k=4, which="BE")
        out = snp.sum(w * np.arange(1.0, 5.0))
        return out + snp.sum(v ** 2 * np.arange(12.0)[:, None]) if vectors else out

    return f


def test_both_ends_differentiate_and_see_a_cluster_cut_at_either_end():
    a, ref = _tridiag(12)
    w = np.linalg.eigvalsh(ref.toarray())
    np.testing.assert_allclose(sd.linalg.eigsh(a, k=4, which="BE")[0], w[[0, 1, 10, 11]],
                               rtol=1e-12)
    # the eigenvalues of both runs: the gradient against central differences
    # (the eigenvectors': `test_check_rules_both_ends`)
    i = np.arange(12)
    f = _both_ends(a, sd.sparse.coo_matrix((np.linspace(0.0, 1.0, 12) ** 2, (i, i)),
                                           shape=(12, 12)), vectors=False)
    h = 1e-6
    np.testing.assert_allclose(sd.grad(f)(0.3), (f(0.3 + h) - f(0.3 - h)) / (2 * h),
                               rtol=1e-6)
    # two copies of the Laplacian side by side: every eigenvalue a repeated
    # pair, and k=2 cuts the lowest pair and the highest; each end's run
    # sees its own cut, so neither derivative passes
    r, c = ref.tocoo().row, ref.tocoo().col
    two = sd.sparse.coo_matrix((np.concatenate([ref.tocoo().data] * 2),
                                (np.concatenate([r, r + 12]), np.concatenate([c, c + 12]))),
                               shape=(24, 24))
    for end in (0, 1):
        with pytest.raises(DegenerateEigenvalueError, match="`k` cuts a cluster"):
            sd.grad(lambda s: sd.linalg.eigsh(two * s, k=2, which="BE")[0][end])(1.0)
    with pytest.raises(ShapeError, match="which='BE' needs k >= 2"):
        sd.linalg.eigsh(a, k=1, which="BE")


@pytest.mark.slow
def test_check_rules_both_ends():
    a, _ = _tridiag(12)
    i = np.arange(12)
    d = sd.sparse.coo_matrix((np.linspace(0.0, 1.0, 12) ** 2, (i, i)), shape=(12, 12))
    report = sd.testing.check_rules(_both_ends(a, d), 0.3, batch=False)
    assert report.jvp_error < 1e-6 and report.vjp_error < 1e-9


def _losses():
    return {"sum": lambda w: snp.sum(w), "sum_sq": lambda w: snp.sum(w ** 2)}


# (two of the four by default: each mode once, each loss once)
@pytest.mark.parametrize("mode, loss", [("SA", "sum"), ("shift-invert", "sum_sq"),
                                        pytest.param("SA", "sum_sq", marks=pytest.mark.slow),
                                        pytest.param("shift-invert", "sum", marks=pytest.mark.slow)])
def test_eigenvalue_gradients(coef, rng, loss, mode):
    g_of_w = _losses()[loss]
    kw = dict(which="SA") if mode == "SA" else dict(sigma=0.0)

    def f(c):
        return g_of_w(sd.linalg.eigsh(laplacian(c), k=4, **kw)[0])

    def f_dense(c):
        return g_of_w(sd.linalg.eigh(sd.sparse.todense(laplacian(c)))[0][:4])

    grad = np.asarray(sd.grad(f)(coef))
    np.testing.assert_allclose(grad, np.asarray(sd.grad(f_dense)(coef)), rtol=1e-8,
                               atol=1e-12)
    # central differences along random directions
    for _ in range(2):
        d = rng.standard_normal(coef.shape)
        h = 1e-5
        fd = (float(f(coef + h * d)) - float(f(coef - h * d))) / (2 * h)
        np.testing.assert_allclose(grad @ d, fd, rtol=1e-6)
    # forward mode agrees
    d = rng.standard_normal(coef.shape)
    _, tangent = sd.jvp(f, (coef,), (d,))
    np.testing.assert_allclose(float(tangent), grad @ d, rtol=1e-9)


def test_eigenvector_gradient_matches_dense(rng):
    m = 8
    c = 1.0 + 0.5 * rng.uniform(size=m * m)
    u = rng.standard_normal(m * m)

    def loss(v):  # sign-invariant in each eigenvector
        return snp.sum((u @ v) ** 2)

    grad = sd.grad(lambda c: loss(sd.linalg.eigsh(laplacian(c, m), k=3, which="SA")[1]))(c)
    dense = sd.grad(lambda c: loss(sd.linalg.eigh(sd.sparse.todense(laplacian(c, m)))[1]
                                   [:, :3]))(c)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(dense), rtol=1e-7, atol=1e-12)


# slow: the same registry example's rules are test_autodiff's
# test_every_primitive_passes_check_rules[linalg.eigsh], its batching
# test_batching's test_batch_rule_agrees_with_a_loop[linalg.eigsh]
@pytest.mark.slow
def test_check_rules_small():
    from registry_examples import EXAMPLES

    fn, args = EXAMPLES["linalg.eigsh"]
    sd.testing.check_rules(fn, *[np.asarray(a) for a in args], seed=0)


# slow: the rules of the eigenvalues and of the whole eigenvectors (second order
# included) are test_check_rules_compares_the_eigenvectors_up_to_sign's; eigsh
# under vmap is test_batched_over_coefficients' and test_batching's
@pytest.mark.slow
def test_check_rules_eigenvectors():
    rng = np.random.default_rng(3)
    c = 1.0 + 0.5 * rng.uniform(size=9)
    u = rng.standard_normal(9)

    def fn(c):
        w, v = sd.linalg.eigsh(laplacian(c, 3), k=2, which="SA")
        return snp.sum((u @ v) ** 2) + snp.sum(w ** 3)

    sd.testing.check_rules(fn, c, seed=1)


def _node_names(graph):
    names = set()
    for node in graph.nodes:
        names.add(node.primitive.name)
        body = node.params.get("body") if hasattr(node.params, "get") else None
        if body is not None and hasattr(body, "nodes"):
            names |= _node_names(body)
    return names


def test_cotangent_stays_on_the_pattern(coef):
    def values(c):
        return snp.sum(sd.linalg.eigsh(laplacian(c), k=4, which="SA")[0] ** 2)

    def vectors(c):
        return snp.sum(sd.linalg.eigsh(laplacian(c), k=4, which="SA")[1] ** 4)

    for f in (values, vectors):
        names = _node_names(sd.trace(sd.grad(f), coef))
        assert "sparse.sddmm" in names
        assert "sparse.todense" not in names and "sparse.sample" not in names
    # a loss of the eigenvalues alone needs no linear solve
    assert not {n for n in _node_names(sd.trace(sd.grad(values), coef))
                if n.startswith("linalg.solve") or n.startswith("linalg.backsolve")}


def test_repeated_eigenvalues():
    # constant coefficient on a square grid: w_1 = w_2 (modes (1,2) and (2,1))
    m = 8
    c = np.ones(m * m)
    w, _ = sd.linalg.eigsh(laplacian(c, m), k=4, which="SA")
    w = np.asarray(w)
    assert abs(w[2] - w[1]) < 1e-10 and w[3] - w[2] > 1e-2
    # a cluster's sum differentiates
    grad = sd.grad(lambda c: snp.sum(sd.linalg.eigsh(laplacian(c, m), k=4, which="SA")[0]))(c)
    dense = sd.grad(lambda c: snp.sum(sd.linalg.eigh(sd.sparse.todense(laplacian(c, m)))[0]
                                      [:4]))(c)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(dense), rtol=1e-8, atol=1e-12)
    # one eigenvalue of the cluster, or one of its eigenvectors, does not
    with pytest.raises(DegenerateEigenvalueError):
        sd.grad(lambda c: sd.linalg.eigsh(laplacian(c, m), k=4, which="SA")[0][1])(c)
    with pytest.raises(DegenerateEigenvalueError):
        sd.grad(lambda c: snp.sum(sd.linalg.eigsh(laplacian(c, m), k=4, which="SA")[1][:, 2]
                                  ** 4))(c)


def test_batched_over_coefficients(rng):
    m = 4
    cs = 1.0 + 0.5 * rng.uniform(size=(3, m * m))

    def f(c):
        return sd.linalg.eigsh(laplacian(c, m), k=2, which="SA")[0]

    got = np.asarray(sd.vmap(f)(cs))
    want = np.stack([np.linalg.eigvalsh(laplacian_scipy(c, m).toarray())[:2] for c in cs])
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_no_convergence_raises(coef):
    with pytest.raises(ConvergenceError, match="converged") as info:
        sd.linalg.eigsh(laplacian(coef), k=4, which="SA", maxiter=1)
    assert info.value.op == "linalg.eigsh"
    assert 0 <= info.value.converged < 4


def test_trace_time_errors(coef):
    a = laplacian(np.ones(9), 3)
    # k >= n: SciPy's TypeError for a sparse A (a dense one is solved by eigh)
    with pytest.raises(DTypeError, match="linalg.eigsh.*k=9 >= n=9"):
        sd.trace(lambda c: sd.linalg.eigsh(laplacian(c, 3), k=9, which="SA")[0], np.ones(9))
    with pytest.raises(ShapeError, match="greater than 0"):
        sd.linalg.eigsh(a, k=0)
    with pytest.raises(InvalidOptionError, match="`which` must be one of.*'BE'.*got 'la'"):
        sd.linalg.eigsh(a, k=2, which="la")
    rect = sd.sparse.coo_matrix((np.ones(3), (np.arange(3), np.arange(3))), shape=(3, 4))
    with pytest.raises(ShapeError, match="linalg.eigsh.*must be square"):
        sd.linalg.eigsh(rect, k=1)
    with pytest.raises(DTypeError, match="linalg.eigsh.*complex"):
        sd.linalg.eigsh(np.eye(4) * 1j, k=1)  # (dense real arrays are taken, as SciPy's)


def test_asymmetric_matrix_raises():
    from sciad.errors import StructureError

    a = sd.sparse.coo_matrix((np.array([2.0, 1.0, 2.0, 2.0]),
                              (np.array([0, 0, 1, 2]), np.array([0, 1, 1, 2]))),
                             shape=(3, 3))
    with pytest.raises(StructureError, match="symmetric"):
        sd.linalg.eigsh(a, k=1)
    # k >= n (the dense solve): refused as well, where it decomposed the
    # symmetric part and SciPy reads the lower triangle (SciPy's
    # test_eigsh_for_k_greater, on a random A: values 0.07 apart)
    A = np.random.default_rng(0).standard_normal((4, 4))
    with pytest.warns(RuntimeWarning, match="k >= N"), \
            pytest.raises(StructureError, match=r"`A` must be symmetric.*np.tril"):
        sd.linalg.eigsh(A, k=4)
    with pytest.warns(RuntimeWarning, match="k >= N"):
        w = sd.linalg.eigsh(A + A.T, k=4)[0]
    np.testing.assert_allclose(w, np.linalg.eigvalsh(A + A.T), rtol=1e-12)


def test_a_cluster_cut_by_k_raises():
    # k=2 keeps one of the repeated pair w_1 = w_2 (ARPACK computes k + 1 and
    # sees the next is repeated): neither its eigenvalue nor its eigenvector
    # has a derivative, forward or reverse; the simple w_0 still has one
    m = 8
    c = np.ones(m * m)
    d = np.random.default_rng(3).standard_normal(m * m)
    for f in (lambda c: sd.linalg.eigsh(laplacian(c, m), k=2, which="SA")[0][1],
              lambda c: snp.sum(sd.linalg.eigsh(laplacian(c, m), k=2, which="SA")[1][:, 1]
                                ** 4)):
        with pytest.raises(DegenerateEigenvalueError, match="`k` cuts a cluster"):
            sd.grad(f)(c)
        with pytest.raises(DegenerateEigenvalueError, match="`k` cuts a cluster"):
            sd.jvp(f, (c,), (d,))
    g = sd.grad(lambda c: sd.linalg.eigsh(laplacian(c, m), k=2, which="SA")[0][0])(c)
    want = sd.grad(lambda c: sd.linalg.eigvalsh(sd.sparse.todense(laplacian(c, m)))[0])(c)
    np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-13)


def _mass(rho, m=M):
    """A lumped mass matrix: diagonal, `rho` on it."""
    i = np.arange(m * m)
    return sd.sparse.coo_matrix((rho, (i, i)), shape=(m * m, m * m))


@pytest.mark.parametrize("sigma", [None, pytest.param(0.0, marks=pytest.mark.slow)])
def test_the_generalized_problem_matches_scipy_and_differentiates(rng, sigma):
    m = 8
    coef, rho = 1.0 + rng.uniform(size=m * m), 1.0 + rng.uniform(size=m * m)
    which = "SA" if sigma is None else "LM"  # the lowest three, either way
    w, v = sd.linalg.eigsh(laplacian(coef, m), k=3, M=_mass(rho, m), sigma=sigma, which=which)
    a = laplacian_scipy(coef, m).toarray()
    import scipy.linalg as sla

    ref = sla.eigh(a, np.diag(rho))[0][:3]
    np.testing.assert_allclose(w, ref, rtol=1e-10)
    v = np.asarray(v)
    np.testing.assert_allclose(a @ v, (rho[:, None] * v) * np.asarray(w), atol=1e-9)
    np.testing.assert_allclose(v.T @ (rho[:, None] * v), np.eye(3), atol=1e-10)

    def f(coef, rho):  # eigenvalues, and a sign-free function of the vectors
        w, v = sd.linalg.eigsh(laplacian(coef, m), k=3, M=_mass(rho, m), sigma=sigma,
                               which=which)
        return w ** 2, snp.sum(v ** 2 * snp.arange(m * m * 1.0)[:, None], axis=0)

    report = sd.testing.check_rules(f, coef, rho, batch=False)
    assert report.jvp_error < 1e-6 and report.vjp_error < 1e-9


def test_a_mass_matrix_that_is_not_positive_definite_raises(coef):
    rho = np.ones(M * M)
    rho[5] = -1.0
    with pytest.raises(sd.errors.NotPositiveDefiniteError, match="`M` must be positive"):
        sd.linalg.eigsh(laplacian(coef), k=2, M=_mass(rho))
    with pytest.raises(ShapeError, match="`M` must have `A`'s shape"):
        sd.linalg.eigsh(laplacian(coef), k=2, M=_mass(np.ones(16), 4))


def _operator(c, m):
    """`laplacian(c, m)` as a matrix-free operator (a matvec closing over `c`)."""
    ep, eq, bnd = _grid(m)

    def matvec(x):
        d = (c[ep] + c[eq]) / 2 * (x[ep] - x[eq])
        return snp.zeros((m * m,)).at[ep].add(d).at[eq].add(-d) + c * bnd * x

    return sd.linalg.operator(matvec, (m * m, m * m))


@pytest.mark.slow
def test_a_matrix_free_operator_matches_the_sparse_matrix(rng):
    m = 8
    c = 1.0 + 0.5 * rng.uniform(size=m * m)
    w, v = sd.linalg.eigsh(_operator(c, m), 3, which="SA")
    ws, vs = sd.linalg.eigsh(laplacian(c, m), 3, which="SA")
    np.testing.assert_allclose(w, ws, rtol=1e-12)
    _assert_same_vectors(np.asarray(v), np.asarray(vs), 1e-10)

    def f(c, A):  # eigenvalues and a sign-free function of the eigenvectors
        w, v = sd.linalg.eigsh(A(c, m), 3, which="SA")
        return snp.sum(w * np.arange(1.0, 4.0)) + snp.sum(v ** 2 * np.arange(m * m * 1.0)[:, None])

    # derivatives through the matvec's graph and matrix-free bordered solves
    # equal the sparse matrix's
    np.testing.assert_allclose(sd.grad(lambda c: f(c, _operator))(c),
                               sd.grad(lambda c: f(c, laplacian))(c), rtol=1e-9, atol=1e-12)
    # a cluster (the square's repeated pair) is refused as for a matrix
    with pytest.raises(DegenerateEigenvalueError, match="eigenvalues 1..2"):
        sd.grad(lambda c: sd.linalg.eigsh(_operator(c, m), 3, which="SA")[0][1])(np.ones(m * m))


def test_a_matrix_free_operator_refuses_what_it_cannot_do():
    m = 4
    A = _operator(np.ones(m * m), m)
    with pytest.raises(ShapeError, match="neither `M` nor `sigma`"):
        sd.linalg.eigsh(A, 2, sigma=0.0)
    bad = sd.linalg.operator(lambda x: snp.concatenate([x[1:], x[:1]]) * 2.0 + x, (5, 5))
    with pytest.raises(sd.errors.StructureError, match="operator must be symmetric"):
        sd.linalg.eigsh(bad, 2)


def test_check_rules_compares_the_eigenvectors_up_to_sign(rng):
    m = 6
    c = 1.0 + 0.5 * rng.uniform(size=m * m)
    report = sd.testing.check_rules(lambda c: sd.linalg.eigsh(laplacian(c, m), 3, which="SA"),
                                    c, gauge={1: "columns"}, batch=False)
    assert report.jvp_error < 1e-6 and report.vjp_error < 1e-9
