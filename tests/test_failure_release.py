"""Every factor a failing program made is released, on every exit.

A failed check stops the program before the releases at its end run (XLA
runs nothing downstream of a failed call), so the check releases what the
run made from the host. Walked here for the sparse direct solvers that hold
factors (KLU's compiled handles, SuperLU's host store, the cuDSS record's
host stand-in) through the paths a user takes: a forward solve, its value
and gradient, a batch (`sd.vmap`) of them with one failing example, and a
failure inside a loop's body (the factor hoisted out of the loop, made by
the enclosing program). Counted exactly (live handles, stored factors),
then measured as the process's memory over a few hundred failing calls
(`slow`).
"""

from __future__ import annotations

import contextlib
import gc

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import NonFiniteError
from helpers import tridiagonal, rss_mib
from sciad.solvers import _batch_split
from sciad.solvers.direct import _cudss, _klu_ffi, _sparse_direct
from sciad.solvers._host import release_host_heap

pytestmark = pytest.mark.skipif(not _klu_ffi.available(), reason="klujax is not installed")


def _program(case, solver, n):
    """`(compiled function, arguments)`: a program whose check fails (an inf
    in the right-hand side)."""
    M = tridiagonal(n)

    def A(d):  # (spd, as "cholmod" needs)
        return sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape,
                                    tags={"spd"} if solver == "cholmod" else ())

    def loss(d, b):
        return snp.sum(sd.linalg.solve(A(d), b, solver=solver) ** 2)

    def loop_loss(d, b):
        a = A(d)
        u = sd.fori_loop(0, 3, lambda i, u: sd.linalg.solve(a, u + b, solver=solver), b)
        return snp.sum(u ** 2)

    b = np.ones(n)
    b[n // 2] = np.inf
    if case == "forward":
        return sd.function(lambda d, b: sd.linalg.solve(A(d), b, solver=solver)), (M.data, b)
    if case == "gradient":
        return sd.function(sd.value_and_grad(loss, argnums=(0, 1))), (M.data, b)
    if case == "loop":
        return sd.function(sd.value_and_grad(loop_loss, argnums=(0, 1))), (M.data, b)
    assert case == "batch"
    B = np.ones((8, n))
    B[-1, n // 2] = np.inf  # (one example of eight fails)
    return (sd.function(sd.vmap(sd.value_and_grad(loss, argnums=(0, 1)))),
            (np.tile(M.data, (8, 1)), B))


class _Held:
    """What a solver holds now: live compiled handles, SuperLU's stored
    factors and, for the stand-in, its ledger."""

    def __init__(self, kernels=None):
        self.kernels = kernels

    def __call__(self):
        jax.effects_barrier()
        return (_batch_split.live_handles(), len(_sparse_direct._store.entries),
                self.kernels.live() if self.kernels is not None else 0)


@contextlib.contextmanager
def _solver(name):
    if name != "cudss":
        yield _Held()
        return
    k = _cudss.StandIn()
    with _cudss.use_kernels(k):
        yield _Held(k)


def _fail(g, args, times):
    for _ in range(times):
        with pytest.raises(NonFiniteError):
            jax.block_until_ready(g(*args))


@pytest.mark.parametrize("case", ["forward", "gradient", "batch", "loop"])
@pytest.mark.parametrize("solver", ["klu", "splu", "cudss"])
def test_a_failing_program_releases_every_factor_it_made(solver, case):
    with _solver(solver) as held:
        g, args = _program(case, solver, 300)
        _fail(g, args, 2)  # (compiled, and anything the first calls keep)
        before = held()
        _fail(g, args, 20)
        assert held() == before, (
            f"{solver}/{case}: (live handles, stored factors, stand-in ledger) went from "
            f"{before} to {held()} over 20 failed calls")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gradient", "batch", "loop"])
@pytest.mark.parametrize("solver", ["klu", "splu", "cudss", "cholmod"])
def test_300_failed_calls_keep_the_process_flat(solver, case):
    """300 failed calls at n = 20,000 (a factor is about 1.3-2.3 MB: a leak
    of one a call is 400 MB or more) grow the process by at most 10 MB
    after warm-up."""
    n = 20_000 if case != "batch" else 2_000
    with _solver(solver):
        g, args = _program(case, solver, n)
        _fail(g, args, 50)
        first = _retained_mib()
        _fail(g, args, 300)
        assert _retained_mib() - first <= 10


@pytest.mark.slow
def test_300_breakdowns_of_compiled_cholmod_keep_the_process_flat():
    """A matrix that is not positive definite, 300 times (value and gradient,
    n = 20,000): CHOLMOD's failed factorizations keep nothing."""
    from sciad.solvers.direct import _cholmod_ffi
    from sciad.solvers import lookup

    if not isinstance(lookup("cholmod"), _cholmod_ffi.CompiledCholmod):
        pytest.skip("sparsax is not installed")
    n, matrix, d = _indefinite(20_000)
    g = sd.function(sd.value_and_grad(lambda d: snp.sum(sd.linalg.solve(
        matrix(d), np.ones(n), solver="cholmod") ** 2)))
    _flat_over_breakdowns([g], d)


@pytest.mark.slow
def test_300_breakdowns_of_the_sparse_cholesky_keep_the_process_flat():
    """A matrix that is not positive definite, 300 times, through sciad's
    sparse Cholesky factor (n = 20,000; a log-determinant's value and
    gradient, and samples): the failed host factorizations keep nothing."""
    n, matrix, d = _indefinite(20_000)
    g = sd.function(sd.value_and_grad(lambda d: sd.linalg.slogdet(matrix(d))[1]))
    s = sd.function(lambda d: sd.linalg.precision_sample(matrix(d), np.ones((n, 4))))
    _flat_over_breakdowns([g, s], d)


def _indefinite(n):
    """`(n, matrix, d)`: an spd-tagged tridiagonal matrix of `n` with the
    values `d`, positive on the diagonal but not definite."""
    M = tridiagonal(n)
    d = M.data.copy()
    rows = np.repeat(np.arange(n), np.diff(M.indptr))
    d[(rows == M.indices) & (rows == n // 2)] = 1e-3  # (positive, not definite)
    return n, (lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape,
                                              tags={"spd"})), d


def _flat_over_breakdowns(programs, d):
    """Each program raises NotPositiveDefiniteError on `d` 50 times (warm-up),
    then 300 more, which grow the process by at most 10 MB."""
    from sciad.errors import NotPositiveDefiniteError

    def fail(times):
        for _ in range(times):
            for f in programs:
                with pytest.raises(NotPositiveDefiniteError):
                    jax.block_until_ready(f(d))

    fail(50)
    first = _retained_mib()
    fail(300)
    assert _retained_mib() - first <= 10


def _retained_mib() -> float:
    """The process's memory with the heap's free pages given back (glibc's
    `malloc_trim`): what is held, not what the allocator keeps cached."""
    gc.collect()
    release_host_heap()
    return rss_mib()


def test_a_raised_failure_is_not_raised_again_by_jax():
    """JAX keeps a token of each device's last program with host callbacks,
    for `jax.effects_barrier()`; a failed program's token held its error,
    which `effects_barrier` (and JAX's own at interpreter exit: "Exception
    ignored in atexit callback") raised again after sciad had raised it."""
    g, args = _program("gradient", "klu", 20_000)  # (its check: a host refinement's)
    with pytest.raises(NonFiniteError):
        jax.block_until_ready(g(*args))
    jax.effects_barrier()  # (raised the NonFiniteError again)
