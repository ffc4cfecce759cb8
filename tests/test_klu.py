"""The compiled KLU solver record ("klu", `sciad.solvers.direct._klu`): results against
SciPy, derivative rules, batching, `sd.to_jax` under JAX's transforms, a
factor reused across a loop, factors that leave their program (never a
freed or foreign handle in a solve), memory that stays flat over many calls,
and the errors of a singular or non-finite system."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg  # noqa: F401  (sp.linalg)

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, NonFiniteError, SingularMatrixError
from sciad.graph import passes
from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p
from sciad.solvers import _batch_split
from sciad.solvers.direct import _klu_ffi
from sciad.solvers._linear import choose

from helpers import assert_vmap_of_sparse_solves, rss_mib

pytestmark = pytest.mark.skipif(not _klu_ffi.available(), reason="klujax is not installed")


def _general_csr(rng, n, dtype=np.float64):
    B = sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = B + 3.0 * sp.eye(n)
    if np.dtype(dtype).kind == "c":
        M = M + 1j * sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = sp.csr_array(M)
    M.sum_duplicates()
    M.sort_indices()
    return M.astype(dtype)


def _tridiag(n):
    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.2], [-1, 0, 1], (n, n)))
    M.sort_indices()
    return M


def _csr(M):
    return lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("nrhs", [None, 3])
@pytest.mark.parametrize("transpose", [False, True])
def test_klu_matches_scipy(rng, nrhs, transpose):
    M = _general_csr(rng, 25)
    b = rng.standard_normal(25 if nrhs is None else (25, nrhs))

    def f(d, b):
        A = _csr(M)(d)
        return sd.linalg.solve(A.T if transpose else A, b, solver="klu")

    D = M.toarray().T if transpose else M.toarray()
    np.testing.assert_allclose(np.asarray(sd.function(f)(M.data, b)), np.linalg.solve(D, b),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.complex128, np.float32, np.complex64])
def test_klu_other_dtypes(rng, dtype):
    M = _general_csr(rng, 12, dtype)
    b = (rng.standard_normal(12) + (1j * rng.standard_normal(12)
                                    if np.dtype(dtype).kind == "c" else 0)).astype(dtype)
    x = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"))(M.data, b)
    assert x.dtype == dtype
    tol = 1e-10 if np.finfo(dtype).bits >= 64 else 1e-4
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(M.toarray(), b), rtol=tol)


def test_transposed_solve_is_not_conjugated(rng):
    """`A^T x = b`, as the other direct solvers (and klujax's tsolve) mean it."""
    from sciad.primitives._linalg import linalg_solve_p

    M = _general_csr(rng, 10, np.complex128)
    b = rng.standard_normal(10) + 1j * rng.standard_normal(10)
    x = sd.function(lambda d, b: linalg_solve_p.bind(
        _csr(M)(d), b, solver="klu", pattern=_csr(M)(d).type.pattern, transpose=True))(
        M.data, b)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(M.toarray().T, b), rtol=1e-10)


# ---------------------------------------------------------------------------
# derivative rules


def test_klu_rules(rng):
    M = _general_csr(rng, 8)
    b = rng.standard_normal(8)

    def f(d, b):
        x = sd.linalg.solve(_csr(M)(d), b, solver="klu")
        return snp.sin(x) * x

    sd.testing.check_rules(f, M.data, b, seed=int(rng.integers(2**31)))


def test_klu_complex_rules(rng):
    M = _general_csr(rng, 6, np.complex128)
    b = rng.standard_normal(6) + 1j * rng.standard_normal(6)
    sd.testing.check_rules(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"),
                           M.data, b, seed=int(rng.integers(2**31)))


def test_klu_gradient_matches_the_hand_adjoint(rng):
    M = _general_csr(rng, 20)
    b = rng.standard_normal(20)

    def loss(d, b):
        return snp.sum(sd.linalg.solve(_csr(M)(d), b, solver="klu") ** 2)

    gd, gb = sd.function(sd.grad(loss, argnums=(0, 1)))(M.data, b)
    D = M.toarray()
    x = np.linalg.solve(D, b)
    lam = np.linalg.solve(D.T, 2 * x)
    rows = np.repeat(np.arange(20), np.diff(M.indptr))
    np.testing.assert_allclose(np.asarray(gb), lam, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gd), -lam[rows] * x[M.indices], rtol=1e-9)
    # forward over reverse: a Hessian-vector product against finite differences
    v = rng.standard_normal(20)
    hv = sd.function(lambda b, v: sd.jvp(lambda b: sd.grad(loss, argnums=1)(M.data, b),
                                         (b,), (v,))[1])(b, v)
    np.testing.assert_allclose(np.asarray(hv), 2 * np.linalg.solve(D.T, np.linalg.solve(D, v)),
                               rtol=1e-9)


# ---------------------------------------------------------------------------
# factors: made and freed in the program that reads them, or not made


def _factor_nodes(graph):
    return [n for n in graph.nodes if n.primitive is linalg_factor_p]


def test_a_factor_read_twice_is_made_once_with_its_uses_counted(rng):
    M = _general_csr(rng, 10)
    g = passes.optimize(sd.trace(sd.grad(lambda d, b: snp.sum(
        sd.linalg.solve(_csr(M)(d), b, solver="klu") ** 2), argnums=(0, 1)), M.data,
        np.ones(10)))
    (f,) = _factor_nodes(g)
    assert f.params.get("uses") == 2
    # one solve alone: no numeric factor (it factors and solves in one call)
    g = passes.optimize(sd.trace(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"),
                                 M.data, np.ones(10)))
    assert all(f.params.get("uses") is None for f in _factor_nodes(g))


def test_a_batch_of_single_solves_makes_no_numeric_factor(rng):
    """`sd.vmap` of one solve: the map of its factorization is read by one map
    of one solve, which factors and solves in one call; no handle is made or
    handed from map to map (a gradient's two solves share one)."""
    M = _general_csr(rng, 10)
    D = np.stack([M.data, 2 * M.data, M.data + 0.5])
    B = rng.standard_normal((3, 10))

    def one(d, b):
        return sd.linalg.solve(_csr(M)(d), b, solver="klu")

    def body_factor(g):
        (m,) = [n for n in g.nodes if n.primitive.name == "map"
                and n.params["body"].nodes[0].primitive is linalg_factor_p]
        return m.params["body"].nodes[0]

    g = passes.optimize(sd.trace(sd.vmap(one), D, B))
    f = body_factor(g)
    assert f.params.get("alone") is True and f.params.get("uses") is None
    hlo = jax.jit(sd.to_jax(sd.vmap(one))).lower(D, B).as_text()
    assert "sciad_klu_factor" not in hlo and "sciad_klu_free_numeric" not in hlo
    x = sd.function(sd.vmap(one))(D, B)
    for k in range(3):
        A = sp.csr_matrix((D[k], M.indices, M.indptr), shape=M.shape).toarray()
        np.testing.assert_allclose(np.asarray(x[k]), np.linalg.solve(A, B[k]), rtol=1e-10)
    loss = lambda d, b: snp.sum(sd.vmap(one)(d, b) ** 2)  # noqa: E731
    g = passes.optimize(sd.trace(sd.grad(loss), D, B))
    f = body_factor(g)
    assert not f.params.get("alone") and f.params.get("uses") == 2


def test_a_factor_reused_by_every_step_of_a_scan(rng):
    """Backward Euler: one matrix, 50 steps, one factorization (hoisted out of
    the loop and its adjoint loop, read by every step), value and gradient."""
    n, steps = 30, 50
    M = _tridiag(n)
    y0 = rng.standard_normal(n)

    def run(d, y0):
        A = _csr(M)(d)

        def step(y, _):
            y = sd.linalg.solve(A, y, solver="klu")
            return y, None

        y, _ = sd.scan(step, y0, length=steps)
        return snp.sum(y ** 2)

    f = sd.function(sd.value_and_grad(run, argnums=(0, 1)))
    val, (gd, gy) = f(M.data, y0)
    D = M.toarray()
    ys = [y0]
    for _ in range(steps):
        ys.append(np.linalg.solve(D, ys[-1]))
    np.testing.assert_allclose(float(val), np.sum(ys[-1] ** 2), rtol=1e-10)
    lam = 2 * ys[-1]
    gd_ref = np.zeros(M.nnz)
    rows = np.repeat(np.arange(n), np.diff(M.indptr))
    for k in range(steps, 0, -1):
        mu = np.linalg.solve(D.T, lam)
        gd_ref -= mu[rows] * ys[k][M.indices]
        lam = mu
    np.testing.assert_allclose(np.asarray(gy), lam, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(gd), gd_ref, rtol=1e-8, atol=1e-12)
    g = passes.optimize(sd.trace(sd.value_and_grad(run, argnums=(0, 1)), M.data, y0))
    factors = _factor_nodes(g)
    assert len(factors) == 1 and factors[0].params.get("uses") is not None


def test_a_factor_returned_from_its_program_holds_no_handle(rng):
    """A factor that leaves its program (a graph output, here also read by two
    solves in it) is not a numeric factor: its handle is 0 (nothing to free,
    nothing freed that a later reader holds), and the solves factor as they
    solve."""
    M = _general_csr(rng, 12)
    p = sd.graph.Pattern(M.shape, M.indptr, M.indices)
    b = rng.standard_normal(12)

    def make_and_use(d, b):
        A = _csr(M)(d)
        F = linalg_factor_p.bind(A, solver="klu", pattern=p)
        x = linalg_backsolve_p.bind(F, A, b, solver="klu", pattern=p)
        return F, linalg_backsolve_p.bind(F, A, x, solver="klu", pattern=p, transpose=True)

    g = passes.optimize(sd.trace(make_and_use, M.data, b))
    # (the graph says it: no handle made, so none to release)
    assert _factor_nodes(g)[0].params.get("uses") is None
    assert not any(n.primitive.releases for n in g.nodes)
    f = sd.function(make_and_use)
    D = M.toarray()
    for _ in range(3):
        (h,), x = f(M.data, b)
        assert np.asarray(h).dtype == np.uint64 and int(np.asarray(h)) == 0
        np.testing.assert_allclose(np.asarray(x), np.linalg.solve(D.T, np.linalg.solve(D, b)),
                                   rtol=1e-10)


def _loss(d, b, M):
    return snp.sum(sd.linalg.solve(_csr(M)(d), b, solver="klu") ** 2)


def test_to_jax_under_jit_grad_and_vmap(rng):
    """The residuals of `sd.to_jax`'s backward pass cross programs (the
    factor among them): its handle must be 0 there."""
    M = _general_csr(rng, 15)
    b = rng.standard_normal(15)
    f = sd.to_jax(lambda d, b: _loss(d, b, M))
    D = M.toarray()
    x = np.linalg.solve(D, b)
    lam = np.linalg.solve(D.T, 2 * x)
    np.testing.assert_allclose(float(jax.jit(f)(M.data, b)), np.sum(x ** 2), rtol=1e-10)
    for _ in range(2):
        gd, gb = jax.jit(jax.grad(f, argnums=(0, 1)))(M.data, b)
        np.testing.assert_allclose(np.asarray(gb), lam, rtol=1e-9)
    gb2 = jax.grad(f, argnums=1)(M.data, b)
    np.testing.assert_allclose(np.asarray(gb2), lam, rtol=1e-9)
    ds = np.stack([M.data, 2 * M.data, 0.5 * M.data])
    bs = np.stack([b, b, -b])
    vals = jax.jit(jax.vmap(f))(ds, bs)
    want = [np.sum(np.linalg.solve(s * D, c) ** 2) for s, c in zip((1, 2, 0.5), bs)]
    np.testing.assert_allclose(np.asarray(vals), want, rtol=1e-10)
    gbs = jax.jit(jax.vmap(jax.grad(f, argnums=1)))(ds, bs)
    for k, s in enumerate((1, 2, 0.5)):
        xs = np.linalg.solve(s * D, bs[k])
        np.testing.assert_allclose(np.asarray(gbs[k]), np.linalg.solve(s * D.T, 2 * xs),
                                   rtol=1e-9)


def test_sd_vmap_of_solves(rng):
    assert_vmap_of_sparse_solves("klu", _general_csr(rng, 10), rng)


@pytest.mark.slow  # ~10 s: 240 calls
def test_memory_stays_flat_over_many_calls():
    """Programs that make (and free) numeric factors, called 100 times, keep
    no memory: a leaked factor here is about 0.5 MiB (measured: 49 MiB over
    100 calls of `f` with the frees removed; 0.05 MiB with them)."""
    n = 5000
    M = _tridiag(n)
    b = np.ones(n)
    f = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    fj = jax.jit(jax.grad(sd.to_jax(lambda d, b: _loss(d, b, M)), argnums=(0, 1)))

    def calls(k):
        for _ in range(k):
            jax.block_until_ready(f(M.data, b))
            jax.block_until_ready(fj(M.data, b))
        gc.collect()
        return rss_mib()

    first = calls(20)
    last = calls(100)
    assert last - first < 20, (first, last)


# ---------------------------------------------------------------------------
# errors


def test_a_singular_matrix_raises(rng):
    M = _general_csr(rng, 8)
    b = np.ones(8)
    zero = np.zeros_like(M.data)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"))
    # a zero row: found before KLU factors, naming the node and the line
    one_row = M.data.copy()
    one_row[M.indptr[2]:M.indptr[3]] = 0.0
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    for bad in (zero, one_row):
        with pytest.raises(SingularMatrixError, match="zero pivot") as info:
            f(bad, b)
        assert "test_klu.py" in str(info.value)
        with pytest.raises(SingularMatrixError, match="zero pivot"):
            g(bad, b)
    # a zero pivot KLU finds itself: its own error, naming the solver
    P = sp.csr_array(np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    with pytest.raises(SingularMatrixError, match="klu"):
        sd.function(lambda d, b: sd.linalg.solve(_csr(P)(d), b, solver="klu"))(P.data, np.ones(3))
    # numerically singular: the Neumann Laplacian (its rows sum to zero)
    L = _tridiag(8)
    lap = np.where(L.indices == np.repeat(np.arange(8), np.diff(L.indptr)), 2.0, -1.0)
    lap[0] = lap[-1] = 1.0
    gl = sd.function(sd.grad(lambda d, b: _loss(d, b, L), argnums=(0, 1)))
    with pytest.raises(SingularMatrixError):
        jax.block_until_ready(gl(lap, b))
    with pytest.raises(SingularMatrixError), sd.errors.unwrapped():  # (JAX's own dispatch)
        jax.block_until_ready(jax.jit(jax.grad(sd.to_jax(lambda d: _loss(d, b, M))))(zero))
    with pytest.raises(SingularMatrixError, match="klu"), sd.errors.unwrapped():
        jax.block_until_ready(jax.jit(jax.grad(sd.to_jax(
            lambda d: snp.sum(sd.linalg.solve(_csr(P)(d), np.ones(3), solver="klu")))))(P.data))
    # still usable afterwards
    np.testing.assert_allclose(np.asarray(f(M.data, b)), np.linalg.solve(M.toarray(), b),
                               rtol=1e-10)


def test_a_failed_check_releases_the_factors_of_its_program():
    """A check that raises stops the program before its frees: the check
    releases the run's factors from the host, and the frees wait for every
    check, so none runs twice (a double free would crash here). Measured
    before: 91 MB over 40 failed calls at n = 20,000; after: 4 MB."""
    n = 20_000
    k = np.random.default_rng(1).uniform(0.5, 2.0, n - 1)
    # a Neumann Laplacian with random coefficients: no zero pivot, singular
    # to working precision (the backward error check fails, on the host)
    L = sp.csr_array(sp.diags([-k, np.r_[k, 0.0] + np.r_[0.0, k], -k], [-1, 0, 1]))
    L.sort_indices()
    b = np.random.default_rng(2).standard_normal(n)
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, L), argnums=(0, 1)))

    def fails(m):
        for _ in range(m):
            with pytest.raises(SingularMatrixError, match="working precision"):
                jax.block_until_ready(g(L.data, b))
        gc.collect()
        return rss_mib()

    live = _batch_split.live_handles()
    first = fails(10)  # (the first calls grow the heap once, by up to ~10 MB)
    assert fails(30) - first < 30  # (a factor is ~2.3 MB: 69 MB if each leaked)
    assert _batch_split.live_handles() == live  # (every factor made was released)
    # the program still runs, and frees its factors, on a good matrix
    good = L.data + np.where(L.indices == np.repeat(np.arange(n), np.diff(L.indptr)), 1.0, 0.0)
    jax.block_until_ready(g(good, b))


@pytest.mark.skipif(not _batch_split.handles_available(),
                    reason="no C++ compiler: no handle table")
def test_a_repeated_or_stale_release_is_refused(rng):
    """Two failed checks of one run may release the same handles, and the
    program's own free may follow a host release: the handle table ends each
    handle once, so the second release frees nothing (a double free would
    crash here), and a solve with a released handle is an error, not a read
    of freed memory. A released entry is reused with a new generation, and
    the stale handle does not reach the new factor."""
    M = _general_csr(rng, 30)
    pattern = _csr(M)(M.data).pattern
    b = np.ones(30)
    make = jax.jit(lambda d: jax.numpy.stack([_klu_ffi.factor(pattern, d),
                                              _klu_ffi.factor(pattern, 2 * d)]))
    free = jax.jit(lambda h: _klu_ffi.free(h))
    solve = jax.jit(lambda h, d: _klu_ffi.solve(pattern, h, d, b, False, numeric=True))
    live = _batch_split.live_handles()
    for _ in range(3):
        h = np.asarray(make(M.data))
        assert h.all() and _batch_split.live_handles() == live + 2
        release = _klu_ffi.KERNELS.release_now
        assert release is not None and release.idempotent
        release(h)
        assert _batch_split.live_handles() == live
        release(h[::-1])  # (refused: released already)
        jax.block_until_ready(free(h))  # (the program's own free: refused too)
        assert _batch_split.live_handles() == live
        with pytest.raises(Exception, match="read after its release"):
            jax.block_until_ready(solve(h[0], M.data))
    # a new factor in a reused entry: the stale handle differs and frees nothing
    h2 = np.asarray(make(M.data))
    assert not set(h2.tolist()) & set(h.tolist())
    release(h)
    assert _batch_split.live_handles() == live + 2
    np.testing.assert_allclose(np.asarray(solve(h2[0], M.data)),
                               np.linalg.solve(M.toarray(), b), rtol=1e-10)
    release(h2)
    assert _batch_split.live_handles() == live


@pytest.mark.parametrize("where", ["matrix", "rhs"])
def test_nan_input_raises(rng, where):
    M = _general_csr(rng, 8)
    d, b = M.data.copy(), np.ones(8)
    if where == "matrix":
        d[3] = np.nan
    else:
        b[2] = np.inf
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"))
    with pytest.raises(NonFiniteError):
        f(d, b)
    with pytest.raises(NonFiniteError):
        sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))(d, b)


def test_klu_is_cpu_only(monkeypatch, rng):
    M = _general_csr(rng, 5)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(InvalidOptionError, match="'splu'"):
        sd.trace(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"), M.data,
                 np.ones(5))
    assert choose(matrix="sparse", tags=frozenset(), dtype=np.dtype(np.float64)).name != "klu"


def test_one_symbolic_analysis_per_pattern(rng):
    M = _general_csr(rng, 9)
    before = _klu_ffi.cached_patterns()
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="klu"))
    f(M.data, np.ones(9))
    f(2 * M.data, np.ones(9))
    sd.function(lambda d, b: 2 * sd.linalg.solve(_csr(M)(d), b, solver="klu"))(M.data,
                                                                              np.ones(9))
    assert _klu_ffi.cached_patterns() == before + 1


def test_one_compiled_function_called_from_several_threads(rng):
    """Each call makes and frees its own numeric factors: concurrent calls of
    one program share none."""
    from concurrent.futures import ThreadPoolExecutor

    M = _general_csr(rng, 40)
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=1))
    bs = rng.standard_normal((8, 40))
    D = M.toarray()
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda b: np.asarray(g(M.data, b)), list(bs) * 4))
    for b, out in zip(list(bs) * 4, outs):
        np.testing.assert_allclose(out, np.linalg.solve(D.T, 2 * np.linalg.solve(D, b)),
                                   rtol=1e-9)


def test_solves_inside_a_branch_and_a_loop(rng):
    """Factors made inside a branch's or a loop's body are freed by that
    body's own lowering run (each run its own finalizers), and the values and
    gradients stay right."""
    M = _general_csr(rng, 10)
    D = M.toarray()
    b = rng.standard_normal(10)

    def f(d, b, flag):
        A = _csr(M)(d)

        def twice(x):
            y = sd.linalg.solve(A, x, solver="klu")
            return sd.linalg.solve(A, y, solver="klu")

        x = sd.cond(flag > 0, twice, lambda x: 2.0 * x, b)
        x = sd.fori_loop(0, 3, lambda i, x: 0.5 * twice(x), x)
        return snp.sum(x ** 2)

    g = sd.function(sd.value_and_grad(f, argnums=1))
    Ai = np.linalg.inv(D)
    for flag in (1.0, -1.0):
        v, gb = g(M.data, b, flag)
        T = (Ai @ Ai) if flag > 0 else 2.0 * np.eye(10)
        T = np.linalg.matrix_power(0.5 * Ai @ Ai, 3) @ T
        np.testing.assert_allclose(float(v), np.sum((T @ b) ** 2), rtol=1e-9)
        np.testing.assert_allclose(np.asarray(gb), 2 * T.T @ (T @ b), rtol=1e-9)


def _threshold_pivoted(seed: int, n: int = 120):
    """A matrix whose diagonal is 1.5e-3 of each column's largest entry: KLU's
    threshold pivoting (a diagonal pivot kept down to 1e-3 of the column's
    largest) takes those pivots, and its solve is far from backward stable."""
    rng = np.random.default_rng(seed)
    A = sp.random(n, n, density=0.06, random_state=rng, format="csr") + sp.eye(n)
    A = sp.csr_matrix(A)
    A.data *= rng.choice([-1.0, 1.0], A.nnz)
    colmax = np.asarray(abs(A).max(axis=0).todense()).ravel()
    A = A.tolil()
    A.setdiag(1.5e-3 * colmax * rng.choice([-1.0, 1.0], n))
    return sp.csr_matrix(A), rng.standard_normal(n)


@pytest.mark.parametrize("transpose", [False, True])
def test_a_solve_that_threshold_pivoting_spoils_is_refined(transpose):
    """The unchecked solve (`throw=False`) has a backward error far above the
    bound; the checked one refines it in the program to SciPy's accuracy
    instead of calling a solvable system singular."""
    A, b = _threshold_pivoted(3)
    M = sd.sparse.from_scipy(A.T.tocsr() if transpose else A)
    op = A.T if transpose else A
    raw, _ = sd.linalg.solve(M, b, solver="klu", throw=False)
    raw = np.asarray(raw)
    eta = np.abs(op @ raw - b).max() / (abs(op).sum(axis=1).max() * np.abs(raw).max()
                                        + np.abs(b).max())
    assert eta > 10 * (10 * len(b) * np.finfo(float).eps)  # (10x the bound)
    x = np.asarray(sd.linalg.solve(M, b, solver="klu"))
    ref = sp.linalg.spsolve(op.tocsc(), b)
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-11 * np.abs(ref).max())


def test_a_spoiled_example_of_a_batch_is_refined_and_its_gradient_checked():
    """Under vmap, one example whose KLU solve needs refinement (the other's
    does not): the host refines that one, and values and the gradient through
    `to_jax` under `jax.jit` match dense solves."""
    A, b = _threshold_pivoted(3)
    A.sort_indices()
    good = A.copy()
    diag = A.indices == np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    good.data[diag] = 10.0 * abs(A).sum(axis=1).max()
    D = np.stack([A.data, good.data])

    def loss(d):
        x = sd.linalg.solve(sd.sparse.csr_matrix((d, A.indices, A.indptr), shape=A.shape),
                            b, solver="klu")
        return snp.sum(x * x)

    vals, grads = jax.jit(sd.to_jax(sd.vmap(sd.value_and_grad(loss))))(D)
    for d, v, g in zip(D, np.asarray(vals), np.asarray(grads)):
        M = sp.csr_matrix((d, A.indices, A.indptr), shape=A.shape).toarray()
        x = np.linalg.solve(M, b)
        lam = np.linalg.solve(M.T, 2 * x)
        np.testing.assert_allclose(v, x @ x, rtol=1e-9)
        rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
        np.testing.assert_allclose(g, -lam[rows] * x[A.indices], rtol=1e-7,
                                   atol=1e-9 * np.abs(g).max())


def test_second_order_through_a_vmapped_solve_matches_splu(rng):
    """A vmapped gradient whose forward map hands its KLU factors to the
    backward map (freed at the program's end), differentiated again both
    ways (reverse over reverse, forward over reverse): splu's results."""
    M = _general_csr(rng, 10)
    D = M.data[None, :] * (1 + 0.1 * rng.random((3, 1)))
    B = rng.standard_normal((3, 10))
    V = rng.standard_normal(D.shape)
    out = {}
    for solver in ("klu", "splu"):
        def loss(d, b, solver=solver):
            return snp.sum(sd.linalg.solve(_csr(M)(d), b, solver=solver) ** 2)

        def g(D, B, loss=loss):
            return sd.grad(lambda D: snp.sum(sd.vmap(loss)(D, B)))(D)

        rr = sd.function(sd.grad(lambda D, B: snp.sum(g(D, B) ** 2)))(D, B)
        fr = sd.function(lambda D, V, B: sd.jvp(lambda D: g(D, B), (D,), (V,))[1])(D, V, B)
        out[solver] = (np.asarray(rr), np.asarray(fr))
    for a, b in zip(out["klu"], out["splu"]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * np.abs(b).max())
