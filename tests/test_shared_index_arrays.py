"""Index arrays held once on the CPU, and products by a shared element
matrix transposed without a broadcast buffer (Mosaic's million-node thermal
task: the peak memory of its value and gradient, issue 51).

- `sciad._buffers.aligned` / `shareable`: aligned, read-only host arrays
  that a CPU device array wraps without a copy (`index_array`), and every
  array that may not be shared (writable, a view of a writable one,
  misaligned) copied instead.
- A pattern keeps its rows and its transpose's permutation compact (int32,
  shared with their device index arrays); `rows` stays int64.
- An assembly's element map with dropped (-1) entries is one array, shared
  with its device constant: the scatter drops them, the gather (its
  transpose) reads 0 there, under `sd.vmap` too.
- The transpose of `rho[:, None, None] * Ke` in `rho` is one
  matrix-vector product (`unbroadcast_product`), with the elementwise
  gradient's values; other broadcasts keep the product and the sum.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad._buffers import ALIGNMENT, aligned, shareable
from sciad.graph._types import Pattern
from sciad.primitives._sparse import IndexMap
from sciad.solvers._indices import (index_array, pattern_cols, pattern_rows,
                                    pattern_transpose)

CPU = jax.default_backend() == "cpu"


def _address(a) -> int:
    return np.asarray(a).ctypes.data


def test_aligned_copies_once_into_a_read_only_aligned_buffer():
    src = np.arange(1001, dtype=np.int64) - 7
    a = aligned(src, np.int32)
    assert a.dtype == np.int32 and a.ctypes.data % ALIGNMENT == 0
    np.testing.assert_array_equal(a, src)
    assert not a.flags.writeable and shareable(a) and shareable(a.reshape(-1, 1))
    with pytest.raises(ValueError):
        a[0] = 1
    assert not shareable(src)                     # writable
    view = src.view()
    view.setflags(write=False)
    assert not shareable(view)                    # a read-only view of a writable array
    assert not shareable(a[1:])                   # off the alignment
    assert not shareable(aligned(np.arange(8), np.int64)[::2])   # not contiguous
    assert aligned(np.zeros(0, np.int64), np.int32).size == 0


@pytest.mark.skipif(not CPU, reason="host arrays are shared by CPU device arrays")
def test_cpu_index_arrays_wrap_shareable_host_arrays_and_copy_others():
    a = aligned(np.arange(50_000), np.int32)
    d = index_array(a)
    assert d.shape == (50_000, 1) and d.dtype == jnp.int32
    assert _address(d) == _address(a)
    w = np.arange(100, dtype=np.int32)            # writable: copied
    dw = index_array(w)
    w[5] = -3
    assert int(dw[5, 0]) == 5
    del a
    import gc

    gc.collect()
    junk = [np.full(50_000, 7, np.int32) for _ in range(4)]  # (reuse freed memory)
    assert int(d[49_999, 0]) == 49_999 and len(junk) == 4


def _unsymmetric(n=40, seed=0):
    A = sp.random(n, n, density=0.15, random_state=seed, format="csr") + sp.eye(n)
    A.sort_indices()
    return A.tocsr()


def test_a_pattern_keeps_rows_and_transpose_compact_and_answers_as_before():
    A = _unsymmetric()
    p = Pattern(A.shape, A.indptr, A.indices)
    rows = p.rows
    assert rows.dtype == np.int64 and not rows.flags.writeable
    np.testing.assert_array_equal(rows, np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)))
    assert p.row_index().dtype == np.int32 and shareable(p.row_index())
    # arithmetic on `rows` is int64: no overflow past 2^31
    assert (p.rows * 2 ** 40)[-1] == (A.shape[0] - 1) * 2 ** 40
    pt, perm = p.transposed()
    assert perm.dtype == np.int32 and shareable(perm)
    At = A.T.tocsr()
    At.sort_indices()
    np.testing.assert_array_equal(A.data[perm], At.data)
    np.testing.assert_array_equal(pt.indices, At.indices)
    if CPU:
        assert _address(pattern_rows(p)) == _address(p.row_index())
        assert _address(pattern_transpose(p)) == _address(perm)
        np.testing.assert_array_equal(np.asarray(pattern_cols(p))[:, 0], A.indices)


def _dropped_dofs():
    """Four 2-node elements on a chain of 4 nodes, node 0 fixed (-1)."""
    dofs = np.array([[-1, 0], [0, 1], [1, 2], [2, -1]])
    rng = np.random.default_rng(3)
    ke = rng.standard_normal((4, 2, 2))
    return dofs, ke


def _reference(dofs, ke, n=3):
    K = np.zeros((n, n))
    for e, d in enumerate(dofs):
        for a in range(2):
            for b in range(2):
                if d[a] >= 0 and d[b] >= 0:
                    K[d[a], d[b]] += ke[e, a, b]
    return K


def test_an_element_map_with_dropped_entries_is_one_shared_array():
    dofs, ke = _dropped_dofs()
    A = sd.sparse.assemble_elements(ke, dofs)
    np.testing.assert_allclose(sd.sparse.todense(A), _reference(dofs, ke), atol=1e-14)
    index = sd.trace(lambda v: sd.sparse.assemble_elements(v, dofs), ke).nodes
    maps = [nd.params["index"] for nd in index if nd.params.get("index") is not None]
    assert maps and all(isinstance(m, IndexMap) for m in maps)
    m = maps[0]
    assert (m.array < 0).any() and shareable(m.array)
    if CPU:
        assert _address(m.device()) == _address(m.array)


def test_dropped_entries_scatter_nowhere_and_gather_zero_under_transforms():
    dofs, ke = _dropped_dofs()
    W = np.random.default_rng(4).standard_normal((3, 3))

    def f(v):  # sum(W * K(v)) over the stored entries
        return snp.sum(sd.sparse.todense(sd.sparse.assemble_elements(v, dofs)) * W)

    g = np.asarray(sd.grad(f)(ke))
    want = np.zeros_like(ke)
    for e, d in enumerate(dofs):
        for a in range(2):
            for b in range(2):
                if d[a] >= 0 and d[b] >= 0:
                    want[e, a, b] = W[d[a], d[b]]
    np.testing.assert_allclose(g, want, atol=1e-14)     # 0 at a dropped entry
    batch = np.stack([ke, 2 * ke, -ke])
    gb = np.asarray(sd.vmap(sd.grad(f))(batch))
    for gi in gb:
        np.testing.assert_allclose(gi, want, atol=1e-14)
    vals = sd.vmap(lambda v: sd.sparse.todense(sd.sparse.assemble_elements(v, dofs)))(batch)
    for v, b in zip(np.asarray(vals), batch):
        np.testing.assert_allclose(v, _reference(dofs, b), atol=1e-14)
    jg = jax.jit(sd.to_jax(sd.grad(f)))(ke)
    np.testing.assert_allclose(np.asarray(jg), want, atol=1e-14)


def _names(f, *args):
    return [nd.primitive.name for nd in sd.graph.passes.optimize(sd.trace(f, *args)).nodes]


def test_the_transpose_of_a_product_by_a_shared_matrix_is_a_matrix_vector_product():
    rng = np.random.default_rng(7)
    r, K = rng.standard_normal(6), rng.standard_normal((3, 4))

    def f(r):
        return snp.sum(snp.sin(r[:, None, None] * K) * snp.cos(K))

    names = _names(sd.grad(f), r)
    assert "matmul" in names
    want = jax.grad(lambda r: jnp.sum(jnp.sin(r[:, None, None] * K) * jnp.cos(K)))(r)
    np.testing.assert_allclose(np.asarray(sd.grad(f)(r)), want, rtol=1e-13, atol=1e-15)
    # in `K` as well (the product's other operand): the sum runs over the cells
    gk = sd.grad(lambda K: snp.sum(snp.sin(r[:, None, None] * K)))(K)
    wk = jax.grad(lambda K: jnp.sum(jnp.sin(r[:, None, None] * K)))(K)
    np.testing.assert_allclose(np.asarray(gk), wk, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("shape_x,shape_y,contracts", [
    ((5, 1, 1), (1, 3, 4), True),   # a matrix-vector product (y's leading 1 too)
    ((5, 2, 1, 1), (3, 4), True),   # two kept axes: (10, 12) @ (12,)
    ((5, 3, 1), (3, 4), False),     # y spans a kept axis: the product, then the sum
    ((5, 1, 4), (3, 1), False),     # x keeps the last axis: the product, then the sum
    ((1, 3, 4), (5, 1, 1), False),   # the sum over the leading axis: the product, then the sum
    ((), (5, 3), False),            # a scalar: the product, then the sum
    ((5, 3), (5, 3), False),        # no broadcast
])
def test_product_transposes_agree_with_jax_for_every_broadcast(shape_x, shape_y, contracts):
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal(shape_x), rng.standard_normal(shape_y)
    f = lambda x, y: snp.sum(snp.tanh(x * y) ** 2)  # noqa: E731
    assert ("matmul" in _names(sd.grad(f), x, y)) == contracts
    fj = lambda x, y: jnp.sum(jnp.tanh(x * y) ** 2)  # noqa: E731
    got = sd.grad(f, argnums=(0, 1))(x, y)
    want = jax.grad(fj, argnums=(0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12, atol=1e-14)
    # and its second order: forward over reverse
    d = rng.standard_normal(shape_x)
    h = sd.hvp(lambda x: f(x, y), x, d)
    hw = jax.jvp(jax.grad(lambda x: fj(x, y)), (x,), (d,))[1]
    np.testing.assert_allclose(np.asarray(h), hw, rtol=1e-11, atol=1e-13)


def test_a_simp_gradient_holds_one_element_sized_buffer():
    """XLA's temporaries for the value and gradient of a SIMP compliance on a
    64 x 64 Q4 mesh: the element values, then the gathered cotangent, in one
    element-sized slot, beside smaller value-sized ones. Before the transpose
    above, the element matrix broadcast to every cell was a second buffer
    (1.44 against 0.92 MB here; 268 MiB at a million HEX8 nodes)."""
    nx = ny = 64
    nodes = np.arange((nx + 1) * (ny + 1)).reshape(ny + 1, nx + 1)
    cells = np.stack([nodes[:-1, :-1], nodes[:-1, 1:], nodes[1:, 1:], nodes[1:, :-1]],
                     -1).reshape(-1, 4)
    keep = (np.arange(nodes.size) % (nx + 1)) != 0      # the left edge fixed
    free = np.full(nodes.size, -1)
    free[keep] = np.arange(keep.sum())
    dofs, n = free[cells], int(keep.sum())
    Ke = np.array([[4, -1, -2, -1], [-1, 4, -1, -2], [-2, -1, 4, -1], [-1, -2, -1, 4]]) / 6.0
    f = np.ones(n)

    def compliance(rho):
        A = sd.sparse.assemble_elements((1e-3 + rho ** 3)[:, None, None] * Ke, dofs,
                                        shape=(n, n), tags=["spd"])
        return snp.dot(f, sd.linalg.solve(A, f))

    x = np.full(cells.shape[0], 0.5)
    compiled = jax.jit(sd.to_jax(sd.value_and_grad(compliance))).lower(x).compile()
    element_bytes = cells.shape[0] * Ke.size * 8
    assert compiled.memory_analysis().temp_size_in_bytes < 2 * element_bytes
