"""Sparse direct solvers with factor reuse.

- `"splu"` (CPU): SciPy's SuperLU (`permc_spec="MMD_AT_PLUS_A"`) on the host,
  through `jax.pure_callback`. The factorization stays on the host; the
  compiled program holds a small handle to it, and every solve with it (plain
  or transposed) is a pair of triangular solves.
- `"spsolve"` (GPU, or anywhere): `jax.experimental.sparse.linalg.spsolve`
  (cuSOLVER on NVIDIA GPUs). It has no factor to keep, so the "factor" is the
  matrix itself and every solve factors again.

Handles: each `factor` call site (one per `linalg.factor` node in a compiled
program) owns one slot of the host store; running it replaces what the slot
held, so memory stays bounded by the number of factor nodes. The handle is
`(slot, generation)`; a solve with a handle whose factor has since been
replaced (the same compiled program running in two threads at once) raises
instead of using the wrong factor. Batched (vmapped) calls keep one factor
per batch element in the slot.

`factor(method, pattern, data)`, `solve(method, pattern, factor, b, transpose)`
and `ok(method, factor)` are what the primitives call.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ._host import callback

METHODS = ("splu", "spsolve")

_lock = threading.Lock()
_slots: dict[int, tuple[int, list]] = {}  # slot -> (generation, [factor per batch element])
_next_slot = itertools.count(1)
_next_gen = itertools.count(1)


class SpluFactor:
    """The run-time value of a SuperLU factorization: `generation` and `ok`
    (arrays), and the host `slot` holding the factor (static). A pytree, so
    it can cross `jax.jit` boundaries as a saved value."""

    __slots__ = ("generation", "ok", "slot")

    def __init__(self, generation, ok, slot: int):
        self.generation, self.ok, self.slot = generation, ok, slot


jax.tree_util.register_pytree_node(
    SpluFactor, lambda f: ((f.generation, f.ok), f.slot),
    lambda slot, kids: SpluFactor(kids[0], kids[1], slot))


class StaleFactorError(RuntimeError):
    """A solve with a factorization that was replaced before the solve ran."""


# SuperLU runs on one host thread of its own, and its factors are dropped
# there. XLA calls the callbacks from whichever worker thread runs them, and
# a SuperLU factor released on another thread than the one that made it was
# not given back (a pure-SciPy loop alternating two threads grew by one
# factor per call; a 16,384-unknown gradient loop in sciad grew to 690 MB);
# on one thread memory stays flat.
_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="sciad-superlu")


def _on_worker(fn, *args):
    return _worker.submit(fn, *args).result()


def _host_factor(slot: int, pattern, data: np.ndarray):
    return _on_worker(_host_factor_here, slot, pattern, data)


def _host_solve(slot: int, transpose: bool, core_ndim: int, gen, b):
    return _on_worker(_host_solve_here, slot, transpose, core_ndim, gen, b)


def _host_factor_here(slot: int, pattern, data: np.ndarray):
    """Factors each matrix of the batch `data (..., nnz)`; returns (generation, ok)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    with _lock:  # drop the slot's old factor first: one factor per slot at a time
        _slots.pop(slot, None)
    data = np.asarray(data)
    batch = data.shape[:-1]
    flat = data.reshape(-1, data.shape[-1])
    n = pattern.shape[0]
    factors, oks = [], []
    for d in flat:
        # A's CSR arrays read as CSC are A^T: factor that (no conversion) and
        # swap the solve's transpose flag.
        at = sp.csc_matrix((d, pattern.indices, pattern.indptr), shape=(n, n))
        try:
            lu = spl.splu(at, permc_spec="MMD_AT_PLUS_A")
            ok = True
        except RuntimeError:  # "Factor is exactly singular"
            lu, ok = None, False
        factors.append(lu)
        oks.append(ok)
    gen = next(_next_gen) % 2**31
    with _lock:
        _slots[slot] = (gen, factors)
    return (np.full(batch, gen, np.int32), np.asarray(oks, bool).reshape(batch))


def _host_solve_here(slot: int, transpose: bool, core_ndim: int, gen: np.ndarray,
                     b: np.ndarray):
    gen = np.asarray(gen)
    b = np.asarray(b)
    with _lock:
        held_gen, factors = _slots.get(slot, (None, []))
    if gen.size and np.any(gen != held_gen):
        raise StaleFactorError(
            "a sparse factorization was replaced before a solve with it ran: the same "
            "compiled function ran in two threads at once. Call it from one thread at a "
            "time, or use solver='spsolve'.")
    core = b.shape[b.ndim - core_ndim:]
    batch = np.broadcast_shapes(gen.shape, b.shape[:b.ndim - core_ndim])
    n_b = int(np.prod(batch, dtype=np.int64))
    flat_b = np.broadcast_to(b, batch + core).reshape((n_b,) + core)
    out = np.empty(flat_b.shape, b.dtype)
    trans = "N" if transpose else "T"  # the factor is of A^T
    for i in range(n_b):
        lu = factors[i] if len(factors) == n_b else factors[0]
        out[i] = np.nan if lu is None else lu.solve(np.asarray(flat_b[i]), trans=trans)
    return (out.reshape(batch + core),)


def factor(method: str, pattern, data):
    """The factor of the sparse matrix with `pattern` and values `data`."""
    if method == "spsolve":
        return (data,)
    assert method == "splu", method
    with _lock:
        slot = next(_next_slot)
    batch_shape = data.shape[:-1]
    out = (jax.ShapeDtypeStruct(batch_shape, jnp.int32),
           jax.ShapeDtypeStruct(batch_shape, jnp.bool_))
    gen, ok = callback(lambda d: _host_factor(slot, pattern, d), out, data)
    return SpluFactor(gen, ok, slot)


def ok(method: str, factor) -> jax.Array:
    """False where the factorization found the matrix singular."""
    if method == "spsolve":
        return jnp.asarray(True)
    return jnp.all(factor.ok)


def solve(method: str, pattern, factor, b, transpose: bool):
    """Solves `A x = b` (or `A^T x = b`) with a factor from `factor`."""
    if method == "spsolve":
        return _spsolve(pattern, factor[0], b, transpose)
    gen, slot = factor.generation, factor.slot
    core_ndim = b.ndim
    (x,) = callback(lambda g, bb: _host_solve(slot, transpose, core_ndim, g, bb),
                    (jax.ShapeDtypeStruct(b.shape, b.dtype),), gen, b)
    return x


def _spsolve(pattern, data, b, transpose: bool):
    from jax.experimental.sparse.linalg import spsolve

    if transpose:
        pattern_t, perm = pattern.transposed()
        pattern, data = pattern_t, data[perm]
    indices = jnp.asarray(pattern.indices, jnp.int32)
    indptr = jnp.asarray(pattern.indptr, jnp.int32)
    if b.ndim == 1:
        return spsolve(data, indices, indptr, b)
    # spsolve has no batching rule: one solve per column
    return jax.lax.map(lambda col: spsolve(data, indices, indptr, col), b.T).T
