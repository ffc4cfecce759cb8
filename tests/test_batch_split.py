"""sciad's batch splitter (`sciad.solvers._batch_split`, `csrc/batch_split.cc`):
a batch's KLU kernel call split over threads gives the unsplit call's results
bit for bit (factor, solve, transposed solve, the one-call solve, the
product; real and complex; uneven slices); the public path splits and its
values and gradients match one thread's; a slice that fails frees the other
slices' factors; the thread policy and its cap; and a machine without a
compiler runs unsplit."""

from __future__ import annotations

import gc
import re
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
from helpers import rss_mib
import sciad.numpy as snp
from sciad.errors import NotSupportedError, SingularMatrixError
from sciad.solvers import _batch_split
from sciad.solvers.direct import _klu_ffi

pytestmark = [
    pytest.mark.skipif(not _klu_ffi.available(), reason="klujax is not installed"),
    pytest.mark.skipif(_batch_split.unavailable() is not None,
                       reason=f"the splitter is not built: {_batch_split.unavailable()}"),
]


def _matrices(rng, n, batch, dtype=np.float64):
    """`batch` matrices on one pattern (values `(batch, nnz)`) and the
    pattern, diagonally dominant."""
    M = sp.csr_array(sp.random(n, n, density=0.2, random_state=int(rng.integers(2**31)))
                     + 4.0 * sp.eye(n))
    M.sum_duplicates()
    M.sort_indices()
    vals = rng.uniform(0.5, 1.5, (batch, M.nnz)) * M.data
    if np.dtype(dtype).kind == "c":
        vals = vals * np.exp(1j * rng.uniform(-0.3, 0.3, vals.shape))
    pattern = sd.sparse.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape).pattern
    return pattern, vals.astype(dtype)


@pytest.fixture
def split_everything(monkeypatch):
    """Every batch of two or more split over (up to) 3 threads."""
    monkeypatch.setattr(_batch_split, "MIN_SLICE_NS", 0)
    monkeypatch.setattr(_batch_split, "usable_cores", lambda: 3)
    monkeypatch.delenv("SCIAD_HOST_THREADS", raising=False)


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("batch", [2, 5])
def test_split_kernels_match_the_unsplit_ones(rng, split_everything, monkeypatch, dtype,
                                               batch):
    """Factor + solve + transposed solve, the one-call solve and the product,
    split over 3 threads (uneven: 5 = 1 + 2 + 2; 2 < 3 threads), give the
    unsplit kernels' results exactly."""
    pattern, vals = _matrices(rng, 40, batch, dtype)
    b = rng.standard_normal((batch, 40, 2)).astype(dtype)

    def run(a, b):
        h = _klu_ffi.factor(pattern, a)
        x = _klu_ffi.solve(pattern, h, a, b, False, numeric=True)
        y = _klu_ffi.solve(pattern, h, a, b, True, numeric=True)
        tok = _klu_ffi.free(h, after=[x, y])
        z = _klu_ffi.solve(pattern, jnp.zeros((), jnp.uint64), a, b, False)
        return x, y, z, _klu_ffi.dot(pattern, a, x), tok

    split = jax.jit(jax.vmap(run))
    # (the product: split, or called unsplit; calls with handles always go
    # through the splitter, for its handle table)
    assert "@sciad_klu_dot_" not in _hlo(jax.vmap(run), vals, b)
    got = split(vals, b)
    monkeypatch.setenv("SCIAD_HOST_THREADS", "1")
    assert "@sciad_klu_dot_" in _hlo(jax.vmap(run), vals, b)
    want = jax.jit(jax.vmap(run))(vals, b)
    for g, w in zip(got[:4], want[:4]):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    A = [sp.csr_array((v, pattern.indices, pattern.indptr), shape=pattern.shape).toarray()
         for v in vals]
    np.testing.assert_allclose(np.asarray(got[0]), np.linalg.solve(np.stack(A), b),
                               rtol=1e-10, atol=1e-12)


def _poisson_loss(n):
    """A batch's loss through the public path: `sum(u^2)`, `A(k) u = b`,
    a 1-D variable-coefficient Laplacian on `n` unknowns."""
    def loss(k, b):
        c = snp.exp(k)
        main = snp.concatenate([c[:1], c[1:] + c[:-1], c[-1:]])[: n] + 0.5
        rows = np.r_[np.arange(n), np.arange(1, n), np.arange(n - 1)]
        cols = np.r_[np.arange(n), np.arange(n - 1), np.arange(1, n)]
        vals = snp.concatenate([main, -c[: n - 1], -c[: n - 1]])
        A = sd.sparse.coo_matrix((vals, (rows, cols)), shape=(n, n))
        return snp.sum(sd.linalg.solve(A, b, solver="klu") ** 2)
    return loss


def _split_threads(hlo: str) -> list[int]:
    """The thread counts of the splitter's calls in a program's text (the
    third entry of each call's trailing int64[5] argument)."""
    return [int(m.split(",")[2]) for m in
            re.findall(r"dense<\[([^\]]*)\]> : tensor<5xi64>", hlo)]


def test_the_public_path_splits_and_matches_one_thread(rng, split_everything, monkeypatch):
    """`sd.vmap` of a KLU solve, its value and gradient through `sd.function`
    and `sd.to_jax` under `jax.jit`: split (the program calls the splitter)
    and equal to the program traced with `SCIAD_HOST_THREADS=1`."""
    n, B = 60, 6
    K = 0.3 * rng.standard_normal((B, n))
    R = rng.standard_normal((B, n))
    loss = _poisson_loss(n)

    def total(K, R):
        return snp.sum(sd.vmap(loss)(K, R))

    value = sd.function(sd.vmap(loss))
    grad = sd.function(sd.grad(total))
    jitted = jax.jit(jax.grad(sd.to_jax(total)))
    assert max(_split_threads(jax.jit(sd.to_jax(sd.vmap(loss))).lower(K, R).as_text())) > 1
    got = value(K, R), grad(K, R), jitted(K, R)
    monkeypatch.setenv("SCIAD_HOST_THREADS", "1")
    assert max(_split_threads(jax.jit(sd.to_jax(sd.vmap(loss))).lower(K, R).as_text())) == 1
    want = (sd.function(sd.vmap(loss))(K, R), sd.function(sd.grad(total))(K, R),
            jax.jit(jax.grad(sd.to_jax(total)))(K, R))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_failed_slice_gives_zero_handles_and_the_others_are_released(split_everything):
    """One matrix of a batch singular (a zero pivot in the last slice): the
    factor call succeeds, the failed slice runs again item by item, so that
    only the singular matrix's handle is 0 and the others are live, for the
    program to judge. Through
    the public path the batch raises `SingularMatrixError` naming the user's
    line, and the failing check releases the other slices' factors: no
    handle stays live, and the process stays flat (a leak is 7.5 MB a call
    here, 300 MB over 40 calls; the first calls grow the threads' malloc
    arenas once, by about 65 MB)."""
    n, B = 40_000, 4
    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (n, n)))
    M.sort_indices()
    pattern = sd.sparse.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape).pattern
    vals = np.tile(M.data, (B, 1))
    vals[-1] = 0.0  # (the last slice's matrix: a zero pivot)
    live = _batch_split.live_handles()
    h = np.asarray(jax.jit(jax.vmap(lambda a: _klu_ffi.factor(pattern, a)))(vals))
    # (slices of 1, 1 and 2 matrices: the last slice failed, and its first
    # matrix, factored again alone, has its handle)
    assert (h[:3] != 0).all() and h[3] == 0
    assert _batch_split.live_handles() == live + 3
    _klu_ffi.KERNELS.release_now(h)
    assert _batch_split.live_handles() == live

    def loss(d):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        return snp.sum(sd.linalg.solve(A, np.ones(n), solver="klu") ** 2)

    run = sd.function(sd.vmap(sd.value_and_grad(loss)))

    def fails(m):
        for _ in range(m):
            with pytest.raises(SingularMatrixError, match="zero pivot") as e:
                jax.block_until_ready(run(vals))
            assert "test_batch_split.py" in str(e.value)  # (the user's line)
        gc.collect()
        return rss_mib()

    first = fails(10)
    assert fails(40) - first < 40
    vals[-1] = M.data  # (and the batch then factors again, and frees)
    jax.block_until_ready(run(vals))
    assert _batch_split.live_handles() == live


def test_the_thread_policy(monkeypatch):
    """One slice for one item or too little work; at most the usable cores
    and the batch; `SCIAD_HOST_THREADS` caps it, and a bad value says what
    to set."""
    monkeypatch.delenv("SCIAD_HOST_THREADS", raising=False)
    monkeypatch.setattr(_batch_split, "usable_cores", lambda: 4)
    ns = _batch_split.MIN_SLICE_NS
    assert _batch_split.threads_for(1, 100 * ns) == 1
    assert _batch_split.threads_for(64, ns / 100) == 1  # (64 items: < 1 slice's work)
    assert _batch_split.threads_for(64, ns / 16) == 4
    assert _batch_split.threads_for(64, ns / 32) == 2
    assert _batch_split.threads_for(3, 10 * ns) == 3
    assert _batch_split.threads_for(64, 10 * ns) == 4
    monkeypatch.setenv("SCIAD_HOST_THREADS", "2")
    assert _batch_split.threads_for(64, 10 * ns) == 2
    monkeypatch.setenv("SCIAD_HOST_THREADS", "1")
    assert _batch_split.threads_for(64, 10 * ns) == 1
    monkeypatch.setenv("SCIAD_HOST_THREADS", "many")
    with pytest.raises(NotSupportedError, match="SCIAD_HOST_THREADS='many'.*whole number"):
        _batch_split.threads_for(64, 10 * ns)


def test_without_a_compiler_calls_run_unsplit(tmp_path):
    """No C++ compiler and nothing cached: the splitter says why, and a
    batch of KLU solves runs (unsplit) with the same results."""
    script = textwrap.dedent("""
        import jax, numpy as np, scipy.sparse as sp
        jax.config.update("jax_enable_x64", True)
        import sciad as sd
        from sciad.solvers import _batch_split
        from sciad.solvers.direct import _klu_ffi
        _batch_split.MIN_SLICE_NS = 0
        M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (30, 30)))
        M.sort_indices()
        def solve(d, b):
            A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
            return sd.linalg.solve(A, b, solver="klu")
        D = np.stack([M.data, 2 * M.data])
        b = np.ones((2, 30))
        x = np.asarray(sd.function(sd.vmap(solve))(D, b))
        want = np.stack([np.linalg.solve(M.toarray(), b[0]),
                         np.linalg.solve(2 * M.toarray(), b[1])])
        assert np.allclose(x, want), x
        assert "sciad_batch_split" not in jax.jit(sd.to_jax(sd.vmap(solve))).lower(
            D, b).as_text()
        print("WHY", _batch_split.unavailable())
    """)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = dict(os.environ, SCIAD_CACHE_DIR=str(tmp_path / "cache"), CXX="",
               PATH=str(bindir))  # (no compiler on the PATH)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    why = out.stdout.split("WHY", 1)[1]
    assert "C++ compiler" in why and "none was found" in why
