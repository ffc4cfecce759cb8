"""Sparse matrices (CSR, static pattern): construction, products, transposes.

A sparse value's type is a `SparseType` (pattern, dtype, tags); at run time
it is its `data` vector. Every primitive here is linear or bilinear in its
operands, so each rule is short and exact:

- `sparse.assemble[pattern, index]`: dense `x (m,)` -> sparse, `data[index[k]] += x[k]`
  (no index: `data = x`). Duplicates add up, as in SciPy's COO -> CSR.
- `sparse.gather[index]`: sparse -> dense `(m,)`, `out[k] = data[index[k]]`
  (0 where `index[k] == -1`; no index: the data vector). The transpose of
  `assemble`, and the other way round.
- `sparse.matmul[pattern, transpose]`: `A @ x` (or `A.T @ x`) for `x` of shape `(m,)` or `(m, k)`.
- `sparse.sddmm[pattern]`: the sampled product `data_k = sum_j u[r_k, j] v[c_k, j]`,
  i.e. `u @ v.T` kept on the pattern. The cotangent of `A` in `A @ x`, so a
  gradient with respect to a sparse matrix never forms a dense `n x m` array.
- `sparse.transpose[pattern]`: `A.T` (a permutation of the data onto the transposed pattern).
- `sparse.todense[pattern]` and `sparse.sample[pattern]` (`data_k = D[r_k, c_k]`), transposes
  of each other.

Ops whose implementation needs the index arrays carry the operand's `pattern`
as a param (the shape rule checks that the two agree): an implementation sees
only the run-time data vectors. Nothing is conjugated (JAX's convention for
complex transposes).
"""

from __future__ import annotations

import hashlib

import jax.numpy as jnp
import numpy as np

from .._buffers import aligned, shareable
from ..errors import DTypeError, ShapeError
from ..graph import Param, Primitive, SparseType, TensorType, is_linear, register_param_type, zeros
from ..graph._autodiff import register_zeros
from ..graph._cost import Cost, size
from ..graph._serialize import _decode_array, _encode_array
from ..graph._sparsity import Deps, by_ids, contraction, empty, select_rows, union, value_shape
from ..graph._types import Pattern
from ..solvers._indices import (cached_index, pattern_cols, pattern_matmul, pattern_rows,
                                pattern_transpose, segment_sum, take, take_static)
from ._contract import _multilinear_jvp
from ._map import columns_rule, map_rule
from ._shape import _linear_jvp

# ---------------------------------------------------------------------------
# Static params: the pattern and index maps


class IndexMap:
    """A static, read-only integer index array used as a param (hashable by
    content): int32 where its entries fit (an assembly map of 8.4e6 entries
    is 34 MB, not 67), else int64. Entries are positions, or -1 (none)."""

    __slots__ = ("array", "_key", "_inverse", "__weakref__")

    def __init__(self, array):
        a = np.asarray(array).ravel()
        if a.dtype.kind not in "iu":
            a = a.astype(np.int64)
        small = a.size == 0 or (a.min() >= np.iinfo(np.int32).min
                                and a.max() <= np.iinfo(np.int32).max)
        want = np.int32 if small else np.int64
        if a.dtype != want or not shareable(a):
            # (a read-only, aligned one is kept as it is; any other is
            # copied once, aligned, so that its device array, `device()`,
            # shares it on the CPU)
            a = aligned(a, want)
        self.array = a
        self._key = hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest()
        self._inverse: dict[int, np.ndarray | None] = {}

    def __len__(self) -> int:
        return int(self.array.size)

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, IndexMap) and self._key == other._key
                                 and np.array_equal(self.array, other.array))

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        return f"#{self._key[:6]}({self.array.size})"

    __repr__ = __str__

    def device(self):
        """The map as an int32 `(k, 1)` device array, made once (the one
        constant of this map in a program: see `sciad.solvers._indices`;
        on the CPU it shares `array`). Its -1 entries stay: an assembly's
        scatter drops them, a gather fills them with 0 (both out of
        bounds)."""
        return cached_index(self, "map", lambda: self.array)

    def inverse(self, size: int) -> np.ndarray | None:
        """Where the map is a permutation of `range(size)` (each of `size`
        entries receives exactly one value), its inverse: `out[inverse] ==
        x` for `out[index] = x`; else None."""
        if size not in self._inverse:
            a, inv = self.array, None
            if a.size == size and (size == 0 or (a.min() >= 0 and a.max() < size)):
                inv = np.full(size, -1, a.dtype)
                inv[a] = np.arange(size, dtype=a.dtype)
                if (inv < 0).any():
                    inv = None
            self._inverse[size] = inv
        return self._inverse[size]


def _encode_index(m: IndexMap):
    return _encode_array(m.array)


def _decode_index(d) -> IndexMap:
    return IndexMap(_decode_array(d))


register_param_type(IndexMap, "index_map", _encode_index, _decode_index)
register_param_type(Pattern, "pattern", Pattern.to_json, Pattern.from_json)


def _sparse(t, op: str, what: str = "operand") -> SparseType:
    if not isinstance(t, SparseType):
        raise DTypeError(f"{what} must be a sparse matrix, got {t.str_short()}.", op=op)
    return t


def _dense(t, op: str, what: str = "operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise DTypeError(f"{what} must be a dense array, got {t.str_short()}.", op=op)
    return t


def _same_dtype(a, b, op: str):
    if a.dtype != b.dtype:
        raise DTypeError(f"operands must share one dtype, got {a.str_short()} and "
                         f"{b.str_short()} (`sd.sparse` functions promote for you).", op=op)
    return a.dtype


def _check_index(index, size: int, nnz: int, op: str) -> None:
    if index is None:
        if size != nnz:
            raise ShapeError(f"without an index map the data has nnz = {nnz} entries, "
                             f"got {size}.", op=op)
        return
    if not isinstance(index, IndexMap):
        raise ShapeError(f"`index` must be an IndexMap, got {index!r}.", op=op)
    if len(index) != size:
        raise ShapeError(f"the index map has {len(index)} entries for {size} values.",
                         op=op)
    if len(index) and (index.array.min() < -1 or index.array.max() >= nnz):
        raise ShapeError(f"index map entries must lie in [-1, {nnz}).", op=op)


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind in "fc"


# ---------------------------------------------------------------------------
# assemble / gather


sparse_assemble_p = Primitive("sparse.assemble", params={
    "pattern": Pattern,
    "index": Param((IndexMap, None), default=None),
    "tags": Param(frozenset[str], default=frozenset()),
})


@sparse_assemble_p.def_abstract_eval
def _assemble_shape(x, *, pattern, index=None, tags=frozenset()):
    x = _dense(x, "sparse.assemble", "the data")
    if x.ndim != 1:
        raise ShapeError(f"the data must be a vector, got {x.str_short()}.",
                         op="sparse.assemble")
    if not isinstance(pattern, Pattern):
        raise ShapeError(f"`pattern` must be a Pattern, got {pattern!r}.",
                         op="sparse.assemble")
    _check_index(index, x.shape[0], pattern.nnz, "sparse.assemble")
    return SparseType(pattern, x.dtype, tags)


@sparse_assemble_p.def_impl
def _assemble_impl(x, *, pattern, index=None, tags=frozenset()):
    if index is None:
        return x
    nnz = pattern.nnz
    inverse = index.inverse(nnz)
    if inverse is not None:
        # (each entry receives one value: a gather, not XLA's scatter, which
        # on the CPU under vmap was 15x slower: 17 against 1.2 ms for 256
        # matrices of 4,992 entries)
        return take_static(x, cached_index(index, f"inverse{nnz}", lambda: inverse))
    return segment_sum(x, index.device(), nnz, drop=True)


def assemble(x, pattern: Pattern, index: IndexMap | None = None, tags=frozenset()):
    """`sparse.assemble`, with default params left out of the node."""
    params = {"pattern": pattern}
    if index is not None:
        params["index"] = index
    if tags:
        params["tags"] = frozenset(tags)
    return sparse_assemble_p.bind(x, **params)


def assemble_at(x, pattern: Pattern, dest, tags=frozenset()):
    """`assemble` of the values `x` at the entries `dest` of `pattern` (as
    `Pattern.from_coo` gives them; duplicates are summed): no index where
    `dest` is every entry in order."""
    index = None
    if dest is not None and not (dest.size == pattern.nnz
                                 and np.array_equal(dest, np.arange(pattern.nnz))):
        index = IndexMap(dest)
    return assemble(x, pattern, index, tags)


def coo(x, row, col, shape):
    """A sparse matrix of shape `shape` with the values `x` at `(row, col)`
    (duplicates summed), for rules: `sd.sparse.coo_matrix` without its
    checks."""
    pattern, dest = Pattern.from_coo(shape, row, col)
    return assemble_at(x, pattern, dest)


def gather(a, index: IndexMap | None = None):
    """`sparse.gather`, with a default index left out of the node."""
    return sparse_gather_p.bind(a) if index is None else sparse_gather_p.bind(a, index=index)


@sparse_assemble_p.def_jvp
def _assemble_jvp(primals, tangents, *, pattern, index=None, tags=frozenset()):
    (x,), (t,) = primals, tangents
    return assemble(x, pattern, index, tags), assemble(t, pattern, index)


@sparse_assemble_p.def_transpose
def _assemble_transpose(ct, x, *, pattern, index=None, tags=frozenset()):
    return (gather(ct, index),)


sparse_gather_p = Primitive("sparse.gather", params={
    "index": Param((IndexMap, None), default=None)})


@sparse_gather_p.def_abstract_eval
def _gather_shape(a, *, index=None):
    a = _sparse(a, "sparse.gather")
    size = a.nnz if index is None else len(index)
    _check_index(index, size, a.nnz, "sparse.gather")
    return TensorType((size,), a.dtype)


@sparse_gather_p.def_impl
def _gather_impl(data, *, index=None):
    if index is None:
        return data
    return take(data, index.device(), fill=True)


sparse_gather_p.def_jvp(_linear_jvp(sparse_gather_p))


@sparse_gather_p.def_transpose
def _gather_transpose(ct, a, *, index=None):
    return (assemble(ct, a.type.pattern, index),)


def _zeros_sparse(t: SparseType):
    return assemble(zeros(t.data_type), t.pattern)


register_zeros(SparseType, _zeros_sparse)


# ---------------------------------------------------------------------------
# products


sparse_matmul_p = Primitive("sparse.matmul", params={
    "pattern": Pattern, "transpose": Param(bool, default=False)})


def _check_pattern(a: SparseType, pattern, op: str) -> None:
    if a.pattern != pattern:
        raise ShapeError(f"the operand's pattern {a.pattern} differs from the node's "
                         f"`pattern` param {pattern}.", op=op)


@sparse_matmul_p.def_abstract_eval
def _matmul_shape(a, x, *, pattern, transpose=False):
    op = "sparse.matmul"
    a = _sparse(a, op, "`a`")
    _check_pattern(a, pattern, op)
    x = _dense(x, op, "`x`")
    dtype = _same_dtype(a, x, op)
    n, m = a.shape[::-1] if transpose else a.shape
    shown = f"{a.str_short()}{'.T' if transpose else ''}"
    if x.ndim not in (1, 2) or x.shape[0] != m:
        raise ShapeError(f"cannot multiply {shown} by {x.str_short()}: `x` must have "
                         f"shape ({m},) or ({m}, k).", op=op)
    return TensorType((n,) + x.shape[1:], dtype)


@sparse_matmul_p.def_impl
def _matmul_impl(data, x, *, pattern, transpose=False):
    return pattern_matmul(pattern, data, x, transpose)


sparse_matmul_p.def_jvp(_multilinear_jvp(sparse_matmul_p))


@sparse_matmul_p.def_transpose
def _matmul_transpose(ct, a, x, *, pattern, transpose=False):
    assert not (is_linear(a) and is_linear(x)), "sparse.matmul: both operands linear"
    if is_linear(x):
        return None, sparse_matmul_p.bind(a, ct, pattern=pattern, transpose=not transpose)
    u, v = (x, ct) if transpose else (ct, x)
    return sparse_sddmm_p.bind(u, v, pattern=pattern), None


sparse_sddmm_p = Primitive("sparse.sddmm", params={"pattern": Pattern})


@sparse_sddmm_p.def_abstract_eval
def _sddmm_shape(u, v, *, pattern):
    op = "sparse.sddmm"
    u, v = _dense(u, op, "`u`"), _dense(v, op, "`v`")
    dtype = _same_dtype(u, v, op)
    n, m = pattern.shape
    if u.ndim != v.ndim or u.ndim not in (1, 2) or u.shape[0] != n or v.shape[0] != m \
            or u.shape[1:] != v.shape[1:]:
        raise ShapeError(f"needs `u` of shape ({n},) or ({n}, k) and `v` of shape ({m},) "
                         f"or ({m}, k) with one k, got {u.str_short()} and {v.str_short()}.",
                         op=op)
    return SparseType(pattern, dtype)


@sparse_sddmm_p.def_impl
def _sddmm_impl(u, v, *, pattern):
    prod = take(u, pattern_rows(pattern), sorted_indices=True) * take(v, pattern_cols(pattern))
    return prod if prod.ndim == 1 else jnp.sum(prod, axis=1)


sparse_sddmm_p.def_jvp(_multilinear_jvp(sparse_sddmm_p))


@sparse_sddmm_p.def_transpose
def _sddmm_transpose(ct, u, v, *, pattern):
    assert not (is_linear(u) and is_linear(v)), "sparse.sddmm: both operands linear"
    if is_linear(u):
        return sparse_matmul_p.bind(ct, v, pattern=pattern), None
    return None, sparse_matmul_p.bind(ct, u, pattern=pattern, transpose=True)


# ---------------------------------------------------------------------------
# transpose, todense, sample


sparse_transpose_p = Primitive("sparse.transpose", params={"pattern": Pattern})

_TRANSPOSED_TAGS = {"lower": "upper", "upper": "lower"}


@sparse_transpose_p.def_abstract_eval
def _transpose_shape(a, *, pattern):
    a = _sparse(a, "sparse.transpose")
    _check_pattern(a, pattern, "sparse.transpose")
    pattern_t, _ = a.pattern.transposed()
    return SparseType(pattern_t, a.dtype,
                      frozenset(_TRANSPOSED_TAGS.get(t, t) for t in a.tags))


@sparse_transpose_p.def_impl
def _transpose_impl(data, *, pattern):
    return take(data, pattern_transpose(pattern))


sparse_transpose_p.def_jvp(_linear_jvp(sparse_transpose_p))


@sparse_transpose_p.def_transpose
def _transpose_transpose(ct, a, *, pattern):
    return (sparse_transpose_p.bind(ct, pattern=pattern.transposed()[0]),)


sparse_todense_p = Primitive("sparse.todense", params={"pattern": Pattern})


@sparse_todense_p.def_abstract_eval
def _todense_shape(a, *, pattern):
    a = _sparse(a, "sparse.todense")
    _check_pattern(a, pattern, "sparse.todense")
    return TensorType(a.shape, a.dtype)


@sparse_todense_p.def_impl
def _todense_impl(data, *, pattern):
    return jnp.zeros(pattern.shape, data.dtype).at[pattern.row_index(),
                                                   pattern.indices].set(data)


sparse_todense_p.def_jvp(_linear_jvp(sparse_todense_p))


@sparse_todense_p.def_transpose
def _todense_transpose(ct, a, *, pattern):
    return (sparse_sample_p.bind(ct, pattern=a.type.pattern),)


sparse_sample_p = Primitive("sparse.sample", params={"pattern": Pattern})


@sparse_sample_p.def_abstract_eval
def _sample_shape(d, *, pattern):
    d = _dense(d, "sparse.sample")
    if d.shape != pattern.shape:
        raise ShapeError(f"needs a dense array of the pattern's shape {pattern.shape}, "
                         f"got {d.str_short()}.", op="sparse.sample")
    return SparseType(pattern, d.dtype)


@sparse_sample_p.def_impl
def _sample_impl(d, *, pattern):
    return d[pattern.row_index(), pattern.indices]


sparse_sample_p.def_jvp(_linear_jvp(sparse_sample_p))


@sparse_sample_p.def_transpose
def _sample_transpose(ct, d, *, pattern):
    return (sparse_todense_p.bind(ct, pattern=pattern),)


@sparse_matmul_p.def_cost
def _sparse_matmul_cost(node, body):
    # a multiply and an add per stored entry and column of the dense operand
    a, x = node.inputs
    cols = max(size(x.type) // max(x.type.shape[0], 1), 1)
    return Cost(2.0 * node.params["pattern"].nnz * cols)


# ---------------------------------------------------------------------------
# batching (`sd.vmap`): a batch of vectors times one matrix is one product with
# a block of columns; anything with a batch of matrices is a `map`


def _install_batch_rules() -> None:
    sparse_matmul_p.def_batch(columns_rule(sparse_matmul_p))
    for p in (sparse_assemble_p, sparse_gather_p, sparse_sddmm_p, sparse_transpose_p,
              sparse_todense_p, sparse_sample_p):
        p.def_batch(map_rule(p))


_install_batch_rules()


# ---------------------------------------------------------------------------
# sparsity (`sd.sparse.jacobian_sparsity`): the stored entries keep their
# structure; a product's output row depends on its row's entries and on the
# vector elements their columns read (a constant matrix's explicit zeros
# included: the pattern is structural)


def _install_sparsity_rules() -> None:
    import scipy.sparse as sp

    @sparse_assemble_p.def_sparsity
    def _assemble(outs, x, *, pattern, index=None, tags=frozenset()):
        if index is None:
            return x.matrix
        a = index.array
        keep = np.nonzero((a >= 0) & (a < pattern.nnz))[0]
        # duplicates are summed: an entry depends on every element sent to it
        sel = sp.csr_matrix((np.ones(keep.size, bool), (a[keep], keep)),
                            shape=(pattern.nnz, x.size))
        return sel @ x.matrix

    @sparse_gather_p.def_sparsity
    def _gather(outs, a, *, index=None):
        if index is None:
            return a.matrix
        i = index.array
        valid = (i >= 0) & (i < a.size)
        return by_ids(lambda ids: np.where(valid, ids[np.where(valid, i, 0)], -1), a)

    @sparse_matmul_p.def_sparsity
    def _matmul(outs, a, x, *, pattern, transpose=False):
        rows, cols = pattern.rows, pattern.indices
        if transpose:
            rows, cols = cols, rows
        q = int(np.prod(x.shape[1:], dtype=np.int64))
        t = np.arange(q)
        out_i = (rows[:, None] * q + t).ravel()          # output element of each term
        ent = np.repeat(np.arange(pattern.nnz), q)      # the matrix entry in it
        vec = (cols[:, None] * q + t).ravel()           # the vector element in it
        size = int(np.prod(value_shape(outs[0]), dtype=np.int64))
        parts = []
        for d, src, other, other_src in ((a, ent, x, vec), (x, vec, a, ent)):
            if not d.matrix.nnz:
                continue
            live = np.ones(src.size, bool) if other.value is None \
                else other.mask().ravel()[other_src]
            sel = sp.csr_matrix((np.ones(int(live.sum()), bool), (out_i[live], src[live])),
                                shape=(size, d.size))
            parts.append(sel @ d.matrix)
        return union(*parts) if parts else empty(size, a.columns)

    @sparse_sddmm_p.def_sparsity
    def _sddmm(outs, u, v, *, pattern):
        # data[k] = sum_t u[row_k, t] v[col_k, t]: a contraction over (k, t)
        k = pattern.nnz
        q = int(np.prod(u.shape[1:], dtype=np.int64))
        uu = select_rows(u.matrix, (pattern.rows[:, None] * q + np.arange(q)).ravel())
        vv = select_rows(v.matrix, (pattern.indices[:, None] * q + np.arange(q)).ravel())
        mu = None if u.value is None else np.asarray(u.value).reshape(-1, q)[pattern.rows]
        mv = None if v.value is None else np.asarray(v.value).reshape(-1, q)[pattern.indices]
        return contraction(outs[0], "kt,kt->k",
                           Deps(uu, (k, q), mu), Deps(vv, (k, q), mv))

    @sparse_transpose_p.def_sparsity
    def _transpose(outs, a, *, pattern):
        _, perm = pattern.transposed()
        return by_ids(lambda ids: ids[perm], a)

    @sparse_todense_p.def_sparsity
    def _todense(outs, a, *, pattern):
        def place(ids):
            out = np.full(pattern.shape, -1, np.int64)
            out[pattern.rows, pattern.indices] = ids
            return out
        return by_ids(place, a)

    @sparse_sample_p.def_sparsity
    def _sample(outs, d, *, pattern):
        return by_ids(lambda ids: ids[pattern.rows, pattern.indices], d)


_install_sparsity_rules()
