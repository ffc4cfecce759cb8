"""The machinery of the sparse direct solvers (the records `_splu.py` and
`_spsolve.py`), with factor reuse.

- SuperLU (`"splu"`, CPU): SciPy's SuperLU (symmetric mode,
  `permc_spec="MMD_AT_PLUS_A"` in a pattern's first factorization, that
  column order kept for its later ones: `_factor_one`) on the host, through
  `host_call`. The factorization stays on the host; the
  compiled program holds a handle to it (an int32), and every solve with it
  (plain or transposed) is a pair of triangular solves.
- `spsolve` (`"spsolve"`, GPU, or anywhere):
  `jax.experimental.sparse.linalg.spsolve` (cuSOLVER on NVIDIA GPUs). It has
  no factor to keep, so the "factor" is the matrix itself and every solve
  factors again.

Factor handles are values. Each run of a factorization makes new handles
(one per batch element), so concurrent calls of one compiled program never
share a factor. A handle is released by the last solve that uses it: the
factorization is told how many solves of the program read it (`uses`, known
from the graph), and each solve counts one down; a handle whose solves are
not all in one program (`uses=None`: a factor saved for a backward pass that
runs later, or never, or twice) is kept until the store's bound pushes it
out. Every solve also receives the matrix's values, so a solve whose handle
was released or pushed out (a second backward pass, a program run twice by
XLA) factors again instead of failing: the store is a cache whose contents
never change a result.

`factor(...)`, `solve(...)` and `rcond_estimate(...)` are what the primitives
call. Checks are done in the same host calls: each takes a host-side
`report(**status)` from the caller, which turns a status into an error or a
warning (the solver only measures).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import itertools
import threading
from collections import OrderedDict
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from .._host import host_call
from .._measures import ratio
from .._threads import one_blas_thread, usable_cores

#: the most steps of iterative refinement a checked solve takes while its
#: backward error is above the bound and falls: one restores a backward
#: stable solve; more make a factor of a nearby matrix (the last Newton
#: iteration's Jacobian, reused for the adjoint at the root) as good as
#: the matrix's own (each step gains the factor's relative distance)
REFINE_STEPS = 4

#: factors kept at most whose uses are not counted (saved for a later
#: program); the oldest beyond it are dropped, except those just stored
MAX_KEPT = 8
#: factors kept whose uses are counted (a program that failed before its
#: last solve leaves its factors behind): the oldest are dropped while there
#: are more than this many AND they take more than `MAX_BYTES` (the batches
#: of small factors that several devices hold at once stay)
MAX_COUNTED = 32
#: the memory (factor entries and their indices) that counted factors may
#: take beyond their count bound
MAX_BYTES = 256 * 2**20


class _Factored:
    """What a handle stands for: the SuperLU factor of `A^T` (see
    `_factor_one`; None if `A` is not finite or exactly singular), the 1-
    and inf-norms of `A`, and its condition estimate once computed."""

    __slots__ = ("lu", "norm1", "norm_inf", "rcond", "worker", "nbytes")

    def __init__(self, pattern, data: np.ndarray, lu, worker: int):
        self.lu = lu
        self.nbytes = 0 if lu is None else int(lu.nnz) * (data.dtype.itemsize + 4)
        self.norm1, self.norm_inf = matrix_norms(pattern, data)
        self.rcond: float | None = None
        self.worker = worker  # the SuperLU thread that made `lu` (and releases it)

    @classmethod
    def make(cls, pattern, data: np.ndarray) -> "_Factored":
        """Factors `data` (on a SuperLU thread)."""
        return cls.make_many(pattern, [data])[0]

    @classmethod
    def make_many(cls, pattern, rows, factorize: Callable | None = None) -> list["_Factored"]:
        """Factors each of `rows` (the values of matrices on `pattern`), spread
        over the SuperLU threads: SuperLU releases the GIL, so a batch's
        factorizations (and those of devices calling at once) run in parallel.
        `factorize(pattern, d)`: another factorization than SuperLU's
        (`_factor_one`), an object with `solve(b, trans)` and `nnz` (None
        where it breaks down)."""
        jobs = []
        with one_blas_thread():  # (the threads here, not BLAS's, use the cores)
            for d in rows:
                w = next(_next_worker) % len(_workers)
                jobs.append((d, w, _workers[w].submit(factorize or _factor_one, pattern, d)
                             if np.isfinite(d).all() else None))
            return [cls(pattern, d, None if job is None else job.result(), w)
                    for d, w, job in jobs]

    def get_rcond(self, pattern, data: np.ndarray, lu) -> float:
        """The condition estimate, computed once; `lu` is this factor's
        SuperLU object as the caller holds it (see `_Store.get`)."""
        if self.rcond is None:
            self.rcond = _rcond_here(pattern, data, lu, self.norm1)
        return self.rcond


def _residual(pattern, data: np.ndarray, x: np.ndarray, b: np.ndarray,
              transpose: bool) -> np.ndarray:
    """`op(A) x - b` from the CSR arrays (A's arrays read as CSC are A^T), with
    SciPy's compiled kernels (which add `op(A) x` to their output, here
    `-b`) and none of its per-call checks: a time step's small solves are a
    few microseconds each."""
    n, m = pattern.shape
    if _sparsetools is None or x.ndim != 1 or data.dtype != x.dtype or b.dtype != x.dtype:
        a = _csr(pattern, data)
        return ((a.T @ x) if transpose else (a @ x)) - b
    y = np.negative(b)
    kernel = _sparsetools.csc_matvec if transpose else _sparsetools.csr_matvec
    kernel(*((m, n) if transpose else (n, m)), pattern.indptr, pattern.indices, data, x, y)
    return y


try:  # SciPy's compiled sparse kernels (private, but stable for years)
    from scipy.sparse import _sparsetools
except ImportError:  # pragma: no cover
    _sparsetools = None


class _Store:
    """Handle -> SuperLU factor (of `A^T`, see `_factor_one`), with how many
    solves may still use it (None: not counted). Oldest first, bounded by
    `MAX_KEPT`, `MAX_COUNTED` and `MAX_BYTES`; the factors of one `put`
    (a batch's, which its program is about to read) are never pushed out
    by that put."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries: OrderedDict[int, list] = OrderedDict()  # handle -> [_Factored, uses]
        self._ids = itertools.count(1)
        #: (pattern, digest of the values) -> (handle, _Factored): see `shared`
        self.by_values: OrderedDict[tuple, tuple] = OrderedDict()

    def new_handle(self) -> int:
        with self.lock:
            return next(self._ids) % (2**31 - 1) + 1

    def put(self, handles, made: list[_Factored], uses: int | None) -> None:
        """Stores `made[i]` under `handles[i]`."""
        dropped = []
        with self.lock:
            for h, f in zip(handles, made):
                old = self.entries.pop(int(h), None)
                if old is not None:
                    dropped.append(old[0])
                self.entries[int(h)] = [f, uses]
            new = {int(h) for h in handles}
            for counted, bound, limit in ((False, MAX_KEPT, -1), (True, MAX_COUNTED, MAX_BYTES)):
                kind = [h for h, e in self.entries.items() if (e[1] is not None) == counted]
                size = sum(self.entries[h][0].nbytes for h in kind)
                old = [h for h in kind if h not in new]
                while old and len(kind) > bound and size > limit:
                    h = old.pop(0)
                    kind.remove(h)
                    f = self.entries.pop(h)[0]
                    size -= f.nbytes
                    dropped.append(f)
        _drop_on_worker(dropped)

    def get(self, handle: int) -> tuple[_Factored, object] | None:
        """`(factored, its SuperLU object)`, read under the lock: an entry in
        the store is not yet released, so the caller holds a live factor
        even if another call pushes the entry out (and releases it) meanwhile."""
        with self.lock:
            entry = self.entries.get(handle)
            return None if entry is None else (entry[0], entry[0].lu)

    def get_or_make(self, pattern, handle: int, data: np.ndarray, uses: int | None):
        """`(factored, its SuperLU object, kept)`: `handle`'s factor as `get`
        gives it (kept True), or, where the store let it go, `data` (the
        values it factored) factored again and stored under `handle`, with
        `uses` (kept False), so a result never depends on the store."""
        got = self.get(handle)
        if got is not None:
            return got[0], got[1], True
        f = _Factored.make(pattern, data)
        self.put([handle], [f], uses)
        return f, f.lu, False

    def shared(self, pattern, data: np.ndarray) -> tuple[int, _Factored]:
        """`(handle, factored)` of the matrix with values `data`: the factor
        a previous call made of the same values, while the store holds it
        unchanged, else a new one (stored uncounted). Chord roots started
        with one matrix (the stages of an implicit time step) so share one
        factorization; a result never depends on whether they did, as the
        factor is of the same values."""
        key = (pattern, hashlib.blake2b(np.ascontiguousarray(data).tobytes(),
                                        digest_size=16).digest())
        with self.lock:
            handle, f = self.by_values.get(key, (0, None))
            entry = self.entries.get(handle)
            if entry is not None and entry[0] is f:
                self.by_values.move_to_end(key)
                return handle, f
        f = _Factored.make(pattern, data)
        handle = self.new_handle()
        self.put([handle], [f], None)
        with self.lock:
            self.by_values[key] = (handle, f)
            while len(self.by_values) > MAX_KEPT:
                self.by_values.popitem(last=False)
        return handle, f

    def release(self, handle: int) -> None:
        """Releases a Newton iteration's previous factor, unless it is a
        shared one (`shared`), which other roots (and their derivatives'
        solves) still read."""
        with self.lock:
            if any(h == handle for h, _ in self.by_values.values()):
                return
        self.discard(handle)

    def used(self, *handles: int) -> None:
        """One solve of each of `handles` ran: release those whose last use it was."""
        dropped = []
        with self.lock:
            for h in handles:
                entry = self.entries.get(h)
                if entry is not None and entry[1] is not None:
                    entry[1] -= 1
                    if entry[1] <= 0:
                        dropped.append(self.entries.pop(h)[0])
        _drop_on_worker(dropped)

    def replace(self, handle: int, f: _Factored) -> None:
        """`f` in place of `handle`'s factor (its count kept); stored anew
        (uncounted) if it was released meanwhile."""
        dropped = []
        with self.lock:
            entry = self.entries.get(int(handle))
            if entry is None:
                self.entries[int(handle)] = [f, None]
            else:
                dropped.append(entry[0])
                entry[0] = f
        _drop_on_worker(dropped)

    def discard(self, *handles: int) -> None:
        """Releases `handles` (those still held), whatever their counts."""
        dropped = []
        with self.lock:
            for h in handles:
                entry = self.entries.pop(int(h), None)
                if entry is not None:
                    dropped.append(entry[0])
        _drop_on_worker(dropped)

    def __len__(self) -> int:
        return len(self.entries)


_store = _Store()


def held() -> int:
    """How many factorizations the host store holds now (for tests and
    benchmarks: 0 between calls of programs whose factors are all used)."""
    return len(_store)


# SuperLU factorizations run on host threads of sciad's own, one executor of
# one thread each, and each factor is dropped on the thread that made it.
# (SciPy's SuperLU frees a factor's memory only on the Python thread state
# that allocated it, which it records per thread state; XLA runs callbacks
# on its own threads, each callback with a new thread state, so a factor
# made in a callback is never given back: 0.27 MB per factorization at 512
# unknowns when the ODE steps factored in their callbacks.)
# XLA calls the callbacks from whichever worker thread runs them, and a
# SuperLU factor released on another thread than the one that made it was
# not given back (a pure-SciPy loop alternating two threads grew by one
# factor per call); released where it was made, memory stays flat. Several
# threads (one per core, at most 8) let a batch's factorizations and those
# of several devices run at once (SuperLU releases the GIL: 1.8x on 2 cores
# for 8 factorizations of a 14,400-unknown Laplacian). Solves run on the
# calling thread (a hop to a worker costs ~40 us, more than a small solve).
_workers = [concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix=f"sciad-superlu-{i}")
            for i in range(max(1, min(usable_cores(), 8)))]
_next_worker = itertools.count()


def _drop_on_worker(factored: list[_Factored]) -> None:
    """Releases the SuperLU objects of `factored`, each on the thread that
    made it."""
    boxes: dict[int, list] = {}
    for f in factored:
        if f.lu is not None:
            boxes.setdefault(f.worker, []).append(f.lu)
        f.lu = None
    for w, box in boxes.items():
        _workers[w].submit(box.clear)  # the last references go on that worker


def _factor_one(pattern, d: np.ndarray):
    """SuperLU of `A^T` (A's CSR arrays read as CSC; no conversion): the solves
    swap their transpose flag. None if SuperLU finds `A` exactly singular.

    The column ordering (minimum degree on `A^T + A`, which depends on the
    pattern alone) is computed by the first factorization of a pattern and
    kept (`_orders`): later ones factor the columns in that order as given
    (`permc_spec="NATURAL"`), as an optimization loop, a time loop or a
    Newton iteration factors one pattern again and again. (The ordering is
    about a tenth of SuperLU's time on the flagship's 2-D matrices: 35 -> 32
    ms at 128^2, 220 -> 202 ms at 256^2; a first measurement on a loaded
    machine, with matrices built by `kron`, had shown a third to a half.)

    SuperLU runs in its symmetric mode (`SymmetricMode`: the elimination
    tree of `A^T + A`, the structure the ordering was made for; partial
    pivoting as before, a diagonal pivot preferred). Without it, the column
    elimination tree of `A^T A` with this ordering made SuperLU's supernodes
    pathological on unstructured meshes: a P1 Laplacian on 16,641 nodes
    factored in 19.8 s, against 0.11 s in symmetric mode, with the same
    751,590 factor entries (COLAMD: 0.11 s, 1,175,832 entries)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    n = pattern.shape[0]
    at = sp.csc_matrix((d, pattern.indices, pattern.indptr), shape=(n, n))
    order = _orders.get(pattern)
    try:
        if order is None:
            lu = spl.splu(at, permc_spec="MMD_AT_PLUS_A", options=_SYMMETRIC_MODE)
            _orders.put(pattern, np.argsort(lu.perm_c))
            return lu
        return _Ordered(spl.splu(at[:, order], permc_spec="NATURAL", options=_SYMMETRIC_MODE),
                        order)
    except RuntimeError:  # "Factor is exactly singular"
        return None


class _Ordered:
    """A SuperLU factor of `B = M[:, order]` standing for one of `M`: its
    solves with `M` (`M x = b`: `x[order] = B^-1 b`; `M^T x = b`:
    `x = B^-T b[order]`), for `_lu_solve` and `nnz` like SciPy's object."""

    __slots__ = ("lu", "order", "nnz")

    def __init__(self, lu, order: np.ndarray):
        self.lu, self.order, self.nnz = lu, order, lu.nnz

    def solve(self, b: np.ndarray, trans: str = "N") -> np.ndarray:
        if trans == "N":
            y = self.lu.solve(b)
            x = np.empty_like(y)
            x[self.order] = y
            return x
        return self.lu.solve(np.ascontiguousarray(b[self.order]), trans=trans)


class _Orders:
    """Pattern -> the column order of its SuperLU factors, for the
    `MAX_ORDERS` patterns factored last (O(n) memory each)."""

    def __init__(self):
        self._map: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, pattern):
        with self._lock:
            order = self._map.get(pattern)
            if order is not None:
                self._map.move_to_end(pattern)
            return order

    def put(self, pattern, order: np.ndarray) -> None:
        with self._lock:
            self._map[pattern] = order
            while len(self._map) > MAX_ORDERS:
                self._map.popitem(last=False)


_SYMMETRIC_MODE = dict(SymmetricMode=True)

#: the patterns whose SuperLU column order is kept (see `_factor_one`)
MAX_ORDERS = 64
_orders = _Orders()


def _rows(d: np.ndarray) -> np.ndarray:
    """The values of each matrix of a batch (leading axes), one row each
    (`reshape(-1, nnz)` cannot tell the rows of a pattern with no entries)."""
    return d.reshape((int(np.prod(d.shape[:-1], dtype=np.int64)), d.shape[-1]))


def _csr(pattern, d: np.ndarray):
    import scipy.sparse as sp

    return sp.csr_matrix((d, pattern.indices, pattern.indptr), shape=pattern.shape)


def _lu_solve(lu, b: np.ndarray, transpose: bool) -> np.ndarray:
    """`A x = b` (or `A^T x = b`) with `lu` the SuperLU of `A^T`."""
    return lu.solve(b, trans="N" if transpose else "T")


def matrix_norms(pattern, d: np.ndarray) -> tuple[float, float]:
    """`(||A||_1, ||A||_inf)` from the stored values."""
    a = np.abs(d)
    n, m = pattern.shape
    cols = np.bincount(pattern.indices, weights=a, minlength=m)
    rows = np.bincount(pattern.rows, weights=a, minlength=n)
    return float(cols.max(initial=0.0)), float(rows.max(initial=0.0))


def _rcond_here(pattern, d: np.ndarray, lu, anorm: float) -> float:
    """`1 / (||A||_1 ||A^-1||_1)`, the inverse norm estimated with
    `scipy.sparse.linalg.onenormest` (Higham and Tisseur's block method) on
    solves with the factor: a few pairs of triangular solves."""
    import scipy.sparse.linalg as spl

    if lu is None:
        return 0.0
    n = pattern.shape[0]
    if n == 0 or anorm == 0.0:
        return 0.0 if n else float("inf")

    def solve_h(v):  # A^H x = v
        return np.conj(_lu_solve(lu, np.conj(v), True))

    op = spl.LinearOperator((n, n), matvec=lambda v: _lu_solve(lu, v, False),
                            rmatvec=solve_h, dtype=d.dtype)
    if n <= 4:  # onenormest needs n > t; exact here
        inv = np.column_stack([_lu_solve(lu, e, False) for e in np.eye(n, dtype=d.dtype)])
        inv_norm = float(np.abs(inv).sum(axis=0).max())
    else:
        inv_norm = float(spl.onenormest(op))
    # (an inverse whose norm is NaN, solves that overflowed, is as singular
    # as it gets: 0, never the inf of a perfectly conditioned matrix)
    return 1.0 / (anorm * inv_norm) if inv_norm > 0 else 0.0


def factor(pattern, data, *, uses: int | None = None,
           assume: str | None = None, report: Callable | None = None,
           factorize: Callable | None = None):
    """The SuperLU factor of the sparse matrix with `pattern` and values `data`
    (leading batch axes allowed), as a tuple of arrays: `(handles,)`; with
    `factorize` (see `_Factored.make_many`), that factorization instead
    (CHOLMOD's, `sciad.solvers.direct._cholmod`). A factor the store let go before
    its last solve is made again by SuperLU (`_Store.get_or_make`): the
    same solution, at SuperLU's cost.

    On the host: `report(nonfinite=, asymmetry=, min_diagonal=, singular=)`
    (arrays over the batch; `asymmetry` is `max |A - A^T| / max |A|` when
    `assume` is "symmetric" or "spd", `min_diagonal` the smallest real
    diagonal entry when it is "spd") is called before the factor is kept; it
    may raise. `uses`: the number of solves that will read it (see the
    module docstring).
    """
    n_batch = data.ndim - 1

    def host(d):
        batch = d.shape[:-1]
        flat = _rows(d)
        k = flat.shape[0]
        nonfinite = ~np.isfinite(flat).all(axis=1)
        asym = np.zeros(k)
        dmin = np.full(k, np.inf)
        if assume in ("symmetric", "spd"):
            _, perm = pattern.transposed()
            scale = np.abs(flat).max(axis=1, initial=0.0)
            asym = np.abs(flat - flat[:, perm]).max(axis=1, initial=0.0) / np.where(
                scale > 0, scale, 1.0)
        if assume == "spd":
            pos = pattern.diagonal_positions()
            diag = np.where(pos >= 0, np.real(flat[:, np.maximum(pos, 0)]), 0.0)
            dmin = diag.min(axis=1, initial=np.inf)
        made = _Factored.make_many(pattern, flat, factorize)
        singular = np.array([f.lu is None and not bad for f, bad in zip(made, nonfinite)])
        handles = np.array([_store.new_handle() for _ in range(k)], np.int32)
        try:
            if report is not None:
                report(nonfinite=nonfinite.reshape(batch), asymmetry=asym.reshape(batch),
                       min_diagonal=dmin.reshape(batch), singular=singular.reshape(batch))
        except BaseException:
            _drop_on_worker(made)
            raise
        _store.put(handles, made, uses)
        return (handles.reshape(batch),)

    (h,) = host_call(host, (jax.ShapeDtypeStruct(data.shape[:n_batch], jnp.int32),), data)
    return (h,)


def solve(pattern, factor: tuple, data, b, transpose: bool, *,
          refine_above: float = np.inf, estimate: str = "never",
          report: Callable | None = None):
    """Solves `A x = b` (or `A^T x = b`) with a SuperLU factor from `factor`.

    On the host, with the checks of a direct solve: the
    residual `r = b - op(A) x` and the normwise backward error
    `||r||_inf / (||A||_inf ||x||_inf + ||b||_inf)` (per column, the
    largest); above `refine_above`, one step of iterative refinement
    (`x += op(A)^-1 r`) and the measures again. `estimate`: `"always"` or
    `"on_residual"` (only when the relative residual `||r|| / ||b||` exceeds
    `sqrt(eps)` or the backward error stays above `refine_above`) computes
    the condition estimate `rcond` with the factor. Then
    `report(nonfinite=, backward_error=, residual=, rcond=, refined=)` (for a
    batch, each measured example in turn with `example=(i, batch)`: see
    `_report_each`) may raise or warn. Returns `x`. With the
    defaults, the plain solve (for a caller that checks in the program).
    """
    (handles,) = factor
    dtype = np.dtype(b.dtype)
    eps = float(np.finfo(dtype).eps)

    def host(h, d, bb):
        if h.ndim == 0 and d.ndim == 1:  # one solve (the common case: no vmap)
            handle = int(h)
            x, status = _solve_checked(pattern, handle, d, bb, transpose, refine_above,
                                       estimate, eps)
            _store.used(handle)
            if report is not None and status is not None:
                with _discarding_on_raise(handle):
                    report(**status)
            return (x,)
        b_core = bb.ndim - h.ndim  # 1 or 2; leading axes are batch axes (vmap)
        batch = np.broadcast_shapes(h.shape, d.shape[:-1], bb.shape[:h.ndim])
        k = int(np.prod(batch, dtype=np.int64))
        core_shape = bb.shape[bb.ndim - b_core:]
        hs = np.broadcast_to(h, batch).reshape(k)
        ds = np.broadcast_to(d, batch + d.shape[-1:]).reshape((k, d.shape[-1]))
        bs = np.broadcast_to(bb, batch + core_shape).reshape((k,) + core_shape)
        out = np.empty(bs.shape, dtype)
        statuses = []
        for i in range(k):
            x, status = _solve_checked(pattern, int(hs[i]), ds[i], bs[i], transpose,
                                       refine_above, estimate, eps)
            out[i] = x
            if status is not None:
                statuses.append((i, status))
        _store.used(*np.unique(hs).tolist())
        if report is not None:
            with _discarding_on_raise(*np.unique(hs).tolist()):
                _report_each(report, statuses, batch)
        return (out.reshape(batch + core_shape),)

    (x,) = host_call(host, (jax.ShapeDtypeStruct(b.shape, b.dtype),), handles, data, b)
    return x


@contextlib.contextmanager
def _discarding_on_raise(*handles: int):
    """Discards `handles` from the store where the block raises: a failed
    check stops the program, so the solves still counted on them never run
    (measured: 1.3 MB kept per failed value-and-gradient call at n = 20,000,
    up to the store's byte bound). A solve that still reads one factors
    again (`_Store.get_or_make`), so discarding never changes a result."""
    try:
        yield
    except BaseException:
        _store.discard(*handles)
        raise


def release_now(handles) -> None:
    """Releases the factors `handles` (a NumPy array of any shape) from the
    host: a failed check's, whose raise stops the program before their last
    solves run. A handle released already (or 0) is skipped."""
    _store.discard(*(int(h) for h in np.asarray(handles).ravel() if h))


release_now.idempotent = True  # (see `sciad.graph.Holding`)


def _report_each(report: Callable, statuses: list, batch: tuple) -> None:
    """Judges each example of a batch that was measured (`(i, status)`) on its
    own, in order: `report(example=(i, batch), **status)` (see
    `sciad.primitives._checks.example_report`), so a failure names its example
    and no example's measure hides or mixes with another's (a batch's worst
    residual and worst condition number can come from two examples)."""
    for i, status in statuses:
        report(example=(i, batch), **status)


def measures(r: np.ndarray, x: np.ndarray, b: np.ndarray, anorm_inf: float):
    """`(backward_error, relative_residual)` of `x` for `op(A) x = b` with
    the residual `r` (columns of a 2-D `b` measured separately, the worst
    reported); NaN where a value is not finite."""
    if b.ndim == 1:  # time steps are many small solves: Python scalars here
        if not b.size:
            return 0.0, 0.0
        # (one buffer: three numpy calls instead of six, a few microseconds)
        both = np.concatenate((r, x, b))
        both = np.abs(both, out=both) if both.dtype.kind == "f" else np.abs(both)
        rn, xn, bn = both.reshape(3, b.size).max(axis=1).tolist()
        den = anorm_inf * xn + bn
        eta = rn / den if den > 0 else (np.inf if rn > 0 else rn * 0.0)
        rel = rn / bn if bn > 0 else (np.inf if rn > 0 else rn * 0.0)
        return eta, rel
    rn, xn, bn = (np.abs(v).max(axis=0, initial=0.0) for v in (r, x, b))
    with np.errstate(invalid="ignore", divide="ignore"):
        eta, rel = ratio(rn, anorm_inf * xn + bn), ratio(rn, bn)
    return float(np.max(eta, initial=0.0)), float(np.max(rel, initial=0.0))


def _solve_checked(pattern, handle: int, d: np.ndarray, b: np.ndarray, transpose: bool,
                   refine_above: float, estimate: str, eps: float):
    """One solve with the checks of a direct solve (see `solve`); returns
    `(x, status)`, the status None where there is nothing to report (the
    backward error within `refine_above` without refinement, no condition
    estimate below `eps`, all finite). The residual is measured with the
    values `d` the node reads, so a factor of another matrix would show as
    a large backward error."""
    # (released or pushed out: factored again, kept until `used`)
    f, lu, kept = _store.get_or_make(pattern, handle, d, 1)
    if lu is None:
        return _no_factor(b)
    x = _lu_solve(lu, b, transpose)
    if refine_above == np.inf and estimate == "never":  # (unchecked)
        return x, None

    x, eta, rel, refined = _refine(pattern, f, lu, d, b, x, transpose, refine_above)
    if not eta <= refine_above and eta == eta and kept:
        # a kept factor of another matrix (a Newton iteration's, reused at
        # the root) that refinement could not bring close: factor the
        # matrix itself, for this solve and the handle's later ones
        f = _Factored.make(pattern, d)
        _store.replace(handle, f)
        lu = f.lu
        if lu is None:
            return _no_factor(b)
        x = _lu_solve(lu, b, transpose)
        x, eta, rel, _ = _refine(pattern, f, lu, d, b, x, transpose, refine_above)
        refined = True
    rcond = np.nan
    if estimate == "always" or (estimate == "on_residual" and (
            not rel <= eps ** 0.5 or not eta <= refine_above)):
        rcond = f.get_rcond(pattern, d, lu)
    elif not refined and eta <= refine_above:
        return x, None  # the common case: nothing to report
    nonfinite = not rel == rel and not np.isfinite(b).all()
    return x, dict(nonfinite=nonfinite, backward_error=eta, residual=rel, rcond=rcond,
                   refined=refined)


def _no_factor(b: np.ndarray):
    """The result of a solve with no factor (the matrix is exactly singular,
    or not finite): NaN, and the status that says so."""
    return np.full(b.shape, np.nan, b.dtype), dict(
        nonfinite=not np.isfinite(b).all(), backward_error=np.nan, residual=np.nan,
        rcond=0.0, refined=False)


def _refine(pattern, f: _Factored, lu, d, b, x, transpose: bool, refine_above: float):
    """Steps of iterative refinement of `x` for `op(A) x = b` (A's values
    `d`, `lu` a factor of it or of a nearby matrix) while the backward error
    is above `refine_above` and falls: `(x, eta, rel, refined)`."""
    anorm = f.norm1 if transpose else f.norm_inf
    r = _residual(pattern, d, x, b, transpose)
    eta, rel = measures(r, x, b, anorm)
    refined = False
    for _ in range(REFINE_STEPS):  # (not for NaN: nothing to refine)
        if eta <= refine_above or eta != eta:
            break
        x_new = x - _lu_solve(lu, r, transpose)
        r_new = _residual(pattern, d, x_new, b, transpose)
        eta_new, rel_new = measures(r_new, x_new, b, anorm)
        refined = True
        if not eta_new < eta:  # no progress: keep the better one
            break
        x, r, eta, rel = x_new, r_new, eta_new, rel_new
    return x, eta, rel, refined


def repair(pattern, data, b, x, transpose: bool, *, refine_above: float, estimate: str,
           report: Callable, guard: Callable | None = None):
    """The failure path of a checked solve that a solver made in the program
    (klu, spsolve) and measured there: on the host, for each matrix of a
    batch whose measures are off (measured again here), a SuperLU factor
    made here for steps of iterative refinement of the program's `x` in
    double precision (while its backward error is above `refine_above` and
    falls) and, as `estimate` asks (see `solve`), the condition estimate;
    then `report(example=(i, batch), **status)` for each such matrix
    (`_report_each`), which may raise or warn.
    Returns `x`, refined where it needed it.

    The program calls it only where a measure is off (the common solve pays
    its measures alone, and compiles no refinement loop and no estimate).
    `guard(host, operands)`, where given, returns the host function and
    operands to call instead (`sciad.primitives._checks.releasing`: what to
    release before `report` raises)."""
    dtype = np.dtype(b.dtype)
    eps = float(np.finfo(dtype).eps)
    core = b.ndim  # (1 or 2; leading axes of the host's arrays: a batch)

    def host(d, bb, xx):
        batch = np.broadcast_shapes(d.shape[:-1], bb.shape[:bb.ndim - core],
                                    xx.shape[:xx.ndim - core])
        k = int(np.prod(batch, dtype=np.int64))
        shape = xx.shape[xx.ndim - core:]
        ds = np.broadcast_to(d, batch + d.shape[-1:]).reshape((k, d.shape[-1]))
        bs = np.broadcast_to(bb, batch + shape).reshape((k,) + shape)
        out = np.array(np.broadcast_to(xx, batch + shape).reshape((k,) + shape))
        statuses = []
        wide = np.complex128 if out.dtype.kind == "c" else np.float64  # (as KLU factors)
        for i in range(k):
            x, status = _repair_one(pattern, ds[i].astype(wide), bs[i].astype(wide),
                                    out[i].astype(wide), transpose, refine_above, estimate,
                                    eps)
            if status is not None:
                out[i] = x
                statuses.append((i, status))
        _report_each(report, statuses, batch)
        return (out.reshape(batch + shape),)

    fn, operands = (host, [data, b, x]) if guard is None else guard(host, [data, b, x])
    (out,) = host_call(fn, (jax.ShapeDtypeStruct(x.shape, x.dtype),), *operands, effect=True)
    return out


def _repair_one(pattern, d: np.ndarray, b: np.ndarray, x: np.ndarray, transpose: bool,
                refine_above: float, estimate: str, eps: float):
    """`(x, status)`: `x` refined with a SuperLU factor of the matrix made
    here, and the measures `report` reads (see `repair`); `(x, None)` where
    the measures of `x` pass (another example of the batch failed)."""
    norm1, norm_inf = matrix_norms(pattern, d)
    eta, rel = measures(_residual(pattern, d, x, b, transpose), x, b,
                        norm1 if transpose else norm_inf)
    nonfinite = not np.isfinite(b).all()
    if (estimate != "always" and eta <= refine_above and rel <= eps ** 0.5
            and not nonfinite):
        return x, None
    [f] = _Factored.make_many(pattern, [d])
    try:
        if f.lu is None:
            return _no_factor(b)
        x, eta, rel, refined = _refine(pattern, f, f.lu, d, b, x, transpose, refine_above)
        rcond = np.nan
        if estimate == "always" or not rel <= eps ** 0.5 or not eta <= refine_above:
            rcond = f.get_rcond(pattern, d, f.lu)
        return x, dict(nonfinite=nonfinite, backward_error=eta, residual=rel, rcond=rcond,
                       refined=refined)
    finally:
        _drop_on_worker([f])


def rcond_unfactored(pattern, data):
    """The 1-norm reciprocal condition estimate `1 / (||A||_1 ||A^-1||_1)` of
    the matrix with values `data` (leading batch axes allowed), with SuperLU
    factors made on the host for the estimate alone."""
    real = np.finfo(np.dtype(data.dtype)).dtype

    def host(d):
        batch = d.shape[:-1]
        flat = _rows(d)
        made = _Factored.make_many(pattern, flat)
        out = [f.get_rcond(pattern, row, f.lu) for f, row in zip(made, flat)]
        _drop_on_worker(made)
        return (np.asarray(out, real).reshape(batch),)

    (rc,) = host_call(host, (jax.ShapeDtypeStruct(data.shape[:-1], real),), data)
    return rc


def rcond_estimate(pattern, factor: tuple, data):
    """The 1-norm reciprocal condition estimate `1 / (||A||_1 ||A^-1||_1)` of
    the matrix with values `data` (leading batch axes allowed), from the
    SuperLU factor `factor` (made again where the store let it go)."""
    real = np.finfo(np.dtype(data.dtype)).dtype
    (handles,) = factor

    def host(h, d):
        batch = np.broadcast_shapes(h.shape, d.shape[:-1])
        k = int(np.prod(batch, dtype=np.int64))
        hs = np.broadcast_to(h, batch).reshape(k)
        ds = np.broadcast_to(d, batch + d.shape[-1:]).reshape((k, d.shape[-1]))
        out = np.empty(k, real)
        for i in range(k):
            got = _store.get(int(hs[i]))
            if got is None:  # released or pushed out: factored for the estimate alone
                f = _Factored.make(pattern, ds[i])
                out[i] = f.get_rcond(pattern, ds[i], f.lu)
                _drop_on_worker([f])
            else:
                out[i] = got[0].get_rcond(pattern, ds[i], got[1])
        _store.used(*np.unique(hs).tolist())
        return (out.reshape(batch),)

    (rc,) = host_call(host, (jax.ShapeDtypeStruct(
        jnp.broadcast_shapes(handles.shape, data.shape[:-1]), real),), handles, data)
    return rc


def spsolve(pattern, data, b, transpose: bool):
    """`A x = b` (`A^T x = b`) by `jax.experimental.sparse.linalg.spsolve`,
    which factors `A` each time."""
    if transpose:
        pattern_t, perm = pattern.transposed()
        pattern, data = pattern_t, data[perm]
    indices = jnp.asarray(pattern.indices, jnp.int32)
    indptr = jnp.asarray(pattern.indptr, jnp.int32)
    if b.ndim == 1:
        return _spsolve_each(data, indices, indptr, b)
    # spsolve has no batching rule: one solve per column
    return jax.lax.map(lambda col: _spsolve_each(data, indices, indptr, col), b.T).T


@custom_vmap
def _spsolve_each(data, indices, indptr, b):
    """JAX's `spsolve`, which has no batching rule, batched by a loop: under
    `jax.vmap` (`jax.jacrev` / `jax.jacfwd` of `sd.to_jax(f)`) one solve
    per example."""
    from jax.experimental.sparse.linalg import spsolve

    return spsolve(data, indices, indptr, b)


@_spsolve_each.def_vmap
def _spsolve_each_rule(axis_size, in_batched, *args):
    args = tuple(a if batched else jnp.broadcast_to(a, (axis_size,) + a.shape)
                 for a, batched in zip(args, in_batched))
    return jax.lax.map(lambda xs: _spsolve_each(*xs), args), True


def each_example(h: np.ndarray, d: np.ndarray, b: np.ndarray):
    """A batched host call's operands, one example at a time: handles `h`,
    matrix values `d` (last axis the entries) and vectors `b` (last axis the
    unknowns), their leading axes broadcast. Returns the batch shape and the
    examples `(handle as an int, values, vector)`."""
    batch = np.broadcast_shapes(h.shape, d.shape[:-1], b.shape[:-1])
    hs = np.broadcast_to(h, batch).reshape(-1)
    ds = np.broadcast_to(d, batch + d.shape[-1:]).reshape(-1, d.shape[-1])
    bs = np.broadcast_to(b, batch + b.shape[-1:]).reshape(-1, b.shape[-1])
    return batch, [(int(hi), di, bi) for hi, di, bi in zip(hs, ds, bs)]


def shared_handle(pattern, data):
    """The handle of the shared factor of the matrix with values `data`
    (`_Store.shared`): a chord root started with it (`jac0`) that converged
    without iterating gives its derivatives this factor."""
    def host(d):
        if d.ndim == 1:
            return (np.asarray(_store.shared(pattern, d)[0], np.int32),)
        flat = _rows(d)
        return (np.array([_store.shared(pattern, r)[0] for r in flat],
                         np.int32).reshape(d.shape[:-1]),)

    return host_call(host, (jax.ShapeDtypeStruct(data.shape[:-1], jnp.int32),), data)[0]


def newton_solve(pattern, handle, data, b, *, keep: bool, uses: int | None, fresh=None):
    """One Newton step's linear solve `A d = b` (A on `pattern` with values
    `data`), factoring `A` on the host: returns `(d, ok, handle)`.

    With `keep`, the factor is stored under a new handle (read later by
    `linalg.backsolve`: the adjoint at the root reuses the last Newton
    factorization, refined) and `handle`, the previous iteration's, is
    released; `uses` counts the solves that will read the last one (None:
    kept until the store's bound pushes it out). `ok` is False where `A` is
    exactly singular or the step is not finite. Leading batch axes (a `map`
    of root solves) are looped over, in one host call.

    `fresh` (a traced bool, the chord method): where False and `handle` is
    a factor, solve with it (`data` are then the values it factored: made
    again from them if the store let it go) instead of factoring `data`.
    With no handle yet, `data` are a chord's given first matrix (`jac0`):
    factored once for all the roots given the same values (`_Store.shared`)."""
    chord = fresh is not None

    def one(h, d, bb, fr):
        if not fr and h == 0 and chord:  # a chord's given first matrix
            h, f = _store.shared(pattern, d)
            if f.lu is None:
                return np.zeros_like(bb), False, h
            x = _lu_solve(f.lu, bb, False)
            return x, bool(np.isfinite(x).all()), h
        if not fr and h > 0:
            lu = _store.get_or_make(pattern, h, d, uses if uses != 0 else None)[1]
            if lu is None:  # exactly singular, or not finite
                return np.zeros_like(bb), False, h
            x = _lu_solve(lu, bb, False)
            return x, bool(np.isfinite(x).all()), h
        if h > 0:
            _store.release(int(h))
        made = _Factored.make(pattern, d)
        if made.lu is None:
            _drop_on_worker([made])
            return np.zeros_like(bb), False, 0
        x = _lu_solve(made.lu, bb, False)
        ok = bool(np.isfinite(x).all())
        if keep and (ok or chord):
            new = _store.new_handle()
            _store.put([new], [made], uses if uses != 0 else None)
            return x, ok, new
        _drop_on_worker([made])
        return x, ok, 0

    def host(h, d, bb, fr):
        if h.ndim == 0 and d.ndim == 1 and bb.ndim == 1 and fr.ndim == 0:
            x, ok, new = one(int(h), d, bb, bool(fr))
            return x, np.asarray(ok), np.asarray(new, np.int32)
        batch, examples = each_example(h, d, bb)
        frs = np.broadcast_to(fr, batch).reshape(-1)
        res = [one(*ex, bool(f)) for ex, f in zip(examples, frs)]
        return (np.stack([r[0] for r in res]).reshape(batch + bb.shape[-1:]),
                np.array([r[1] for r in res]).reshape(batch),
                np.array([r[2] for r in res], np.int32).reshape(batch))

    fresh = jnp.ones((), bool) if fresh is None else fresh
    return host_call(host, (jax.ShapeDtypeStruct(b.shape, b.dtype),
                            jax.ShapeDtypeStruct((), jnp.bool_),
                            jax.ShapeDtypeStruct((), jnp.int32)), handle, data, b, fresh)
