"""`sciad.fem`: scikit-fem forms assembled with sciad coefficients, checked
against scikit-fem's own matrices and vectors, and their derivatives."""

from __future__ import annotations

import numpy as np
import pytest
import skfem
from skfem.helpers import ddot, dot, grad, sym_grad, trace

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, InvalidOptionError, MissingCoefficientError, ShapeError

RNG = np.random.default_rng(0)


@skfem.BilinearForm
def diffusion(u, v, w):
    return w.k * dot(grad(u), grad(v)) + w.c * u * v


@skfem.BilinearForm
def advection(u, v, w):  # not symmetric; reads the coefficient's gradient
    return dot(grad(w.k), grad(u)) * v + w.k * u * v


@skfem.LinearForm
def source(v, w):
    return w.k * v + dot(grad(w.k), grad(v))


@skfem.Functional
def energy(w):
    return w.k ** 2 + dot(grad(w.k), grad(w.k))


@skfem.BilinearForm
def elasticity(u, v, w):
    e_u, e_v = sym_grad(u), sym_grad(v)
    return 2.0 * w.mu * ddot(e_u, e_v) + w.lam * trace(e_u) * trace(e_v)


def _basis(name):
    if name == "tri-p1":
        return skfem.Basis(skfem.MeshTri().refined(2), skfem.ElementTriP1())
    if name == "tri-p2":
        return skfem.Basis(skfem.MeshTri().refined(1), skfem.ElementTriP2())
    if name == "tet-p1":
        return skfem.Basis(skfem.MeshTet().refined(1), skfem.ElementTetP1())
    if name == "quad-q1":
        return skfem.Basis(skfem.MeshQuad().refined(2), skfem.ElementQuad1())
    raise ValueError(name)


BASES = ["tri-p1", "tri-p2", "tet-p1", "quad-q1"]


def _dense(A):
    return np.asarray(A.todense())


def _nodal(basis):
    return 1.0 + RNG.random(basis.N)


# ---------------------------------------------------------------------------
# values: equal to scikit-fem's


@pytest.mark.parametrize("name", BASES)
def test_bilinear_matches_skfem(name):
    basis = _basis(name)
    k = _nodal(basis)
    K = sd.fem.assemble(diffusion, basis, k=k, c=0.5)
    ref = diffusion.assemble(basis, k=k, c=0.5)
    np.testing.assert_allclose(_dense(K), ref.toarray(), rtol=0, atol=1e-13)
    traced = sd.function(lambda k: sd.fem.assemble(diffusion, basis, k=k, c=0.5).todense())
    np.testing.assert_allclose(traced(k), ref.toarray(), rtol=0, atol=1e-13)
    # the pattern is scikit-fem's (its structural entries)
    assert K.type.nnz == ref.tocsr().nnz or K.type.nnz >= (ref != 0).nnz


@pytest.mark.parametrize("name", ["tri-p1", "tri-p2", "tet-p1"])
def test_linear_form_and_functional_match_skfem(name):
    basis = _basis(name)
    k = _nodal(basis)
    f = sd.function(lambda k: sd.fem.assemble(source, basis, k=k))(k)
    np.testing.assert_allclose(f, source.assemble(basis, k=k), rtol=0, atol=1e-13)
    e = sd.function(lambda k: sd.fem.assemble(energy, basis, k=k))(k)
    np.testing.assert_allclose(e, energy.assemble(basis, k=k), rtol=1e-13)
    A = sd.function(lambda k: sd.fem.assemble(advection, basis, k=k).todense())(k)
    np.testing.assert_allclose(A, advection.assemble(basis, k=k).toarray(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("dim", [2, 3])
def test_vector_elasticity_matches_skfem(dim):
    if dim == 2:
        mesh, elem = skfem.MeshTri().refined(1), skfem.ElementTriP1()
    else:
        mesh, elem = skfem.MeshTet(), skfem.ElementTetP1()
    basis = skfem.Basis(mesh, skfem.ElementVector(elem))
    scalar = basis.with_element(elem)
    nq = basis.X.shape[-1]
    lam = 1.0 + RNG.random(mesh.nelements)          # element-wise
    mu = 1.0 + RNG.random(scalar.N)                  # nodal, on the scalar basis
    ref = elasticity.assemble(basis, lam=np.repeat(lam[:, None], nq, axis=1),
                              mu=scalar.interpolate(mu))
    f = sd.function(lambda lam, mu: sd.fem.assemble(
        elasticity, basis, lam=lam, mu=sd.fem.interpolate(scalar, mu)).todense())
    np.testing.assert_allclose(f(lam, mu), ref.toarray(), rtol=0, atol=1e-12)

    @skfem.BilinearForm
    def drift(u, v, w):  # a vector field of the vector basis in a scalar form
        return dot(w.b, grad(u)) * v + ddot(grad(w.b), grad(w.b)) * u * v

    b = RNG.standard_normal(basis.N)
    ref = drift.assemble(scalar, b=basis.interpolate(b))
    with pytest.raises(ShapeError, match="nodal array of basis.N"):
        sd.fem.assemble(drift, scalar, b=b)  # b lives on the vector basis
    got = sd.function(lambda b: sd.fem.assemble(
        drift, scalar, b=sd.fem.interpolate(basis, b)).todense())(b)
    np.testing.assert_allclose(got, ref.toarray(), rtol=0, atol=1e-13)


def test_vector_nodal_coefficient_on_vector_basis():
    basis = skfem.Basis(skfem.MeshTri().refined(1), skfem.ElementVector(skfem.ElementTriP1()))

    @skfem.LinearForm
    def body(v, w):
        return dot(w.b, v) + ddot(grad(w.b), grad(v))

    b = RNG.standard_normal(basis.N)
    got = sd.function(lambda b: sd.fem.assemble(body, basis, b=b))(b)
    np.testing.assert_allclose(got, body.assemble(basis, b=b), rtol=0, atol=1e-13)


@pytest.mark.parametrize("kind", ["nodal", "element", "element-column", "quadrature", "scalar",
                                  "python-scalar"])
def test_each_coefficient_kind_matches_skfem(kind):
    basis = _basis("tri-p2")
    ne, nq = basis.nelems, basis.X.shape[-1]
    k, ref_k = _coefficient(kind, basis)
    want = diffusion.assemble(basis, k=ref_k, c=2.0).toarray()
    if kind == "python-scalar":
        got = sd.function(lambda: sd.fem.assemble(diffusion, basis, k=k, c=2.0).todense())()
    else:
        got = sd.function(lambda k: sd.fem.assemble(diffusion, basis, k=k, c=2.0).todense())(k)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert (ne, nq) == (basis.nelems, basis.X.shape[-1])


def _coefficient(kind, basis):
    """A coefficient of each kind and what scikit-fem is given for it."""
    ne, nq = basis.nelems, basis.X.shape[-1]
    if kind == "nodal":
        k = _nodal(basis)
        return k, k
    if kind == "element":
        k = 1.0 + RNG.random(ne)
        return k, np.repeat(k[:, None], nq, axis=1)
    if kind == "element-column":
        k = 1.0 + RNG.random((ne, 1))
        return k, np.repeat(k, nq, axis=1)
    if kind == "quadrature":
        k = 1.0 + RNG.random((ne, nq))
        return k, k
    if kind == "scalar":
        return np.array(1.7), 1.7
    return 1.7, 1.7


# ---------------------------------------------------------------------------
# derivatives


@pytest.mark.parametrize("kind", ["nodal", "element", "element-column", "quadrature", "scalar"])
def test_check_rules_each_coefficient_kind(kind):
    basis = skfem.Basis(skfem.MeshTri(), skfem.ElementTriP1())
    k, _ = _coefficient(kind, basis)

    def f(k):
        K = sd.fem.assemble(diffusion, basis, k=snp.exp(k) if kind == "nodal" else k * k, c=1.0)
        return K.data

    sd.testing.check_rules(f, np.asarray(k, np.float64))


@pytest.mark.parametrize("which", ["linear", "functional", "advection", "elasticity"])
def test_check_rules_linear_functional_and_elasticity(which):
    basis = skfem.Basis(skfem.MeshTri(), skfem.ElementTriP2())
    k = _nodal(basis)
    if which == "linear":
        sd.testing.check_rules(lambda k: sd.fem.assemble(source, basis, k=k * k), k,
                               batch=False)
    elif which == "functional":
        sd.testing.check_rules(lambda k: sd.fem.assemble(energy, basis, k=snp.sin(k)), k)
    elif which == "advection":
        sd.testing.check_rules(lambda k: sd.fem.assemble(advection, basis, k=k).data, k,
                               batch=False)
    else:
        vb = skfem.Basis(skfem.MeshTri(), skfem.ElementVector(skfem.ElementTriP1()))
        lam = 1.0 + RNG.random(vb.nelems)
        sd.testing.check_rules(
            lambda lam, mu: sd.fem.assemble(elasticity, vb, lam=lam * lam, mu=mu).data, lam,
            np.array(0.7), batch=False)


def test_gradient_through_solve_matches_hand_adjoint():
    """d/dm of 0.5 |u(m) - d|^2 with K(exp(m)) u = f, against scikit-fem +
    SciPy with the adjoint written by hand."""
    import scipy.sparse.linalg as spla

    basis = skfem.Basis(skfem.MeshTri().refined(3), skfem.ElementTriP1())
    D = basis.get_dofs()
    m = 0.3 * RNG.standard_normal(basis.N)
    d = RNG.standard_normal(basis.N)

    def misfit(m):
        K = sd.fem.assemble(diffusion, basis, k=snp.exp(m), c=0.0)
        f = sd.fem.assemble(source, basis, k=1.0 + 0.0 * m)
        u = sd.fem.solve(*sd.fem.condense(K, f, D=D))
        return 0.5 * snp.sum((u - d) ** 2)

    val, g = sd.value_and_grad(misfit)(m)
    # by hand
    K = diffusion.assemble(basis, k=np.exp(m), c=0.0)
    f = source.assemble(basis, k=np.ones(basis.N))
    A, b, x, I = skfem.condense(K, f, D=D)
    uI = spla.spsolve(A.tocsc(), b)
    u = x.copy()
    u[I] = uI
    lamI = spla.spsolve(A.T.tocsc(), (u - d)[I])
    lam = np.zeros(basis.N)
    lam[I] = lamI

    # g_j = -lam^T (dK/dm_j) u; K is linear in k = exp(m): dK/dk_j by finite columns
    g_ref = np.zeros(basis.N)
    for j in range(basis.N):
        e = np.zeros(basis.N)
        e[j] = 1.0
        dK = diffusion.assemble(basis, k=e, c=0.0)
        g_ref[j] = -lam @ (dK @ u) * np.exp(m[j])
    np.testing.assert_allclose(val, 0.5 * np.sum((u - d) ** 2), rtol=1e-12)
    np.testing.assert_allclose(g, g_ref, rtol=1e-8, atol=1e-12)


def test_pattern_and_index_made_once_and_one_scatter_node():
    basis = skfem.Basis(skfem.MeshTri().refined(1), skfem.ElementTriP1())
    k = _nodal(basis)
    g = sd.trace(lambda k: sd.fem.assemble(diffusion, basis, k=k, c=1.0).data, k)
    names = [n.primitive.name for n in g.nodes]
    assert names.count("sparse.assemble") == 1
    assert len(names) < 15  # vectorized: no per-element or per-basis-pair nodes
    from sciad import fem

    plan = fem._plan("bilinear", basis, None)
    sd.fem.assemble(diffusion, basis, k=k, c=1.0)
    assert fem._plan("bilinear", basis, None) is plan


# ---------------------------------------------------------------------------
# boundary conditions, facets, probes, meshes


def test_condense_and_solve_match_skfem_with_boundary_values():
    basis = skfem.Basis(skfem.MeshTri().refined(3), skfem.ElementTriP1())
    k = _nodal(basis)
    K = diffusion.assemble(basis, k=k, c=0.0)
    f = source.assemble(basis, k=k)
    D = basis.get_dofs()
    x = basis.project(lambda x: x[0] * x[1])
    want = skfem.solve(*skfem.condense(K, f, x=x, D=D))

    def run(k, x):
        K = sd.fem.assemble(diffusion, basis, k=k, c=0.0, tags="spd")
        f = sd.fem.assemble(source, basis, k=k)
        A, b, xx, I = sd.fem.condense(K, f, x, D=D)
        assert "spd" in A.type.tags
        return sd.fem.solve(A, b, xx, I)

    np.testing.assert_allclose(sd.function(run)(k, x), want, rtol=1e-10, atol=1e-12)
    # eagerly, on concrete matrices
    Kc = sd.fem.assemble(diffusion, basis, k=k, c=0.0)
    AII, bI, _, I = sd.fem.condense(Kc, f, x, D=D)
    want_A, want_b, _, _ = skfem.condense(K, f, x=x, D=D)
    np.testing.assert_allclose(_dense(AII), want_A.toarray(), atol=1e-13)
    np.testing.assert_allclose(bI, want_b, atol=1e-13)
    # keeping I instead of dismissing D; no right-hand side
    AII2 = sd.fem.condense(Kc, I=I, expand=False)
    np.testing.assert_allclose(_dense(AII2), want_A.toarray(), atol=1e-13)


@pytest.mark.slow
def test_condense_derivative_in_coefficient_and_boundary_values():
    basis = skfem.Basis(skfem.MeshTri().refined(1), skfem.ElementTriP1())
    k = _nodal(basis)
    D = basis.get_dofs()
    x = RNG.standard_normal(basis.N)

    def u_of(k, x):
        K = sd.fem.assemble(diffusion, basis, k=k, c=1.0)
        f = sd.fem.assemble(source, basis, k=k)
        return sd.fem.solve(*sd.fem.condense(K, f, x, D=D))

    sd.testing.check_rules(u_of, k, x, second_order=False, batch=False)


def test_robin_boundary_on_facet_basis_matches_skfem():
    mesh = skfem.MeshTri().refined(2)
    basis = skfem.Basis(mesh, skfem.ElementTriP2())
    fb = skfem.FacetBasis(mesh, basis.elem)

    @skfem.BilinearForm
    def robin(u, v, w):
        return w.h_c * u * v

    @skfem.LinearForm
    def flux(v, w):
        return w.g * v + w.h_c * dot(w.n, w.n) * v

    hc = _nodal(fb)
    g = RNG.random((fb.nelems, fb.X.shape[-1]))
    want = robin.assemble(fb, h_c=hc).toarray()
    got = sd.function(lambda hc: sd.fem.assemble(robin, fb, h_c=hc).todense())(hc)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    gotf = sd.function(lambda hc, g: sd.fem.assemble(flux, fb, h_c=hc, g=g))(hc, g)
    np.testing.assert_allclose(gotf, flux.assemble(fb, h_c=hc, g=g), rtol=0, atol=1e-13)
    sd.testing.check_rules(lambda hc: sd.fem.assemble(robin, fb, h_c=hc * hc).data, hc,
                           batch=False)


def test_probes_match_skfem_and_differentiate():
    basis = skfem.Basis(skfem.MeshTri().refined(2), skfem.ElementTriP2())
    pts = np.array([[0.1, 0.5, 0.77], [0.2, 0.5, 0.31]])
    u = RNG.standard_normal(basis.N)
    P = basis.probes(pts)
    np.testing.assert_allclose(sd.function(lambda u: sd.fem.probes(basis, pts) @ u)(u),
                               P @ u, rtol=1e-13)
    assert sd.fem.probes(basis, pts) is sd.fem.probes(basis, pts.copy())
    sd.testing.check_rules(lambda u: sd.fem.probes(basis, pts) @ (u * u), u)
    with pytest.raises(ShapeError, match=r"\(dim, npoints\)"):
        sd.fem.probes(basis, pts.T)


def test_refined_and_meshio_meshes(tmp_path):
    pytest.importorskip("meshio")
    mesh = skfem.MeshTri.init_circle(2)
    path = tmp_path / "disc.msh"
    mesh.save(str(path))
    loaded = skfem.Mesh.load(str(path))
    basis = skfem.Basis(loaded.refined(1), skfem.ElementTriP1())
    k = _nodal(basis)
    got = sd.function(lambda k: sd.fem.assemble(diffusion, basis, k=k, c=1.0).todense())(k)
    np.testing.assert_allclose(got, diffusion.assemble(basis, k=k, c=1.0).toarray(), atol=1e-13)


# ---------------------------------------------------------------------------
# errors


def test_errors_name_the_op_and_what_to_do():
    basis = skfem.Basis(skfem.MeshTri().refined(1), skfem.ElementTriP1())
    with pytest.raises(ShapeError, match=r"fem.assemble.*coefficient `k` has shape \(7,\); "
                                         r"expected a nodal array of basis.N = 9"):
        sd.fem.assemble(diffusion, basis, k=np.ones(7), c=1.0)
    with pytest.raises(ShapeError, match=r"\(\.\.\., 8, 3\)"):
        sd.function(lambda k: sd.fem.assemble(diffusion, basis, k=k, c=1.0).data)(
            np.ones((8, 2)))
    with pytest.raises(DTypeError, match="BilinearForm"):
        sd.fem.assemble(lambda u, v, w: u * v, basis)

    @skfem.BilinearForm
    def vector_valued(u, v, w):
        return grad(u) * v

    with pytest.raises(ShapeError, match="dot"):
        sd.fem.assemble(vector_valued, basis)
    with pytest.raises(InvalidOptionError, match="exactly one of `I`"):
        sd.fem.condense(sd.fem.assemble(diffusion, basis, k=1.0, c=1.0), np.ones(basis.N))
    with pytest.raises(InvalidOptionError, match="tags"):
        sd.fem.assemble(source, basis, k=1.0, tags="spd")


def test_einsum_ellipsis_as_numpy():
    cases = [("i...,i...", [(2, 5, 3), (2, 5, 3)]), ("i...,i...", [(2, 5, 3), (2, 4, 5, 3)]),
             ("ij...->ji...", [(2, 3, 5)]), ("ij...,j...->i...", [(2, 3, 4, 5), (3, 4, 5)]),
             ("i...,j...->ij...", [(2, 1, 3), (3, 4, 3)]), ("...i,...i->...", [(2, 3, 4), (4,)])]
    for spec, shapes in cases:
        xs = [RNG.standard_normal(s) for s in shapes]
        got = sd.function(lambda *a: snp.einsum(spec, *a))(*xs)
        np.testing.assert_allclose(got, np.einsum(spec, *xs), rtol=1e-13)
    with pytest.raises(ShapeError, match="broadcast"):
        sd.trace(lambda a, b: snp.einsum("i...,i...", a, b), np.ones((2, 3)), np.ones((2, 4)))


def test_default_parameters_x_and_h_reach_the_form():
    basis = _basis("tri-p2")

    @skfem.LinearForm
    def weighted(v, w):
        return w.k * w.x[0] * w.h * v + w.x[1] ** 2 * v

    k = _nodal(basis)
    got = sd.function(lambda k: sd.fem.assemble(weighted, basis, k=k))(k)
    np.testing.assert_allclose(got, weighted.assemble(basis, k=k), rtol=0, atol=1e-14)


def test_a_missing_coefficient_names_the_form_and_the_ones_given():
    # (it was scikit-fem's bare "Attribute 'k' not found in 'w'")
    basis = skfem.Basis(skfem.MeshTri().refined(2), skfem.ElementTriP1())
    with pytest.raises(MissingCoefficientError,
                       match=r"the form `diffusion` reads the coefficient `w.k`.*given: `kk`.*"
                             r"rename it `k=`") as e:
        sd.fem.assemble(diffusion, basis, kk=np.ones(basis.N))
    assert isinstance(e.value, AttributeError)  # (`hasattr(w, name)` in a form still works)
    with pytest.raises(MissingCoefficientError, match=r"given: none.*assemble\(diffusion, basis"):
        sd.fem.assemble(diffusion, basis)
