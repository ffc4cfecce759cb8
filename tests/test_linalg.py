"""Linear solves: results against NumPy/SciPy for every solver, implicit
derivative rules checked (first and second order, real and complex), one
factorization shared by the forward and adjoint solves, and the errors a
failing solve raises."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ConvergenceError, InvalidOptionError, NonFiniteError,
                          NotPositiveDefiniteError, ShapeError, SingularMatrixError)


def _spd_csr(rng, n, dtype=np.float64):
    """A random sparse symmetric positive definite matrix (canonical CSR)."""
    B = sp.random(n, n, density=0.25, random_state=int(rng.integers(2**31)))
    M = sp.csr_array(B @ B.T + n * sp.eye(n))
    M.sum_duplicates()
    M.sort_indices()
    return M.astype(dtype)


def _general_csr(rng, n, dtype=np.float64):
    B = sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = B + 2.0 * sp.eye(n)
    if dtype == np.complex128:
        M = M + 1j * sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = sp.csr_array(M)
    M.sum_duplicates()
    M.sort_indices()
    return M.astype(dtype)


ITERATIVE = ("cg", "gmres", "bicgstab")


def _tol(solver, **kw):
    """Tight tolerances (and a preconditioner) for the iterative solvers only."""
    return dict(tol=1e-13, **kw) if solver in ITERATIVE else {}


def _csr(M, tags=()):
    """A function building M's pattern from traced values."""
    return lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape, tags=tags)


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("solver", ["lu", "cholesky", "cg", "gmres", "bicgstab"])
@pytest.mark.parametrize("nrhs", [None, 3])
def test_dense_solvers_match_numpy(rng, solver, nrhs):
    n = 7
    B = rng.standard_normal((n, n))
    A = B @ B.T + n * np.eye(n)
    b = rng.standard_normal(n if nrhs is None else (n, nrhs))
    f = sd.function(lambda A, b: sd.linalg.solve(A, b, solver=solver, **_tol(solver)))
    np.testing.assert_allclose(np.asarray(f(A, b)), np.linalg.solve(A, b), rtol=1e-9,
                               atol=1e-11)


@pytest.mark.parametrize("solver", ["splu", "klu", "spsolve", "cg", "gmres", "bicgstab"])
@pytest.mark.parametrize("nrhs", [None, 2])
def test_sparse_solvers_match_scipy(rng, solver, nrhs):
    M = _spd_csr(rng, 30)
    b = rng.standard_normal(30 if nrhs is None else (30, nrhs))

    def f(d, b):
        return sd.linalg.solve(_csr(M)(d), b, solver=solver,
                               **_tol(solver, preconditioner="jacobi"))

    np.testing.assert_allclose(np.asarray(sd.function(f)(M.data, b)), spl.spsolve(M.tocsc(), b),
                               rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_splu_keeps_a_patterns_column_order(rng, dtype):
    """The second factorization of a pattern factors in the first one's
    column order (no ordering again); plain and transposed solves with one
    or several right-hand sides still match SciPy, for new values too."""
    from sciad.solvers.direct import _sparse_direct

    M = _general_csr(rng, 40, dtype)
    pattern = _csr(M)(M.data).pattern
    f = sd.function(lambda d, b: (sd.linalg.solve(_csr(M)(d), b, solver="splu"),
                                  sd.linalg.solve(_csr(M)(d).T, b, solver="splu")))
    made = []
    real = _sparse_direct._factor_one
    try:
        _sparse_direct._factor_one = lambda p, d: made.append(real(p, d)) or made[-1]
        for k, nrhs in enumerate([None, 3, None]):
            d = M.data * (1.0 + 0.1 * k * rng.standard_normal(M.nnz))
            A = sp.csr_array((d, M.indices, M.indptr), shape=M.shape).toarray()
            b = rng.standard_normal(40 if nrhs is None else (40, nrhs)).astype(dtype)
            x, xt = f(d, b)
            np.testing.assert_allclose(np.asarray(x), np.linalg.solve(A, b), rtol=1e-10)
            np.testing.assert_allclose(np.asarray(xt), np.linalg.solve(A.T, b), rtol=1e-10)
    finally:
        _sparse_direct._factor_one = real
    assert _sparse_direct._orders.get(pattern) is not None
    # (one ordering each for A's pattern and A^T's, then their order kept)
    assert len(made) == 6
    assert sum(not isinstance(lu, _sparse_direct._Ordered) for lu in made) == 2


def test_complex_solves(rng):
    M = _general_csr(rng, 12, np.complex128)
    b = rng.standard_normal(12) + 1j * rng.standard_normal(12)
    D = M.toarray()
    x_sparse = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b))(M.data, b)
    x_dense = sd.function(lambda A, b: sd.linalg.solve(A, b))(D, b)
    ref = np.linalg.solve(D, b)
    np.testing.assert_allclose(np.asarray(x_sparse), ref, rtol=1e-11)
    np.testing.assert_allclose(np.asarray(x_dense), ref, rtol=1e-11)


def test_auto_choice_is_visible_in_the_graph(rng):
    M = _spd_csr(rng, 5)
    g = sd.trace(lambda d, b: sd.linalg.solve(_csr(M)(d), b), M.data, np.ones(5))
    auto = "klu" if jax.default_backend() == "cpu" else "splu"  # (KLU, compiled, on the CPU)
    assert "linalg.solve[pattern=" in str(g) and f"solver='{auto}'" in str(g)
    g = sd.trace(lambda A, b: sd.linalg.solve(A, b, assume="spd"), np.eye(3), np.ones(3))
    assert "solver='cholesky'" in str(g)


def test_a_system_of_no_unknowns_is_solved_as_numpy_does():
    """`np.linalg.solve` of a (0, 0) matrix returns an empty array (of a
    (0, k) right-hand side, (0, k)); it was a LoweringError (a max over no
    entries in the solve's checks), for every solver."""
    A = np.zeros((0, 0))
    S = sd.sparse.csr_matrix((np.zeros(0), np.zeros(0, np.int32), np.zeros(1, np.int32)),
                             shape=(0, 0))
    for solver in ("lu", "cholesky", "splu", "klu", "spsolve", "cg", "gmres", "bicgstab"):
        for b in (np.zeros(0), np.zeros((0, 3))):
            x = sd.linalg.solve(S if solver in ("splu", "klu", "spsolve") else A, b,
                                solver=solver)
            assert x.shape == np.linalg.solve(A, b).shape and x.dtype == np.float64, solver
    f = sd.function(lambda A, b: sd.linalg.solve(A, b))
    assert f(A, np.zeros((0, 2))).shape == (0, 2)
    gA, gb = sd.grad(lambda A, b: snp.sum(sd.linalg.solve(A, b)), argnums=(0, 1))(
        A, np.zeros(0))
    assert gA.shape == (0, 0) and gb.shape == (0,)
    x, dx = sd.jvp(lambda A, b: sd.linalg.solve(A, b), (A, np.zeros((0, 2))),
                   (A, np.zeros((0, 2))))
    assert x.shape == dx.shape == (0, 2)
    for M in (A, S):
        x, info = sd.linalg.solve(M, np.zeros(0), throw=False)
        assert x.shape == (0,) and bool(info.converged) and float(info.backward_error) == 0


# ---------------------------------------------------------------------------
# derivative rules


@pytest.mark.parametrize("solver,assume", [
    ("lu", None), pytest.param("lu", "symmetric", marks=pytest.mark.slow), ("cholesky", "spd"),
    # the same rules as the direct solvers'; checking them op by op through
    # lineax's loops takes ~20 s
    pytest.param("gmres", None, marks=pytest.mark.slow)])
def test_dense_solve_rules(rng, solver, assume):
    n = 5
    B = rng.standard_normal((n, n))
    A = B @ B.T + n * np.eye(n) if assume else B + n * np.eye(n)
    b = rng.standard_normal((n, 2))

    def f(A, b):
        if assume:  # keep the perturbed matrix symmetric, as the assumption says
            A = 0.5 * (A + A.T)
        return sd.linalg.solve(A, b, solver=solver, assume=assume, **_tol(solver))

    sd.testing.check_rules(f, A, b, seed=int(rng.integers(2**31)))


@pytest.mark.parametrize("solver,tags", [
    ("splu", ()), ("splu", ("spd",)),
    pytest.param("klu", ("spd",), marks=pytest.mark.slow),  # (test_klu.py: klu's rules)
    pytest.param("spsolve", (), marks=pytest.mark.slow),
    pytest.param("cg", ("spd",), marks=pytest.mark.slow),
    pytest.param("bicgstab", (), marks=pytest.mark.slow)])  # ~20 s op by op
def test_sparse_solve_rules(rng, solver, tags):
    M = _spd_csr(rng, 8)
    b = rng.standard_normal(8)

    def f(d, b):
        if tags:  # symmetrize the perturbation, as the tag promises
            d = 0.5 * (d + sd.sparse.data(_csr(M)(d).T))
        x = sd.linalg.solve(_csr(M, tags)(d), b, solver=solver, **_tol(solver))
        return snp.sin(x) * x

    sd.testing.check_rules(f, M.data, b, seed=int(rng.integers(2**31)))


def test_complex_sparse_solve_rules(rng):
    M = _general_csr(rng, 8, np.complex128)
    b = rng.standard_normal(8) + 1j * rng.standard_normal(8)
    sd.testing.check_rules(lambda d, b: sd.linalg.solve(_csr(M)(d), b), M.data, b,
                           seed=int(rng.integers(2**31)))


def _poisson(n):
    """The 1-D Dirichlet Laplacian's COO coordinates and a coefficient map."""
    i = np.arange(n)
    rows = np.concatenate([i, i[:-1], i[1:]])
    cols = np.concatenate([i, i[1:], i[:-1]])
    return rows, cols


def test_gradient_matches_a_hand_written_adjoint(rng):
    n = 40
    rows, cols = _poisson(n)
    f = rng.standard_normal(n)
    d = rng.standard_normal(n)

    def entries(m):
        k = snp.exp(m)
        # -d/dx(k du/dx) with k on cells: diagonal k_i + k_{i+1}, off -k
        kk = snp.concatenate([k, k[-1:]])
        diag = kk[:-1] + kk[1:]
        return snp.concatenate([diag, -k[1:], -k[1:]])

    def misfit(m):
        A = sd.sparse.coo_matrix((entries(m), (rows, cols)), shape=(n, n), tags={"spd"})
        u = sd.linalg.solve(A, f)
        return 0.5 * snp.sum((u - d) ** 2)

    m = 0.3 * rng.standard_normal(n)
    g = np.asarray(sd.grad(misfit)(m))

    # the adjoint by hand, with SciPy: one LU, a forward and a transposed solve
    def np_entries(m):
        k = np.exp(m)
        kk = np.concatenate([k, k[-1:]])
        return np.concatenate([kk[:-1] + kk[1:], -k[1:], -k[1:]])

    A = sp.csc_matrix((np_entries(m), (rows, cols)), shape=(n, n))
    lu = spl.splu(A)
    u = lu.solve(f)
    lam = lu.solve(u - d, trans="T")
    dA = -lam[rows] * u[cols]  # dJ/d(entry) for each COO entry
    with jax.enable_x64(True):
        _, pullback = jax.vjp(lambda m: jnp.asarray(np_entries_jax(m)), jnp.asarray(m))
        ref = np.asarray(pullback(jnp.asarray(dA))[0])
    np.testing.assert_allclose(g, ref, rtol=1e-8)
    rates = sd.testing.taylor_test(misfit, m, rng.standard_normal(n))
    assert np.all(rates > 1.9), rates


def np_entries_jax(m):
    k = jnp.exp(m)
    kk = jnp.concatenate([k, k[-1:]])
    return jnp.concatenate([kk[:-1] + kk[1:], -k[1:], -k[1:]])


def test_hvp_through_a_sparse_solve_matches_dense_jax(rng):
    M = _general_csr(rng, 10)
    rows, cols = M.nonzero()
    b = rng.standard_normal(10)

    def loss(d):
        x = sd.linalg.solve(_csr(M)(d), b)
        return snp.sum(x ** 3)

    def loss_jax(d):
        A = jnp.zeros((10, 10)).at[rows, cols].set(d)
        return jnp.sum(jnp.linalg.solve(A, b) ** 3)

    v = rng.standard_normal(M.nnz)
    got = np.asarray(sd.hvp(loss, M.data, v))
    with jax.enable_x64(True):
        ref = jax.jvp(jax.grad(loss_jax), (jnp.asarray(M.data),), (jnp.asarray(v),))[1]
    np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-8)


# ---------------------------------------------------------------------------
# one factorization


def _factor_nodes(graph):
    return [n for n in graph.nodes if n.primitive.name == "linalg.factor"]


@pytest.mark.parametrize("tags", [(), ("spd",)])
def test_value_and_grad_factors_once(rng, tags):
    M = _spd_csr(rng, 9)
    b = rng.standard_normal(9)

    def obj(d):
        x = sd.linalg.solve(_csr(M, tags)(d), b)
        y = sd.linalg.solve(_csr(M, tags)(d), x)  # a second solve, same matrix
        return snp.sum(y * y)

    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(obj), M.data))
    assert len(_factor_nodes(g)) == 1, g
    assert not any(n.primitive.name == "linalg.solve" for n in g.nodes)
    backsolves = [n for n in g.nodes if n.primitive.name == "linalg.backsolve"]
    assert len(backsolves) == 4  # two forward, two adjoint
    # the adjoint solves are transposed solves with the same factor (as cheap as
    # plain ones, and their residual is checked against A^T), except where the
    # solver's adjoint of a symmetric matrix is its forward solve (cholmod's)
    factor = _factor_nodes(g)[0]
    same = tags and sd.solvers.lookup(factor.params["solver"]).symmetric_adjoint
    transposed = [n for n in backsolves if n.params.get("transpose")]
    assert len(transposed) == (0 if same else 2)
    record = sd.solvers.lookup(factor.params["solver"])
    if record.held_on_host or record.frees_factor:  # (a factor held until its last reader)
        assert factor.params.get("uses") == 4  # the last backsolve releases it
    assert factor.params.get("assume") == ("spd" if tags else None)
    v = rng.standard_normal(M.nnz)
    if tags:  # a direction that keeps the matrix symmetric, as its tag says
        _, perm = sd.graph.Pattern(M.shape, M.indptr, M.indices).transposed()
        v = 0.5 * (v + v[perm])
    fd = sd.testing.taylor_test(obj, M.data, v)
    assert np.all(fd > 1.9)


def test_factor_sharing_keeps_results(rng):
    n = 6
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    b = rng.standard_normal(n)

    def f(A, b):
        x = sd.linalg.solve(A, b)
        return sd.linalg.solve(A, x) + sd.linalg.solve(A.T, b)

    g = sd.trace(f, A, b)
    shared = sd.graph.passes.share_factors(g)
    assert len(_factor_nodes(shared)) == 2  # A and A.T
    ref = np.linalg.solve(A, np.linalg.solve(A, b)) + np.linalg.solve(A.T, b)
    for graph in (g, shared):
        np.testing.assert_allclose(np.asarray(sd.graph.evaluate(graph, A, b)[0]), ref,
                                   rtol=1e-12)
    assert sd.graph.passes.share_factors(shared).pretty() == shared.pretty()


def test_batched_sparse_solves_through_to_jax(rng):
    M = _general_csr(rng, 8)
    f = sd.to_jax(lambda d, b: sd.linalg.solve(_csr(M)(d), b))
    B = rng.standard_normal((4, 8))
    with jax.enable_x64(True):
        X = jax.vmap(f, in_axes=(None, 0))(jnp.asarray(M.data), jnp.asarray(B))
        D = jax.vmap(lambda d: f(d, jnp.asarray(B[0])))(jnp.stack([M.data, 2 * M.data]))
    np.testing.assert_allclose(np.asarray(X), np.linalg.solve(M.toarray(), B.T).T, rtol=1e-11)
    np.testing.assert_allclose(np.asarray(D[1]), 0.5 * np.linalg.solve(M.toarray(), B[0]),
                               rtol=1e-11)


# ---------------------------------------------------------------------------
# errors


def test_singular_matrix_raises_with_the_users_line():
    A = np.array([[1.0, 2.0], [2.0, 4.0]])
    f = sd.function(lambda A, b: sd.linalg.solve(A, b))
    with pytest.raises(SingularMatrixError, match="singular") as info:
        f(A, np.ones(2))
    # (after factor sharing, the factorization node reports it)
    assert "test_linalg.py" in str(info.value)
    assert info.value.op in ("linalg.solve", "linalg.factor")
    M = sp.csr_array(np.array([[1.0, 1.0], [1.0, 1.0]]))
    g = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b))
    with pytest.raises(SingularMatrixError, match="singular"):
        g(M.data, np.ones(2))
    # its gradient is never computed from a failed solve
    with pytest.raises(SingularMatrixError):
        sd.grad(lambda d: snp.sum(sd.linalg.solve(_csr(M)(d), np.ones(2))))(M.data)


def test_structurally_singular_fails_at_trace_time():
    def f(d):
        A = sd.sparse.coo_matrix((d, ([0, 1], [0, 0])), shape=(2, 2))
        return sd.linalg.solve(A, np.ones(2))

    with pytest.raises(SingularMatrixError, match="structurally singular: column 1 has no "
                                                  "stored entry") as info:
        sd.trace(f, np.ones(2))
    assert "test_linalg.py" in str(info.value)


def test_non_finite_input_is_named():
    f = sd.function(lambda A, b: sd.linalg.solve(A, b))
    with pytest.raises(NonFiniteError, match="right-hand side holds NaN"):
        f(np.eye(2), np.array([1.0, np.nan]))
    with pytest.raises(NonFiniteError, match="matrix holds NaN"):
        f(np.array([[1.0, np.inf], [0.0, 1.0]]), np.ones(2))


def test_not_positive_definite():
    f = sd.function(lambda A, b: sd.linalg.solve(A, b, assume="spd"))
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        f(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2))


def test_iterative_non_convergence_reports_residual_and_iterations(rng):
    M = _spd_csr(rng, 40)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cg", maxiter=2))
    with pytest.raises(ConvergenceError, match=r"cg did not converge: relative residual "
                                               r"\S+ after 2 iterations") as info:
        f(M.data, rng.standard_normal(40))
    assert info.value.iterations == 2 and info.value.residual > 1e-10
    assert "test_linalg.py" in str(info.value)


def test_trace_time_errors():
    with pytest.raises(ShapeError, match=r"`b` must have shape \(3,\) or \(3, k\)"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b), np.eye(3), np.ones(4))
    with pytest.raises(ShapeError, match="must be a square matrix"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b), np.ones((3, 2)), np.ones(3))
    # (every name a solve takes: "auto" and the "amg" shorthand too)
    with pytest.raises(InvalidOptionError, match="unknown solver 'qr'; choose one of 'auto', "
                       "'amg', 'lu'.*explain_solver"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b, solver="qr"), np.eye(2), np.ones(2))
    with pytest.raises(InvalidOptionError, match="takes no `tol`"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b, solver="lu", tol=1e-3), np.eye(2),
                 np.ones(2))
    with pytest.raises(InvalidOptionError, match="solver 'splu' does not take a dense matrix"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b, solver="splu"), np.eye(2), np.ones(2))


def test_a_scipy_sparse_matrix_says_to_convert_it():
    A = sp.eye(3, format="csr")
    with pytest.raises(sd.errors.DTypeError,
                       match=r"linalg.solve: a scipy.sparse matrix \(csr_matrix\) is not an "
                             r"array: convert it with `sd.sparse.from_scipy\(A\)`") as err:
        sd.linalg.solve(A, np.ones(3))
    assert isinstance(err.value, TypeError)
    with pytest.raises(sd.errors.DTypeError, match=r"linalg.eigh: .*from_scipy"):
        sd.linalg.eigh(A)
    with pytest.raises(sd.errors.DTypeError, match=r"add: a scipy.sparse matrix .*from_scipy"):
        snp.add(sp.eye(3, format="coo"), 1.0)
    x = sd.linalg.solve(sd.sparse.from_scipy(A), np.ones(3))  # as advised
    np.testing.assert_allclose(x, np.ones(3))


def test_host_callbacks_keep_float64_exact_whatever_the_thread(rng):
    """Host calls get the program's buffers as they are and return 64-bit
    results as uint32 words, so no thread's x64 setting can round them to
    float32 (JAX's own callbacks convert with the running thread's setting)."""
    from sciad.solvers import _host

    x = rng.standard_normal(5) * (1 + 1e-12)  # not representable in float32
    z = x + 1j * x[::-1]
    seen = {}

    def host(a, c):
        seen["dtypes"] = (a.dtype, c.dtype)
        return a * 3.0, c * 1j

    def f(a, c):
        return _host.host_call(host, (jax.ShapeDtypeStruct(a.shape, a.dtype),
                                      jax.ShapeDtypeStruct(c.shape, c.dtype)), a, c)

    with jax.enable_x64(True):
        a3, cj = jax.jit(f)(jnp.asarray(x), jnp.asarray(z))
        batched = jax.vmap(f)(jnp.stack([x, 2 * x]), jnp.stack([z, z]))
    assert seen["dtypes"] == (np.float64, np.complex128)
    np.testing.assert_array_equal(np.asarray(a3), x * 3.0)
    np.testing.assert_array_equal(np.asarray(cj), z * 1j)
    np.testing.assert_array_equal(np.asarray(batched[0][1]), 2 * x * 3.0)


@pytest.mark.parametrize("solver", ["splu", "klu", "spsolve", "cg"])
def test_structure_tags_are_verified_by_default(solver):
    from sciad.errors import StructureError

    rows, cols = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])

    def f(d, b):
        A = sd.sparse.coo_matrix((d, (rows, cols)), shape=(2, 2), tags={"spd"})
        return sd.linalg.solve(A, b, solver=solver)

    with sd.config.checks(False):  # cheap checks are on whatever the setting
        with pytest.raises(StructureError, match=r"declared spd \(a tag, or `assume=`\) but "
                           r"is not symmetric: max \|A - A.T\| / max \|A\| = 3\.3"):
            sd.function(f)(np.array([3.0, 1.0, 0.0, 2.0]), np.ones(2))
        with pytest.raises(StructureError, match="diagonal entry <= 0"):
            sd.function(f)(np.array([-3.0, 1.0, 1.0, 2.0]), np.ones(2))
        x = sd.function(f)(np.array([3.0, 1.0, 1.0, 2.0]), np.ones(2))
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve([[3, 1], [1, 2]], [1, 1]))


@pytest.mark.parametrize("assume", ["spd", "symmetric"])
def test_dense_assume_is_verified(rng, assume):
    """A non-symmetric matrix solved with `assume="spd"` went to Cholesky (x
    35% off); with `assume="symmetric"` the value was right and the gradient
    (whose adjoint solve took A for A.T) 62% off. Both raise now."""
    from sciad.errors import StructureError

    A = rng.standard_normal((5, 5)) + 5 * np.eye(5)
    b = rng.standard_normal(5)
    f = sd.function(lambda A, b: sd.linalg.solve(A, b, assume=assume))
    g = sd.function(sd.grad(lambda A, b: snp.sum(sd.linalg.solve(A, b, assume=assume) ** 2)))
    with pytest.raises(StructureError, match=f"declared {assume}"):
        f(A, b)
    with pytest.raises(StructureError, match=f"declared {assume}"):
        g(A, b)
    S = A + A.T + 10 * np.eye(5)
    np.testing.assert_allclose(np.asarray(f(S, b)), np.linalg.solve(S, b), rtol=1e-12)


def test_throw_false_returns_an_explicit_status(rng):
    M = _spd_csr(rng, 40)
    b = rng.standard_normal(40)

    def f(d, b, maxiter):
        return sd.linalg.solve(_csr(M)(d), b, solver="cg", maxiter=maxiter, throw=False)

    x, info = sd.function(f, static_argnums=2)(M.data, b, 2)
    assert not bool(info.converged) and float(info.residual) > 1e-6
    x, info = sd.function(f, static_argnums=2)(M.data, b, 500)
    assert bool(info.converged) and float(info.residual) < 1e-10
    np.testing.assert_allclose(np.asarray(x), spl.spsolve(M.tocsc(), b), rtol=1e-8)
    # a singular dense matrix: no exception, a status that says so
    g = sd.function(lambda A, b: sd.linalg.solve(A, b, throw=False))
    x, info = g(np.array([[1.0, 2.0], [2.0, 4.0]]), np.ones(2))
    assert not bool(info.converged)
    # derivatives use solves that raise
    with pytest.raises(SingularMatrixError):
        sd.grad(lambda A: snp.sum(sd.linalg.solve(A, np.ones(2), throw=False)[0]))(
            np.array([[1.0, 2.0], [2.0, 4.0]]))


# ---------------------------------------------------------------------------
# matrix-free operators


def _diffusion_operator(theta, L):
    """`A(theta) v = exp(theta) * v + L v`: a parameterized operator."""
    return sd.linalg.operator(lambda v: snp.exp(theta) * v + L @ v, (L.shape[0],) * 2)


@pytest.mark.parametrize("nrhs", [None, pytest.param(2, marks=pytest.mark.slow)])
def test_matrix_free_solve_gradients_match_dense_jax(rng, nrhs):
    n = 10
    L = 0.3 * rng.standard_normal((n, n))
    theta = 2.0 + rng.standard_normal(n)
    b = rng.standard_normal(n if nrhs is None else (n, nrhs))

    def f(theta, b):
        x = sd.linalg.solve(_diffusion_operator(theta, L), b, solver="gmres", tol=1e-13)
        return snp.sum(x * snp.sin(x))

    def f_jax(theta, b):
        x = jnp.linalg.solve(jnp.diag(jnp.exp(theta)) + L, b)
        return jnp.sum(x * jnp.sin(x))

    with jax.enable_x64(True):
        want_val = float(f_jax(theta, b))
        want = jax.grad(f_jax, argnums=(0, 1))(jnp.asarray(theta), jnp.asarray(b))
    got = sd.value_and_grad(f, argnums=(0, 1))(theta, b)
    assert abs(float(got[0]) - want_val) < 1e-10
    for g, w in zip(got[1], want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-8, atol=1e-11)


@pytest.mark.slow  # ~10 s; the registry's check_rules covers linalg.solve_operator
def test_matrix_free_rules_first_and_second_order(rng):
    n = 6
    L = 0.3 * rng.standard_normal((n, n))
    S = L + L.T
    theta, b = 2.0 + rng.standard_normal(n), rng.standard_normal(n)

    def general(theta, b):
        return sd.linalg.solve(_diffusion_operator(theta, L), b, solver="gmres", tol=1e-13)

    def spd(theta, b):
        op = sd.linalg.operator(lambda v: snp.exp(theta) * v + 0.1 * (S @ v), (n, n),
                                tags={"spd"})
        return sd.linalg.solve(op, b, tol=1e-13)  # "auto": CG

    for f in (general, spd):
        report = sd.testing.check_rules(f, theta, b, seed=int(rng.integers(2**31)))
        assert report.second_order_error is not None
    assert "solver='cg'" in str(sd.trace(spd, theta, b))


def test_matrix_free_errors(rng):
    op = sd.linalg.operator(lambda v: 2.0 * v, (3, 3))
    with pytest.raises(InvalidOptionError, match="needs an iterative solver"):
        sd.trace(lambda b: sd.linalg.solve(op, b, solver="lu"), np.ones(3))
    with pytest.raises(ShapeError, match="square shape"):
        sd.linalg.operator(lambda v: v, (3, 2))
    bad = sd.linalg.operator(lambda v: v[:2], (3, 3))
    with pytest.raises(ShapeError, match="map a vector to a vector of the same type"):
        sd.trace(lambda b: sd.linalg.solve(bad, b), np.ones(3))
    stuck = sd.linalg.operator(lambda v: snp.concatenate([v[:2], 0.0 * v[2:]]), (3, 3))
    with pytest.raises(ConvergenceError, match="gmres did not converge"):
        sd.function(lambda b: sd.linalg.solve(stuck, b, maxiter=5))(np.ones(3))
    x, info = sd.function(lambda b: sd.linalg.solve(stuck, b, maxiter=5, throw=False))(
        np.ones(3))
    assert not bool(info.converged)


def test_a_solve_without_condition_estimate_is_checked_in_the_program():
    """`linalg.solve[estimate=False]` (the per-step solves of BDF's discrete
    adjoint): the same solution, no host call unless a check fails (none
    outside a `cond` in the lowered program), and a singular matrix still
    raises, naming the singularity."""
    import jax

    from sciad.errors import SingularMatrixError
    from sciad.primitives._linalg import solve

    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(4, 4)) + 4 * np.eye(4), rng.normal(size=4)
    f = sd.to_jax(lambda A, b: solve(A, b, estimate=False))
    np.testing.assert_allclose(np.asarray(f(A, b)), np.linalg.solve(A, b), rtol=1e-12)

    def calls(jaxpr, under_cond=False):  # (host calls: whether each is under a cond)
        for e in jaxpr.eqns:
            if e.primitive.name == "sciad_host_call":
                yield under_cond
            for p in e.params.values():
                for sub in p if isinstance(p, (tuple, list)) else [p]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        yield from calls(inner, under_cond or e.primitive.name == "cond")

    found = list(calls(jax.make_jaxpr(f)(A, b).jaxpr))
    assert found and all(found)  # (the checks' calls, each only where it fails)
    with pytest.raises(SingularMatrixError, match="singular"):
        sd.function(lambda A, b: solve(A, b, estimate=False))(np.ones((4, 4)), b)
