"""`sd.sparse.jacobian_sparsity` and `sd.sparse.jacobian`: detected patterns
against known stencils, colored Jacobians against dense ones (forward and
reverse coloring), the coloring's validity, and the warning for a primitive
without a sparsity rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, SparsityWarning
from sciad.solvers._coloring import color_columns


def laplacian_pattern(m: int) -> np.ndarray:
    t = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(m, m))
    eye = sp.eye(m)
    return ((sp.kron(t, eye) + sp.kron(eye, t)) != 0).toarray()


def five_point(u, m):
    U = snp.pad(snp.reshape(u, (m, m)), 1)
    lap = U[:-2, 1:-1] + U[2:, 1:-1] + U[1:-1, :-2] + U[1:-1, 2:] - 4 * U[1:-1, 1:-1]
    return snp.reshape(lap + U[1:-1, 1:-1] ** 3, (m * m,))


def test_five_point_stencil_pattern_and_colored_jacobian(rng):
    m = 6
    u = rng.standard_normal(m * m)
    P = sd.sparse.jacobian_sparsity(lambda u: five_point(u, m), u)
    assert isinstance(P, sp.csr_matrix) and P.dtype == bool
    np.testing.assert_array_equal(P.toarray(), laplacian_pattern(m))
    J = sd.sparse.jacobian(lambda u: five_point(u, m))(u)
    assert sd.sparse.issparse(J) and J.type.pattern.nnz == P.nnz
    dense = np.asarray(sd.jacfwd(lambda u: five_point(u, m))(u))
    np.testing.assert_allclose(np.asarray(J.todense()), dense, rtol=1e-14, atol=1e-14)


def test_the_graph_holds_one_batched_jvp_and_shows_the_pattern():
    m = 6
    g = sd.trace(lambda u: sd.sparse.jacobian(lambda u: five_point(u, m))(u), np.ones(m * m))
    text = str(g)
    assert f"csr<f64>[{m * m},{m * m}; nnz={laplacian_pattern(m).sum()}]" in text
    # the products for all colors are one batched graph: as many nodes as one JVP
    one_jvp = sd.trace(lambda u, v: sd.jvp(lambda u: five_point(u, m), (u,), (v,))[1],
                       np.ones(m * m), np.ones(m * m))
    assert len(g.nodes) <= len(one_jvp.nodes) + 6


def test_coloring_is_valid_and_small_on_stencils():
    for m in (5, 16):
        P = sp.csr_matrix(laplacian_pattern(m))
        colors = color_columns(P)
        assert colors.max() + 1 <= 7
        for c in range(colors.max() + 1):  # structurally orthogonal: no row twice
            assert P[:, colors == c].sum(axis=1).max() <= 1


def test_constant_matrices_keep_their_zeros_and_sparse_matrices_their_pattern(rng):
    tri = np.triu(rng.standard_normal((5, 5)))
    P = sd.sparse.jacobian_sparsity(lambda x: tri @ x, np.ones(5))
    np.testing.assert_array_equal(P.toarray(), tri != 0)
    A = sp.random(7, 7, density=0.3, random_state=1, format="csr") + sp.eye(7)
    P = sd.sparse.jacobian_sparsity(lambda x: sd.sparse.from_scipy(A) @ snp.sin(x), np.ones(7))
    np.testing.assert_array_equal(P.toarray(), A.toarray() != 0)
    # an elementwise product of two reads of x: the union of their patterns
    P = sd.sparse.jacobian_sparsity(lambda x: x[1:] * x[:-1], np.ones(5))
    np.testing.assert_array_equal(P.toarray(), np.eye(4, 5, 0, bool) | np.eye(4, 5, 1, bool))


def test_reverse_coloring_for_few_outputs(rng):
    # 3 outputs of 40 inputs, each output reading every input: the rows
    # need 3 VJPs where the columns would need 40 JVPs
    w = rng.standard_normal((3, 40))

    def f(x):
        return w @ snp.tanh(x)

    x = rng.standard_normal(40)
    J = sd.sparse.jacobian(f)(x)
    np.testing.assert_allclose(np.asarray(J.todense()), np.asarray(sd.jacfwd(f)(x)),
                               rtol=1e-13, atol=1e-15)
    g = sd.trace(lambda x: sd.sparse.jacobian(f)(x), x)
    assert "3,40" in str(g)  # the seeds: one per row color
    Jf = sd.sparse.jacobian(f, mode="forward")(x)
    np.testing.assert_allclose(np.asarray(Jf.todense()), np.asarray(J.todense()), rtol=1e-13)


def test_the_colored_jacobian_is_differentiable(rng):
    m = 4
    u = rng.standard_normal(m * m)
    v = rng.standard_normal(m * m)

    def total(u):
        J = sd.sparse.jacobian(lambda u: five_point(u, m))(u)
        return snp.sum(sd.sparse.data(J) ** 2)

    def total_dense(u):
        return snp.sum(sd.jacfwd(lambda u: five_point(u, m))(u) ** 2)

    np.testing.assert_allclose(np.asarray(sd.grad(total)(u)),
                               np.asarray(sd.grad(total_dense)(u)), rtol=1e-12)
    assert min(sd.testing.taylor_test(total, u, v)) > 1.9


def test_a_primitive_without_a_rule_is_dense_with_a_warning():
    p = sd.primitive("test_sparse_jacobian.no_rule", params={})
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x * 2.0)
    with pytest.warns(SparsityWarning, match="test_sparse_jacobian.no_rule"):
        P = sd.sparse.jacobian_sparsity(lambda x: p(x[:3]) * x[:3], np.ones(5))
    want = np.zeros((3, 5), bool)
    want[:, :3] = True
    np.testing.assert_array_equal(P.toarray(), want)
    p.def_sparsity(lambda outs, x: x.matrix)  # elementwise: declared, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparsityWarning)
        P = sd.sparse.jacobian_sparsity(lambda x: p(x[:3]) * x[:3], np.ones(5))
    np.testing.assert_array_equal(P.toarray(), np.eye(3, 5, dtype=bool))


def test_bad_input():
    with pytest.raises(sd.errors.ShapeError, match="one array"):
        sd.sparse.jacobian_sparsity(lambda x: (x, x), np.ones(3))
    with pytest.raises(InvalidOptionError, match="mode"):
        sd.sparse.jacobian(lambda x: x, mode="sideways")(np.ones(3))
