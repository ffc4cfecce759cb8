"""Index arrays in programs: one device array per static index map, and
gathers and segment sums that use it as it is.

A sparse matrix's index arrays (the row and column of each stored entry, a
transpose's permutation, an AMG level's) are static: they enter an XLA
program as constants. Each NumPy array handed to a JAX operation becomes a
new constant (JAX deduplicates constants by object identity), and
`x[idx]` and `jax.ops.segment_sum` add int64 -> int32 conversions and
negative-index fix-ups on top, which XLA folds on the host at compile time.
With a 10^6-unknown 3-D Laplacian's pattern appearing a dozen times as
int64 and int32 constants, compilation took a minute and gigabytes.

So each index array is converted once, to a `(k, 1)` int32 `jax.Array`
(the shape `lax.gather` and `lax.scatter_add` read), cached with its owner
(a `Pattern`, an `IndexMap`, an AMG level; weakly: it goes with its owner),
and read by `take` and `segment_sum`, which call `lax.gather` and
`lax.scatter_add` directly. One trace then holds each index array once,
whatever reads it, and XLA has nothing to fold. (Under JAX's
`jax_use_simplified_jaxpr_constants`, such arrays are passed to the
executable as arguments instead of being embedded.)
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from .. import _cache
from .._buffers import aligned, shareable


_PROMISE = lax.GatherScatterMode.PROMISE_IN_BOUNDS


_NO_MESH = jax.sharding.AbstractMesh((), (), ())


#: an index array at least this large, where it enters programs as a
#: constant (JAX's hoisting of large constants off: JAX was imported before
#: sciad), is worth a `ConstantsWarning`: XLA copies it into the program and
#: folds it when it compiles (on an H200, a 345,960-unknown elasticity
#: program compiled in 15.6 s and a 998,976-unknown one in 31.6 s that way;
#: hoisted, its CPU compilation takes 0.9 s at 180,000 unknowns)
LARGE_CONSTANT_BYTES = 32 * 2 ** 20
_warned_constants = []


def _warn_if_embedded(nbytes: int) -> None:
    """A `ConstantsWarning`, once per process, for an index array of `nbytes`
    that programs will embed (see `LARGE_CONSTANT_BYTES`)."""
    if _warned_constants or nbytes < LARGE_CONSTANT_BYTES:
        return
    from .. import _startup

    if not _startup.policy.startswith("off"):  # (on, or the user's own choice)
        return
    import warnings

    from ..errors import ConstantsWarning

    _warned_constants.append(nbytes)
    warnings.warn(ConstantsWarning(
        f"an index array of {nbytes / 2 ** 20:.0f} MiB (a sparse pattern's or a mesh's) enters "
        "this program as a constant copied into its text, which XLA folds when it compiles: "
        "compilation grows with the mesh (tens of seconds at a million unknowns), because "
        "JAX was imported before sciad and JAX's hoisting of large constants is off. Import "
        "sciad before JAX, or set JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1 in the environment "
        "(sciad.config, \"Large constants\"). Shown once."), stacklevel=2)


def index_array(values) -> jax.Array:
    """The NumPy integer array `values` (every entry in `[0, 2^31)`, or -1
    past an array's end where a caller pads) as a `(k, 1)` int32 `jax.Array`,
    made outside any trace. Callers cache it: see `cached_index`. On the
    CPU it shares `values` where that is an aligned, read-only int32 array
    (`sciad._buffers`: a pattern's transpose, an assembly's map), so the
    host and the device hold it once. One of at least
    `LARGE_CONSTANT_BYTES`, where programs will embed it, warns once
    (`ConstantsWarning`)."""
    values = np.asarray(values).ravel()
    if values.size and values.max() >= np.iinfo(np.int32).max:
        dtype = np.int64  # (more than 2^31 entries: not reachable in practice)
    else:
        dtype = np.int32
    _warn_if_embedded(values.size * np.dtype(dtype).itemsize)
    device = jax.local_devices()[0]
    # (on the CPU the device array wraps an aligned, read-only host array
    # instead of copying it: the caller's own where it is one, as a
    # pattern's transpose and an assembly's map are, else one conversion)
    if not (values.dtype == dtype and shareable(values)):
        values = aligned(values, dtype)
    # (outside any mesh too: an array made inside `shard_map`, or under
    # `jax.set_mesh`, carries that mesh in its type, and a later program
    # that reads the cached array under another mesh, or none, fails)
    with jax.ensure_compile_time_eval(), jax.sharding.use_abstract_mesh(_NO_MESH):
        if device.platform != "cpu":
            return jax.device_put(values.reshape(-1, 1), device)
        try:
            return jax.device_put(values.reshape(-1, 1), device, may_alias=True)
        except TypeError:  # pragma: no cover - a JAX without `may_alias`
            return jax.device_put(values.reshape(-1, 1), device)


def cached_index(owner, name: str, make: Callable[[], np.ndarray]) -> jax.Array:
    """`index_array(make())`, made once per `(owner, name)` and kept in
    sciad's analysis cache (`sciad._cache`, kind "index arrays"): `owner` is
    any hashable, weakly referencable object (owners equal by content share
    one array; its arrays go with it)."""
    return _cache.cached(owner, "index arrays", name, lambda: index_array(make()))


def take(x, idx, *, sorted_indices: bool = False, fill: bool = False):
    """`x[idx[:, 0]]` (along the first axis) for a `(k, 1)` index array of
    valid positions: one `lax.gather`, no index fix-ups. With `fill`, an
    index out of bounds (-1 for none) reads 0 (a mask in the gather)."""
    dnums = lax.GatherDimensionNumbers(offset_dims=tuple(range(1, x.ndim)),
                                       collapsed_slice_dims=(0,), start_index_map=(0,))
    if fill:
        return lax.gather(x, idx, dnums, (1,) + tuple(x.shape[1:]),
                          indices_are_sorted=sorted_indices,
                          mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=0)
    return lax.gather(x, idx, dnums, (1,) + tuple(x.shape[1:]),
                      indices_are_sorted=sorted_indices, mode=_PROMISE)


@functools.lru_cache(maxsize=None)
def _take_fn(k: int):
    @custom_vmap
    def f(x, idx):  # x: (n, ...), idx: (k, 1) -> x[idx[:, 0]]
        return take(x, idx)

    @f.def_vmap
    def _rule(axis_size, in_batched, x, idx):
        # a batch gathered batch-major, one element each: JAX's own rule
        # gathers (batch, 1) windows, in a layout XLA:CPU transposes around
        # every consumer (measured: 23 against 13 ms for 256 matrices of
        # 4,992 entries assembled and read by two products)
        if in_batched[1]:  # (per-example indices: not made here, kept general)
            xb = x if in_batched[0] else jnp.broadcast_to(x, (axis_size,) + x.shape)
            return jax.vmap(take)(xb, idx), True
        i = idx[:, 0].reshape((1, k) + (1,) * (x.ndim - 2))
        return jnp.take_along_axis(x, jnp.broadcast_to(i, (x.shape[0], k) + x.shape[2:]),
                                   axis=1, mode="promise_in_bounds"), True

    return f


def take_static(x, idx):
    """`take(x, idx)` for a static index array (a cached one), whose batch
    rule keeps a batch batch-major (see `_take_fn`): what a batch of sparse
    matrices' values read (an assembly's permutation, a transpose's, the
    diagonal)."""
    return _take_fn(int(idx.shape[0]))(x, idx)


def segment_sum(data, idx, n: int, *, sorted_indices: bool = False, drop: bool = False):
    """`out[idx[k, 0]] += data[k]` into zeros of `n` rows (the sum of each
    segment, as `jax.ops.segment_sum`): one `lax.scatter_add`. `drop`:
    indices past the end (`n`) are dropped; otherwise they must be valid."""
    dnums = lax.ScatterDimensionNumbers(update_window_dims=tuple(range(1, data.ndim)),
                                        inserted_window_dims=(0,),
                                        scatter_dims_to_operand_dims=(0,))
    zeros = jnp.zeros((n,) + tuple(data.shape[1:]), data.dtype)
    mode = lax.GatherScatterMode.FILL_OR_DROP if drop else _PROMISE
    return lax.scatter_add(zeros, idx, data, dnums, indices_are_sorted=sorted_indices,
                           mode=mode)


class CsrPattern:
    """A static CSR pattern of the solvers' own (an AMG level's `A_l` or
    `P_l`): what `pattern_matmul` and the index caches read of the graph's
    `Pattern` (`shape`, `indptr`, `indices`, `nnz`, `rows`, `row_index()`,
    `transposed()`, `is_structurally_symmetric()`), without its checks and content hash
    (columns need not be sorted within a row). Compared by identity: each
    is made once by its owner and cached with it."""

    __slots__ = ("shape", "indptr", "indices", "_rows", "_transposed", "__weakref__")

    def __init__(self, shape, indptr, indices):
        self.shape = (int(shape[0]), int(shape[1]))
        self.indptr = np.asarray(indptr, np.int64)
        self.indices = np.asarray(indices, np.int64)
        self._rows = self._transposed = None

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def rows(self) -> np.ndarray:
        """The row of each stored entry."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.shape[0], dtype=np.int64),
                                   np.diff(self.indptr))
        return self._rows

    def row_index(self) -> np.ndarray:
        """The rows as kept (`Pattern.row_index`)."""
        return self.rows

    def transposed(self) -> tuple["CsrPattern", np.ndarray]:
        """`(pattern of A.T, perm)` with `data(A.T) = data(A)[perm]`."""
        if self._transposed is None:
            import scipy.sparse as sp

            csc = sp.csr_matrix((np.arange(self.nnz, dtype=np.int64), self.indices,
                                 self.indptr), shape=self.shape).tocsc()
            self._transposed = (CsrPattern(self.shape[::-1], csc.indptr, csc.indices),
                                np.asarray(csc.data, np.int64))
        return self._transposed

    def is_structurally_symmetric(self) -> bool:
        if self.shape[0] != self.shape[1]:
            return False
        t, _ = self.transposed()  # (False for unsorted columns: a copy, never wrong)
        return bool(np.array_equal(t.indptr, self.indptr)
                    and np.array_equal(t.indices, self.indices))


def pattern_rows(pattern) -> jax.Array:
    """The row of each stored entry, as a cached `(nnz, 1)` index array."""
    return cached_index(pattern, "rows", pattern.row_index)


def pattern_cols(pattern) -> jax.Array:
    """The column of each stored entry, as a cached `(nnz, 1)` index array."""
    return cached_index(pattern, "cols", lambda: pattern.indices)


def pattern_transpose(pattern) -> jax.Array:
    """`perm` with `data(A.T) = data(A)[perm]`, as a cached index array."""
    return cached_index(pattern, "transpose", lambda: pattern.transposed()[1])


def pattern_diagonal(pattern) -> jax.Array:
    """The data index of each diagonal entry (0 where there is none: mask
    with `pattern.diagonal_positions() >= 0`), as a cached index array."""
    return cached_index(pattern, "diagonal",
                        lambda: np.maximum(pattern.diagonal_positions(), 0))


#: a product pads each row of `op(A)` to the longest (ELLPACK) where that
#: adds at most this fraction of the stored entries (FEM and stencil
#: matrices: 7% for a 3-D elasticity matrix), on the CPU
ELL_MAX_PADDING = 0.5


def ell_backends() -> frozenset:
    """The backends whose sparse products take the ELLPACK layout where rows
    are even: the CPU's (measured there), or those `SCIAD_ELL_BACKENDS`
    names (comma-separated, such as "cpu,gpu": a switch for measuring it on
    an accelerator, where a scatter-add's atomic updates may cost more than
    the padding). Read when a program is traced."""
    import os

    text = os.environ.get("SCIAD_ELL_BACKENDS")
    return frozenset(("cpu",) if text is None else
                     (b.strip() for b in text.split(",") if b.strip()))


def _ell_layout(pattern, transpose: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """`(pos, cols)`, both `(n, w)`: for each row of `op(A)` its stored
    entries' positions in `data` (`nnz` past a row's end: a padding read as
    0) and their columns (0 in the padding), or None where padding every
    row to the longest `w` would add more than `ELL_MAX_PADDING` entries."""
    nnz = pattern.nnz
    if transpose:
        tp, perm = pattern.transposed()
        indptr, cols, perm = tp.indptr, tp.indices, np.asarray(perm, np.int64)
    else:
        indptr, cols, perm = pattern.indptr, pattern.indices, None
    n = indptr.size - 1
    counts = np.diff(indptr)
    w = int(counts.max(initial=0))
    if nnz == 0 or n * w > (1.0 + ELL_MAX_PADDING) * nnz:
        return None
    rows = np.repeat(np.arange(n), counts)
    slot = np.arange(nnz) - indptr[rows]
    pos = np.full((n, w), nnz, np.int64)
    pos[rows, slot] = np.arange(nnz) if perm is None else perm
    ell_cols = np.zeros((n, w), np.int64)
    ell_cols[rows, slot] = cols
    return pos, ell_cols


def _ell(pattern, transpose: bool):
    """`(pos, cols, (n, w))`: `_ell_layout` as device index arrays (each
    cached as an index array: the host layout is not kept), or None; made
    once per pattern and direction."""
    key = "ell transposed" if transpose else "ell"

    def make():
        layout = _ell_layout(pattern, transpose)
        if layout is None:
            return None
        pos, cols = layout
        # (a structurally symmetric pattern's transpose has its columns: one
        # constant for both)
        cols_key = "ell cols" if transpose and pattern.is_structurally_symmetric() \
            else key + " cols"
        return (cached_index(pattern, key + " pos", lambda: pos),
                cached_index(pattern, cols_key, lambda: cols), pos.shape)

    # (nbytes 0: the arrays are counted as the index arrays they are)
    return _cache.cached(pattern, "index arrays", key, make, nbytes=0)


def pattern_matmul(pattern, data, x, transpose: bool = False):
    """`op(A) x` for the sparse matrix with values `data` on `pattern` (`x` of
    shape `(m,)` or `(m, k)`), compiled by XLA (`sparse.matmul`'s
    implementation). On the CPU, where its rows have about as many entries
    each (`ELL_MAX_PADDING`), each row's entries padded to the longest
    (ELLPACK: gathers and a sum along the row, 3.5 times faster than a
    scatter-add there: 9.7 ms against 34 ms for a 3-D elasticity matrix of
    7.8 * 10^6 entries, SciPy's `csr_matvec` 9.3 ms); else a gather of `x`
    and a scatter-add of the products."""
    from ._linear import backend

    ell = _ell(pattern, transpose) if backend() in ell_backends() else None
    if ell is not None:
        pos, cols, (n, w) = ell
        vals = jnp.asarray(data).at[pos[:, 0]].get(mode="fill", fill_value=0).reshape(
            (n, w) + (1,) * (x.ndim - 1))
        return jnp.sum(vals * take(x, cols).reshape((n, w) + x.shape[1:]), axis=1)
    rows, cols = pattern_rows(pattern), pattern_cols(pattern)
    gather, scatter, n = (rows, cols, pattern.shape[1]) if transpose else \
        (cols, rows, pattern.shape[0])
    prod = data.reshape((-1,) + (1,) * (x.ndim - 1)) * take(x, gather)
    return segment_sum(prod, scatter, n, sorted_indices=not transpose)
