"""`"amg"`: a smoothed-aggregation algebraic multigrid preconditioner (pyamg's
aggregation, a V-cycle in the program) for sparse matrices.

XLA needs static shapes, but a smoothed-aggregation hierarchy's shapes depend
on the values (strength of connection drops weak entries). So the hierarchy
is split in two:

- per PATTERN, at trace time (cached): the aggregates of every level, from
  the pattern alone (every off-diagonal entry is a strong connection, which
  is pyamg's own default, `symmetric` strength with theta = 0, up to exact
  zeros): `pyamg.aggregation.standard_aggregation` of the symmetrized
  pattern, nodes it leaves out made aggregates of their own. The tentative
  prolongator `T` (constant candidate: `1/sqrt(|aggregate|)`) has no
  values to learn; `P = (I - w D^-1 A) T` lies on `pattern(A) pattern(T)`
  and `A_c = P^T A P` on `pattern(P)^T pattern(A) pattern(P)`: these
  SUPERSET patterns are products of 0/1 matrices (positive, so nothing
  cancels), computed once. Levels are made until at most `MAX_COARSE`
  unknowns remain (at most `MAX_LEVELS` levels).
- per VALUES, on the host (one `host_call`, cached by a digest of the
  values, so the adjoint solve's setup with the same values is a lookup):
  the damped-Jacobi weights `w = 4 / (3 rho(D^-1 A))` (pyamg's
  `approximate_spectral_radius`, from a fixed start vector), `P` and `A_c`
  by SciPy products, scattered onto the superset patterns (SciPy drops
  exact zeros: entries are found by their `(row, col)` keys, missing ones
  are 0), and the coarsest level's dense inverse.

With a near-null space (`AMG(near_null_space=B, block_size=b)`: the
candidates `B`, `(n, k)`, that the matrix nearly annihilates, the rigid-body
modes of elasticity, `rigid_body_modes`), the finest level aggregates
NODES, the `b` consecutive unknowns of each (a node's unknowns are in
one aggregate), on the node graph of the pattern, and `T` fits `B`: per
aggregate, the orthonormal basis of its rows of `B` by modified
Gram-Schmidt (a candidate that the earlier ones span there gets a zero
column, as pyamg's `fit_candidates`), `k` coarse unknowns per aggregate;
the coarse level's candidates are the coefficients (`B = T B_c`) and its
nodes its aggregates (block `k`). `T` is then value-independent still (it
depends on the pattern and `B`, both known at trace time), so the same
split holds. On 3-D elasticity this is what makes the cycle converge in
tens of steps rather than hundreds (a scalar constant candidate cannot
represent rotations).

pyamg is imported by the two functions that call it (`_aggregate`, at
trace time, and `_build_one`, on the host), on first use: it adds about
0.1 s to `import sciad`, which a program without AMG does not pay.

In the program the V-cycle runs on the level matrices as (pattern, values)
with gather + segment_sum products: one damped Jacobi sweep before and one
after the coarse correction (`R = P^T`), so the cycle is symmetric, and
positive definite for an spd `A`, which CG needs. The transposed solve
uses the same hierarchy with every level operator transposed (the
hierarchy of `A^T` with the same `P`): the exact transpose of the cycle.

Memory is O(nnz): the level patterns and values (`hierarchy_size`), at
most `MAX_CACHED` value sets within `MAX_CACHED_BYTES` (the newest always)
in sciad's analysis cache (`sciad._cache`, whose byte budget may drop them
sooner), and a dense coarsest level of at most `MAX_COARSE`
unknowns. In the program, each level's index arrays are int32 constants,
one per array (`_indices`), the finest level's shared with the solve's
products and checks.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from ... import _cache
from ...errors import InvalidOptionError, NotSupportedError, ShapeError
from .._host import host_call, release_host_heap
from .._indices import CsrPattern, pattern_matmul
from ._iterative import AbstractPreconditioner, missing_diagonal
from .._threads import one_blas_thread

#: the coarsest level is solved by a dense inverse once it has at most this
#: many unknowns (pyamg's default is 10; a dense product of a few hundred
#: is cheaper than more levels of gathers)
MAX_COARSE = 256
#: the most levels (the coarsest included)
MAX_LEVELS = 12
#: a pattern that cannot be coarsened below this (a diagonal matrix) is
#: refused rather than inverted densely
MAX_DENSE = 4096
#: hierarchies (value sets) kept on the host
MAX_CACHED = 4
#: ... and the bytes they may take together: older entries go before a new
#: hierarchy is built where it would not fit beside them (the newest is
#: kept whatever its size: the adjoint solve of a gradient looks up the
#: forward solve's, and one entry is what that needs; at 10^6 unknowns one
#: hierarchy is ~70 MB)
MAX_CACHED_BYTES = 64 * 2 ** 20
#: patterns whose aggregation is kept
MAX_PATTERNS = 8
@dataclass(frozen=True, eq=False)
class _Level:
    """One smoothed level: its matrix's pattern (CSR `indptr`, `cols`), its
    prolongator `P` (n x nc) on a superset pattern, and the tentative
    prolongator `T` (one entry per aggregated row). Index arrays are int32
    where they fit (what SciPy converts to anyway); the rows of each entry,
    for the program, are made with its patterns (`_level_patterns`)."""

    n: int
    indptr: np.ndarray
    cols: np.ndarray
    diag: np.ndarray
    p_indptr: np.ndarray
    p_cols: np.ndarray
    nc: int
    t: object  # scipy csr (n x nc)


@dataclass(frozen=True, eq=False)
class Structure:
    """The value-independent part of a hierarchy: the smoothed levels and the
    size of the coarsest (solved densely)."""

    levels: tuple
    coarse: tuple  # (n, indptr, cols) of the coarsest level's pattern

    @property
    def n_coarse(self) -> int:
        return self.coarse[0]

    def layout(self, dtype) -> tuple:
        """`((shape, dtype), ...)` of the arrays the host setup returns: each
        level's Jacobi weights `w / diag` and `P`'s values, the values of
        levels 1.., and the coarsest level's dense inverse."""
        out = [((lv.n,), dtype) for lv in self.levels]
        out += [((lv.p_cols.size,), dtype) for lv in self.levels]
        out += [((lv.cols.size,), dtype) for lv in self.levels[1:]]
        nc = self.n_coarse
        return tuple(out) + (((nc, nc), dtype),)

    def nnz(self) -> list[tuple[int, int, int]]:
        """`(n, nnz(A_l), nnz(P_l))` per level (the coarsest: `n^2` dense, no P)."""
        out = [(lv.n, lv.cols.size, lv.p_cols.size) for lv in self.levels]
        return out + [(self.n_coarse, self.n_coarse ** 2, 0)]

    def apply_flops(self) -> float:
        """FLOPs of one V-cycle: per smoothed level, two products with `A_l`
        (the residuals after the pre-smoothing from zero and before the
        post-smoothing), one with `P` and one with `P^T`, and the vector
        updates; the coarsest, a dense product."""
        f = 0.0
        for lv in self.levels:
            f += 2.0 * (2 * lv.cols.size + 2 * lv.p_cols.size) + 6.0 * lv.n
        return f + 2.0 * self.n_coarse ** 2

    def nbytes(self, itemsize: int) -> int:
        """Bytes of the hierarchy in the program: values and int32 indices of
        every level, the weights, the dense coarsest level."""
        b = 0
        for lv in self.levels:
            b += (lv.cols.size + lv.p_cols.size) * (itemsize + 8) + lv.n * itemsize
        return b + self.n_coarse ** 2 * itemsize


def _csr_ones(n, m, indptr, cols):
    return sp.csr_matrix((np.ones(len(cols)), cols, indptr), shape=(n, m))


def _aggregates(a) -> tuple[np.ndarray, int]:
    """`(agg, count)`: the aggregate of each row of the 0/1 matrix `a` (its
    symmetrized off-diagonal pattern aggregated by pyamg's
    `standard_aggregation`; a row with no neighbours its own aggregate)."""
    from pyamg.aggregation import standard_aggregation  # (on first use: see the docstring)

    n = a.shape[0]
    c = (a + a.T).tocsr()
    c.setdiag(0)
    c.eliminate_zeros()
    c.data[:] = 1.0
    agg_op, _ = standard_aggregation(c)
    agg_op = sp.csr_matrix(agg_op)
    agg = np.full(n, -1, np.int64)
    agg[np.repeat(np.arange(n), np.diff(agg_op.indptr))] = agg_op.indices
    lone = np.nonzero(agg < 0)[0]  # not aggregated (no neighbours): their own aggregate
    nc = agg_op.shape[1]
    agg[lone] = nc + np.arange(lone.size)
    return agg, nc + lone.size


def _aggregate(a):
    """`(T, nc)`: the tentative prolongator of the 0/1 matrix `a`'s pattern."""
    n = a.shape[0]
    agg, nc = _aggregates(a)
    size = np.bincount(agg, minlength=nc).astype(np.float64)
    t = sp.csr_matrix((1.0 / np.sqrt(size[agg]), agg, np.arange(n + 1)), shape=(n, nc))
    return t, nc


def _aggregate_nodes(a, block: int, candidates: np.ndarray):
    """`(T, nc, coarse candidates)`: the tentative prolongator of the 0/1
    matrix `a`'s pattern fitted to `candidates` (`(n, k)`), aggregating
    nodes of `block` consecutive unknowns (see the module docstring)."""
    n, k = candidates.shape
    nodes = n // block
    s = sp.csr_matrix((np.ones(n), np.arange(n) // block, np.arange(n + 1)), shape=(n, nodes))
    agg, n_agg = _aggregates((s.T @ a @ s).tocsr())
    of = agg[np.arange(n) // block]                      # each unknown's aggregate
    order = np.argsort(of, kind="stable")
    counts = np.bincount(of, minlength=n_agg)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.empty(n, np.int64)
    slot[order] = np.arange(n) - start[of[order]]       # the unknown's row in its aggregate
    width = max(int(counts.max()), 1)
    rows = np.zeros((n_agg, width, k))
    rows[of, slot] = candidates
    # modified Gram-Schmidt, all aggregates at once; a candidate that the
    # earlier ones span (within 1e-10 of its norm there) gets a zero column
    q = np.zeros_like(rows)
    r = np.zeros((n_agg, k, k))
    for j in range(k):
        v = rows[:, :, j].copy()
        for i in range(j):
            c = np.einsum("ar,ar->a", q[:, :, i], v)
            r[:, i, j] = c
            v -= c[:, None] * q[:, :, i]
        norm = np.linalg.norm(v, axis=1)
        ok = norm > 1e-10 * np.maximum(np.linalg.norm(rows[:, :, j], axis=1), 1e-300)
        q[ok, :, j] = v[ok] / norm[ok, None]
        r[ok, j, j] = norm[ok]
    t_cols = (of[:, None] * k + np.arange(k)).ravel()
    t = sp.csr_matrix((q[of, slot].ravel(), t_cols, np.arange(0, n * k + 1, k)),
                      shape=(n, n_agg * k))
    return t, n_agg * k, r.reshape(n_agg * k, k)  # (B = T B_c: B_c's rows per aggregate are R's)


def _pattern_of(m):
    """`(indptr, cols)` of a canonical CSR product of positive matrices."""
    m = m.tocsr()
    m.sum_duplicates()
    m.sort_indices()
    return _compact(m.indptr), _compact(m.indices)


def _compact(a) -> np.ndarray:
    """The index array `a` as int32 where its values allow (else int64)."""
    a = np.asarray(a)
    small = a.size == 0 or a.max() < np.iinfo(np.int32).max
    return a.astype(np.int32 if small else np.int64, copy=False)


def _rows_of(indptr):
    return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))


def _diag_positions(indptr, cols):
    rows = _rows_of(indptr)
    pos = np.full(indptr.size - 1, -1, np.int64)
    on = np.nonzero(rows == cols)[0]
    pos[rows[on]] = on
    return _compact(pos)


def build_structure(shape, indptr, indices, max_coarse: int = MAX_COARSE,
                    max_levels: int = MAX_LEVELS, candidates: np.ndarray | None = None,
                    block_size: int = 1) -> Structure:
    """The aggregation of the pattern `(shape, indptr, indices)` (see the
    module docstring); with `candidates` (a near-null space, `(n, k)`), of
    nodes of `block_size` unknowns, `T` fitted to them."""
    n = int(shape[0])
    indptr, cols = _compact(indptr), _compact(indices)
    levels = []
    while n > max_coarse and len(levels) + 1 < max_levels:
        a = _csr_ones(n, n, indptr, cols)
        if candidates is None:
            t, nc = _aggregate(a)
        else:
            t, nc, coarse_candidates = _aggregate_nodes(a, block_size, candidates)
        if nc >= n:  # nothing to coarsen (no off-diagonal entries)
            break
        if candidates is not None:  # (the coarse level's nodes: its aggregates)
            candidates, block_size = coarse_candidates, candidates.shape[1]
        tp = t.copy()
        tp.data[:] = 1.0
        p_indptr, p_cols = _pattern_of(a @ tp + tp)
        p = _csr_ones(n, nc, p_indptr, p_cols)
        c_indptr, c_cols = _pattern_of(p.T @ (a @ p))
        levels.append(_Level(n, indptr, cols, _diag_positions(indptr, cols), p_indptr, p_cols,
                             nc, t))
        del a, tp, p
        n, indptr, cols = nc, c_indptr, c_cols
    return Structure(tuple(levels), (n, indptr, cols))


def structure(pattern, candidates: np.ndarray | None = None, block_size: int = 1,
              key=None) -> Structure:
    """`build_structure` of a sciad `Pattern` (with `candidates`, a near-null
    space of nodes of `block_size` unknowns, identified by `key`), kept in
    sciad's analysis cache per pattern and candidates (and the current
    `MAX_COARSE`, `MAX_LEVELS`; at most `MAX_PATTERNS` of them)."""
    return _cache.cached(
        _cache.GLOBAL, "amg structure", (pattern, MAX_COARSE, MAX_LEVELS, key),
        lambda: build_structure(pattern.shape, pattern.indptr, pattern.indices, MAX_COARSE,
                                MAX_LEVELS, candidates, block_size), limit=MAX_PATTERNS)


# ---------------------------------------------------------------------------
# the host setup, per values


_setups = 0
_setups_lock = threading.Lock()


def setup_count() -> int:
    """How many hierarchies the host has built (not found in its cache) since
    the process started: for tests and benchmarks."""
    return _setups


#: entries matched at a time by `_scatter` (its int64 keys are held for one
#: block of rows of about this many entries, not for the whole matrix)
SCATTER_BLOCK = 2 ** 18


def _scatter(m, n_cols: int, indptr, cols) -> np.ndarray:
    """The values of the CSR matrix `m` on the superset pattern `(indptr,
    cols)` (0 where `m` has no entry). Rows are matched a block at a time,
    by keys `row * n_cols + col` within the block."""
    m = m.tocsr()
    m.sum_duplicates()
    out = np.zeros(cols.size)
    n, m_ptr = m.shape[0], m.indptr
    r0 = 0
    while r0 < n:
        # the rows whose entries (of m) fit in one block, at least one row
        r1 = int(np.searchsorted(m_ptr, m_ptr[r0] + SCATTER_BLOCK, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        a0, a1, s0, s1 = int(m_ptr[r0]), int(m_ptr[r1]), int(indptr[r0]), int(indptr[r1])
        keys = np.repeat(np.arange(r1 - r0, dtype=np.int64), np.diff(m_ptr[r0:r1 + 1])) \
            * n_cols + m.indices[a0:a1]
        super_keys = np.repeat(np.arange(r1 - r0, dtype=np.int64),
                               np.diff(indptr[r0:r1 + 1])) * n_cols + cols[s0:s1]
        pos = np.searchsorted(super_keys, keys)
        if keys.size and not (pos[-1] < super_keys.size
                              and np.array_equal(super_keys[pos], keys)):
            raise AssertionError("amg: a product has an entry outside its symbolic pattern")
        out[s0 + pos] = m.data[a0:a1]
        r0 = r1
    return out


def _dense_inverse(c: np.ndarray) -> np.ndarray:
    """The coarsest level's inverse, or where it is numerically singular
    (its 1-norm condition number above `1 / (n eps)`: a pure-Neumann
    problem, whose coarse matrices keep the constant null space) its
    pseudo-inverse, singular values below `n eps` of the largest cut (as
    pyamg's default coarse solver): an inverse on its range. (`inv` of a
    singular matrix is often finite, rounding making a pivot: entries of
    1e16 along the null space, which stalled CG on consistent Neumann
    systems at a relative residual of 1e-2.)"""
    n = max(c.shape[0], 1)
    eps = np.finfo(np.float64).eps
    if not np.isfinite(c).all():
        return np.full_like(c, np.nan)
    try:
        inv = np.linalg.inv(c)
        cond = np.abs(c).sum(axis=0).max() * np.abs(inv).sum(axis=0).max()
        if np.isfinite(cond) and cond * n * eps < 1.0:
            return inv
    except np.linalg.LinAlgError:
        pass
    return np.linalg.pinv(c, rcond=n * eps)


def _build_one(s: Structure, d: np.ndarray) -> tuple:
    from pyamg.util.linalg import approximate_spectral_radius  # (on first use)

    weights, ps, values = [], [], []
    if not np.isfinite(d).all():  # the solve's checks report it: no setup
        return None
    a_vals = np.asarray(d, np.float64)  # (not copied: read only)
    for i, lv in enumerate(s.levels):
        a = sp.csr_matrix((a_vals, lv.cols, lv.indptr), shape=(lv.n, lv.n))
        diag = np.where(lv.diag >= 0, a_vals[np.maximum(lv.diag, 0)], 0.0)
        dinv = np.divide(1.0, diag, out=np.zeros_like(diag), where=diag != 0)
        da = sp.diags(dinv) @ a
        start = np.random.default_rng(0).random(lv.n)
        try:
            rho = float(approximate_spectral_radius(da, symmetric=False,
                                                    initial_guess=start))
        except Exception:  # noqa: BLE001 - a breakdown only weakens the cycle
            rho = float("nan")
        w = 4.0 / (3.0 * rho) if np.isfinite(rho) and rho > 0 else 0.0
        p = (lv.t - w * (da @ lv.t)).tocsr()
        del da  # (host memory: each level's products go as soon as they are used)
        weights.append(w * dinv)
        ps.append(_scatter(p, lv.nc, lv.p_indptr, lv.p_cols))
        ap = a @ p
        del a
        ac = (p.T @ ap).tocsr()
        del ap, p
        if i + 1 < len(s.levels):
            nxt = s.levels[i + 1]
            a_vals = _scatter(ac, lv.nc, nxt.indptr, nxt.cols)
            values.append(a_vals)
        else:
            coarse = ac.toarray()
    if not s.levels:
        n, indptr, cols = s.coarse
        coarse = sp.csr_matrix((a_vals, cols, indptr), shape=(n, n)).toarray()
    return (*weights, *ps, *values, _dense_inverse(coarse))


def _setup_one(s: Structure, d: np.ndarray, dtype) -> tuple:
    """The hierarchy of the values `d` (one matrix), from sciad's analysis
    cache if it holds them (at most `MAX_CACHED` value sets within
    `MAX_CACHED_BYTES`, the newest always)."""
    key = (np.dtype(dtype).str,
           hashlib.blake2b(np.ascontiguousarray(d).view(np.uint8), digest_size=16).digest())
    return _cache.cached(s, "amg hierarchy", key, lambda: _build_setup(s, d, dtype),
                         limit=MAX_CACHED)


def _build_setup(s: Structure, d: np.ndarray, dtype) -> tuple:
    global _setups
    # (room for the new one first: the host does not hold the old
    # hierarchies while it builds)
    _cache.trim("amg hierarchy", max_entries=MAX_CACHED, max_bytes=MAX_CACHED_BYTES,
                room=sum(int(np.prod(shape)) for shape, _ in s.layout(dtype))
                * np.dtype(dtype).itemsize)
    with one_blas_thread():
        arrays = _build_one(s, d)
    release_host_heap()  # (the products' temporaries, freed by now)
    if arrays is None:
        arrays = tuple(np.zeros(shape, dtype) for shape, _ in s.layout(dtype))
    else:
        arrays = tuple(np.asarray(x, dtype) for x in arrays)
    with _setups_lock:
        _setups += 1
    return arrays


@jax.custom_batching.custom_vmap
def _one_of(x):
    """One element of `x`, for an ordering dependency: unbatched under
    `jax.vmap` (example 0's), so it never batches the call that reads it."""
    return jnp.ravel(x)[:1]


@_one_of.def_vmap
def _one_of_vmap(axis_size, in_batched, x):
    return jnp.ravel(x[0] if in_batched[0] else x)[:1], False


def setup(a, s: Structure, after=None):
    """The hierarchy of the sparse matrix with values `a` (leading batch axes
    allowed under `jax.vmap`): one host call, its arrays as `layout` says.

    `after` (a solve's right-hand side): the call also reads one element of
    it, which it ignores, so that XLA runs it once that is computed. An
    adjoint solve's setup (a cache hit) then runs after the forward solve,
    and the two solves' hierarchies are not live in the program together
    (XLA otherwise schedules both setups first: at 10^6 unknowns that held
    ~70 MB more). (Under `jax.vmap` the element is example 0's: it never
    batches the call.)"""
    return host_setup(lambda d, dtype: _setup_one(s, d, dtype), s.layout(np.dtype(a.dtype)), a,
                      after)


def host_setup(build, layout, a, after=None):
    """The host call that makes a hierarchy's arrays (`layout`, as
    `Structure.layout` gives it) from the values `a` with `build(d, dtype)`,
    one matrix's values `d` at a time (under `jax.vmap`, for each example,
    stacked); `after` as in `setup`."""
    dtype = np.dtype(a.dtype)
    args = (a,) if after is None or not jnp.size(after) else (a, _one_of(after))

    def host(d, *_):
        if d.ndim == 1:
            return build(d, dtype)
        batch = d.shape[:-1]
        built = [build(r, dtype) for r in d.reshape((-1, d.shape[-1]))]
        return tuple(np.stack([b[i] for b in built]).reshape(batch + shape)
                     for i, (shape, _) in enumerate(layout))

    return host_call(host, tuple(jax.ShapeDtypeStruct(shape, dt) for shape, dt in layout), *args)


# ---------------------------------------------------------------------------
# the V-cycle, in the program


def _level_patterns(lv: _Level, level: int, pattern) -> tuple:
    """`(A_l, P_l)` of a level as `CsrPattern`s (the finest level's `A` is
    the matrix's own `pattern`, where given), made once per level."""
    def patterns():
        a = CsrPattern((lv.n, lv.n), lv.indptr, lv.cols)
        return a, CsrPattern((lv.n, lv.nc), lv.p_indptr, lv.p_cols)

    a, p = _cache.cached(lv, "amg patterns", None, patterns, nbytes=0)
    return (pattern if level == 0 and pattern is not None else a), p


def _products(lv: _Level, level: int, pattern) -> tuple:
    """`(amul, pmul)` of a level: `amul(vals, x, transpose)` = `op(A_l) x`,
    `pmul(p, x, transpose)` = `P x` or `P^T x`, by `pattern_matmul` on its
    patterns (on the CPU, ELLPACK where a level's rows are even: gathers and
    a sum along each row, instead of a scatter-add)."""
    a_pat, p_pat = _level_patterns(lv, level, pattern)

    def amul(vals, x, transpose):
        return pattern_matmul(a_pat, vals, x, transpose)

    def pmul(p, x, transpose):
        return pattern_matmul(p_pat, p, x, transpose)

    return amul, pmul


def vcycle(s: Structure, arrays, a, v, *, transpose: bool = False, pattern=None):
    """One V-cycle from zero for `op(A) x = v` (`op` the transpose if
    `transpose`): `x ~ op(A)^-1 v`. `a`: the finest level's values;
    `pattern`: its pattern (the one `s` was built from), if at hand. Each
    level's products are `pattern_matmul`'s (`_products`)."""
    products = [_products(lv, k, pattern) for k, lv in enumerate(s.levels)]
    return cycle(products, arrays, a, v, transpose=transpose)


def index_products(levels, spmv) -> list:
    """`cycle`'s products of levels given as `(n, nc, (rows, cols, p_rows,
    p_cols))` each (index arrays), by `spmv(vals, rows, cols, n_out, x,
    transpose)`: the block AMG's padded levels (`_block_amg`)."""
    def of(n, nc, indices):
        rows, cols, prow, pcol = indices

        def amul(vals, x, transpose):
            return spmv(vals, rows, cols, n, x, transpose)

        def pmul(p, x, transpose):
            return spmv(p, prow, pcol, nc if transpose else n, x, transpose)

        return amul, pmul

    return [of(*level) for level in levels]


def cycle(products, arrays, a, v, *, transpose: bool = False):
    """The V-cycle of `vcycle` on `len(products)` smoothed levels, each
    level's products `products[level] = (amul, pmul)` (`_products`,
    `index_products`); `arrays` as `Structure.layout` lays them out."""
    nl = len(products)
    weights, ps, values = arrays[:nl], arrays[nl:2 * nl], arrays[2 * nl:3 * nl - 1]
    cinv = arrays[-1]
    mats = (a, *values)

    def down(level, b):
        if level == nl:
            m = cinv.T if transpose else cinv
            return jnp.matmul(m, b, precision=jax.lax.Precision.HIGHEST)
        vals, w, p = mats[level], weights[level], ps[level]
        amul, pmul = products[level]
        x = w * b  # pre-smoothing from zero
        r = b - amul(vals, x, transpose)
        xc = down(level + 1, pmul(p, r, True))
        x = x + pmul(p, xc, False)
        return x + w * (b - amul(vals, x, transpose))  # post-smoothing

    return down(0, v)


class AMG(AbstractPreconditioner):
    """Smoothed-aggregation algebraic multigrid as a preconditioner, with a
    near-null space: `sd.linalg.solve(A, b, solver="cg",
    preconditioner=sd.linalg.AMG(near_null_space=B, block_size=3))`.

    `preconditioner="amg"` aggregates single unknowns with a constant
    candidate, which suits scalar problems (diffusion, Poisson). For a
    system whose near-null space has more vectors, elasticity above all
    (the rigid-body modes: translations and rotations, which a constant
    cannot represent), give them:

    - `near_null_space`: an array `(n, k)` of the `k` candidate vectors
      (`rigid_body_modes(points)` for elasticity), rows in the matrix's
      unknowns' order. Constant: it is part of the solve's params (shown in
      the printed graph by a content hash), not differentiated.
    - `block_size`: how many consecutive unknowns make one node (3 for 3-D
      elasticity with interleaved `u_x, u_y, u_z`, 2 in 2-D); a node's
      unknowns are aggregated together.

    The hierarchy's aggregates and tentative prolongator (fitted to the
    candidates per aggregate, `k` coarse unknowns each) are made once per
    pattern and candidates, at trace time; the values' part once per matrix
    values, on the host, as for `"amg"`. The cycle is symmetric positive
    definite for an spd `A` (CG's requirement), and the adjoint solve uses
    the same hierarchy transposed.

        B = sd.linalg.rigid_body_modes(points)          # (3 n_nodes, 6)
        amg = sd.linalg.AMG(near_null_space=B, block_size=3)
        u = sd.linalg.solve(K, f, solver="cg", preconditioner=amg, tol=1e-8)

    On a 3-D HEX8 cantilever of 24 x 12 x 24 cells (23,400 unknowns) CG
    to 1e-10 takes 242 steps with `"amg"` and 33 with the rigid-body modes,
    as many as pyamg with the same smoothing (see the guide "Linear
    solves").

    (`sd.linalg.AMG`. Internally: one V-cycle per application, see
    `sciad.solvers.iterative._amg`; the registered record,
    `preconditioner="amg"`, is `AMG()`.)
    """

    name = "amg"
    matrices = frozenset({"sparse"})
    where = "host"

    def __init__(self, near_null_space=None, *, block_size: int = 1):
        op = "linalg.AMG"
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
                or block_size < 1:
            raise InvalidOptionError(f"`block_size` (the unknowns of one node) must be an int "
                                     f">= 1, got {block_size!r}.", op=op)
        b = None
        if near_null_space is not None:
            b = np.array(near_null_space, dtype=np.float64)
            if b.ndim == 1:
                b = b[:, None]
            if b.ndim != 2 or b.shape[1] < 1 or b.shape[0] < 1:
                raise ShapeError(f"`near_null_space` must be an array (n, k) of k candidate "
                                 f"vectors, got shape {np.shape(near_null_space)}.", op=op)
            if not np.all(np.isfinite(b)):
                raise InvalidOptionError("`near_null_space` has non-finite entries; pass the "
                                         "candidates' values (e.g. `rigid_body_modes(points)`).",
                                         op=op)
            if b.shape[0] % int(block_size):
                raise ShapeError(f"`near_null_space` has {b.shape[0]} rows, not a multiple of "
                                 f"block_size = {block_size}: each node has `block_size` "
                                 "consecutive unknowns.", op=op)
            b.setflags(write=False)
        elif block_size != 1:
            raise InvalidOptionError("`block_size` groups unknowns into nodes for a "
                                     "near-null space; pass `near_null_space` with it.", op=op)
        self.near_null_space = b
        self.block_size = int(block_size)
        self._key = None if b is None else (self.block_size, b.shape, hashlib.blake2b(
            b.tobytes(), digest_size=16).hexdigest())

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._key == other._key

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key))

    def __repr__(self) -> str:
        if self._key is None:
            return "amg"
        n, k = self._key[1]
        return f"amg(block {self.block_size}, {k} candidates #{self._key[2][:6]})"

    __str__ = __repr__

    def structure(self, pattern) -> Structure:
        """The aggregation of `pattern` (with this near-null space)."""
        return structure(pattern, self.near_null_space, self.block_size, self._key)

    def rejects(self, *, matrix: str, pattern=None, shown: str = ""):
        if matrix != "sparse":
            return NotSupportedError, (
                f"the 'amg' preconditioner builds its hierarchy from a sparse matrix, got a "
                f"{matrix} one{f' ({shown})' if shown else ''}; pass an `sd.sparse` matrix, "
                "or use preconditioner='jacobi'.")
        why = missing_diagonal(pattern, "the 'amg' preconditioner smooths with the diagonal, "
                               "so it", shown)
        if why is not None:
            return why
        b = self.near_null_space
        if b is not None and b.shape[0] != pattern.shape[0]:
            return ShapeError, (
                f"the AMG preconditioner's near_null_space has {b.shape[0]} rows, but "
                f"{shown or 'the matrix'} has {pattern.shape[0]} unknowns; give one row per "
                "unknown (in the matrix's order).")
        s = self.structure(pattern)
        if s.n_coarse > MAX_DENSE:
            return NotSupportedError, (
                f"the 'amg' preconditioner could not coarsen {shown or 'the matrix'} below "
                f"{s.n_coarse} unknowns (its pattern has too few off-diagonal entries); "
                "use preconditioner='jacobi'.")
        return None

    def setup(self, a, *, pattern, after=None):
        return setup(a, self.structure(pattern), after)

    def apply(self, state, a, v, *, pattern, transpose: bool = False):
        return vcycle(self.structure(pattern), state, a, v, transpose=transpose,
                      pattern=pattern)

    def setup_bytes(self, n: int, pattern, dtype) -> int:
        return self.structure(pattern).nbytes(np.dtype(dtype).itemsize)

    def apply_flops(self, n: int, pattern) -> float:
        return self.structure(pattern).apply_flops()

    def describe(self, n: int, pattern, dtype) -> str:
        s = self.structure(pattern)
        levels = ", ".join(f"{k}/{z}" for k, z, _ in s.nnz())
        return (f"{self!r}: {len(s.levels) + 1} levels (n/nnz {levels}), "
                f"V-cycle {s.apply_flops():.3g} flops")
