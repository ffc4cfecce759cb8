"""`sd.linalg.slogdet` and `sd.linalg.selected_inverse`: values against
NumPy and the dense inverse, derivatives (check_rules to second order, the
gradient and Hessian-vector products against closed forms), batches,
`to_jax`, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (InvalidOptionError, NonFiniteError, NotPositiveDefiniteError,
                          NotSupportedError, ShapeError, SingularMatrixError)


def _grid(n=4, shift=0.3):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (n, n))
    A = (sp.kron(T, sp.eye(n)) + sp.kron(sp.eye(n), T) + shift * sp.eye(n * n)).tocsr()
    A.sort_indices()
    return A


def _coords(A):
    return np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)), A.indices


def _matrix(v, rows, cols, n):
    return sd.sparse.coo_matrix((v, (rows, cols)), shape=(n, n))


def _nonsymmetric(rng, n=7):
    """Diagonally dominant, with entries whose mirror is not stored."""
    R = sp.random(n, n, 0.3, random_state=np.random.RandomState(rng.integers(2**31)))
    R.data = rng.uniform(-1.0, 1.0, R.nnz)
    A = (R + sp.diags(np.asarray(abs(R).sum(axis=1)).ravel() + 0.5)).tocsr()
    A.sort_indices()
    return A


@pytest.mark.parametrize("kind", ["general", "spd", "negative", "complex"])
def test_dense_slogdet_is_numpys(rng, kind):
    a = rng.standard_normal((5, 5))
    if kind == "spd":
        a = a @ a.T + np.eye(5)
    elif kind == "negative":
        a = np.diag([-2.0, 1.0, 3.0, 0.5, 1.5]) + 0.1 * a
    elif kind == "complex":
        a = a + 1j * rng.standard_normal((5, 5))
    sign, logabs = sd.linalg.slogdet(a, assume="spd" if kind == "spd" else None)
    want = np.linalg.slogdet(a)
    np.testing.assert_allclose(complex(sign), want[0], rtol=1e-13)
    np.testing.assert_allclose(float(logabs), want[1], rtol=1e-13)


def test_a_dense_slogdet_shares_the_solves_factorization(rng):
    """`share_factors` makes one factorization for a solve, its adjoint, the
    log-determinant and its derivative (a transposed backsolve)."""
    a = rng.standard_normal((5, 5)) + 5 * np.eye(5)
    b = rng.standard_normal(5)

    def f(a):
        return sd.linalg.slogdet(a)[1] + snp.sum(sd.linalg.solve(a, b))

    names = [n.primitive.name
             for n in sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), a)).nodes]
    assert names.count("linalg.factor") == 1 and "linalg.factor_slogdet" in names
    assert "linalg.slogdet" not in names and "linalg.solve" not in names
    value, grad = sd.function(sd.value_and_grad(f))(a)
    inv = np.linalg.inv(a)
    np.testing.assert_allclose(float(value), np.linalg.slogdet(a)[1] + (inv @ b).sum(),
                               rtol=1e-13)
    # d/dA (log|det A| + sum(A^-1 b)) = A^-T - A^-T 1 (A^-1 b)^T
    np.testing.assert_allclose(np.asarray(grad), inv.T - np.outer(inv.T.sum(axis=1), inv @ b),
                               rtol=1e-10, atol=1e-14)
    report = sd.testing.check_rules(f, a)
    assert report.jvp_error < 1e-7 and report.second_order_error < 1e-7


def test_sparse_slogdet_is_numpys(rng):
    for A in (_grid(), _nonsymmetric(rng), -_nonsymmetric(rng, 8)):
        sign, logabs = sd.linalg.slogdet(sd.sparse.from_scipy(A))
        want = np.linalg.slogdet(A.toarray())
        assert float(sign) == want[0]
        np.testing.assert_allclose(float(logabs), want[1], rtol=1e-13)


def test_a_singular_matrix_is_numpys_and_its_derivative_is_refused():
    a = np.array([[1.0, 2.0], [2.0, 4.0]])
    S = sd.sparse.from_dense(a)
    for A in (a, S):
        sign, logabs = sd.linalg.slogdet(A)
        assert float(sign) == 0.0 and float(logabs) == -np.inf
    with pytest.raises(SingularMatrixError):
        sd.grad(lambda a: sd.linalg.slogdet(a)[1])(a)
    with pytest.raises(SingularMatrixError, match="zero pivot"):
        sd.grad(lambda A: sd.linalg.slogdet(A)[1])(S)


def test_bad_matrices_raise_the_factorizations_errors():
    with pytest.raises(NotPositiveDefiniteError, match="declared spd"):
        sd.linalg.slogdet(np.diag([1.0, -1.0]), assume="spd")
    for A in (np.array([[1.0, np.nan], [0.0, 1.0]]),
              sd.sparse.from_dense(np.array([[1.0, np.nan], [0.0, 1.0]]))):
        with pytest.raises(NonFiniteError, match="NaN"):
            sd.linalg.slogdet(A)
    with pytest.raises(InvalidOptionError, match=r"'cholesky' \(spd\), .* got 'klu'"):
        sd.linalg.slogdet(sd.sparse.from_scipy(_grid()), solver="klu")
    with pytest.raises(ShapeError, match="square"):
        sd.linalg.slogdet(np.ones((2, 3)))
    with pytest.raises(ShapeError, match="sparse matrix"):
        sd.linalg.selected_inverse(np.eye(3))
    C = sd.sparse.from_dense(np.eye(2) * (1 + 1j))
    for solver in ("cholmod", "cholesky"):
        if solver == "cholmod" and not _cholmod_available():
            continue
        with pytest.raises(NotSupportedError, match="real|complex"):
            sd.linalg.slogdet(C, solver=solver)


def _cholmod_available() -> bool:
    from sciad.solvers.direct import _cholmod_ffi

    return _cholmod_ffi.available()


def _complex(rng, n=7):
    """A complex matrix on a non-symmetric pattern, diagonally dominant, its
    entries of every phase."""
    A = _nonsymmetric(rng, n).astype(complex)
    A.data = A.data * np.exp(2j * np.pi * rng.uniform(size=A.nnz))
    return A


def test_complex_sparse_slogdet_and_selected_inverse(rng):
    """A complex sparse matrix (SuperLU, and the recurrence in complex
    arithmetic): NumPy's sign (the determinant's phase) and log-determinant,
    the dense inverse on the pattern, and the derivatives: the directional
    derivatives' closed forms (`d logabsdet = Re tr(A^-1 W)`, `d sign = i
    sign Im tr(A^-1 W)`) and check_rules to second order on both."""
    A = _complex(rng)
    r, c = _coords(A)
    n = A.shape[0]
    D = A.toarray()
    sign, logabs = sd.linalg.slogdet(sd.sparse.from_scipy(A))
    want = np.linalg.slogdet(D)
    np.testing.assert_allclose(complex(sign), want[0], rtol=1e-13)
    np.testing.assert_allclose(float(logabs), want[1], rtol=1e-13)
    inv = np.linalg.inv(D)
    Z = sd.linalg.selected_inverse(sd.sparse.from_scipy(A))
    np.testing.assert_allclose(np.asarray(sd.sparse.data(Z)), inv[r, c], rtol=1e-12, atol=1e-14)

    W = rng.standard_normal(A.nnz) + 1j * rng.standard_normal(A.nnz)
    t = np.trace(inv @ sp.csr_matrix((W, (r, c)), shape=A.shape).toarray())
    (s, l), (ds, dl) = sd.jvp(lambda v: tuple(sd.linalg.slogdet(_matrix(v, r, c, n))),
                              (A.data,), (W,))
    np.testing.assert_allclose(float(dl), t.real, rtol=1e-11)
    np.testing.assert_allclose(complex(ds), complex(s) * 1j * t.imag, rtol=1e-11)

    f = lambda v: snp.real(sd.linalg.slogdet(_matrix(v, r, c, n))[0]) + \
        sd.linalg.slogdet(_matrix(v, r, c, n))[1]  # noqa: E731
    g = lambda v: sd.sparse.data(sd.linalg.selected_inverse(_matrix(v, r, c, n)))  # noqa: E731
    for fn in (f, g):
        report = sd.testing.check_rules(fn, A.data)
        assert report.jvp_error < 1e-7 and report.vjp_error < 1e-10
        assert report.second_order_error < 1e-7 and not report.skipped


def test_selected_inverse_is_the_dense_inverse_on_the_pattern(rng):
    for A in (_grid(), _nonsymmetric(rng)):
        Z = sd.linalg.selected_inverse(sd.sparse.from_scipy(A))
        r, c = _coords(A)
        inv = np.linalg.inv(A.toarray())
        np.testing.assert_allclose(np.asarray(sd.sparse.data(Z)), inv[r, c], rtol=1e-12,
                                   atol=1e-14)


def test_the_gradient_and_hessian_vector_products_are_the_closed_forms(rng):
    """d log|det A| / dA = A^-T and its derivative in direction W,
    -(A^-1 W A^-1)^T, both on the pattern, for values that are not
    symmetric on a pattern that is not."""
    A = _nonsymmetric(rng, 9)
    r, c = _coords(A)
    n = A.shape[0]
    f = lambda v: sd.linalg.slogdet(_matrix(v, r, c, n))[1]  # noqa: E731
    w = rng.standard_normal(A.nnz)
    inv = np.linalg.inv(A.toarray())
    W = sp.csr_matrix((w, (r, c)), shape=A.shape).toarray()
    np.testing.assert_allclose(np.asarray(sd.grad(f)(A.data)), inv.T[r, c], rtol=1e-11)
    want = -(inv @ W @ inv).T[r, c]
    np.testing.assert_allclose(np.asarray(sd.hvp(f, A.data, w)), want, rtol=1e-10, atol=1e-13)
    _, d = sd.jvp(f, (A.data,), (w,))
    np.testing.assert_allclose(float(d), np.trace(inv @ W), rtol=1e-11)


# (the registry walk checks both primitives' rules on a non-symmetric pattern
# too: test_autodiff; these, larger, with -m slow)
@pytest.mark.slow
@pytest.mark.parametrize("which", ["slogdet", "selected_inverse"])
def test_check_rules_to_second_order(rng, which):
    A = _nonsymmetric(rng, 6)
    r, c = _coords(A)
    n = A.shape[0]
    if which == "slogdet":
        f = lambda v: sd.linalg.slogdet(_matrix(v, r, c, n))[1]  # noqa: E731
    else:
        f = lambda v: sd.sparse.data(sd.linalg.selected_inverse(_matrix(v, r, c, n)))  # noqa: E731
    report = sd.testing.check_rules(f, A.data * rng.uniform(0.9, 1.1, A.nnz))
    assert report.jvp_error < 1e-7 and report.vjp_error < 1e-10
    assert report.second_order_error < 1e-7 and not report.skipped


def test_dense_check_rules_complex(rng):
    a = rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)) + 3 * np.eye(4)
    report = sd.testing.check_rules(lambda a: snp.real(sd.linalg.slogdet(a)[0])
                                    + sd.linalg.slogdet(a)[1], a)
    assert report.jvp_error < 1e-7 and report.second_order_error < 1e-7


def test_a_batch_and_to_jax(rng):
    import jax

    A = _grid(3)
    r, c = _coords(A)
    n = A.shape[0]
    f = lambda v: sd.linalg.slogdet(_matrix(v, r, c, n))[1]  # noqa: E731
    vs = A.data * rng.uniform(0.8, 1.2, (3, A.nnz))
    want = [np.linalg.slogdet(sp.csr_matrix((v, (r, c)), shape=A.shape).toarray())[1]
            for v in vs]
    np.testing.assert_allclose(np.asarray(sd.vmap(f)(vs)), want, rtol=1e-13)
    g = jax.jit(jax.grad(sd.to_jax(f)))(vs[0])
    inv = np.linalg.inv(sp.csr_matrix((vs[0], (r, c)), shape=A.shape).toarray())
    np.testing.assert_allclose(np.asarray(g), inv.T[r, c], rtol=1e-11)


def _cholmod():
    from sciad.solvers.direct import _cholmod_ffi

    if not _cholmod_ffi.available():
        pytest.skip("the [cholmod] extra (sparsax) is not installed")


def _symmetric_params(A):
    """`f(u)`: the spd-tagged matrix whose upper triangle (diagonal included)
    is `u` (a parameterization that keeps it symmetric), and `u` for `A`."""
    r, c = _coords(A)
    upper = r <= c
    mirror = sp.csr_matrix((np.arange(A.nnz, dtype=float), (r, c)), shape=A.shape)
    # the upper entry each stored entry mirrors
    at = np.searchsorted(np.flatnonzero(upper),
                         np.asarray(mirror[np.minimum(r, c), np.maximum(r, c)]).ravel())
    n = A.shape[0]
    return (lambda u: sd.sparse.coo_matrix((u[at], (r, c)), shape=(n, n), tags={"spd"}),
            A.data[upper])


def test_cholmod_reads_spd_matrices_and_shares_the_solves_factorization():
    _cholmod()
    import sparsax_cpp

    A = _grid(5)
    r, c = _coords(A)
    inv = np.linalg.inv(A.toarray())
    M = lambda v: sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"})  # noqa: E731

    def f(v):
        x = sd.linalg.solve(M(v), np.ones(A.shape[0]), solver="cholmod")
        return sd.linalg.slogdet(M(v), solver="cholmod")[1] + snp.sum(x)

    g = sd.function(sd.value_and_grad(f))
    value, grad = g(A.data)
    np.testing.assert_allclose(float(value), np.linalg.slogdet(A.toarray())[1]
                               + inv.sum(), rtol=1e-13)
    x = inv.sum(axis=1)
    np.testing.assert_allclose(np.asarray(grad), inv[c, r] - x[r] * x[c], rtol=1e-11)
    before = sparsax_cpp.factorization_count()
    g(A.data * 1.01)  # new values: one factorization for the solves, the log-determinant and A^-1
    assert sparsax_cpp.factorization_count() - before == 1
    Z = sd.linalg.selected_inverse(M(A.data), solver="cholmod")
    np.testing.assert_allclose(np.asarray(sd.sparse.data(Z)), inv[r, c], rtol=1e-12)


def test_cholmod_is_given_the_upper_triangle_and_mirrors_the_selected_inverse():
    # the kernels read the entries with row <= column alone (the triangle
    # CHOLMOD reads: the lower one is not copied into it); the selected
    # inverse's lower entries are their mirrors'; a diagonal matrix's
    # entries are all upper (no gather)
    _cholmod()
    from sciad.solvers.direct import _cholmod_ffi

    A = _grid(4)
    r, c = _coords(A)
    inv = np.linalg.inv(A.toarray())
    M = sd.sparse.coo_matrix((A.data, (r, c)), shape=A.shape, tags={"spd"})
    upper = _cholmod_ffi._upper(M.pattern)
    assert upper is not None and upper[0].shape[0] == np.count_nonzero(r <= c)
    Z = np.asarray(sd.sparse.data(sd.linalg.selected_inverse(M, solver="cholmod")))
    np.testing.assert_allclose(Z, inv[M.pattern.rows, M.pattern.indices], rtol=1e-12)
    d = np.arange(1.0, 5.0)
    D = sd.sparse.coo_matrix((d, (np.arange(4), np.arange(4))), shape=(4, 4), tags={"spd"})
    assert _cholmod_ffi._upper(D.pattern) is None
    x = sd.linalg.solve(D, np.ones(4), solver="cholmod")
    np.testing.assert_allclose(np.asarray(x), 1.0 / d, rtol=1e-14)


def test_an_spd_matrix_is_read_by_the_sparse_cholesky_factor_shared_by_all():
    """"auto" reads a sparse matrix tagged spd with sciad's compiled sparse
    Cholesky factorization: one factorization (after `cse`) for the
    log-determinant, its gradient and Hessian-vector products, the selected
    inverse and samples of the same values; each against the dense forms."""
    A = _grid(5)
    r, c = _coords(A)
    n = A.shape[0]
    inv = np.linalg.inv(A.toarray())
    M = lambda v: sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"})  # noqa: E731
    z = np.linspace(-1.0, 1.0, n)

    def f(v):
        Z = sd.linalg.selected_inverse(M(v))
        x = sd.linalg.precision_sample(M(v), z)
        return sd.linalg.slogdet(M(v))[1] + snp.sum(sd.sparse.data(Z)) + snp.sum(x)

    names = [nd.primitive.name
             for nd in sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), A.data)).nodes]
    assert names.count("linalg.sparse_cholesky") == 1
    assert "linalg.slogdet" not in names and "linalg.selected_inverse" not in names
    logdet = lambda v: sd.linalg.slogdet(M(v))[1]  # noqa: E731
    sign, value = sd.linalg.slogdet(M(A.data))
    assert float(sign) == 1.0
    np.testing.assert_allclose(float(value), np.linalg.slogdet(A.toarray())[1], rtol=1e-14)
    np.testing.assert_allclose(np.asarray(sd.grad(logdet)(A.data)), inv[c, r], rtol=1e-12)
    t = np.random.default_rng(3).standard_normal(A.nnz)
    dA = sp.csr_matrix((t, (r, c)), shape=A.shape).toarray()
    dS = 0.5 * (dA + dA.T)  # (the symmetric part is factored: a declared-spd matrix's)
    np.testing.assert_allclose(np.asarray(sd.hvp(logdet, A.data, t)),
                               -(inv @ dS @ inv)[r, c], rtol=1e-10, atol=1e-14)
    Z = sd.linalg.selected_inverse(M(A.data))
    np.testing.assert_allclose(np.asarray(sd.sparse.data(Z)), inv[r, c], rtol=1e-12)


def test_hessian_vector_products_in_a_block_share_the_factor_and_its_reverse_pass():
    """`sd.vmap` of `sd.hvp` over directions: one factorization and one
    unbatched reverse pass (the gradient's) for the block, each direction's
    tangent, `symmul` and second reverse pass one batched node; each product
    the dense closed form."""
    A = _grid(4)
    r, c = _coords(A)
    inv = np.linalg.inv(A.toarray())
    M = lambda v: sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"})  # noqa: E731
    logdet = lambda v: sd.linalg.slogdet(M(v))[1]  # noqa: E731
    V = np.random.default_rng(5).standard_normal((3, A.nnz))
    block = lambda v, V: sd.vmap(lambda d: sd.hvp(logdet, v, d))(V)  # noqa: E731
    nodes = sd.graph.passes.optimize(sd.trace(block, A.data, V)).nodes
    names = [nd.primitive.name for nd in nodes]  # (unbatched: the block's)
    assert names.count("linalg.sparse_cholesky") == 1
    assert names.count("linalg.cholesky_adjoint") == 1
    mapped = [[b.primitive.name for b in nd.params["body"].nodes] for nd in nodes
              if nd.primitive.name == "map" and nd.params["size"] == 3]
    for name in ("linalg.cholesky_tangent", "linalg.fill_symmul", "linalg.cholesky_adjoint"):
        assert mapped.count([name]) == 1   # (one node over the 3 directions)
    assert not any("linalg.sparse_cholesky" in body for body in mapped)
    got = np.asarray(sd.function(block)(A.data, V))
    for d, g in zip(V, got):
        dA = sp.csr_matrix((d, (r, c)), shape=A.shape).toarray()
        dS = 0.5 * (dA + dA.T)
        np.testing.assert_allclose(g, -(inv @ dS @ inv)[r, c], rtol=1e-10, atol=1e-14)


# slow: the registry walk checks the sparse Cholesky family's rules to second
# order, test_cholmod CHOLMOD's; the gradient and Hessian-vector products by
# the default path are checked against closed forms above
@pytest.mark.slow
@pytest.mark.parametrize("solver", ["cholesky", "cholmod"])
def test_spd_rules_to_second_order(rng, solver):
    if solver == "cholmod":
        _cholmod()
    M, u = _symmetric_params(_grid(3))
    for f in (lambda u: sd.linalg.slogdet(M(u), solver=solver)[1],
              lambda u: sd.sparse.data(sd.linalg.selected_inverse(M(u), solver=solver))):
        report = sd.testing.check_rules(f, u * rng.uniform(0.9, 1.1, u.size))
        assert report.jvp_error < 1e-7 and report.second_order_error < 1e-7


@pytest.mark.parametrize("solver", ["cholesky", "cholmod"])
def test_spd_solvers_refuse_what_is_not_spd(solver):
    if solver == "cholmod":
        _cholmod()
    A = _grid(3)
    r, c = _coords(A)
    v = A.data.copy()
    v[1] += 0.5  # no longer symmetric
    with pytest.raises(sd.errors.StructureError, match="not symmetric"):
        sd.linalg.slogdet(sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"}),
                          solver=solver)
    with pytest.raises(NotPositiveDefiniteError):
        sd.linalg.slogdet(sd.sparse.coo_matrix((A.data - 3.0 * (r == c), (r, c)), shape=A.shape,
                                               tags={"spd"}), solver=solver)
    v = A.data.copy()
    v[0] = np.nan  # (every measure compared so that NaN fails)
    for f in (lambda M: sd.linalg.slogdet(M, solver=solver)[1],
              lambda M: sd.linalg.selected_inverse(M, solver=solver)):
        with pytest.raises(NonFiniteError, match="NaN"):
            f(sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"}))


def test_a_failure_leaves_no_factor_held():
    """A selected inverse that fails (a zero pivot without pivoting) between
    two solves with one SuperLU factor held on the host: its host call ends
    what the program holds before it raises (the factor would otherwise stay
    held, one per call)."""
    from sciad.solvers.direct import _sparse_direct

    r, c = np.array([0, 1]), np.array([1, 0])  # [[0, 1], [1, 0]]: SuperLU pivots

    def f(v):
        M = _matrix(v, r, c, 2)
        x, _ = sd.linalg.solve(M, snp.ones(2), solver="splu", throw=False)
        Z = sd.linalg.selected_inverse(_matrix(v + 0.0 * x[0], r, c, 2))  # (after the solve)
        y, _ = sd.linalg.solve(M, sd.sparse.data(Z), solver="splu", throw=False)
        return snp.sum(y)

    g = sd.function(f)
    held = _sparse_direct.held()
    for _ in range(5):
        with pytest.raises(SingularMatrixError, match="zero pivot"):
            g(np.array([1.0, 1.0]))
    assert _sparse_direct.held() == held


_JAX_CHILD = '''
import json, sys
import jax, jax.numpy as jnp, numpy as np, scipy.sparse as sp
jax.config.update("jax_enable_x64", True)
import sciad as sd
from sciad.solvers.direct import _cholmod_ffi

T = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (3, 3))
A = (sp.kron(T, sp.eye(3)) + sp.kron(sp.eye(3), T)).tocsr()
A.sort_indices()
r, c = np.repeat(np.arange(9), np.diff(A.indptr)), A.indices
inv = np.linalg.inv(A.toarray())
grad = inv.T[r, c]
hess = np.array([-(inv @ sp.csr_matrix((e, (r, c)), shape=(9, 9)).toarray() @ inv).T[r, c]
                 for e in np.eye(A.nnz)])
errors = {}
for solver, tags in (("splu", ()), ("cholmod", {"spd"})):
    if solver == "cholmod" and not _cholmod_ffi.available():
        continue
    g = sd.to_jax(lambda v: sd.linalg.slogdet(
        sd.sparse.coo_matrix((v, (r, c)), shape=(9, 9), tags=tags), solver=solver)[1])
    v = jnp.asarray(A.data)
    errors[solver] = [
        float(np.abs(jax.jacfwd(g)(v) - grad).max()),
        float(np.abs(jax.hessian(g)(v) - hess).max()),
        float(np.abs(jax.vmap(lambda t: jax.jvp(g, (v,), (t,))[1])(jnp.eye(A.nnz)[:3])
                     - grad[:3]).max())]
print("RESULT " + json.dumps(errors))
'''


def test_jax_transforms_of_to_jax_in_a_child():
    """JAX's own jacfwd, hessian and vmap of jvp of `sd.to_jax` of a sparse
    log-determinant (host SuperLU and compiled CHOLMOD), against the closed
    forms, in a child process (a crash fails the test, not the worker)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _JAX_CHILD], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    errors = json.loads(line[len("RESULT "):])
    assert "splu" in errors
    for solver, errs in errors.items():
        assert max(errs) < 1e-12, (solver, errs)


def test_the_selected_inverse_on_the_factors_pattern(rng):
    """`on="factor"`: every entry of the filled pattern `L + L^T` (more than
    `A`'s: fill), each the dense inverse's, in `A`'s numbering; its
    derivative checked; other solvers refuse it."""
    A = _grid(4)
    r, c = _coords(A)
    n = A.shape[0]
    M = lambda v: sd.sparse.coo_matrix((v, (r, c)), shape=A.shape, tags={"spd"})  # noqa: E731
    Z = sd.linalg.selected_inverse(M(A.data), on="factor")
    inv = np.linalg.inv(A.toarray())
    dense = np.asarray(sd.sparse.todense(Z))
    stored = dense != 0
    assert stored.sum() > A.nnz and np.array_equal(stored, stored.T)
    np.testing.assert_allclose(dense[stored], inv[stored], rtol=1e-12)
    Mu, u = _symmetric_params(_grid(3))
    report = sd.testing.check_rules(
        lambda u: sd.sparse.data(sd.linalg.selected_inverse(Mu(u), on="factor")),
        u * rng.uniform(0.9, 1.1, u.size), second_order=False)
    assert report.jvp_error < 1e-7
    with pytest.raises(InvalidOptionError, match="on='factor'"):
        sd.linalg.selected_inverse(M(A.data), solver="splu", on="factor")
    with pytest.raises(InvalidOptionError, match="'matrix' or 'factor'"):
        sd.linalg.selected_inverse(M(A.data), on="fill")
    assert n == 16
