"""`sd.linalg.eigsh` as SciPy's `scipy.sparse.linalg.eigsh`: every documented
option compared with SciPy (A as SciPy's sparse arrays and matrices, dense
arrays, LinearOperators, float32; which, sigma, M, v0, ncv, maxiter, tol,
return_eigenvectors and its order, mode normal/buckling/cayley; k up to n;
the no-convergence error with the converged pairs), refusals by name, and
the derivatives of what the options add against finite differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ArpackNoConvergenceError, ConvergenceError, DTypeError,
                          InvalidOptionError, ShapeError)

N = 40
I = np.arange(N)
A = sp.diags([np.full(N, 2.0) + 0.01 * I, -np.ones(N - 1), -np.ones(N - 1)], [0, 1, -1]).tocsr()
M = sp.diags(1.0 + 0.1 * np.cos(I)).tocsr()


def same_vectors(v, want, mat=None):
    """Columns equal up to sign (unit or M-normalized alike)."""
    np.testing.assert_allclose(np.abs(np.sum(v * want, axis=0))
                               if mat is None else np.abs(np.sum(v * (mat @ want), axis=0)),
                               1.0, atol=1e-7)


@pytest.mark.parametrize("form", ["csr_matrix", "csr_array", "coo_array", "dense",
                                  "LinearOperator", "sciad"])
def test_A_in_the_forms_scipy_accepts(form):
    a = {"csr_matrix": lambda: A, "csr_array": lambda: sp.csr_array(A),
         "coo_array": lambda: sp.coo_array(A), "dense": lambda: A.toarray(),
         "LinearOperator": lambda: spla.aslinearoperator(A),
         "sciad": lambda: sd.sparse.csr_matrix((A.data, A.indices, A.indptr),
                                               shape=A.shape)}[form]()
    w, v = sd.linalg.eigsh(a, 4)
    ws, vs = spla.eigsh(A, 4)
    np.testing.assert_allclose(w, ws, rtol=1e-10)
    same_vectors(np.asarray(v), vs)


def test_float32_gives_float32_as_scipy():
    a32 = A.astype(np.float32)
    w, v = sd.linalg.eigsh(a32, 3, which="SA")
    ws = spla.eigsh(a32, 3, which="SA")[0]
    assert np.asarray(w).dtype == np.float32 and np.asarray(v).dtype == np.float32
    np.testing.assert_allclose(w, ws, rtol=1e-5)


@pytest.mark.parametrize("sigma", [None, 1.0])
@pytest.mark.parametrize("which", ["LM", "SM", "LA", "SA", "BE"])
def test_which_and_sigma_values_vectors_and_order(which, sigma):
    ws, vs = spla.eigsh(A, 4, which=which, sigma=sigma)
    w, v = sd.linalg.eigsh(A, 4, which=which, sigma=sigma)
    np.testing.assert_allclose(w, ws, rtol=1e-9)
    same_vectors(np.asarray(v), vs)
    # without vectors, SciPy's (ARPACK's) order: SA and SM descending
    only = sd.linalg.eigsh(A, 4, which=which, sigma=sigma, return_eigenvectors=False)
    np.testing.assert_allclose(only, spla.eigsh(A, 4, which=which, sigma=sigma,
                                                return_eigenvectors=False), rtol=1e-9)


def test_lm_without_vectors_orders_mixed_signs_as_scipy():
    b = sp.diags([-5.0, 4.5, 5.2, 0.1, 0.2, 0.3, 1.0, 2.0, -1.0, 0.5, 0.7, -0.2]).tocsr()
    got = sd.linalg.eigsh(b, 3, return_eigenvectors=False)
    np.testing.assert_allclose(got, spla.eigsh(b, 3, return_eigenvectors=False), rtol=1e-10)


def test_generalized_with_M_and_shift_invert():
    for kw in (dict(which="SA"), dict(sigma=0.5)):
        ws, vs = spla.eigsh(A, 3, M=M, **kw)
        w, v = sd.linalg.eigsh(A, 3, M, **kw)
        np.testing.assert_allclose(w, ws, rtol=1e-9)
        same_vectors(np.asarray(v), vs, M)


@pytest.mark.parametrize("which", ["LM", "SM", "LA", "SA"])
def test_buckling_mode_as_scipy(which):
    # SciPy's buckling, A x = w M x: A positive definite (the diagonal `M`
    # here), M symmetric (the tridiagonal `A` here); x^T A x = 1
    ws, vs = spla.eigsh(M, 4, M=A, sigma=2.0, which=which, mode="buckling")
    w, v = sd.linalg.eigsh(M, 4, A, 2.0, which, mode="buckling")
    np.testing.assert_allclose(w, ws, rtol=1e-9)
    v = np.asarray(v)
    np.testing.assert_allclose(np.diag(v.T @ (M @ v)), 1.0, rtol=1e-9)
    same_vectors(v, vs, M)


@pytest.mark.parametrize("which", ["LM", "SM", "LA", "SA"])
def test_cayley_mode_as_scipy(which):
    ws, vs = spla.eigsh(A, 4, M=M, sigma=1.0, which=which, mode="cayley")
    w, v = sd.linalg.eigsh(A, 4, M, 1.0, which, mode="cayley")
    np.testing.assert_allclose(w, ws, rtol=1e-9)
    same_vectors(np.asarray(v), vs, M)


def test_v0_ncv_maxiter_tol_are_taken():
    ws = spla.eigsh(A, 3, which="LA")[0]
    for kw in (dict(v0=np.ones(N)), dict(ncv=8), dict(ncv=6), dict(maxiter=1000),
               dict(tol=1e-12), dict(rng=np.random.default_rng(3))):
        np.testing.assert_allclose(sd.linalg.eigsh(A, 3, which="LA", **kw)[0], ws, rtol=1e-9)
    # ncv = k + 1 is too small a basis here, for SciPy too
    with pytest.raises(spla.ArpackNoConvergence):
        spla.eigsh(A, 3, which="LA", ncv=4)
    with pytest.raises(ArpackNoConvergenceError):
        sd.linalg.eigsh(A, 3, which="LA", ncv=4)


@pytest.mark.parametrize("kw, cls, match", [
    (dict(ncv=3), InvalidOptionError, "k < ncv <= n"),
    (dict(ncv=N + 1), InvalidOptionError, "k < ncv <= n"),
    (dict(v0=np.ones(3)), ShapeError, "`v0` must have n"),
    (dict(Minv=sp.eye(N)), InvalidOptionError, "`Minv` is not taken"),
    (dict(OPinv=sp.eye(N), sigma=1.0), InvalidOptionError, "`OPinv` is not taken"),
    (dict(mode="twist", sigma=1.0), InvalidOptionError, "`mode` must be"),
    (dict(mode="cayley", sigma=0.0), InvalidOptionError, "nonzero"),
    (dict(mode="buckling", sigma=1.0), InvalidOptionError, "needs `M`"),
    (dict(which="XX"), InvalidOptionError, "`which` must be"),
])
def test_refused_options_name_themselves(kw, cls, match):
    with pytest.raises(cls, match=match):
        sd.linalg.eigsh(A, 3, **kw)
    assert issubclass(cls, ValueError)  # SciPy raises ValueError for these


def test_scipy_operators_with_their_own_inverses_run_as_scipy():
    op = spla.aslinearoperator(A)
    lu = spla.splu((A - 0.5 * sp.eye(N)).tocsc())
    inv = spla.LinearOperator((N, N), matvec=lu.solve, dtype=np.float64)
    w = sd.linalg.eigsh(op, 3, sigma=0.5, OPinv=inv, return_eigenvectors=False)
    np.testing.assert_allclose(w, spla.eigsh(A, 3, sigma=0.5, return_eigenvectors=False),
                               rtol=1e-9)


def test_k_range_as_scipy():
    with pytest.raises(ValueError, match="greater than 0"):
        sd.linalg.eigsh(A, 0)
    w, v = sd.linalg.eigsh(A, N - 1, which="SA")  # ARPACK's largest k
    np.testing.assert_allclose(w, spla.eigsh(A, N - 1, which="SA")[0], rtol=1e-9)
    with pytest.raises(TypeError, match="k=40 >= n=40"):  # SciPy: TypeError for sparse A
        sd.linalg.eigsh(A, N)
    with pytest.warns(RuntimeWarning, match="k >= N"):  # dense: all pairs by eigh
        w, v = sd.linalg.eigsh(A.toarray(), N + 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ws = spla.eigsh(A.toarray(), N + 2)[0]
    np.testing.assert_allclose(w, ws, rtol=1e-10)
    assert np.asarray(v).shape == (N, N)


def test_no_convergence_carries_the_converged_pairs():
    with pytest.raises(ArpackNoConvergenceError) as info:
        sd.linalg.eigsh(A, 5, which="SA", maxiter=3)
    e = info.value
    assert isinstance(e, ConvergenceError) and isinstance(e, RuntimeError)
    assert e.converged == len(e.eigenvalues) and e.eigenvectors.shape == (N, e.converged)
    # a run where some pairs converge: they are eigenpairs
    b = sp.diags(np.concatenate([[10.0, 9.0], np.linspace(0.0, 1.0, 200)])).tocsr()
    try:
        sd.linalg.eigsh(b, 6, which="LA", maxiter=2, ncv=8)
    except ArpackNoConvergenceError as e:
        w, v = e.eigenvalues, e.eigenvectors
        assert len(w) == e.converged
        np.testing.assert_allclose(b @ v, v * w, atol=1e-6)
    else:
        pytest.fail("expected ARPACK not to converge in 2 restarts")


def test_operator_host_no_convergence_as_scipy():
    op = spla.aslinearoperator(A)
    with pytest.raises(ArpackNoConvergenceError):
        sd.linalg.eigsh(op, 5, which="SA", maxiter=3)


def _fd(f, x, h=1e-6):
    return np.stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(len(x))], axis=1)


D0 = np.diag(np.full(12, 2.0) + 0.1 * np.arange(12)) - np.eye(12, k=1) - np.eye(12, k=-1)


def test_dense_traced_A_differentiates():
    def f(t):
        return sd.linalg.eigsh(D0 + snp.diag(t), 3, which="SA")[0]

    def f_np(t):
        return spla.eigsh(D0 + np.diag(t), 3, which="SA")[0]

    t = 0.1 * np.arange(12.0)
    np.testing.assert_allclose(sd.jacfwd(f)(t), _fd(f_np, t), atol=1e-6)


def test_buckling_and_cayley_derivatives_against_differences():
    m0 = np.diag(1.0 + 0.1 * np.cos(np.arange(12.0)))
    t = 0.05 * np.arange(12.0)

    def buck(t):
        return sd.linalg.eigsh(m0 + snp.diag(t), 3, D0, 2.0, "LA", mode="buckling")[0]

    def buck_np(t):
        return spla.eigsh(m0 + np.diag(t), 3, M=D0, sigma=2.0, which="LA",
                          mode="buckling")[0]

    def cay(t):
        return sd.linalg.eigsh(D0 + snp.diag(t), 3, m0, 1.0, "LM", mode="cayley")[0]

    def cay_np(t):
        return spla.eigsh(D0 + np.diag(t), 3, M=m0, sigma=1.0, which="LM", mode="cayley")[0]

    np.testing.assert_allclose(sd.jacfwd(buck)(t), _fd(buck_np, t), atol=1e-6)
    np.testing.assert_allclose(sd.jacrev(cay)(t), _fd(cay_np, t), atol=1e-6)


def test_float32_gradient_flows():
    def f(t):
        a = (D0 + snp.diag(t)).astype(np.float32)
        return snp.sum(sd.linalg.eigsh(a, 2, which="LA")[0])

    g = np.asarray(sd.grad(f)(np.zeros(12, np.float32)))
    w, v = np.linalg.eigh(D0)
    np.testing.assert_allclose(g, np.sum(v[:, -2:] ** 2, axis=1), atol=1e-4)


@pytest.mark.slow
def test_buckling_rules_pass_check_rules():
    m0 = np.diag(1.0 + 0.1 * np.cos(np.arange(12.0)))
    sd.testing.check_rules(
        lambda t: sd.linalg.eigsh(m0 + snp.diag(t), 2, D0, 2.0, "LA", mode="buckling"),
        0.05 * np.arange(12.0))


def test_a_matrix_free_operator_takes_v0_ncv_and_return_eigenvectors():
    d = np.full(N, 2.0) + 0.01 * I

    def matvec(x):
        return d * x - snp.pad(x[1:], (0, 1)) - snp.pad(x[:-1], (1, 0))

    op = sd.linalg.operator(matvec, (N, N), tags=("symmetric",))
    ws = spla.eigsh(A, 3, which="LA", return_eigenvectors=False)
    got = sd.linalg.eigsh(op, 3, which="LA", v0=np.ones(N), ncv=10, return_eigenvectors=False)
    np.testing.assert_allclose(got, ws, rtol=1e-9)
