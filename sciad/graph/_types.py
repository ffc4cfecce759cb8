"""Types of graph values: frozen, hashable, printable.

`TensorType(shape, dtype, tags)` is the type of a dense array. Sparse and
factorization types subclass `AbstractType` the same way; every type knows
its short printed form (`f64[3,4]`) and its JSON form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .. import _cache
from .._buffers import aligned
from ..errors import DTypeError, InvalidOptionError, SerializationError, ShapeError

_SHORT = {
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "complex64": "c64",
    "complex128": "c128",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
}
_LONG = {v: k for k, v in _SHORT.items()}

#: Structure tags a matrix type may carry. Ops may rely on them; with
#: `sciad.config.enable_checks` on they are verified where they are introduced.
KNOWN_TAGS = frozenset({"symmetric", "hermitian", "spd", "lower", "upper", "diagonal"})


def dtype_short(dtype) -> str:
    """`float64` -> `f64`; the names the printer uses."""
    dtype = np.dtype(dtype)
    try:
        return _SHORT[dtype.name]
    except KeyError:
        return dtype.name


def dtype_from_short(name: str) -> np.dtype:
    return np.dtype(_LONG.get(name, name))


def canonical_dtype(dtype) -> np.dtype:
    """The dtypes sciad supports: NumPy's bool, integer, float and complex."""
    dtype = np.dtype(dtype)
    if dtype.name not in _SHORT:
        raise DTypeError(
            f"dtype {dtype} is not supported; use one of "
            f"{', '.join(sorted(_SHORT))}."
        )
    return dtype


class AbstractType:
    """Interface of a graph value's type.

    A type is frozen and hashable, prints itself with `str_short()`, and round
    trips through `to_json()` / `type_from_json`.
    """

    __slots__ = ()

    def str_short(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def to_json(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def __str__(self) -> str:
        return self.str_short()


@dataclass(frozen=True, slots=True)
class TensorType(AbstractType):
    """A dense array of static `shape` and `dtype`.

    `tags` records structural facts about a matrix (`symmetric`, `spd`, ...);
    most ops drop them.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    tags: frozenset = field(default=frozenset())

    def __post_init__(self):
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ShapeError(f"TensorType: negative dimension in shape {shape}.")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "tags", frozenset(self.tags))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def update(self, **kw) -> "TensorType":
        return TensorType(
            kw.get("shape", self.shape), kw.get("dtype", self.dtype), kw.get("tags", frozenset())
        )

    def str_short(self) -> str:
        text = f"{dtype_short(self.dtype)}[{','.join(map(str, self.shape))}]"
        if self.tags:
            text += "{" + ",".join(sorted(self.tags)) + "}"
        return text

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": "tensor", "shape": list(self.shape),
                               "dtype": self.dtype.name}
        if self.tags:
            out["tags"] = sorted(self.tags)
        return out

    @classmethod
    def of(cls, value) -> "TensorType":
        """The type of a concrete array-like (NumPy, JAX, Python scalar)."""
        if isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
            value = np.asarray(value)
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        if shape is None or dtype is None:
            value = np.asarray(value)
            shape, dtype = value.shape, value.dtype
        return cls(tuple(shape), np.dtype(dtype))


_TYPE_KINDS: dict[str, Any] = {"tensor": lambda d: TensorType(
    tuple(d["shape"]), dtype_from_short(d["dtype"]), frozenset(d.get("tags", ())))}


def register_type_kind(kind: str, from_json) -> None:
    """Lets `type_from_json` decode a new kind of type (sparse, factor, ...)."""
    _TYPE_KINDS[kind] = from_json


def _shown(data, limit: int = 120) -> str:
    text = repr(data)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_from_json(data: dict) -> AbstractType:
    try:
        decode = _TYPE_KINDS[data["kind"]]
    except (KeyError, TypeError):
        raise SerializationError(f"unknown value type {_shown(data)}.",
                                 op="from_json") from None
    try:
        return decode(data)
    except SerializationError:  # (a ResourceLimitError too) from a pattern or array
        raise
    except Exception as e:
        raise SerializationError(f"bad value type {_shown(data)}: {e}",
                                 op="from_json") from None


# --------------------------------------------------------------------------
# Sparse matrices


class Pattern:
    """The static sparsity pattern of a CSR matrix: `shape`, `indptr`, `indices`.

    Column indices are sorted within each row and unique (SciPy's canonical
    CSR form). A pattern is immutable and compares (and hashes) by content, so
    two matrices built from equal index arrays have one type. The arrays are
    read-only NumPy int64 arrays; derived index maps (row of each entry, the
    transposed pattern, the diagonal's positions) are computed once and kept,
    the rows and the transpose's permutation as int32 where they fit.
    """

    __slots__ = ("shape", "indptr", "indices", "_key", "_cache", "__weakref__")

    def __init__(self, shape, indptr, indices):
        shape = tuple(int(d) for d in shape)
        indptr = np.array(indptr, dtype=np.int64).ravel()
        indices = np.array(indices, dtype=np.int64).ravel()
        if len(shape) != 2 or min(shape) < 0:
            raise ShapeError(f"a sparse matrix has a 2-D shape, got {shape}.", op="sparse")
        n, m = shape
        if indptr.shape != (n + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0) \
                or indptr[-1] != indices.size:
            raise ShapeError(
                f"`indptr` must be non-decreasing, of length n_rows + 1 = {n + 1}, start "
                f"at 0 and end at len(indices) = {indices.size}; got length "
                f"{indptr.size} ending at {indptr[-1] if indptr.size else None}.",
                op="sparse")
        if indices.size and (indices.min() < 0 or indices.max() >= m):
            raise ShapeError(f"column indices must lie in [0, {m}), got "
                             f"[{indices.min()}, {indices.max()}].", op="sparse")
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        key = rows * max(m, 1) + indices
        if indices.size > 1 and not np.all(np.diff(key) > 0):
            raise ShapeError("column indices must be sorted and unique within each row "
                             "(canonical CSR); `sd.sparse.coo_matrix` sorts and sums "
                             "duplicates for you.", op="sparse")
        indptr.setflags(write=False)
        indices.setflags(write=False)
        self.shape = shape
        self.indptr = indptr
        self.indices = indices
        digest = hashlib.blake2b(digest_size=8)
        digest.update(np.asarray(shape, np.int64).tobytes())
        digest.update(indptr.tobytes())
        digest.update(indices.tobytes())
        self._key = digest.hexdigest()
        # (kept compact: int32 where it fits, aligned, so that the device
        # index array of the rows shares it on the CPU; `rows` widens it)
        self._cache: dict[str, Any] = {"rows": aligned(rows, np.int32 if n < 2 ** 31
                                                       else np.int64)}

    # -- identity ------------------------------------------------------------
    def __eq__(self, other) -> bool:
        if self is other:
            return True
        return (isinstance(other, Pattern) and self._key == other._key
                and self.shape == other.shape
                and np.array_equal(self.indptr, other.indptr)
                and np.array_equal(self.indices, other.indices))

    def __hash__(self) -> int:
        return hash(self._key)

    def fingerprint(self) -> str:
        """A short content hash, printed where the pattern is a param."""
        return self._key[:6]

    def __str__(self) -> str:
        n, m = self.shape
        return f"#{self.fingerprint()}<{n}x{m}, nnz={self.nnz}>"

    def __repr__(self) -> str:
        return f"Pattern(shape={self.shape}, nnz={self.nnz}, #{self.fingerprint()})"

    # -- derived index maps (computed once) ----------------------------------
    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def rows(self) -> np.ndarray:
        """The row of each stored entry: int64, a new read-only array on
        each call, made from `row_index()` (callers do arithmetic with it,
        such as `rows * n + cols`, that int32 would overflow)."""
        rows = self._cache["rows"].astype(np.int64)
        rows.setflags(write=False)
        return rows

    def row_index(self) -> np.ndarray:
        """The row of each stored entry as it is kept: read-only, int32
        where the rows fit (an index to read with, not to compute with;
        the device index array of the rows shares it on the CPU)."""
        return self._cache["rows"]

    def _cached(self, name: str, make):
        value = self._cache.get(name)
        if value is None:
            value = self._cache[name] = make()
        return value

    def transposed(self) -> tuple["Pattern", np.ndarray]:
        """`(pattern of A.T, perm)` with `data(A.T) = data(A)[perm]` (`perm`
        read-only, int32 where `nnz < 2^31`: an index, never arithmetic)."""
        def make():
            n, m = self.shape
            # (SciPy's compiled CSR -> CSC conversion carrying each entry's
            # position: a counting sort by column that keeps the rows in
            # order, O(nnz), where a sort by (column, row) took 0.6 s for a
            # 263,000-node HEX8 mesh's pattern)
            import scipy.sparse as sp

            csc = sp.csr_matrix((np.arange(self.nnz, dtype=np.int64), self.indices, self.indptr),
                                shape=self.shape).tocsc()
            # (int32 where it fits, aligned and read-only: the device index
            # array of the transpose, `sciad.solvers._indices`, shares it on
            # the CPU; 75 MiB, not 151 twice, at a million HEX8 nodes)
            perm = aligned(csc.data, np.int32 if self.nnz < 2 ** 31 else np.int64)
            if n == m and np.array_equal(csc.indptr, self.indptr) \
                    and np.array_equal(csc.indices, self.indices):
                # (structurally symmetric, as every stiffness matrix is: the
                # transpose's pattern is this one, not a second copy of it,
                # 300 MiB at a million unknowns)
                return self, perm
            return Pattern((m, n), csc.indptr, csc.indices), perm
        return self._cached("transposed", make)

    def is_structurally_symmetric(self) -> bool:
        def make():
            if self.shape[0] != self.shape[1]:
                return False
            t, _ = self.transposed()
            return t == self
        return self._cached("symmetric", make)

    def diagonal_positions(self) -> np.ndarray:
        """For each `i < min(shape)`, the data index of entry `(i, i)`, or -1."""
        def make():
            k = min(self.shape)
            pos = np.full(k, -1, np.int64)
            rows = self.row_index()
            on_diag = np.nonzero(rows == self.indices)[0]
            pos[rows[on_diag]] = on_diag
            pos.setflags(write=False)
            return pos
        return self._cached("diagonal", make)

    def positions_of(self, rows, cols) -> np.ndarray:
        """The data index of each `(rows[k], cols[k])`, or -1 where the pattern
        has no such entry."""
        rows = np.asarray(rows, np.int64).ravel()
        cols = np.asarray(cols, np.int64).ravel()
        m = max(self.shape[1], 1)
        key = self.rows * m + self.indices
        want = rows * m + cols
        pos = np.searchsorted(key, want)
        pos = np.minimum(pos, max(key.size - 1, 0))
        found = (key.size > 0) & (key[pos] == want) if key.size else np.zeros(
            want.shape, bool)
        return np.where(found, pos, -1).astype(np.int64)

    def empty_lines(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows and columns without any stored entry."""
        def make():
            n, m = self.shape
            empty_rows = np.nonzero(np.diff(self.indptr) == 0)[0]
            empty_cols = np.nonzero(np.bincount(self.indices, minlength=m) == 0)[0]
            return empty_rows, empty_cols
        return self._cached("empty", make)

    @classmethod
    def from_coo(cls, shape, row, col) -> tuple["Pattern", np.ndarray]:
        """The canonical pattern of COO coordinates (duplicates merged) and, for
        each input entry, its data index in that pattern (read-only).

        The last few results are kept, by a digest of the coordinates: a
        function that assembles its matrix from the same coordinates in every
        trace (forward, gradient, ...) sorts them once and gets one `Pattern`
        object (whose derived arrays, device index arrays included, are then
        made once)."""
        shape = tuple(int(d) for d in shape)
        row = np.asarray(row).ravel()
        col = np.asarray(col).ravel()
        if row.shape != col.shape:
            raise ShapeError(f"`row` and `col` must have one length, got {row.size} and "
                             f"{col.size}.", op="sparse.coo_matrix")
        for name, idx in (("row", row), ("col", col)):
            if idx.size and idx.dtype.kind not in "iu":
                raise ShapeError(f"`{name}` must hold integers, got dtype {idx.dtype}.",
                                 op="sparse.coo_matrix")
        row, col = row.astype(np.int64, copy=False), col.astype(np.int64, copy=False)
        n, m = shape
        if row.size and (row.min() < 0 or row.max() >= n or col.min() < 0
                         or col.max() >= m):
            raise ShapeError(f"coordinates out of range for shape {shape}: rows in "
                             f"[{row.min()}, {row.max()}], cols in [{col.min()}, "
                             f"{col.max()}].", op="sparse.coo_matrix")
        digest = hashlib.blake2b(digest_size=16)
        digest.update(np.ascontiguousarray(row).tobytes())
        digest.update(np.ascontiguousarray(col).tobytes())
        cache_key = (cls, shape, row.size, digest.digest())
        return _cache.cached(_cache.GLOBAL, "coo index map", cache_key,
                             lambda: cls._from_coo_uncached(shape, row, col),
                             limit=FROM_COO_CACHED)

    @classmethod
    def _from_coo_uncached(cls, shape, row, col):
        n, m = shape
        grouped = _coo_grouped(n, m, row, col)
        if grouped is not None:
            indptr, indices, dest = grouped
            dest.setflags(write=False)
            return cls(shape, indptr, indices), dest
        return cls._from_coo_sorted(shape, row, col)

    @classmethod
    def _from_coo_sorted(cls, shape, row, col):
        """`_from_coo_uncached` by one global sort of the coordinates (where
        SciPy's compiled grouping is not importable)."""
        n, m = shape
        key = row * max(m, 1) + col
        uniq, dest = np.unique(key, return_inverse=True)
        del key
        u_rows, u_cols = uniq // max(m, 1), uniq % max(m, 1)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(u_rows, minlength=n), out=indptr[1:])
        dest = np.ascontiguousarray(dest.reshape(-1), dtype=np.int64)
        if dest.base is not None:
            dest = dest.copy()
        dest.setflags(write=False)
        return cls(shape, indptr, u_cols), dest

    def to_json(self) -> dict:
        from ._serialize import _encode_array  # (here: _serialize imports this module)

        return {"shape": list(self.shape), "indptr": _encode_array(self.indptr),
                "indices": _encode_array(self.indices)}

    @classmethod
    def from_json(cls, d: dict) -> "Pattern":
        from ._serialize import _charge, _decode_array, _decode_shape  # (a cycle, as above)

        shape = _decode_shape(d["shape"], "a sparse pattern", limit="dim")
        if len(shape) == 2:  # (else the constructor says what is wrong)
            # the rows are counted with `indptr`; the columns here, as shape
            # rules build per-column index maps (`transposed`)
            _charge(shape[1], f"a sparse pattern's {shape[1]} columns")
        return cls(shape, _decode_array(d["indptr"]), _decode_array(d["indices"]))


#: `Pattern.from_coo` results kept (by a digest of the coordinates)
FROM_COO_CACHED = 4


def _coo_grouped(n: int, m: int, row: np.ndarray, col: np.ndarray):
    """`(indptr, indices, dest)` of COO coordinates, duplicates merged, by
    SciPy's compiled CSR grouping (`coo_tocsr`, a counting sort by row, then
    each row's columns sorted: `csr_sort_indices`) carrying each entry's
    position: about twice as fast as one global sort of the coordinates
    (the 8.4 M entries of a 263,000-node HEX8 mesh: 0.38 s against 0.6 to
    0.85 s). None where SciPy's private module is missing."""
    try:
        from scipy.sparse import _sparsetools
    except ImportError:  # pragma: no cover - depends on the SciPy version
        return None
    N = row.size
    idx = np.int32 if max(n, m, N) < 2 ** 31 - 1 else np.int64
    indptr = np.empty(n + 1, idx)
    indices = np.empty(N, idx)
    ids = np.empty(N, idx)
    _sparsetools.coo_tocsr(n, m, N, row.astype(idx), col.astype(idx), np.arange(N, dtype=idx),
                           indptr, indices, ids)
    _sparsetools.csr_sort_indices(n, indptr, indices, ids)
    counts = np.diff(indptr)
    first = np.ones(N, bool)  # (an entry that starts a new (row, col))
    if N:
        np.not_equal(indices[1:], indices[:-1], out=first[1:])
        first[indptr[:-1][counts > 0]] = True
    dest = np.empty(N, np.int64)
    dest[ids] = np.cumsum(first, dtype=np.int64) - 1
    u_rows = np.repeat(np.arange(n, dtype=np.int64), counts)[first]
    out_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(u_rows, minlength=n), out=out_ptr[1:])
    return out_ptr, indices[first].astype(np.int64), dest


@dataclass(frozen=True, slots=True)
class SparseType(AbstractType):
    """A sparse matrix in CSR form: static `pattern`, `dtype` and structure `tags`.

    At run time a sparse value is its `data` vector: the `nnz` stored entries
    in the pattern's order. Its tangents and cotangents are sparse values on
    the same pattern, so a gradient with respect to a sparse matrix costs
    `nnz` numbers, never a dense `n x m` array.
    """

    pattern: Pattern
    dtype: np.dtype
    tags: frozenset = field(default=frozenset())

    def __post_init__(self):
        if not isinstance(self.pattern, Pattern):
            raise ShapeError(f"SparseType needs a Pattern, got {self.pattern!r}.",
                             op="sparse")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        tags = frozenset(self.tags)
        unknown = tags - KNOWN_TAGS
        if unknown:
            raise InvalidOptionError(f"unknown structure tag(s) {sorted(unknown)}; known: "
                                     f"{sorted(KNOWN_TAGS)}.", op="sparse")
        object.__setattr__(self, "tags", tags)

    format = "csr"

    @property
    def shape(self) -> tuple[int, int]:
        return self.pattern.shape

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nnz(self) -> int:
        return self.pattern.nnz

    @property
    def size(self) -> int:
        return self.pattern.nnz

    @property
    def data_type(self) -> TensorType:
        """The type of the run-time `data` vector."""
        return TensorType((self.nnz,), self.dtype)

    def update(self, **kw) -> "SparseType":
        return SparseType(kw.get("pattern", self.pattern), kw.get("dtype", self.dtype),
                          kw.get("tags", frozenset()))

    def str_short(self) -> str:
        n, m = self.shape
        tags = "".join(f"; {t}" for t in sorted(self.tags))
        return f"csr<{dtype_short(self.dtype)}>[{n},{m}; nnz={self.nnz}{tags}]"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": "sparse", "format": "csr", "dtype": self.dtype.name,
                               "pattern": self.pattern.to_json()}
        if self.tags:
            out["tags"] = sorted(self.tags)
        return out


register_type_kind("sparse", lambda d: SparseType(
    Pattern.from_json(d["pattern"]), dtype_from_short(d["dtype"]),
    frozenset(d.get("tags", ()))))


def runtime_type(t: AbstractType) -> TensorType | None:
    """The `TensorType` of a value's run-time array (a sparse matrix's `data`),
    or None for types without one."""
    if isinstance(t, TensorType):
        return t
    if isinstance(t, SparseType):
        return t.data_type
    if isinstance(t, BatchedType):  # (a batch of sparse matrices: of their data)
        inner = runtime_type(t.inner)
        return None if inner is None else TensorType((t.size,) + inner.shape, t.dtype)
    return None


class SparseArray:
    """A concrete sparse matrix: its `data` vector (a NumPy or JAX array) and
    its `SparseType`. What `sd.sparse` constructors return outside a trace,
    what `sd.function` returns for a sparse output, and what can be passed
    as an argument of a traced function. Inside a trace a sparse value is a
    `Tracer` of `SparseType`; both support the same operations.

    It is a JAX pytree (its `data` is the one leaf), so it passes through
    `jax.jit` and `jax.tree_util` unchanged.
    """

    __slots__ = ("data", "type")
    __array_priority__ = 1000

    def __init__(self, data, type: SparseType):
        if not isinstance(type, SparseType):
            raise ShapeError(f"SparseArray needs a SparseType, got {type!r}.", op="sparse")
        shape = tuple(getattr(data, "shape", np.shape(data)))
        if shape != (type.nnz,):
            raise ShapeError(f"the data of {type.str_short()} must have shape "
                             f"({type.nnz},), got {shape}.", op="sparse")
        self.data = data
        self.type = type

    shape = property(lambda self: self.type.shape)
    dtype = property(lambda self: self.type.dtype)
    ndim = property(lambda self: 2)
    nnz = property(lambda self: self.type.nnz)
    pattern = property(lambda self: self.type.pattern)
    tags = property(lambda self: self.type.tags)

    def __repr__(self) -> str:
        return f"SparseArray({self.type.str_short()})"


def _register_sparse_pytree():
    jax.tree_util.register_pytree_node(
        SparseArray, lambda s: ((s.data,), s.type), lambda t, c: SparseArray(c[0], t))


_register_sparse_pytree()


def value_type(x) -> AbstractType:
    """The type of a concrete value: a `SparseArray`'s own, else a `TensorType`."""
    if isinstance(x, SparseArray):
        return x.type
    return TensorType.of(x)


# method -> function(FactorType) -> the TensorTypes of its run-time arrays;
# filled by the primitives that make factorizations (`linalg.factor`)
_FACTOR_LAYOUTS: dict[str, Any] = {}


def register_factor_layout(method: str, layout) -> None:
    """How a factorization of `method` is held at run time: `layout(t)` gives
    the `TensorType`s of the arrays that make up a value of `FactorType` `t`."""
    _FACTOR_LAYOUTS[method] = layout


@dataclass(frozen=True, slots=True)
class FactorType(AbstractType):
    """A factorization of an `n x n` matrix (`method`: "lu", "cholesky", ...),
    made once and used by every solve with that matrix. Not differentiable:
    it appears only after differentiation, when the factor-sharing pass
    rewrites `linalg.solve` nodes. Its run-time value is a tuple of arrays
    (`leaf_types`): a dense factorization's arrays, or a handle to one kept
    on the host."""

    shape: tuple[int, int]
    dtype: np.dtype
    method: str
    pattern: Pattern | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    def update(self, **kw) -> "FactorType":
        return self

    @property
    def leaf_types(self) -> tuple[TensorType, ...]:
        """The types of the arrays a value of this type is made of."""
        layout = _FACTOR_LAYOUTS.get(self.method)
        assert layout is not None, f"no run-time layout for factorizations {self.method!r}"
        return tuple(layout(self))

    def str_short(self) -> str:
        n, m = self.shape
        return f"factor<{self.method}, {dtype_short(self.dtype)}>[{n},{m}]"

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": "factor", "shape": list(self.shape),
                               "dtype": self.dtype.name, "method": self.method}
        if self.pattern is not None:
            out["pattern"] = self.pattern.to_json()
        return out


register_type_kind("factor", lambda d: FactorType(
    tuple(d["shape"]), dtype_from_short(d["dtype"]), str(d["method"]),
    Pattern.from_json(d["pattern"]) if d.get("pattern") is not None else None))


@dataclass(frozen=True, slots=True)
class BatchedType(AbstractType):
    """A batch of `size` values of a type that is not an array: sparse
    matrices on one pattern, factorizations of such matrices (a batch of
    arrays is an array with one more axis). Its run-time arrays are
    `inner`'s with a leading axis of `size`. `sd.vmap` makes them, and only
    `map` nodes (`sciad.primitives._map`) read them."""

    inner: AbstractType
    size: int

    def __post_init__(self):
        assert not isinstance(self.inner, TensorType), "a batch of arrays is an array"
        object.__setattr__(self, "size", int(self.size))

    @property
    def dtype(self) -> np.dtype:
        return self.inner.dtype

    @property
    def tags(self) -> frozenset:
        return getattr(self.inner, "tags", frozenset())

    def update(self, **kw) -> "BatchedType":
        return BatchedType(self.inner.update(**kw), self.size)

    def str_short(self) -> str:
        return f"{self.size} x {self.inner.str_short()}"

    def to_json(self) -> dict:
        return {"kind": "batched", "size": self.size, "inner": self.inner.to_json()}


register_type_kind("batched", lambda d: BatchedType(type_from_json(d["inner"]), d["size"]))


def holds_tuple(t: AbstractType) -> bool:
    """Whether a value of type `t` is a tuple of arrays at run time (a
    factorization, or a batch of them) rather than one array."""
    return isinstance(t, FactorType) or (isinstance(t, BatchedType) and holds_tuple(t.inner))


def leaf_types(t: AbstractType) -> tuple[TensorType, ...] | None:
    """The types of the run-time arrays of a value of type `t`, in order: a
    tensor's own, a sparse matrix's data vector, a factorization's arrays
    (for a batch of values, each with a leading batch axis); None for types
    without a run-time form."""
    if isinstance(t, FactorType):
        return t.leaf_types
    if isinstance(t, BatchedType):
        inner = leaf_types(t.inner)
        return None if inner is None else tuple(
            x.update(shape=(t.size,) + tuple(x.shape)) for x in inner)
    rt = runtime_type(t)
    return None if rt is None else (rt,)
