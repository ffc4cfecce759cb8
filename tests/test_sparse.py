"""Sparse matrices: constructors against SciPy, products and structure ops,
derivatives with respect to the stored values, sparse values as arguments
and results of compiled functions, and the errors users see."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, InvalidOptionError, ShapeError
from program_constants import array_constants


def _random_csr(rng, n, m, density=0.4, dtype=np.float64):
    M = sp.random(n, m, density=density, random_state=int(rng.integers(2**31)), format="csr")
    if dtype == np.complex128:
        M = M + 1j * sp.random(n, m, density=density,
                               random_state=int(rng.integers(2**31)), format="csr")
    M = sp.csr_array(M)
    M.sum_duplicates()
    M.sort_indices()
    return M


def test_coo_sums_duplicates_like_scipy(rng):
    row = np.array([0, 2, 1, 0, 2, 2, 0])
    col = np.array([1, 2, 0, 1, 0, 2, 3])
    d = rng.standard_normal(row.size)
    A = sd.sparse.coo_matrix((d, (row, col)), shape=(3, 4))
    ref = sp.coo_matrix((d, (row, col)), shape=(3, 4)).toarray()
    np.testing.assert_allclose(np.asarray(A.todense()), ref, rtol=0, atol=1e-15)
    assert A.nnz == 5 and A.shape == (3, 4)
    # traced data: the same, through one assemble node
    f = sd.function(lambda d: sd.sparse.coo_matrix((d, (row, col)), shape=(3, 4)).todense())
    np.testing.assert_allclose(np.asarray(f(d)), ref, rtol=0, atol=1e-15)


def test_csr_with_unsorted_and_duplicate_indices(rng):
    indptr = np.array([0, 3, 3, 5])
    indices = np.array([2, 0, 2, 1, 0])
    d = rng.standard_normal(5)
    ref = sp.csr_matrix((d, indices, indptr), shape=(3, 3)).toarray()
    A = sd.sparse.csr_matrix((d, indices, indptr), shape=(3, 3))
    np.testing.assert_allclose(np.asarray(A.todense()), ref, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_products_against_scipy(rng, dtype):
    M = _random_csr(rng, 7, 5, dtype=dtype)
    x, X = rng.standard_normal(5), rng.standard_normal((5, 3))
    y, Y = rng.standard_normal(7), rng.standard_normal((2, 7))
    D = M.toarray()

    def f(d, x, X, y, Y):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        return A @ x, A @ X, A.T @ y, y @ A, Y @ A, A.T.todense(), A.diagonal()

    outs = sd.function(f)(M.data, x, X, y, Y)
    refs = (D @ x, D @ X, D.T @ y, y @ D, Y @ D, D.T, np.diagonal(D))
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(np.asarray(o), r, rtol=1e-13, atol=1e-14)


def test_sum_and_scaling_merge_patterns(rng):
    A = _random_csr(rng, 6, 6)
    B = _random_csr(rng, 6, 6)
    sA, sB = sd.sparse.from_scipy(A), sd.sparse.from_scipy(B)

    def f(s):
        return ((sA + sB) @ np.ones(6), (sA - s * sB) @ np.ones(6), (-sA / 2.0).todense())

    got = sd.function(f)(1.5)
    ref = ((A + B) @ np.ones(6), (A - 1.5 * B) @ np.ones(6), -A.toarray() / 2)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-13, atol=1e-14)
    # eagerly, on SparseArrays, the same
    np.testing.assert_allclose(np.asarray((sA + sB).todense()), (A + B).toarray(),
                               atol=1e-15)


def test_gradient_is_sparse_and_matches_dense_jax(rng):
    M = _random_csr(rng, 8, 8, density=0.3)
    rows, cols = M.nonzero()
    x, w = rng.standard_normal(8), rng.standard_normal(8)

    def loss(d):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        r = A @ x - w
        return 0.5 * snp.sum(r * r) + snp.sum(snp.sin(A.T @ w))

    def loss_dense(D):
        r = D @ x - w
        return 0.5 * jnp.sum(r * r) + jnp.sum(jnp.sin(D.T @ w))

    g = np.asarray(sd.grad(loss)(M.data))
    with jax.enable_x64(True):
        G = np.asarray(jax.grad(loss_dense)(jnp.asarray(M.toarray())))
    np.testing.assert_allclose(g, G[rows, cols], rtol=1e-12, atol=1e-13)
    # the reverse pass forms no dense n x n array
    graph = sd.trace(sd.grad(loss), M.data)
    assert not any(v.type.shape == (8, 8) for n in graph.nodes for v in n.outputs
                   if isinstance(v.type, sd.TensorType))
    assert any(n.primitive.name == "sparse.sddmm" for n in graph.nodes)


def test_sparse_matrix_as_argument_and_result(rng):
    M = _random_csr(rng, 5, 5)
    A = sd.sparse.from_scipy(M)
    x = rng.standard_normal(5)

    @sd.function
    def f(A, x):
        return A @ x, 2.0 * A

    y, B = f(A, x)
    np.testing.assert_allclose(np.asarray(y), M @ x, rtol=1e-14)
    assert isinstance(B, sd.sparse.SparseArray) and B.type == A.type
    np.testing.assert_allclose(np.asarray(B.data), 2 * M.data)
    # the gradient with respect to a sparse matrix is sparse on its pattern
    gA = sd.grad(lambda A, x: snp.sum((A @ x) ** 2))(A, x)
    assert isinstance(gA, sd.sparse.SparseArray) and gA.type.pattern == A.type.pattern
    rows, cols = M.nonzero()
    r = M @ x
    np.testing.assert_allclose(np.asarray(gA.data), 2 * r[rows] * x[cols], rtol=1e-12)


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, marks=pytest.mark.slow),
                                   np.complex128])
def test_rules_of_a_composite_sparse_function(rng, dtype):
    M = _random_csr(rng, 6, 4, dtype=dtype)
    x = rng.standard_normal((4, 2)).astype(dtype)
    if dtype == np.complex128:
        x = x + 1j * rng.standard_normal((4, 2))

    def f(d, x):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        B = A + sd.sparse.sddmm(A @ x, x, A.type.pattern)
        return B.T @ (A @ x), B.diagonal()

    sd.testing.check_rules(f, M.data, x, seed=int(rng.integers(2**31)))


def test_constant_sparse_matrix_prints_and_round_trips(rng):
    M = _random_csr(rng, 4, 4)
    A = sd.sparse.from_scipy(M, tags=())
    g = sd.trace(lambda x: A @ x, np.ones(4))
    assert "const<csr<f64>[4,4; nnz=" in str(g)
    back = sd.Graph.from_json(g.to_json())
    assert str(back) == str(g)
    x = rng.standard_normal(4)
    np.testing.assert_allclose(np.asarray(sd.graph.evaluate(back, x)[0]), M @ x, rtol=1e-14)


def test_tags_are_checked_against_the_pattern():
    # a tag the pattern contradicts is a StructureError (as the README says), not a shape's
    with pytest.raises(sd.errors.StructureError, match="pattern is not symmetric"):
        sd.sparse.coo_matrix((np.ones(2), ([0, 1], [1, 1])), shape=(2, 2), tags={"spd"})
    A = sd.sparse.coo_matrix((np.ones(3), ([0, 1, 1], [0, 1, 0])), shape=(2, 2))
    with pytest.raises(sd.errors.StructureError,
                       match=r"linalg.solve: the pattern is not symmetric, so the matrix "
                             r"cannot be tagged \['spd', 'symmetric'\]: .* drop the tag"):
        sd.linalg.solve(A, np.ones(2), assume="spd")
    with pytest.raises(InvalidOptionError, match="unknown structure tag"):
        sd.sparse.coo_matrix((np.ones(1), ([0], [0])), shape=(1, 1), tags={"posdef"})
    A = sd.sparse.coo_matrix((np.ones(2), ([0, 1], [1, 0])), shape=(2, 2),
                             tags={"symmetric"})
    assert A.T is A


def test_errors_name_the_op_and_the_problem():
    with pytest.raises(DTypeError, match="`row` must be static"):
        sd.trace(lambda r: sd.sparse.coo_matrix((np.ones(2), (r, np.arange(2)))),
                 np.arange(2))
    with pytest.raises(ShapeError, match="`data` has 3 entries, `row` and `col` 2"):
        sd.sparse.coo_matrix((np.ones(3), ([0, 1], [0, 1])))
    with pytest.raises(ShapeError, match="coordinates out of range"):
        sd.sparse.coo_matrix((np.ones(2), ([0, 5], [0, 1])), shape=(3, 3))
    A = sd.sparse.coo_matrix((np.ones(2), ([0, 1], [0, 1])), shape=(2, 3))
    with pytest.raises(ShapeError, match=r"cannot multiply csr<f64>\[2,3; nnz=2\] by "
                                         r"f64\[2\]") as info:
        sd.trace(lambda x: A @ x, np.ones(2))
    assert "test_sparse.py" in str(info.value)
    with pytest.raises(DTypeError, match="`sin` .* not supported on sparse|sin"):
        sd.trace(lambda d: snp.sin(sd.sparse.coo_matrix((d, ([0], [0])))), np.ones(1))
    with pytest.raises(ShapeError, match="multiplied or divided by a scalar, got shape"):
        sd.trace(lambda d: sd.sparse.coo_matrix((d, ([0], [0]))) * np.ones((1, 1)),
                 np.ones(1))
    with pytest.raises(DTypeError, match="`pow` of csr<f64>.* not supported on sparse"):
        sd.trace(lambda d: sd.sparse.coo_matrix((d, ([0], [0]))) ** 2, np.ones(1))


def test_derivatives_through_a_constant_sparse_matrix(rng):
    M = _random_csr(rng, 6, 6)
    A = sd.sparse.from_scipy(M)
    x = rng.standard_normal(6)

    def f(x):
        return snp.sum(snp.sin(A @ x) * (A.T @ x))

    sd.testing.check_rules(f, x, seed=int(rng.integers(2**31)))
    D = M.toarray()
    with jax.enable_x64(True):
        ref = jax.grad(lambda x: jnp.sum(jnp.sin(D @ x) * (D.T @ x)))(x)
    np.testing.assert_allclose(np.asarray(sd.grad(f)(x)), np.asarray(ref), rtol=1e-12)


def test_a_pattern_is_one_int32_constant_per_index_array(rng):
    # products with A and A.T and the sampled product of the gradient read
    # A's rows and columns: each enters the program once, as int32
    M = _random_csr(rng, 60, 60, density=0.2)  # (720 entries: passed as buffers)
    x = rng.standard_normal(60)

    def f(d, x):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        return snp.sum((A @ x) * (A.T @ x))

    g = jax.jit(sd.to_jax(sd.value_and_grad(f, argnums=(0, 1))))
    with jax.enable_x64(True):
        lowered = g.lower(jnp.asarray(M.data), jnp.asarray(x))
        val, (gd, gx) = g(jnp.asarray(M.data), jnp.asarray(x))
    big = [(t, v) for t, shape, v in array_constants(lowered) if shape[0] == M.nnz
           and t in ("i32", "i64")]
    assert big and all(t == "i32" for t, _ in big) and len(big) == len(set(big))
    Ax, ATx = M @ x, M.T @ x
    np.testing.assert_allclose(val, Ax @ ATx, rtol=1e-12)
    np.testing.assert_allclose(gx, M.T @ ATx + M @ Ax, rtol=1e-12)
    rows = np.repeat(np.arange(60), np.diff(M.indptr))
    np.testing.assert_allclose(gd, x[M.indices] * ATx[rows] + Ax[M.indices] * x[rows],
                               rtol=1e-12)


def test_from_coo_groups_as_one_sort_does(rng):
    """SciPy's compiled CSR grouping (the fast path) against one global sort
    of the coordinates: the same pattern and the same index of each entry,
    with duplicates, empty rows (trailing ones too) and no entries at all."""
    from sciad.graph import Pattern

    for trial in range(60):
        n, m = (int(k) for k in rng.integers(1, 25, 2))
        N = int(rng.integers(0, 70))
        r, c = rng.integers(0, n, N), rng.integers(0, m, N)
        if trial % 3 == 0:
            r = np.minimum(r, max(n - 3, 0))  # (the last rows empty)
        (pa, da), (pb, db) = (Pattern._from_coo_uncached((n, m), r, c),
                              Pattern._from_coo_sorted((n, m), r, c))
        np.testing.assert_array_equal(pa.indptr, pb.indptr)
        np.testing.assert_array_equal(pa.indices, pb.indices)
        np.testing.assert_array_equal(da, db)
        assert not da.flags.writeable


def test_the_transposed_pattern_is_the_sorted_transpose(rng):
    """`Pattern.transposed` (SciPy's compiled CSR -> CSC conversion carrying
    positions) against a sort by (column, row): the same pattern and
    permutation, rectangular and empty patterns included."""
    from sciad.graph import Pattern

    for trial in range(40):
        n, m = (int(k) for k in rng.integers(0, 15, 2))
        A = sp.random(n, m, density=float(rng.uniform(0.0, 0.6)), format="csr",
                      random_state=trial)
        A.sort_indices()
        p = Pattern(A.shape, A.indptr, A.indices)
        pt, perm = p.transposed()
        np.testing.assert_array_equal(perm, np.lexsort((p.rows, p.indices)))
        T = A.T.tocsr()
        T.sort_indices()
        assert pt.shape == (m, n) and not perm.flags.writeable
        np.testing.assert_array_equal(pt.indptr, T.indptr)
        np.testing.assert_array_equal(pt.indices, T.indices)


def test_from_coo_sorts_the_same_coordinates_once():
    row, col = np.array([2, 0, 1, 0, 2]), np.array([1, 0, 2, 0, 1])
    p1, d1 = sd.graph.Pattern.from_coo((3, 3), row, col)
    p2, d2 = sd.graph.Pattern.from_coo((3, 3), row.copy(), col.copy())
    assert p1 is p2 and d2 is d1 and not d1.flags.writeable
    np.testing.assert_array_equal(d1, [2, 0, 1, 0, 2])  # entries (0,0), (1,2), (2,1)
    p3, _ = sd.graph.Pattern.from_coo((3, 4), row, col)  # another shape: its own pattern
    assert p3 is not p1 and p3.shape == (3, 4)
    A = sd.sparse.coo_matrix((np.arange(5.0), (row, col)), shape=(3, 3))
    np.testing.assert_array_equal(np.asarray(A.todense()),
                                  sp.coo_matrix((np.arange(5.0), (row, col)), (3, 3)).toarray())


def test_a_batch_assembles_by_gather_or_scatter_alike(rng):
    """An assembly whose entries each receive one value is a gather (with a
    batch-major batch rule, `take_static`); one that sums duplicates stays a
    scatter. Both equal SciPy's, one example and a vmapped batch."""
    from sciad.primitives._sparse import IndexMap

    n = 6
    perm = rng.permutation(n * n)
    rows, cols = perm // n, perm % n  # every entry once, shuffled
    dup_rows = np.concatenate([rows, rows[:5]])
    dup_cols = np.concatenate([cols, cols[:5]])
    for r, c in ((rows, cols), (dup_rows, dup_cols)):
        vals = rng.standard_normal((3, r.size))

        def data(v, r=r, c=c):
            return sd.sparse.data(sd.sparse.coo_matrix((v, (r, c)), shape=(n, n)))

        want = [sp.csr_array(sp.coo_array((v, (r, c)), shape=(n, n))).toarray()
                for v in vals]
        got = np.asarray(sd.function(sd.vmap(data))(vals))
        one = np.asarray(sd.function(data)(vals[0]))
        for k in range(3):  # (the pattern is full: its values are the dense matrix)
            np.testing.assert_allclose(got[k].reshape(n, n), want[k], rtol=1e-14)
        np.testing.assert_allclose(one.reshape(n, n), want[0], rtol=1e-14)
        hlo = jax.jit(jax.vmap(sd.to_jax(data))).lower(vals).as_text()
        assert ("scatter" in hlo) == (r.size > n * n)
    m = IndexMap(np.array([2, 0, 1]))
    np.testing.assert_array_equal(m.inverse(3), [1, 2, 0])
    assert IndexMap(np.array([0, 0, 1])).inverse(3) is None
    assert IndexMap(np.array([0, -1, 1])).inverse(3) is None
    assert IndexMap(np.array([0, 3, 1])).inverse(3) is None  # (3: a dropped entry)
    assert m.inverse(4) is None


def test_take_static_under_nested_vmaps(rng):
    from sciad.solvers._indices import index_array, take_static

    idx = index_array(np.array([3, 1, 1, 0]))
    x = jnp.asarray(rng.standard_normal((2, 3, 5, 4)))  # (batch, batch, rows, cols)
    got = jax.jit(jax.vmap(jax.vmap(lambda v: take_static(v, idx))))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x)[:, :, [3, 1, 1, 0]])
    both = jax.vmap(take_static)(x[0], jnp.stack([idx, idx, idx]))  # (batched indices)
    np.testing.assert_array_equal(np.asarray(both), np.asarray(x[0])[:, [3, 1, 1, 0]])


def test_products_in_padded_rows_and_by_scatter_agree():
    """On the CPU a product pads each row to the longest (ELLPACK) where
    that adds at most half the stored entries, else scatters: both are the
    product, forward and transposed, for a vector, a matrix of columns and
    a batch of values; an uneven pattern (one full row) scatters its
    product, and pads its transposed one (each column gains one entry)."""
    import jax
    import scipy.sparse as sp

    from sciad.solvers import _indices

    rng = np.random.default_rng(0)
    even = sp.diags([1.0, 2.0, 3.0, 4.0, 5.0], [-2, -1, 0, 1, 3], shape=(40, 37)).tocsr()
    uneven = even.tolil()
    uneven[5, :] = 1.0
    for A, padded in ((even.tocsr(), True), (uneven.tocsr(), False)):
        A.sort_indices()
        A.data = rng.standard_normal(A.nnz)
        pat = sd.sparse.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape).type.pattern
        assert (_indices._ell_layout(pat, False) is not None) == padded
        assert _indices._ell_layout(pat, True) is not None

        def S(d):
            return sd.sparse.csr_matrix((d, A.indices, A.indptr), shape=A.shape)

        x, X = rng.standard_normal(37), rng.standard_normal((37, 3))
        y = rng.standard_normal(40)
        np.testing.assert_allclose(sd.function(lambda d, x: S(d) @ x)(A.data, x), A @ x,
                                   rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(sd.function(lambda d, x: S(d) @ x)(A.data, X), A @ X,
                                   rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(sd.function(lambda d, y: S(d).T @ y)(A.data, y), A.T @ y,
                                   rtol=1e-13, atol=1e-13)
        D = np.stack([A.data, -2.0 * A.data])
        out = sd.function(sd.vmap(lambda d, x: S(d) @ x))(D, np.stack([x, x]))
        np.testing.assert_allclose(out[1], -2.0 * (A @ x), rtol=1e-13, atol=1e-13)
        jaxpr = str(jax.make_jaxpr(sd.to_jax(lambda d, x: S(d) @ x))(A.data, x))
        assert ("reduce_sum" in jaxpr) == padded and ("scatter-add" in jaxpr) != padded


# ---------------------------------------------------------------------------
# element assembly


def _triangles(rng, nx: int = 4):
    """A triangulated `nx x nx` grid: its cells `(m, 3)`, and each cell's
    nodes numbered among the free ones (the left column's nodes fixed: -1)."""
    idx = np.arange((nx + 1) ** 2).reshape(nx + 1, nx + 1)
    a, b, c, d = idx[:-1, :-1].ravel(), idx[:-1, 1:].ravel(), idx[1:, :-1].ravel(), \
        idx[1:, 1:].ravel()
    cells = np.concatenate([np.stack([a, b, d], 1), np.stack([a, d, c], 1)])
    fixed = np.zeros(idx.size, bool)
    fixed[idx[:, 0]] = True
    number = np.full(idx.size, -1)
    number[~fixed] = np.arange((~fixed).sum())
    return cells, number[cells], int((~fixed).sum())


def _scipy_elements(values, rows, cols, shape):
    r = np.broadcast_to(rows[:, :, None], values.shape).ravel()
    c = np.broadcast_to(cols[:, None, :], values.shape).ravel()
    keep = (r >= 0) & (c >= 0)
    return sp.coo_matrix((values.ravel()[keep], (r[keep], c[keep])), shape=shape).toarray()


def test_assemble_elements_sums_as_scipy_and_drops_negative_dofs(rng):
    cells, dofs, n = _triangles(rng)
    m = cells.shape[0]
    values = rng.standard_normal((m, 3, 3))
    A = sd.sparse.assemble_elements(values, dofs)  # shape: one past the largest dof
    assert A.shape == (n, n)
    np.testing.assert_allclose(np.asarray(A.todense()), _scipy_elements(values, dofs, dofs,
                                                                      (n, n)), rtol=1e-15)
    # rectangular element matrices: a pair of dofs (here all nodes, by the free ones)
    B = rng.standard_normal((m, 3, 3))
    R = sd.sparse.assemble_elements(B, (cells, dofs), shape=(cells.max() + 2, n))
    np.testing.assert_allclose(np.asarray(R.todense()),
                               _scipy_elements(B, cells, dofs, (cells.max() + 2, n)),
                               rtol=1e-15)
    # integer values become float64; one pattern and one map per dofs, kept
    C = sd.sparse.assemble_elements(np.ones((m, 3, 3), int), dofs)
    assert C.dtype == np.float64 and C.type.pattern is A.type.pattern


def test_assemble_elements_rules_and_gradient_of_a_solve(rng):
    cells, dofs, n = _triangles(rng, 2)
    Ke = np.array([[1.0, -0.5, -0.5], [-0.5, 0.5, 0.0], [-0.5, 0.0, 0.5]])
    f = rng.standard_normal(n)

    def compliance(k):
        K = sd.sparse.assemble_elements(snp.exp(k)[:, None, None] * Ke, dofs,
                                        tags=["spd"])
        return snp.dot(f, sd.linalg.solve(K, f))

    k = 0.3 * rng.standard_normal(cells.shape[0])
    sd.testing.check_rules(compliance, k, seed=int(rng.integers(2**31)))
    sd.testing.check_rules(lambda v: sd.sparse.assemble_elements(v, dofs) @ f,
                           rng.standard_normal((cells.shape[0], 3, 3)),
                           seed=int(rng.integers(2**31)))
    # against the same compliance by SciPy: value and the adjoint by hand
    K = _scipy_elements(np.exp(k)[:, None, None] * Ke, dofs, dofs, (n, n))
    u = np.linalg.solve(K, f)
    value, grad = sd.function(sd.value_and_grad(compliance))(k)
    ue = np.where(dofs >= 0, u[np.maximum(dofs, 0)], 0.0)
    np.testing.assert_allclose(value, f @ u, rtol=1e-12)
    np.testing.assert_allclose(grad, -np.exp(k) * np.einsum("ma,ab,mb->m", ue, Ke, ue),
                               rtol=1e-10)
    # batched values (one mesh, several coefficient fields)
    ks = 0.3 * rng.standard_normal((3, cells.shape[0]))
    got = sd.function(sd.vmap(compliance))(ks)
    np.testing.assert_allclose(got, [sd.function(compliance)(x) for x in ks], rtol=1e-12)


def test_assemble_elements_holds_one_map_per_mesh_not_its_coordinates(rng):
    # the map from element entries to stored entries is int32, made once per
    # dofs (a new trace, or another array with the same dofs, finds it), and
    # the program reads it as one index array
    cells, dofs, n = _triangles(rng, 6)
    values = rng.standard_normal((cells.shape[0], 3, 3))
    g1 = sd.trace(lambda v: sd.sparse.assemble_elements(v, dofs).data, values)
    g2 = sd.trace(lambda v: sd.sparse.assemble_elements(v, dofs.copy()).data, values)
    (n1,), (n2,) = ([nd for nd in g.nodes if nd.primitive.name == "sparse.assemble"]
                    for g in (g1, g2))
    assert n1.params["index"] is n2.params["index"]
    assert n1.params["pattern"] is n2.params["pattern"]
    index = n1.params["index"].array
    assert index.dtype == np.int32 and not index.flags.writeable
    kept = (dofs >= 0).sum(axis=1)
    assert index.size == dofs.size * 3 and (index == -1).sum() == np.sum(9 - kept ** 2)


def test_assemble_elements_errors_name_what_is_wrong(rng):
    cells, dofs, n = _triangles(rng, 2)
    m = cells.shape[0]
    v = np.ones((m, 3, 3))
    with pytest.raises(DTypeError, match=r"sparse.assemble_elements: `dofs` must be static"):
        sd.trace(lambda d: sd.sparse.assemble_elements(v, d), dofs)
    with pytest.raises(ShapeError, match=r"`values` must have shape \(elements, k, l\) = "
                                         rf"\({m}, 3, 3\) for these dofs, got \({m}, 3\)"):
        sd.sparse.assemble_elements(np.ones((m, 3)), dofs)
    with pytest.raises(ShapeError, match=r"`dofs` must be an \(elements, dofs per element\) "
                                         rf"array, got shape \({3 * m},\)"):
        sd.sparse.assemble_elements(v, dofs.ravel())
    with pytest.raises(DTypeError, match="`dofs` must hold integers, got dtype float64"):
        sd.sparse.assemble_elements(v, dofs.astype(float))
    with pytest.raises(ShapeError, match=r"`shape` \(2, 2\) does not hold the dofs"):
        sd.sparse.assemble_elements(v, dofs, shape=(2, 2))
    with pytest.raises(ShapeError, match="`row_dofs` has 8 elements, `col_dofs` 7"):
        sd.sparse.assemble_elements(v, (dofs, dofs[:-1]))
    with pytest.raises(sd.errors.StructureError, match="pattern is not symmetric"):
        sd.sparse.assemble_elements(np.ones((1, 1, 2)), (np.array([[0]]), np.array([[0, 1]])),
                                    shape=(2, 2), tags=["spd"])
