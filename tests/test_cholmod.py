"""The sparse Cholesky records ("cholmod": compiled, `sciad.solvers.direct._cholmod_ffi`,
where sparsax is installed; on the host, `sciad.solvers.direct._cholmod`, with
cvxopt): results against SciPy, derivative rules, batching, `sd.to_jax` under
JAX's transforms, what "auto" picks, the factorizations and analyses made,
and the errors of a matrix that is not positive definite, not finite or not
what its tags claim. Each test runs with each record registered as
"cholmod"."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (
    DTypeError, InvalidOptionError, NonFiniteError, NotPositiveDefiniteError, StructureError,
)
from sciad.solvers.direct import _cholmod, _cholmod_ffi, _klu, _sparse_direct
from sciad.solvers import lookup, register, unregister
from sciad.solvers._linear import choose

from helpers import assert_vmap_of_sparse_solves


@pytest.fixture(params=["compiled", "host"], autouse=True)
def record(request):
    """The "cholmod" record under test, registered for the test's length."""
    made = (_cholmod_ffi.CompiledCholmod() if request.param == "compiled"
            else _cholmod.Cholmod())
    if not made.available():
        pytest.skip(f"{made.needs} is not installed")
    old = lookup("cholmod")
    unregister("cholmod")
    register(made)
    yield made
    unregister("cholmod")
    register(old)


def _unavailable(monkeypatch, record):
    """Makes `record`'s library look uninstalled."""
    module = _cholmod_ffi if isinstance(record, _cholmod_ffi.CompiledCholmod) else _cholmod
    monkeypatch.setattr(module, "available", lambda: False)


def _spd(rng, n):
    """A sparse spd matrix (sorted CSR) and, for its stored entries, the index
    of the lower-triangle parameter each one reads (`w[mirror]` is a
    symmetric matrix's values for any `w`)."""
    B = sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = sp.csr_array(B + B.T + n * sp.eye(n))
    M.sum_duplicates()
    M.sort_indices()
    rows = np.repeat(np.arange(n), np.diff(M.indptr))
    key = {(r, c): k for k, (r, c) in enumerate(zip(rows, M.indices))}
    mirror = np.array([key[(max(r, c), min(r, c))] for r, c in zip(rows, M.indices)])
    return M, mirror


def _csr(M, tags=("spd",)):
    return lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape, tags=tags)


def _loss(d, b, M):
    return snp.sum(sd.linalg.solve(_csr(M)(d), b, solver="cholmod") ** 2)


@pytest.mark.parametrize("nrhs", [None, 3])
def test_cholmod_matches_scipy(rng, nrhs):
    M, _ = _spd(rng, 30)
    b = rng.standard_normal(30 if nrhs is None else (30, nrhs))
    x = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cholmod"))(M.data, b)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(M.toarray(), b), rtol=1e-10,
                               atol=1e-12)


def test_float32_is_solved_in_double_and_cast_back(rng):
    M, _ = _spd(rng, 12)
    b = rng.standard_normal(12).astype(np.float32)
    x = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cholmod"))(
        M.data.astype(np.float32), b)
    assert x.dtype == np.float32
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(M.toarray(), b), rtol=1e-4)


def test_cholmod_rules(rng):
    M, mirror = _spd(rng, 8)
    w = M.data.copy()

    def f(w, b):  # (every perturbation of w keeps the matrix symmetric)
        x = sd.linalg.solve(_csr(M)(w[mirror]), b, solver="cholmod")
        return snp.sin(x) * x

    sd.testing.check_rules(f, w, rng.standard_normal(8), seed=int(rng.integers(2**31)))


def test_gradient_matches_the_hand_adjoint(rng):
    M, _ = _spd(rng, 20)
    b = rng.standard_normal(20)
    gd, gb = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))(M.data, b)
    D = M.toarray()
    x = np.linalg.solve(D, b)
    lam = np.linalg.solve(D, 2 * x)
    rows = np.repeat(np.arange(20), np.diff(M.indptr))
    np.testing.assert_allclose(np.asarray(gb), lam, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gd), -lam[rows] * x[M.indices], rtol=1e-9)


def test_to_jax_under_jit_grad_and_vmap(rng):
    M, _ = _spd(rng, 15)
    b = rng.standard_normal(15)
    f = sd.to_jax(lambda d, b: _loss(d, b, M))
    D = M.toarray()
    lam = np.linalg.solve(D, 2 * np.linalg.solve(D, b))
    for _ in range(2):  # (the second call reuses the pattern's analysis)
        gb = jax.jit(jax.grad(f, argnums=1))(M.data, b)
        np.testing.assert_allclose(np.asarray(gb), lam, rtol=1e-9)
    ds = np.stack([M.data, 2 * M.data])
    vals = jax.jit(jax.vmap(f))(ds, np.stack([b, -b]))
    want = [np.sum(np.linalg.solve(s * D, c) ** 2) for s, c in ((1, b), (2, -b))]
    np.testing.assert_allclose(np.asarray(vals), want, rtol=1e-10)


def test_sd_vmap_of_solves(rng):
    M, _ = _spd(rng, 10)
    assert_vmap_of_sparse_solves("cholmod", M, rng, tags={"spd"})


def test_value_and_gradient_factor_once(rng, record):
    if not isinstance(record, _cholmod_ffi.CompiledCholmod):
        pytest.skip("the compiled record's")
    import sparsax_cpp

    M, _ = _spd(rng, 16)
    b = rng.standard_normal(16)
    g = sd.function(sd.value_and_grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    jax.block_until_ready(g(M.data, b))
    before = sparsax_cpp.factorization_count()
    for s in (2.0, 3.0):
        jax.block_until_ready(g(s * M.data, b))
    assert sparsax_cpp.factorization_count() - before == 2  # (the adjoint solve reuses it)


def test_each_pattern_is_analyzed_once_and_no_factor_is_held(rng, monkeypatch, record):
    if not isinstance(record, _cholmod.Cholmod):
        pytest.skip("the host record's")
    import cvxopt.cholmod as chm

    M, _ = _spd(rng, 16)
    b = rng.standard_normal(16)
    calls = []
    symbolic = chm.symbolic
    monkeypatch.setattr(chm, "symbolic", lambda *a, **k: calls.append(1) or symbolic(*a, **k))
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    def drained():  # (a dropped factor is let go on its worker, in its queue)
        for worker in _sparse_direct._workers:
            worker.submit(lambda: None).result()

    for s in (1.0, 2.0, 3.0):
        jax.block_until_ready(g(s * M.data, b))
        drained()
    assert len(calls) == 1
    pattern = _csr(M)(M.data).pattern
    mine = [e for e in list(_sparse_direct._store.entries.values())
            if getattr(e[0].lu, "prepared", None) is _cholmod._prepared(pattern)]
    assert not mine  # (each factor released by its last solve)
    assert 1 <= _cholmod.spare_factors(pattern) <= _cholmod.SPARE_FACTORS


def test_auto_picks_cholmod_for_large_spd_matrices(monkeypatch, record):
    n = _klu.MAX_AUTO + 10
    pattern = sd.sparse.from_scipy(sp.diags([-1.0, 4.0, -1.0, 1.0], [-1, 0, 1, 5],
                                            shape=(n, n))).pattern

    def pick(tags, dtype=np.float64):
        return choose(matrix="sparse", tags=frozenset(tags), dtype=np.dtype(dtype),
                      pattern=pattern).name

    assert pick({"spd"}) == "cholmod"
    assert pick(set()) != "cholmod"
    # (KLU below OVER_KLU unknowns and on banded matrices: its batches hold their
    # factors and split over the cores)
    small = sd.sparse.from_scipy(sp.diags([-1.0, 4.0, -1.0, 1.0], [-1, 0, 1, 5],
                                          shape=(100, 100))).pattern
    tri = sd.sparse.from_scipy(sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(n, n))).pattern
    for p in (small, tri):
        assert choose(matrix="sparse", tags=frozenset({"spd"}), dtype=np.dtype(np.float64),
                      pattern=p).name == "klu"
    assert pick({"spd"}, np.complex128) != "cholmod"
    _unavailable(monkeypatch, record)
    assert pick({"spd"}) != "cholmod"


# ---------------------------------------------------------------------------
# errors


def test_an_indefinite_matrix_raises_through_every_path(rng):
    M, _ = _spd(rng, 10)
    d = M.data.copy()
    rows = np.repeat(np.arange(10), np.diff(M.indptr))
    d[(rows == M.indices) & (rows == 4)] = 1e-3  # (positive diagonal, not definite)
    D = sp.csr_array((d, M.indices, M.indptr), shape=M.shape).toarray()
    assert np.linalg.eigvalsh(D).min() < 0
    b = np.ones(10)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cholmod"))
    with pytest.raises(NotPositiveDefiniteError, match="splu") as info:
        f(d, b)
    assert "test_cholmod.py" in str(info.value)
    with pytest.raises(NotPositiveDefiniteError):
        sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))(d, b)
    with pytest.raises(NotPositiveDefiniteError), sd.errors.unwrapped():
        jax.block_until_ready(jax.jit(jax.grad(sd.to_jax(lambda d: _loss(d, b, M))))(d))
    # still usable afterwards, and splu solves the same matrix as told
    np.testing.assert_allclose(np.asarray(f(M.data, b)), np.linalg.solve(M.toarray(), b),
                               rtol=1e-10)
    x = sd.function(lambda d, b: sd.linalg.solve(_csr(M, ())(d), b, solver="splu"))(d, b)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(D, b), rtol=1e-8)


def test_bad_values_and_claims_raise(rng):
    M, _ = _spd(rng, 8)
    b = np.ones(8)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cholmod"))
    d = M.data.copy()
    d[3] = np.nan
    with pytest.raises(NonFiniteError):
        f(d, b)
    asym = M.data.copy()
    asym[np.flatnonzero(np.repeat(np.arange(8), np.diff(M.indptr)) != M.indices)[0]] += 1.0
    with pytest.raises(StructureError, match="symmetric"):
        f(asym, b)
    with pytest.raises(NonFiniteError):
        f(M.data, np.full(8, np.inf))


def test_refusals(rng, monkeypatch, record):
    M, _ = _spd(rng, 6)
    b = np.ones(6)
    with pytest.raises(StructureError, match="spd"):
        sd.function(lambda d: sd.linalg.solve(_csr(M, ())(d), b, solver="cholmod"))(M.data)
    # assume= stands for the tag
    x = sd.function(lambda d: sd.linalg.solve(_csr(M, ())(d), b, solver="cholmod",
                                              assume="spd"))(M.data)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(M.toarray(), b), rtol=1e-10)
    with pytest.raises(DTypeError, match="real"):
        sd.function(lambda d: sd.linalg.solve(_csr(M)(d), b.astype(complex), solver="cholmod"))(
            M.data.astype(complex))
    _unavailable(monkeypatch, record)
    with pytest.raises(InvalidOptionError, match="needs .*(cvxopt|sparsax)"):
        sd.function(lambda d: sd.linalg.solve(_csr(M)(d), b, solver="cholmod"))(M.data)


def test_a_batch_judges_its_failed_matrix_alone(rng, record):
    M, _ = _spd(rng, 10)
    rows = np.repeat(np.arange(10), np.diff(M.indptr))
    bad = M.data.copy()
    bad[(rows == M.indices) & (rows == 4)] = 1e-3  # (not positive definite)
    ds = np.stack([M.data, bad, 2 * M.data, 3 * M.data])
    b = np.ones(10)
    f = sd.function(sd.vmap(lambda d: sd.linalg.solve(_csr(M)(d), b, solver="cholmod")))
    with pytest.raises(NotPositiveDefiniteError, match="splu") as info:
        f(ds)
    assert "test_cholmod.py" in str(info.value)
    xs = f(ds[[0, 2, 3]])
    for x, s in zip(np.asarray(xs), (1, 2, 3)):
        np.testing.assert_allclose(x, np.linalg.solve(s * M.toarray(), b), rtol=1e-10)
    if isinstance(record, _cholmod_ffi.CompiledCholmod):
        from sciad.solvers import _batch_split

        if not _batch_split.handles_available():
            pytest.skip("no compiler: a failed kernel stops the program instead")
        # (the kernel's batch, unchecked: the failed matrix's solution alone is NaN,
        # the batch splitter running a failed slice again item by item)
        pattern = _csr(M)(M.data).pattern
        x = np.asarray(jax.jit(jax.vmap(lambda d: _cholmod_ffi.solve(pattern, d, b)))(ds))
        assert np.isnan(x[1]).all() and np.isfinite(x[[0, 2, 3]]).all()
        np.testing.assert_allclose(x[2], np.linalg.solve(2 * M.toarray(), b), rtol=1e-10)
