"""Smoothed-aggregation AMG with a near-null space (`sd.linalg.AMG`): the
rigid-body modes of elasticity, node aggregation, the tentative prolongator
fitted to the candidates, and the preconditioner as a solve's param
(printed, serialized, differentiated through, refused with clear errors)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

import sciad as sd
from sciad.errors import ConvergenceError, InvalidOptionError, ShapeError
from sciad.solvers.iterative import _amg as amg


@pytest.fixture(autouse=True)
def deep_hierarchies(monkeypatch):
    monkeypatch.setattr(amg, "MAX_COARSE", 20)


def _hex8_stiffness(nu: float = 0.3) -> np.ndarray:
    """The unit cube's trilinear element stiffness (E = 1), nodes in
    `itertools.product((0, 1), repeat=3)` order, unknowns interleaved."""
    corners = np.array(list(itertools.product((0.0, 1.0), repeat=3)))
    lam, mu = nu / ((1 + nu) * (1 - 2 * nu)), 1.0 / (2 * (1 + nu))
    D = np.zeros((6, 6))
    D[:3, :3] = lam
    D[:3, :3] += 2 * mu * np.eye(3)
    D[3:, 3:] = mu * np.eye(3)
    K = np.zeros((24, 24))
    for q in itertools.product(0.5 + np.array([-0.5, 0.5]) / np.sqrt(3), repeat=3):
        f = corners * q + (1 - corners) * (1 - np.asarray(q))
        dN = np.stack([(2 * corners[:, k] - 1) * np.prod(np.delete(f, k, axis=1), axis=1)
                       for k in range(3)], axis=1)
        B = np.zeros((6, 24))
        for k in range(3):
            B[k, k::3] = dN[:, k]
        for row, (i, j) in zip(range(3, 6), ((1, 2), (0, 2), (0, 1))):
            B[row, i::3], B[row, j::3] = dN[:, j], dN[:, i]
        K += B.T @ D @ B / 8
    return K


def _cantilever(shape=(8, 4, 4), seed=0, moduli=None):
    """`(K, f, B)`: a HEX8 cantilever clamped at x = 0 with a moderately
    varying modulus per cell (or `moduli`), its free unknowns' rigid-body
    modes."""
    nodes = np.arange(np.prod([s + 1 for s in shape])).reshape([s + 1 for s in shape])
    cells = np.stack([nodes[tuple(slice(c, c + s) for c, s in zip(o, shape))].ravel()
                      for o in itertools.product((0, 1), repeat=3)], axis=1)
    dofs = (3 * cells[:, :, None] + np.arange(3)).reshape(len(cells), 24)
    E = np.random.default_rng(seed).uniform(0.3, 1.0, len(cells)) if moduli is None \
        else np.asarray(moduli, float)
    Ke = _hex8_stiffness()
    a, b = np.meshgrid(np.arange(24), np.arange(24), indexing="ij")
    n = 3 * nodes.size
    K = sp.coo_matrix(((E[:, None] * Ke.ravel()).ravel(),
                       (dofs[:, a.ravel()].ravel(), dofs[:, b.ravel()].ravel())),
                      shape=(n, n)).tocsr()
    points = np.stack(np.meshgrid(*[np.arange(s + 1.0) for s in shape], indexing="ij"),
                      -1).reshape(-1, 3)
    free = np.repeat(points[:, 0] > 0, 3)
    K = K[free][:, free].tocsr()
    K.sort_indices()
    f = np.zeros(n)
    f[3 * np.flatnonzero(points[:, 0] == shape[0]) + 2] = -1.0
    return K, f[free], sd.linalg.rigid_body_modes(points)[free]


def _solve(K, f, pre, maxiter, **kw):
    A = lambda d: sd.sparse.csr_matrix((d, K.indices, K.indptr), shape=K.shape)  # noqa: E731
    return sd.function(lambda d, f: sd.linalg.solve(
        A(d), f, solver="cg", preconditioner=pre, tol=1e-10, maxiter=maxiter, **kw))(K.data, f)


def test_rigid_body_modes_are_the_null_space_of_a_free_element():
    Ke = _hex8_stiffness()
    corners = np.array(list(itertools.product((0.0, 1.0), repeat=3)))
    B = sd.linalg.rigid_body_modes(corners)
    assert B.shape == (24, 6) and np.linalg.matrix_rank(B) == 6
    np.testing.assert_allclose(Ke @ B, 0.0, atol=1e-13)  # (and its 6 zero eigenvalues only)
    assert np.sum(np.linalg.eigvalsh(Ke) < 1e-12) == 6
    B2 = sd.linalg.rigid_body_modes(np.random.default_rng(0).random((5, 2)))
    assert B2.shape == (10, 3) and np.linalg.matrix_rank(B2) == 3
    for bad in (np.zeros((4, 4)), np.zeros(6), np.array([[0.0, np.nan, 0.0]])):
        with pytest.raises(ShapeError, match="linalg.rigid_body_modes"):
            sd.linalg.rigid_body_modes(bad)


def test_the_tentative_prolongator_fits_the_candidates_on_every_level():
    K, _, B = _cantilever()
    pre = sd.linalg.AMG(B, block_size=3)
    s = pre.structure(sd.sparse.from_scipy(K).type.pattern)
    assert len(s.levels) >= 2, s.nnz()
    cand = B
    for lv in s.levels:
        t = lv.t.toarray()
        # each aggregate's columns orthonormal (or zero), and B = T B_c
        gram = t.T @ t
        np.testing.assert_allclose(gram, np.diag(np.diag(gram)), atol=1e-12)
        assert set(np.round(np.diag(gram), 12)) <= {0.0, 1.0}
        coarse = t.T @ cand  # (T's columns orthonormal: B_c = T^T B)
        np.testing.assert_allclose(t @ coarse, cand, atol=1e-10)
        # a node's unknowns are in one aggregate
        agg = lv.t.indices.reshape(lv.n, -1)[:, 0] // coarse.shape[1]
        block = 3 if cand is B else 6
        assert np.all(agg.reshape(-1, block) == agg.reshape(-1, block)[:, :1])
        cand = coarse


def test_rigid_body_modes_make_cg_converge_where_a_constant_candidate_does_not():
    """On elasticity, measured (8 x 4 x 4 cells, 20-unknown coarsest level):
    CG + AMG with the rigid-body modes 28 steps, with "amg" 71."""
    K, f, B = _cantilever()
    x = _solve(K, f, sd.linalg.AMG(B, block_size=3), 40)
    np.testing.assert_allclose(x, spl.spsolve(K.tocsc(), f), rtol=1e-7,
                               atol=1e-8 * np.abs(x).max())
    with pytest.raises(ConvergenceError):
        _solve(K, f, "amg", 40)
    # solver="amg" is the same shorthand with a configured AMG
    y = sd.function(lambda d: sd.linalg.solve(
        sd.sparse.csr_matrix((d, K.indices, K.indptr), shape=K.shape), f, solver="amg",
        preconditioner=sd.linalg.AMG(B, block_size=3), tol=1e-10, maxiter=40,
        assume="spd"))(K.data)
    np.testing.assert_allclose(y, x, rtol=1e-8, atol=1e-10 * np.abs(x).max())


def test_gradient_through_the_preconditioned_solve_is_the_direct_solves():
    K, f, B = _cantilever((4, 2, 2))
    pre = sd.linalg.AMG(B, block_size=3)
    w = np.random.default_rng(1).standard_normal(K.shape[0])

    def loss(d, **kw):
        A = sd.sparse.csr_matrix((d, K.indices, K.indptr), shape=K.shape)
        return sd.numpy.dot(w, sd.linalg.solve(A, f, **kw))

    g = sd.function(sd.grad(lambda d: loss(d, solver="cg", preconditioner=pre, tol=1e-12,
                                           assume="spd")))(K.data)
    g_ref = sd.function(sd.grad(lambda d: loss(d, solver="splu")))(K.data)
    np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=1e-9 * np.abs(g_ref).max())


def test_the_preconditioner_is_a_param_equal_by_content_printed_and_serialized():
    K, f, B = _cantilever((4, 2, 2))
    a, b = sd.linalg.AMG(B, block_size=3), sd.linalg.AMG(B.copy(), block_size=3)
    assert a == b and hash(a) == hash(b) and a != sd.linalg.AMG(2 * B, block_size=3)
    assert a != sd.linalg.AMG() and repr(sd.linalg.AMG()) == "amg"
    assert repr(a).startswith("amg(block 3, 6 candidates #")

    def run(d):
        return sd.linalg.solve(sd.sparse.csr_matrix((d, K.indices, K.indptr), shape=K.shape),
                               f, solver="cg", preconditioner=a, tol=1e-10)

    g = sd.trace(run, K.data)
    assert repr(a) in str(g)
    back = sd.graph.graph_from_json(sd.graph.graph_to_json(g))
    (node,) = [n for n in back.nodes if n.primitive.name == "linalg.solve"]
    assert node.params["preconditioner"] == a
    np.testing.assert_array_equal(node.params["preconditioner"].near_null_space, B)


def test_bad_near_null_spaces_are_refused():
    K, f, B = _cantilever((4, 2, 2))
    with pytest.raises(ShapeError, match="near_null_space has .* rows, but .* unknowns"):
        _solve(K, f, sd.linalg.AMG(B[:-3], block_size=3), 10)
    with pytest.raises(ShapeError, match="not a multiple of block_size = 3"):
        sd.linalg.AMG(B[:-1], block_size=3)
    with pytest.raises(InvalidOptionError, match="non-finite"):
        sd.linalg.AMG(np.where(B > 0.5, np.nan, B), block_size=3)
    with pytest.raises(InvalidOptionError, match="pass `near_null_space` with it"):
        sd.linalg.AMG(block_size=3)
    with pytest.raises(InvalidOptionError, match="block_size"):
        sd.linalg.AMG(B, block_size=0)
    with pytest.raises(ShapeError, match=r"array \(n, k\)"):
        sd.linalg.AMG(np.zeros((2, 3, 4)))
    with pytest.raises(InvalidOptionError, match="solver='amg' is preconditioned by 'amg'"):
        sd.linalg.solve(sd.sparse.from_scipy(K), f, solver="amg", preconditioner="jacobi")



def _on_pattern(K, C) -> np.ndarray:
    """The values of the sparse matrix `C` at the stored entries of `K` (0
    where `C` has none; `C`'s entries lie within `K`'s pattern)."""
    n = K.shape[1]
    rows = np.repeat(np.arange(K.shape[0]), np.diff(K.indptr))
    keys = rows * n + K.indices
    c = C.tocoo()
    out = np.zeros(K.nnz)
    np.add.at(out, np.searchsorted(keys, c.row * n + c.col), c.data)
    return out


def test_rules_through_cg_with_the_rigid_body_modes():
    """check_rules through a CG solve preconditioned by AMG with the
    rigid-body modes, the matrix a function of the per-cell moduli (a
    symmetric matrix for every modulus), without second order and
    batching."""
    import sciad.numpy as snp

    shape = (4, 2, 2)
    K, f, B = _cantilever(shape, moduli=np.ones(int(np.prod(shape))))
    m = int(np.prod(shape))
    # column e: the stored values of K with a unit modulus in cell e alone
    M = np.stack([_on_pattern(K, _cantilever(shape, moduli=np.eye(m)[e])[0])
                  for e in range(m)], axis=1)
    E = np.random.default_rng(3).uniform(0.5, 1.0, m)
    np.testing.assert_allclose(M @ np.ones(m), K.data, rtol=1e-12,
                               atol=1e-12 * np.abs(K.data).max())
    pre = sd.linalg.AMG(B, block_size=3)

    def solve(E, b):
        A = sd.sparse.csr_matrix((snp.matmul(M, E), K.indices, K.indptr), shape=K.shape)
        return sd.linalg.solve(A, b, solver="cg", preconditioner=pre, tol=1e-12)

    sd.testing.check_rules(solve, E, f, rtol=1e-5, second_order=False, batch=False)
