"""The algebraic multigrid preconditioner (`preconditioner="amg"`,
`sciad.solvers.iterative._amg`) and the preconditioner records: iteration counts
against Jacobi on 2-D and 3-D Poisson problems, derivative rules through
CG+AMG and GMRES+AMG (the transposed V-cycle), batching, `sd.to_jax` under
`jax.jit`, one host setup per matrix values, the failure modes (singular,
indefinite, not converged, NaN) and `sd.cost`. The gradients are checked
against SciPy in the quick tests, and by `check_rules` (with batching and
second order) in the slow ones.

The problems are small (a few hundred unknowns), so `MAX_COARSE` is
lowered to get hierarchies of three or four levels."""

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
                          NotSupportedError, StructureError)
from sciad.solvers import lookup, names
from program_constants import array_constants
from sciad.solvers.iterative import _amg as amg


@pytest.fixture(autouse=True)
def deep_hierarchies(monkeypatch):
    monkeypatch.setattr(amg, "MAX_COARSE", 20)


def _poisson(*ms):
    """The 5-point (2-D) or 7-point (3-D) Laplacian on an `ms` grid, CSR."""
    ops = [sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m)) for m in ms]
    eyes = [sp.eye(m) for m in ms]
    A = 0
    for k in range(len(ms)):
        term = 1
        for j in range(len(ms)):
            term = sp.kron(term, ops[j] if j == k else eyes[j])
        A = A + term
    A = sp.csr_matrix(A)
    A.sort_indices()
    return A


def _convection(m, c=0.8):
    """A 2-D convection-diffusion matrix (upwinded in x): not symmetric."""
    A = _poisson(m, m).tolil()
    for i in range(m * m):
        if i % m:
            A[i, i - 1] -= c
            A[i, i] += c
    A = A.tocsr()
    A.sort_indices()
    return A


def _sd(A, data=None):
    return sd.sparse.csr_matrix((A.data if data is None else data, A.indices, A.indptr),
                                shape=A.shape)


def _rhs(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n)


@pytest.mark.parametrize("grid", [(24, 24), pytest.param((8, 8, 8), marks=pytest.mark.slow)])
def test_amg_cg_converges_in_far_fewer_iterations_than_jacobi(grid):
    A = _poisson(*grid)
    b = _rhs(A.shape[0])
    s = amg.structure(_sd(A).type.pattern)
    assert len(s.levels) >= 2, s.nnz()

    def solve(pre, maxiter):
        return sd.function(lambda d, b: sd.linalg.solve(
            _sd(A, d), b, solver="cg", preconditioner=pre, tol=1e-10, maxiter=maxiter))(
            A.data, b)

    # measured: 16-17 iterations with AMG, 42-94 with Jacobi
    x = solve("amg", 25)
    np.testing.assert_allclose(x, spl.spsolve(A.tocsc(), b), rtol=1e-8, atol=0)
    with pytest.raises(ConvergenceError) as e:
        solve("jacobi", 25)
    assert e.value.residual > e.value.tolerance == 1e-10
    assert e.value.iterations == 25


def _spd_params(A):
    """`(E, p)`: `A.data = E @ p` with `p` the diagonal and the upper
    triangle's entries, each off-diagonal one on both of its positions: a
    symmetric matrix for every `p`."""
    coo = A.tocoo()
    upper = [(i, j) for i, j in zip(coo.row, coo.col) if i < j]
    index = {ij: k for k, ij in enumerate(upper)}
    n = A.shape[0]
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    E = np.zeros((A.nnz, n + len(upper)))
    for k, (i, j) in enumerate(zip(rows, A.indices)):
        E[k, i if i == j else n + index[(min(i, j), max(i, j))]] = 1.0
    p = np.concatenate([A.diagonal(), [A[i, j] for i, j in upper]])
    return E, p


@pytest.mark.slow
@pytest.mark.parametrize("assume", [None, "spd"])
def test_rules_through_amg_cg(assume):
    A = _poisson(8, 8)  # 64 unknowns: three levels at MAX_COARSE=20
    E, p = _spd_params(A)
    b = _rhs(A.shape[0])

    def f(p, b):
        S = _sd(A, snp.matmul(E, p))
        return sd.linalg.solve(S, b, solver="cg", preconditioner="amg", tol=1e-12,
                               assume=assume)

    sd.testing.check_rules(f, p, b, rtol=1e-5)


@pytest.mark.slow
def test_rules_through_amg_cg_quick():
    """The same on a smaller grid, without second order and batching."""
    A = _poisson(6, 6)
    E, p = _spd_params(A)
    b = _rhs(A.shape[0])
    assert len(amg.structure(_sd(A).type.pattern).levels) >= 1

    def f(p, b):
        return sd.linalg.solve(_sd(A, snp.matmul(E, p)), b, solver="cg",
                               preconditioner="amg", tol=1e-12)

    sd.testing.check_rules(f, p, b, rtol=1e-5, second_order=False, batch=False)


@pytest.mark.slow
def test_rules_through_amg_gmres_nonsymmetric():
    """GMRES+AMG on a convection-diffusion matrix; the VJP is the transposed
    solve, preconditioned by the transposed V-cycle."""
    A = _convection(7)
    b = _rhs(A.shape[0])

    def f(d, b):
        return sd.linalg.solve(_sd(A, d), b, solver="amg", tol=1e-12)

    x = sd.function(f)(A.data, b)
    np.testing.assert_allclose(x, spl.spsolve(A.tocsc(), b), rtol=1e-9)
    sd.testing.check_rules(f, A.data, b, rtol=1e-5, second_order=False, batch=False)


@pytest.mark.parametrize("method", ["gmres", pytest.param("bicgstab", marks=pytest.mark.slow)])
def test_transposed_solve_uses_the_transposed_hierarchy(method):
    A = _convection(12, c={"gmres": 0.8, "bicgstab": 0.6}[method])  # (values new to the cache)
    c = _rhs(A.shape[0], 1)
    b = _rhs(A.shape[0])
    before = amg.setup_count()

    def loss(d, b):
        x = sd.linalg.solve(_sd(A, d), b, solver=method, preconditioner="amg", tol=1e-12)
        return snp.sum(c * x)

    gb = sd.grad(loss, argnums=1)(A.data, b)
    np.testing.assert_allclose(gb, spl.spsolve(A.T.tocsc(), c), rtol=1e-9)
    assert amg.setup_count() == before + 1  # the adjoint solve found the forward's setup


@pytest.mark.parametrize("method", ["cg", "gmres"])
def test_level_products_in_ellpack_or_scatter_give_one_answer(monkeypatch, method):
    """Each level's products (`A_l x`, `P x`, `P^T x`, forward and
    transposed) take ELLPACK where `SCIAD_ELL_BACKENDS` names the backend
    (the CPU by default) and rows are even, else a scatter-add: the solve
    and its gradient agree to rounding either way."""
    from sciad.solvers import _indices

    # (values new to the hierarchy cache: other tests count its setups)
    A = _convection(12, c=0.3) if method == "gmres" else _poisson(12, 12) * 1.25
    b = _rhs(A.shape[0])
    loss = _squares_loss(A, solver=method, preconditioner="amg", tol=1e-12)
    assert _indices.ell_backends() == frozenset({"cpu"})
    want = sd.value_and_grad(loss)(A.data, b)
    monkeypatch.setenv("SCIAD_ELL_BACKENDS", "")
    assert _indices.ell_backends() == frozenset()
    got = sd.value_and_grad(loss)(A.data, b)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-11)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9, atol=1e-12 * np.abs(want[1]).max())
    monkeypatch.setenv("SCIAD_ELL_BACKENDS", "cpu, gpu")
    assert _indices.ell_backends() == frozenset({"cpu", "gpu"})


def _squares_loss(A, **solve):
    """`(d, b) -> sum(x^2)` with `A(d) x = b` solved by `sd.linalg.solve(..., **solve)`."""
    def loss(d, b):
        x = sd.linalg.solve(_sd(A, d), b, **solve)
        return snp.sum(x * x)

    return loss


def _compiled_amg_gradient(A):
    """The compiled gradient of `sum(x^2)`, `A(d) x = b`, solved by AMG-CG, in
    `(d, b)`."""
    loss = _squares_loss(A, solver="amg", assume="spd", tol=1e-12)
    return sd.function(sd.grad(loss, argnums=(0, 1)))


def test_hierarchy_built_once_per_values(monkeypatch):
    from sciad.solvers.iterative import _amg

    trims = []
    monkeypatch.setattr(_amg, "release_host_heap", lambda: trims.append(1))
    A = _poisson(12, 12)
    b = _rhs(A.shape[0])
    g = _compiled_amg_gradient(A)
    n0 = amg.setup_count()
    g(A.data, b)
    assert amg.setup_count() == n0 + 1  # forward and adjoint: one setup
    g(A.data, 2 * b)
    assert amg.setup_count() == n0 + 1  # the same values: found in the cache
    g(2 * A.data, b)
    assert amg.setup_count() == n0 + 2  # new values: a new hierarchy
    # each build gives its temporaries' pages back to the system (a lookup
    # has none)
    assert len(trims) == 2


def test_host_heap_release_is_found_on_glibc():
    import platform
    import sys

    from sciad.solvers import _host

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert _host._malloc_trim() is not None
    _host.release_host_heap()


def test_cache_within_its_byte_budget_keeps_the_newest(monkeypatch):
    monkeypatch.setattr(amg, "MAX_CACHED_BYTES", 1)  # no room for two hierarchies
    A = _poisson(11, 11)
    b = _rhs(A.shape[0])
    g = _compiled_amg_gradient(A)
    n0 = amg.setup_count()
    g(A.data, b)
    assert amg.setup_count() == n0 + 1  # the adjoint solve still finds the forward's setup
    g(3 * A.data, b)
    assert amg.setup_count() == n0 + 2
    assert sd.config.analysis_cache_info().kinds["amg hierarchy"].entries == 1
    g(A.data, b)
    assert amg.setup_count() == n0 + 3  # the first values' hierarchy went


def test_jax_vmap_over_right_hand_sides_of_a_to_jax_solve():
    # the setup's ordering operand (one element of the right-hand side) stays
    # unbatched under jax.vmap: one hierarchy for the shared matrix
    A = _poisson(8, 8)
    B = np.stack([_rhs(A.shape[0], k) for k in range(3)])
    f = sd.to_jax(lambda d, b: sd.linalg.solve(_sd(A, d), b, solver="cg",
                                               preconditioner="amg", tol=1e-12))
    n0 = amg.setup_count()
    with jax.enable_x64(True):
        X = jax.jit(jax.vmap(f, in_axes=(None, 0)))(jnp.asarray(A.data), jnp.asarray(B))
    np.testing.assert_allclose(X, spl.spsolve(A.tocsc(), B.T).T, rtol=1e-9)
    assert amg.setup_count() == n0 + 1


def test_index_arrays_enter_the_program_once_as_int32():
    # every index array (A's rows and columns, its transpose's permutation,
    # each level's) is one int32 constant, whatever number of products,
    # V-cycles (forward and transposed) and checks read it
    A = _poisson(10, 10)
    b = _rhs(A.shape[0])

    loss = _squares_loss(A, solver="cg", preconditioner="amg", tol=1e-12)
    f = jax.jit(sd.to_jax(sd.value_and_grad(loss)))
    with jax.enable_x64(True):
        lowered = f.lower(jnp.asarray(A.data), jnp.asarray(b))
    consts = array_constants(lowered)
    assert [c for c in consts if c[0] == "i64"] == []
    i32 = [c for c in consts if c[0] == "i32"]
    assert len(i32) == len(set(i32)) >= 4  # A's rows and cols; each level's P


@pytest.mark.slow
def test_vmap_over_values_and_rhs():
    A = _poisson(10, 10)
    B = np.stack([_rhs(A.shape[0], k) for k in range(3)])
    D = np.stack([A.data * (1 + k) for k in range(3)])

    def f(d, b):
        return sd.linalg.solve(_sd(A, d), b, solver="cg", preconditioner="amg", tol=1e-12)

    X = sd.function(sd.vmap(f))(D, B)
    for k in range(3):
        np.testing.assert_allclose(X[k], spl.spsolve(A.tocsc() * (1 + k), B[k]), rtol=1e-9)
    X = sd.function(sd.vmap(f, in_axes=(None, 0)))(A.data, B)  # right-hand sides only
    np.testing.assert_allclose(X, spl.spsolve(A.tocsc(), B.T).T, rtol=1e-9)


def test_to_jax_under_jit():
    A = _poisson(10, 10)
    b = _rhs(A.shape[0])

    loss = _squares_loss(A, solver="amg", assume="spd", tol=1e-12)
    f = jax.jit(jax.value_and_grad(sd.to_jax(loss), argnums=1))
    with jax.enable_x64(True):
        val, gb = f(jnp.asarray(A.data), jnp.asarray(b))
    x = spl.spsolve(A.tocsc(), b)
    np.testing.assert_allclose(val, x @ x, rtol=1e-10)
    np.testing.assert_allclose(gb, 2 * spl.spsolve(A.tocsc(), x), rtol=1e-9)


# ---------------------------------------------------------------------------
# failures


def _run(A, b, data=None, **kw):
    return sd.function(lambda d, b: sd.linalg.solve(_sd(A, d), b, **kw))(
        A.data if data is None else data, b)


def test_singular_matrix_raises():
    """A Neumann Laplacian (rows sum to zero) with a right-hand side outside
    its range: no solution, so no convergence (never a wrong answer)."""
    A = _poisson(10, 10).tolil()
    A.setdiag(0)
    A.setdiag(-np.asarray(A.sum(axis=1)).ravel())
    A = sp.csr_matrix(A)
    A.sort_indices()
    b = _rhs(A.shape[0])
    with pytest.raises(ConvergenceError, match="did not converge") as e:
        _run(A, b, solver="cg", preconditioner="amg", maxiter=200)
    assert e.value.residual > 1e-3


@pytest.mark.slow
def test_indefinite_matrix_with_cg_raises():
    A = (_poisson(10, 10) - 1.0 * sp.eye(100)).tocsr()  # eigenvalues on both sides of 0
    A.sort_indices()
    b = _rhs(A.shape[0])
    with pytest.raises(ConvergenceError, match="symmetric positive definite"):
        _run(A, b, solver="cg", preconditioner="amg", maxiter=300)
    # declared spd with a negative diagonal: caught before the solve
    B = (_poisson(10, 10) - 5.0 * sp.eye(100)).tocsr()
    B.sort_indices()
    with pytest.raises(StructureError, match="spd"):
        _run(B, b, solver="amg", assume="spd")
    # GMRES+AMG solves the indefinite one
    x = _run(A, b, solver="amg", tol=1e-10)
    np.testing.assert_allclose(x, spl.spsolve(A.tocsc(), b), rtol=1e-7)


@pytest.mark.slow
def test_nonfinite_values_and_rhs_raise():
    A = _poisson(8, 8)
    b = _rhs(A.shape[0])
    bad = A.data.copy()
    bad[3] = np.nan
    with pytest.raises(NonFiniteError, match="matrix"):
        _run(A, b, data=bad, solver="amg", assume="spd")
    with pytest.raises(NonFiniteError, match="right-hand side"):
        _run(A, np.where(np.arange(b.size) == 5, np.nan, b), solver="amg", assume="spd")

    with pytest.raises(NonFiniteError):
        sd.grad(_squares_loss(A, solver="amg", assume="spd"))(bad, b)


def test_options_checked_at_trace_time():
    A = _poisson(6, 6)
    b = _rhs(A.shape[0])
    assert {"jacobi", "amg"} <= set(names("preconditioner"))
    with pytest.raises(InvalidOptionError, match="'jacobi', 'amg'"):
        _run(A, b, solver="cg", preconditioner="multigrid")
    with pytest.raises(InvalidOptionError, match="preconditioned by 'amg'"):
        _run(A, b, solver="amg", preconditioner="jacobi")
    with pytest.raises(NotSupportedError, match="sparse"):
        sd.function(lambda M, b: sd.linalg.solve(M, b, solver="cg", preconditioner="amg"))(
            A.toarray(), b)
    N = sp.csr_matrix(A - sp.diags(A.diagonal()))  # no stored diagonal
    N.eliminate_zeros()
    N = N + sp.eye(36, k=1)
    N = sp.csr_matrix(N)
    N.sort_indices()
    with pytest.raises(StructureError, match="diagonal.*setdiag"):  # (a structure, not values)
        _run(N, b, solver="gmres", preconditioner="amg")
    assert lookup("amg", "preconditioner").where == "host"


def test_cost_reports_hierarchy_and_vcycle():
    A = _poisson(16, 16)
    b = _rhs(A.shape[0])

    def f(pre):
        return sd.cost(lambda d, b: sd.linalg.solve(_sd(A, d), b, solver="cg",
                                                    preconditioner=pre), A.data, b)

    rows = {pre: next(r for r in f(pre).rows
                      if r.node.primitive.name == "linalg.solve")
            for pre in ("amg", "jacobi")}
    s = amg.structure(_sd(A).type.pattern)
    assert f"amg: {len(s.levels) + 1} levels" in rows["amg"].note
    assert rows["amg"].temp == s.nbytes(8) > 0
    assert rows["amg"].flops - rows["jacobi"].flops == pytest.approx(s.apply_flops() - 256)
    assert s.apply_flops() > 2 * 2 * A.nnz


@pytest.mark.parametrize("block", [3, 2 ** 18])
def test_scatter_onto_a_superset_pattern_block_by_block(monkeypatch, block):
    # the host setup puts each product's values on its symbolic pattern a
    # block of rows at a time: any block size gives the dense answer, rows
    # with no entries and rows longer than a block included
    from sciad.solvers.iterative import _amg

    monkeypatch.setattr(_amg, "SCATTER_BLOCK", block)
    rng = np.random.default_rng(3)
    dense = (rng.random((40, 30)) < 0.3).astype(float)
    dense[5, :] = 1.0  # a row longer than a block
    dense[7, :] = 0.0  # a row with no entries
    sup = sp.csr_matrix(dense)
    m = sup.copy()
    m.data = rng.standard_normal(m.nnz) * (rng.random(m.nnz) < 0.7)  # a subset, exact zeros
    m.eliminate_zeros()
    out = _amg._scatter(m, 30, sup.indptr, sup.indices)
    got = sp.csr_matrix((out, sup.indices, sup.indptr), shape=sup.shape).toarray()
    np.testing.assert_array_equal(got, m.toarray())
    outside = sp.csr_matrix(([1.0], ([7], [0])), shape=sup.shape)
    with pytest.raises(AssertionError, match="outside its symbolic pattern"):
        _amg._scatter(m + outside, 30, sup.indptr, sup.indices)


def _neumann_laplacian_3d(m):
    """The 7-point Laplacian on an m^3 grid with zero-flux boundaries:
    singular, its null space the constants."""
    e = np.ones(m)
    d = sp.diags([-e[:-1], 2 * e, -e[:-1]], [-1, 0, 1]).tolil()
    d[0, 0] = d[-1, -1] = 1.0
    d, eye = d.tocsr(), sp.eye(m)
    return (sp.kron(sp.kron(d, eye), eye) + sp.kron(sp.kron(eye, d), eye)
            + sp.kron(sp.kron(eye, eye), d)).tocsr()


@pytest.mark.parametrize("m", [8, pytest.param(12, marks=pytest.mark.slow)])
def test_amg_solves_consistent_singular_systems(m):
    # pure Neumann, b in the range (zero mean): AMG-CG stalled at relative
    # residuals of 2e-3 (8^3) and 1.7e-7 (12^3), its coarsest level's `inv`
    # finite but huge along the null space; pyamg converges in 11 iterations
    rng = np.random.default_rng(0)
    A = _neumann_laplacian_3d(m)
    b = rng.standard_normal(A.shape[0])
    b -= b.mean()
    x = np.asarray(sd.linalg.solve(sd.sparse.from_scipy(A), b, solver="amg", assume="spd",
                                   tol=1e-10))
    assert np.linalg.norm(A @ x - b) <= 1e-9 * np.linalg.norm(b)
    # an inconsistent b has no solution: the message says why, not "use gmres" alone
    with pytest.raises(ConvergenceError, match="outside its range"):
        sd.linalg.solve(sd.sparse.from_scipy(A), b + 1.0, solver="amg", assume="spd",
                        maxiter=100)
