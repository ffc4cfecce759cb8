"""Sparse matrices with a static pattern and differentiable values.

```python
import sciad as sd, sciad.numpy as snp

def residual(k, u):
    # SciPy's COO constructor: duplicate entries are summed
    K = sd.sparse.coo_matrix((k_entries(k), (rows, cols)), shape=(n, n))
    return K @ u - f
```

The pattern (`indices`/`indptr`, or `row`/`col`) is static: NumPy integers,
known when the function is traced. The values (`data`) may be traced and are
differentiable; the derivative with respect to a sparse matrix is a sparse
matrix on the same pattern (`nnz` numbers, never a dense `n x n` array).
Inside a traced function a sparse matrix is a traced value of type
`csr<f64>[n,m; nnz=...]`; outside, the constructors return a `SparseArray`
(its `data` and type). Both support `A @ x`, `x @ A`, `A.T`, `A * s`,
`A / s`, `-A`, `A + B` and `A - B` (patterns are merged), `A.diagonal()`,
`A.todense()` and `A.data`.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from . import _sparse_jacobian, numpy as snp
from .errors import DTypeError, InvalidOptionError, ShapeError, StructureError
from .graph import Tracer
from .graph._types import KNOWN_TAGS, Pattern, SparseArray, SparseType
from .primitives._sparse import (
    IndexMap,
    assemble,
    assemble_at,
    gather,
    sparse_matmul_p,
    sparse_sample_p,
    sparse_sddmm_p,
    sparse_todense_p,
    sparse_transpose_p,
)
from .primitives._sparse_sharded import RowPartition, row_partition, sharded_matmul_p

__all__ = [
    "SparseArray", "SparseType", "Pattern", "issparse", "csr_matrix", "coo_matrix",
    "assemble_elements",
    "from_scipy", "from_dense", "sample", "sddmm", "matmul", "transpose", "diagonal", "todense", "data",
    "with_data", "astype", "jacobian_sparsity", "jacobian", "RowPartition", "row_partition",
    "sharded_matmul",
]


def issparse(x) -> bool:
    """Whether `x` is a sparse matrix (concrete or traced)."""
    return isinstance(getattr(x, "type", None), SparseType) and isinstance(
        x, (Tracer, SparseArray))


def _tags(tags, op: str) -> frozenset:
    tags = frozenset([tags] if isinstance(tags, str) else (tags or ()))
    unknown = tags - KNOWN_TAGS
    if unknown:
        raise InvalidOptionError(f"unknown structure tag(s) {sorted(unknown)}; known: "
                                 f"{sorted(KNOWN_TAGS)}.", op=op)
    return tags


def _check_tags(pattern: Pattern, tags: frozenset, op: str) -> None:
    """Static checks of structure tags (the values are checked at run time by
    the solvers that rely on them, with `sciad.config.enable_checks` on)."""
    if {"symmetric", "spd", "hermitian"} & tags:
        if pattern.shape[0] != pattern.shape[1]:
            raise ShapeError(f"a {pattern.shape} matrix cannot be tagged "
                             f"{sorted(tags)}: it is not square.", op=op)
        if not pattern.is_structurally_symmetric():
            raise StructureError(f"the pattern is not symmetric, so the matrix cannot be "
                                 f"tagged {sorted(tags & {'symmetric', 'spd', 'hermitian'})}"
                                 f": give a symmetric pattern (with explicit zeros where "
                                 f"needed), or drop the tag (and `assume=`).", op=op)


def _static_ints(x, name: str, op: str) -> np.ndarray:
    if isinstance(x, Tracer):
        raise DTypeError(f"`{name}` must be static (NumPy integers known when the "
                         "function is traced); only `data` may be a traced value.", op=op)
    arr = np.asarray(x)
    if arr.size and arr.dtype.kind not in "iu":
        raise DTypeError(f"`{name}` must hold integers, got dtype {arr.dtype}.", op=op)
    return arr.astype(np.int64).ravel()


def _data_operand(data, op: str, name: str = "data", vector: bool = True):
    """`data` as a traced or concrete numeric array (a vector unless not
    `vector`), integers and booleans as float64."""
    if isinstance(data, Tracer):
        d = data
    else:
        d = snp.asarray(data)
    if vector and d.ndim != 1:
        raise ShapeError(f"`{name}` must be a vector, got shape {tuple(d.shape)}.", op=op)
    if np.dtype(d.dtype).kind not in "fciub":
        raise DTypeError(f"`{name}` must be numeric, got {d.dtype}.", op=op)
    if np.dtype(d.dtype).kind in "iub":
        d = snp.astype(d, np.float64)
    return d


def _assemble(data, pattern: Pattern, index: np.ndarray | None, tags: frozenset, op: str):
    _check_tags(pattern, tags, op)
    return assemble_at(data, pattern, index, tags)


def csr_matrix(arg, shape=None, *, tags: Iterable[str] = ()):
    """A CSR matrix from `(data, indices, indptr)`, as SciPy's `csr_matrix`.

    **Arguments:**

    - `arg`: `(data, indices, indptr)`. `indices` and `indptr` are static
      integer arrays; `data` (length `nnz`) may be traced. Unsorted or
      duplicate column indices are allowed and handled as SciPy's
      `sum_duplicates` would.
    - `shape`: `(n, m)`; by default `n = len(indptr) - 1` and `m` one past the
      largest column index.
    - `tags`: structural facts the solvers may use: `"symmetric"`, `"spd"`
      (symmetric positive definite), `"hermitian"`, `"lower"`, `"upper"`,
      `"diagonal"`. The pattern is checked here; the values with
      `sciad.config.enable_checks` on.

    **Returns:**

    A sparse matrix (`SparseArray` outside a trace, a traced value inside).
    """
    op = "sparse.csr_matrix"
    if not (isinstance(arg, tuple) and len(arg) == 3):
        raise ShapeError("expects `(data, indices, indptr)`; for COO use "
                         "`sd.sparse.coo_matrix((data, (row, col)), shape)`.", op=op)
    data, indices, indptr = arg
    indices = _static_ints(indices, "indices", op)
    indptr = _static_ints(indptr, "indptr", op)
    n = indptr.size - 1
    if n < 0:
        raise ShapeError("`indptr` must have at least one entry.", op=op)
    if shape is None:
        shape = (n, int(indices.max()) + 1 if indices.size else 0)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or shape[0] != n:
        raise ShapeError(f"`shape` {shape} does not fit `indptr` of length {indptr.size} "
                         f"(n_rows + 1).", op=op)
    data = _data_operand(data, op)
    if data.shape[0] != indices.size:
        raise ShapeError(f"`data` has {data.shape[0]} entries, `indices` {indices.size}.",
                         op=op)
    if indptr[0] != 0 or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0):
        raise ShapeError(f"`indptr` must be non-decreasing from 0 to len(indices) = "
                         f"{indices.size}.", op=op)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    pattern, dest = Pattern.from_coo(shape, rows, indices)
    return _assemble(data, pattern, dest, _tags(tags, op), op)


def coo_matrix(arg, shape=None, *, tags: Iterable[str] = ()):
    """A sparse matrix from `(data, (row, col))`, as SciPy's `coo_matrix`;
    duplicate entries are summed. Stored in CSR form.

    `row` and `col` are static integer arrays; `data` may be traced. `shape`
    defaults to one past the largest row and column index. See `csr_matrix`
    for `tags`.
    """
    op = "sparse.coo_matrix"
    if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[1], tuple)
            and len(arg[1]) == 2):
        raise ShapeError("expects `(data, (row, col))`.", op=op)
    data, (row, col) = arg
    row = _static_ints(row, "row", op)
    col = _static_ints(col, "col", op)
    if shape is None:
        shape = (int(row.max()) + 1 if row.size else 0, int(col.max()) + 1 if col.size else 0)
    data = _data_operand(data, op)
    if data.shape[0] != row.size:
        raise ShapeError(f"`data` has {data.shape[0]} entries, `row` and `col` "
                         f"{row.size}.", op=op)
    pattern, dest = Pattern.from_coo(shape, row, col)
    return _assemble(data, pattern, dest, _tags(tags, op), op)


#: how many element index maps (`assemble_elements`) are kept, the least
#: recently used dropped first
ELEMENT_MAPS_CACHED = 4


def _element_dofs(dofs, op: str) -> tuple[np.ndarray, np.ndarray]:
    """`(row_dofs, col_dofs)`, each `(m, k)` int64, from `dofs`: one array
    (square elements) or a pair."""
    pair = isinstance(dofs, tuple)
    if pair and len(dofs) != 2:
        raise ShapeError(f"`dofs` is one (m, k) array or a pair (row_dofs, col_dofs), got a "
                         f"tuple of {len(dofs)}.", op=op)
    out = []
    for name, d in zip(("row_dofs", "col_dofs") if pair else ("dofs",),
                       dofs if pair else (dofs,)):
        if isinstance(d, Tracer):
            raise DTypeError(f"`{name}` must be static (NumPy integers known when the "
                             "function is traced); only `values` may be a traced value.",
                             op=op)
        a = np.asarray(d)
        if a.ndim != 2:
            raise ShapeError(f"`{name}` must be an (elements, dofs per element) array, got "
                             f"shape {a.shape}.", op=op)
        if a.size and a.dtype.kind not in "iu":
            raise DTypeError(f"`{name}` must hold integers, got dtype {a.dtype}.", op=op)
        out.append(a.astype(np.int64, copy=False))
    rows, cols = (out[0], out[0]) if not pair else out
    if rows.shape[0] != cols.shape[0]:
        raise ShapeError(f"`row_dofs` has {rows.shape[0]} elements, `col_dofs` "
                         f"{cols.shape[0]}.", op=op)
    return rows, cols


def _element_map(shape, rows: np.ndarray, cols: np.ndarray):
    """`(pattern, index)`: the pattern of every `(rows[e, a], cols[e, b])`
    with both non-negative, and the `IndexMap` from the flattened `(m, k,
    l)` element values to its entries (-1 for a dropped one; None where each
    value is its entry, in order). Kept by a
    digest of the dofs (`ELEMENT_MAPS_CACHED` of them)."""
    import hashlib

    from . import _cache

    digest = hashlib.blake2b(digest_size=16)
    for a in (rows, cols):
        digest.update(np.ascontiguousarray(a).tobytes())
    key = (tuple(shape), rows.shape, cols.shape, digest.digest())

    def make():
        m, k = rows.shape
        l = cols.shape[1]
        r = np.broadcast_to(rows[:, :, None], (m, k, l)).reshape(-1)
        c = np.broadcast_to(cols[:, None, :], (m, k, l)).reshape(-1)
        keep = (r >= 0) & (c >= 0)
        everything = bool(keep.all())
        if not everything:
            r, c = r[keep], c[keep]
        pattern, dest = Pattern._from_coo_uncached(tuple(shape), r, c)
        del r, c
        if not everything:
            full = np.full(keep.size, -1, np.int64)
            full[keep] = dest
            dest = full
        elif dest.size == pattern.nnz and np.array_equal(dest, np.arange(pattern.nnz)):
            return pattern, None  # (every entry once, in order: no map)
        return pattern, IndexMap(dest)

    return _cache.cached(_cache.GLOBAL, "element index map", key, make,
                         limit=ELEMENT_MAPS_CACHED)


def assemble_elements(values, dofs, shape=None, *, tags: Iterable[str] = ()):
    """A sparse matrix summed from dense element matrices, as a finite-element
    code assembles its stiffness matrix: `A[dofs[e, a], dofs[e, b]] +=
    values[e, a, b]` for every element `e`, an entry whose degree of freedom
    is negative dropped (a constrained one, eliminated).

    The pattern and the map from element entries to stored entries are made
    once per `dofs` (kept by a digest of it, a few meshes at a time) and
    read as one index array by the program: what the user holds is `dofs`,
    `(elements, k)` integers, not the `k * k` coordinates per element that
    `coo_matrix` takes. The derivative with respect to `values` is a gather
    of the matrix's cotangent, `(elements, k, k)`.

    **Arguments:**

    - `values`: `(m, k, k)` element matrices (`(m, k, l)` with a pair of
      dofs), traced or concrete; integers become float64.
    - `dofs`: static `(m, k)` integers: the global row and column of each
      element's local degrees of freedom, negative for one to drop; or a
      pair `(row_dofs, col_dofs)` of `(m, k)` and `(m, l)` arrays for
      rectangular element matrices.
    - `shape`: `(n, n')`; by default one past the largest row and column.
    - `tags`: as `csr_matrix`'s (`"spd"` for a stiffness matrix).

    **Returns:**

    A sparse matrix (traced inside a trace, a `SparseArray` outside).

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    # two triangles on four nodes; node 0 is held fixed (its rows dropped)
    cells = np.array([[0, 1, 2], [1, 3, 2]])
    dofs = np.where(cells == 0, -1, cells - 1)
    Ke = np.array([[1.0, -0.5, -0.5], [-0.5, 0.5, 0.0], [-0.5, 0.0, 0.5]])

    def total(k):  # k: one coefficient per element
        K = sd.sparse.assemble_elements(k[:, None, None] * Ke, dofs, tags=["spd"])
        return snp.sum(sd.linalg.solve(K, np.ones(3)))

    sd.function(total)(np.array([1.0, 2.0]))
    # 10.2
    sd.grad(total)(np.array([1.0, 2.0]))
    # [-9.04, -0.58]
    ```
    """
    op = "sparse.assemble_elements"
    rows, cols = _element_dofs(dofs, op)
    m, k, l = rows.shape[0], rows.shape[1], cols.shape[1]
    data = _data_operand(values, op, "values", vector=False)
    if tuple(data.shape) != (m, k, l):
        raise ShapeError(f"`values` must have shape (elements, k, l) = {(m, k, l)} for these "
                         f"dofs, got {tuple(data.shape)}.", op=op)
    if shape is None:
        shape = (int(rows.max()) + 1 if rows.size else 0,
                 int(cols.max()) + 1 if cols.size else 0)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or (rows.size and rows.max() >= shape[0]) \
            or (cols.size and cols.max() >= shape[1]):
        raise ShapeError(f"`shape` {shape} does not hold the dofs (largest row "
                         f"{int(rows.max()) if rows.size else -1}, column "
                         f"{int(cols.max()) if cols.size else -1}).", op=op)
    pattern, index = _element_map(shape, rows, cols)
    tags = _tags(tags, op)
    _check_tags(pattern, tags, op)
    flat = snp.reshape(data, (m * k * l,))
    return assemble(flat, pattern, index, tags)


def from_scipy(M, *, tags: Iterable[str] = ()):
    """A constant sparse matrix from any SciPy sparse matrix or array (its
    explicit zeros are kept in the pattern)."""
    import scipy.sparse as sp

    if not sp.issparse(M):
        raise DTypeError(f"expects a SciPy sparse matrix, got {type(M).__name__}.",
                         op="sparse.from_scipy")
    C = sp.csr_array(M, copy=True)
    C.sum_duplicates()
    C.sort_indices()
    data = np.asarray(C.data)
    if data.dtype.kind in "iub":
        data = data.astype(np.float64)
    return csr_matrix((data, C.indices, C.indptr), shape=C.shape, tags=tags)


def from_dense(D, *, tags: Iterable[str] = ()):
    """A constant sparse matrix holding the nonzeros of a concrete dense array.
    (For a traced dense array, give the pattern: `sd.sparse.sample(D, pattern)`.)"""
    if isinstance(D, Tracer):
        raise DTypeError("the pattern of a traced dense array is not known; build the "
                         "matrix from its entries with `coo_matrix`.",
                         op="sparse.from_dense")
    import scipy.sparse as sp

    return from_scipy(sp.csr_array(np.asarray(D)), tags=tags)


def sample(D, pattern: Pattern):
    """The entries of dense `D` on `pattern`, as a sparse matrix."""
    D = snp.asarray(D)
    if np.dtype(D.dtype).kind not in "fc":
        D = snp.astype(D, np.float64)
    return sparse_sample_p.bind(D, pattern=pattern)


def sddmm(u, v, pattern: Pattern):
    """`u @ v.T` kept on `pattern` (for vectors, the outer product `u v^T`):
    `data_k = sum_j u[r_k, j] v[c_k, j]`. The gradient of `A @ x` with
    respect to `A` is `sddmm(ct, x)`."""
    u, v = snp.asarray(u), snp.asarray(v)
    dtype = np.result_type(u.dtype, v.dtype, np.float32)
    return sparse_sddmm_p.bind(snp.astype(u, dtype), snp.astype(v, dtype), pattern=pattern)


# ---------------------------------------------------------------------------
# operations


def _check_sparse(A, op: str) -> SparseType:
    if not issparse(A):
        raise DTypeError(f"expects a sparse matrix, got {type(A).__name__}.", op=op)
    return A.type


def data(A):
    """The stored values of `A`, a vector of length `nnz` in the pattern's order."""
    _check_sparse(A, "sparse.data")
    return gather(A)


def with_data(A, new_data):
    """A matrix with `A`'s pattern and tags and the values `new_data`."""
    t = _check_sparse(A, "sparse.with_data")
    d = _data_operand(new_data, "sparse.with_data")
    if tuple(d.shape) != (t.nnz,):
        raise ShapeError(f"needs {t.nnz} values for {t.str_short()}, got shape "
                         f"{tuple(d.shape)}.", op="sparse.with_data")
    return assemble(d, t.pattern, None, t.tags)


def astype(A, dtype):
    """`A` with its values converted to `dtype`."""
    t = _check_sparse(A, "sparse.astype")
    dtype = np.dtype(dtype)
    if dtype == t.dtype:
        return A
    return assemble(snp.astype(data(A), dtype), t.pattern, None,
                    t.tags if dtype.kind == t.dtype.kind else frozenset())


def _promote(A, x):
    xt = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    dtype = np.result_type(A.type.dtype, xt)
    if dtype.kind not in "fc":
        dtype = np.result_type(dtype, np.float64)
    return astype(A, dtype), snp.astype(snp.asarray(x), dtype)


def matmul(A, x):
    """`A @ x` for sparse `A` and dense `x` of shape `(m,)` or `(m, k)`; also
    `x @ A` for dense `x` of shape `(n,)` or `(k, n)` and sparse `A`."""
    if issparse(A) and issparse(x):
        raise DTypeError("sparse @ sparse is not supported; multiply one of them by "
                         "a dense array.", op="sparse.matmul")
    if issparse(A):
        A, x = _promote(A, x)
        return sparse_matmul_p.bind(A, x, pattern=A.type.pattern)
    # x @ A = (A.T @ x.T).T
    x, A = A, x
    A, x = _promote(A, x)
    if x.ndim == 1:
        return sparse_matmul_p.bind(A, x, pattern=A.type.pattern, transpose=True)
    if x.ndim != 2:
        raise ShapeError(f"cannot multiply {x.type.str_short() if hasattr(x, 'type') else x.shape}"
                         f" by {A.type.str_short()}.", op="sparse.matmul")
    y = sparse_matmul_p.bind(A, snp.transpose(x), pattern=A.type.pattern, transpose=True)
    return snp.transpose(y)


def sharded_matmul(A, x, partition: RowPartition, *, transpose: bool = False):
    """`A @ x` (or `A.T @ x`) for a square sparse `A` whose rows, and the
    entries of `x`, are split over the devices of a mesh axis.

    **Arguments:**

    - `A`: a square sparse matrix of `n` rows.
    - `x`: a vector of shape `(n,)`.
    - `partition`: `sd.sparse.row_partition(A.type.pattern, devices, axis)`
      (cached per pattern): device `d` of mesh axis `axis` holds rows and
      entries `[d n/devices, (d + 1) n/devices)` of `A`, `x` and the result.
    - `transpose`: multiply by `A.T` instead.

    Under a mesh with `axis` (`jax.set_mesh`, or arguments sharded over one)
    each device computes its own rows after an exchange of the halo values
    only (`ppermute`s or one `all_gather`, as the partition's `exchange`
    says), as does the transpose; without one it computes the same product
    on one device. Differentiable
    in `A`'s values and `x` (the adjoint's products are sharded too).

    ```python
    P = sd.sparse.row_partition(A.type.pattern, 4, "rows")
    with jax.set_mesh(jax.make_mesh((4,), ("rows",))):
        y = sd.function(lambda A, x: sd.sparse.sharded_matmul(A, x, P))(A, x)
    ```
    """
    A, x = _promote(A, x)
    return sharded_matmul_p.bind(A, x, pattern=A.type.pattern, partition=partition,
                                 transpose=transpose)


def transpose(A):
    """`A.T` (a symmetric-tagged matrix is returned as it is)."""
    t = _check_sparse(A, "sparse.transpose")
    if "symmetric" in t.tags or ("spd" in t.tags and t.dtype.kind != "c"):
        return A
    return sparse_transpose_p.bind(A, pattern=t.pattern)


def diagonal(A):
    """The main diagonal of `A` as a dense vector (zeros where not stored)."""
    t = _check_sparse(A, "sparse.diagonal")
    pos = t.pattern.diagonal_positions()
    if pos.size == t.nnz and np.array_equal(pos, np.arange(t.nnz)):
        return data(A)
    return gather(A, IndexMap(pos))


def todense(A):
    """`A` as a dense `(n, m)` array."""
    t = _check_sparse(A, "sparse.todense")
    return sparse_todense_p.bind(A, pattern=t.pattern)


def _scale(A, s, op: str, divide: bool = False):
    t = _check_sparse(A, op)
    s = snp.asarray(s)
    if s.ndim != 0:
        raise ShapeError(f"a sparse matrix can be multiplied or divided by a scalar, got "
                         f"shape {tuple(s.shape)}. For other maps of the stored values "
                         "use `sd.sparse.with_data(A, f(sd.sparse.data(A)))`.", op=op)
    d = data(A)
    new = d / s if divide else d * s
    keep = frozenset(x for x in t.tags if x != "spd")
    return assemble(new, t.pattern, None, keep)


def _negate(A):
    t = _check_sparse(A, "sparse.neg")
    keep = frozenset(x for x in t.tags if x != "spd")
    return assemble(snp.negative(data(A)), t.pattern, None, keep)


def _add(A, B, sign: float):
    """`A + sign * B` for two sparse matrices; patterns are merged."""
    op = "sparse.add" if sign > 0 else "sparse.sub"
    ta, tb = _check_sparse(A, op), _check_sparse(B, op)
    if ta.shape != tb.shape:
        raise ShapeError(f"cannot add {ta.str_short()} and {tb.str_short()}: shapes "
                         "differ.", op=op)
    dtype = np.result_type(ta.dtype, tb.dtype)
    A, B = astype(A, dtype), astype(B, dtype)
    da, db = data(A), data(B)
    db = snp.negative(db) if sign < 0 else db
    tags = ta.tags & tb.tags - ({"spd"} if sign < 0 else set())
    if ta.pattern == tb.pattern:
        return assemble(da + db, ta.pattern, None, tags)
    pa, pb = ta.pattern, tb.pattern
    rows = np.concatenate([pa.rows, pb.rows])
    cols = np.concatenate([pa.indices, pb.indices])
    pattern, dest = Pattern.from_coo(ta.shape, rows, cols)
    both = snp.concatenate([da, db])
    return assemble(both, pattern, IndexMap(dest), tags)


# ---------------------------------------------------------------------------
# operators, shared by traced sparse values and SparseArray; sciad.numpy's
# functions send sparse operands here


def binary_dispatch(name: str, x, y):
    """`sciad.numpy`'s `name(x, y)` with a sparse operand, or NotImplemented."""
    if name == "matmul":
        return matmul(x, y)
    xs, ys = issparse(x), issparse(y)
    if name in ("add", "sub") and xs and ys:
        return _add(x, y, 1.0 if name == "add" else -1.0)
    if name == "mul" and xs != ys:
        return _scale(x, y, "sparse.mul") if xs else _scale(y, x, "sparse.mul")
    if name == "div" and xs and not ys:
        return _scale(x, y, "sparse.div", divide=True)
    raise DTypeError(
        f"`{name}` of {_shown(x)} and {_shown(y)} is not supported on sparse matrices: "
        "they support `A @ x`, `A.T`, `A + B`, `A - B`, scaling by a scalar, and "
        "`sd.sparse.data(A)` / `sd.sparse.with_data(A, d)` for elementwise maps of "
        "the stored values.", op=name)


def unary_dispatch(name: str, x):
    if name == "neg":
        return _negate(x)
    if name == "transpose":
        return transpose(x)
    raise DTypeError(f"`{name}` of {_shown(x)} is not supported on sparse matrices; map "
                     "the stored values with `sd.sparse.with_data(A, f(sd.sparse.data(A)))`"
                     ".", op=name)


def _shown(x) -> str:
    t = getattr(x, "type", None)
    if t is not None:
        return t.str_short()
    return type(x).__name__


def _install_sparse_array_methods() -> None:
    def swap(f):
        return lambda self, other: f(other, self)

    ops = {
        "__matmul__": snp.matmul, "__rmatmul__": swap(snp.matmul),
        "__add__": snp.add, "__radd__": swap(snp.add),
        "__sub__": snp.subtract, "__rsub__": swap(snp.subtract),
        "__mul__": snp.multiply, "__rmul__": swap(snp.multiply),
        "__truediv__": snp.divide,
        "__neg__": snp.negative, "__pos__": lambda self: self,
        "diagonal": diagonal, "todense": todense, "toarray": todense,
        "astype": astype, "transpose": transpose,
    }
    for name, fn in ops.items():
        setattr(SparseArray, name, fn)
    SparseArray.T = property(transpose)


_install_sparse_array_methods()


def jacobian_sparsity(f, *args, argnums: int = 0):
    """The structural sparsity pattern of `f`'s Jacobian, detected from its graph.

    `f` is traced once and its graph interpreted with each primitive's
    sparsity rule: every element of every value carries the set of input
    elements it depends on. The pattern is global (it holds for every value
    of the input) and sound (every entry that can be nonzero is in it); a
    constant matrix's zeros (a stencil) are kept. A primitive without a rule
    is taken as dense in its operands, with a `SparsityWarning` naming it.

    **Arguments:**

    - `f`: a function of arrays returning one array.
    - `*args`: example arguments (only their shapes and dtypes matter, and
      the values of constants in `f`).
    - `argnums`: the argument to differentiate (an int).

    **Returns:**

    A SciPy CSR matrix of booleans of shape `(f(x).size, x.size)`.

    ```python
    import numpy as np, sciad as sd

    def F(u):
        return u[1:] - u[:-1] + u[1:] ** 2

    sd.sparse.jacobian_sparsity(F, np.ones(4)).toarray()
    # [[ True  True False False]
    #  [False  True  True False]
    #  [False False  True  True]]
    ```
    """
    return _sparse_jacobian.jacobian_sparsity(f, *args, argnums=argnums)


def jacobian(f, argnums: int = 0, *, mode: str = "auto"):
    """The Jacobian of `f` as a sparse matrix, by colored forward (or reverse)
    mode.

    The pattern is detected from `f`'s graph (`jacobian_sparsity`) and its
    columns colored: columns that share no row get one color, and one JVP
    per color, seeded with the sum of its columns' unit vectors, gives all
    of them. The JVPs are batched into one graph of the size of one JVP. A
    5-point stencil takes 5 to 7 products, whatever the grid's size, where a
    dense Jacobian takes one per unknown. With fewer outputs than inputs
    the rows may color better, and `mode="auto"` then uses VJPs.

    **Arguments:**

    - `f`: a function of arrays returning one array.
    - `argnums`: the argument to differentiate (an int).
    - `mode`: `"auto"`, `"forward"` (JVPs per column color) or `"reverse"`
      (VJPs per row color).

    **Returns:**

    A function of `f`'s arguments returning a sciad sparse matrix of shape
    `(f(x).size, x.size)` (a traced one inside a trace). Its values are
    differentiable like any sciad value.

    ```python
    import numpy as np, sciad as sd

    def F(u):
        return u[1:] - u[:-1] + u[1:] ** 2

    J = sd.sparse.jacobian(F)(np.ones(4))   # two colors: two JVPs
    J.todense()
    # [[-1.  3.  0.  0.]
    #  [ 0. -1.  3.  0.]
    #  [ 0.  0. -1.  3.]]
    ```
    """
    return _sparse_jacobian.jacobian(f, argnums, mode=mode)

