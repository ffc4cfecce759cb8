"""`sd.optimize.root` and `sd.optimize.fixed_point`: roots against SciPy,
implicit derivatives (first and second order, forward and reverse, through
`jax.grad(sd.to_jax(...))`) against finite differences, the three Jacobian
kinds, batching, and the failures: each diagnosis, `throw=False`, and the
refused derivative of a failed solve."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.optimize

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, InvalidOptionError, ShapeError

N = 12


def _klu_usable() -> bool:
    from sciad.solvers.nonlinear import _jacobian_klu
    return _jacobian_klu.usable()


def residual_in(xp):
    """`-(k(u) u')' - f` on a 1-D grid, `k = c (1 + u^2)`, zero Dirichlet ends,
    written with `xp` (sciad.numpy, NumPy or jax.numpy)."""
    def diffusion(u, f, c=1.0):
        h = 1.0 / (u.shape[0] + 1)
        up = xp.pad(u, (1, 1))
        k = c * (1.0 + up ** 2)
        flux = 0.5 * (k[1:] + k[:-1]) * (up[1:] - up[:-1]) / h
        return -(flux[1:] - flux[:-1]) / h - f
    return diffusion


diffusion, diffusion_np = residual_in(snp), residual_in(np)


@pytest.mark.parametrize("jac", ["sparse", "dense", "gmres",
                                 pytest.param("klu", marks=pytest.mark.skipif(
                                     not _klu_usable(), reason="needs klujax on the CPU"))])
def test_root_agrees_with_scipy(jac, rng):
    f = 20.0 + 5.0 * rng.standard_normal(N)
    res = sd.optimize.root(diffusion, np.zeros(N), (f,), jac=jac)
    want = scipy.optimize.root(diffusion_np, np.zeros(N), (f,), tol=1e-13).x
    assert res.success and res.status == 0 and 1 <= res.nit <= 10
    assert res.residual <= 1e-10 * np.abs(f).max()
    np.testing.assert_allclose(np.asarray(res.x), want, rtol=1e-9, atol=1e-12)


def test_newton_krylov_is_matrix_free(rng):
    f = 20.0 + 5.0 * rng.standard_normal(N)
    res = sd.optimize.root(diffusion, np.zeros(N), (f,), method="newton_krylov")
    ref = sd.optimize.root(diffusion, np.zeros(N), (f,), jac="sparse")
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(ref.x), rtol=1e-9)
    graph = sd.trace(lambda f: sd.optimize.root(diffusion, snp.zeros(N), (f,),
                                                method="newton_krylov").x, f)
    assert "jac='gmres'" in str(graph) and "pattern=" not in str(graph)
    with pytest.raises(InvalidOptionError, match="matrix-free"):
        sd.optimize.root(diffusion, np.zeros(N), (f,), method="newton_krylov", jac="dense")


@pytest.mark.parametrize("jac", ["sparse", pytest.param("dense", marks=pytest.mark.slow)])
def test_the_chord_method_factors_once_and_differentiates_as_newton(jac, rng, monkeypatch):
    # from a start near the root, the chord method keeps its first
    # factorization; the root and its (implicit) derivative are Newton's
    from sciad.solvers.direct import _sparse_direct as sdir

    f = 20.0 + 5.0 * rng.standard_normal(N)
    x0 = np.asarray(sd.optimize.root(diffusion, np.zeros(N), (f,)).x) * 1.01
    factored = []
    make = sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or make(*a))

    def solve(f, method):
        return sd.optimize.root(diffusion, x0, (f,), method=method, jac=jac)

    chord, newton = solve(f, "chord"), solve(f, "newton")
    assert chord.success and chord.nit >= newton.nit >= 2
    if jac == "sparse":
        assert len(factored) == 1 + newton.nit  # chord: one; Newton: one per iteration
    np.testing.assert_allclose(np.asarray(chord.x), np.asarray(newton.x), rtol=1e-9)
    g = [np.asarray(sd.grad(lambda f: snp.sum(solve(f, m).x ** 2))(f)) for m in
         ("chord", "newton")]
    np.testing.assert_allclose(g[0], g[1], rtol=1e-8)
    with pytest.raises(InvalidOptionError, match="chord.*factorization"):
        sd.optimize.root(diffusion, x0, (f,), method="chord", jac="gmres")


def test_chord_roots_started_with_one_matrix_share_its_factorization(rng, monkeypatch):
    """`jac0`: the chord's first matrix. Two roots given the same sparse
    matrix (a Jacobian near both roots, as the stages of an implicit time
    step are) factor it once between them; their roots and implicit
    derivatives are Newton's. A dense `jac0` works too, and with a start
    already at the root the derivative still reads the shared factor."""
    from sciad.solvers.direct import _sparse_direct as sdir

    f = 20.0 + 5.0 * rng.standard_normal(N)
    g = f * 1.02
    x0 = np.asarray(sd.optimize.root(diffusion, np.zeros(N), (f,)).x)
    factored = []
    make = sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or make(*a))

    def both(f, g, jac="sparse"):
        J0 = sd.sparse.jacobian(lambda x: diffusion(x, f))(x0)
        if jac == "dense":
            J0 = sd.sparse.todense(J0)
        a = sd.optimize.root(diffusion, x0 * 1.01, (f,), method="chord", jac="sparse", jac0=J0)
        b = sd.optimize.root(diffusion, x0 * 0.99, (g,), method="chord", jac="sparse", jac0=J0)
        return a.x, b.x, a.nit + b.nit

    xa, xb, nit = sd.function(both)(f, g)
    assert len(factored) == 1 and int(nit) >= 4, (len(factored), nit)
    for x, rhs in ((xa, f), (xb, g)):
        ref = sd.optimize.root(diffusion, np.zeros(N), (rhs,), jac="sparse")
        np.testing.assert_allclose(np.asarray(x), np.asarray(ref.x), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(sd.function(lambda f, g: both(f, g, "dense"))(f, g)[0]),
                               np.asarray(xa), rtol=1e-9)

    def loss(f, start):  # (started at the root: no iteration, the factor shared)
        J0 = sd.sparse.jacobian(lambda x: diffusion(x, f))(x0)
        return snp.sum(sd.optimize.root(diffusion, start, (f,), method="chord",
                                        jac="sparse", jac0=J0, atol=1e-9).x ** 2)

    want = sd.grad(lambda f: snp.sum(sd.optimize.root(diffusion, np.zeros(N), (f,)).x ** 2))(f)
    for start in (x0 * 1.01, x0):
        np.testing.assert_allclose(np.asarray(sd.grad(loss)(f, start)), np.asarray(want),
                                   rtol=1e-8)


def test_a_gradient_taken_inside_another_trace_of_a_constant_argument(rng):
    """`sd.grad(g)(f)` inside a traced function, `f` a constant there: it is
    lifted into the trace, so the root's VJP forms its cotangent (it had
    given zero; also tests/test_autodiff.py)."""
    f = 20.0 + 5.0 * rng.standard_normal(N)

    def g(f):
        return snp.sum(sd.optimize.root(diffusion, np.zeros(N), (f,), jac="dense").x ** 2)

    want = np.asarray(sd.grad(g)(f))
    got = sd.function(lambda s: s * sd.grad(g)(f))(1.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    assert np.abs(want).max() > 0


@pytest.mark.slow
def test_a_root_started_with_jac0_passes_check_rules(rng):
    """The node with its `jac0` operand (no derivative flows through it):
    JVP against differences, VJP against JVP, second order, and `sd.vmap`
    (a `map` of the node, the operand batched with the others)."""
    def solve(f):
        x0 = 0.01 * f
        J0 = sd.sparse.jacobian(lambda x: diffusion(x, f))(x0)
        return sd.optimize.root(diffusion, x0, (f,), method="chord", jac="sparse", jac0=J0).x

    sd.testing.check_rules(solve, 5.0 + rng.random(N))


@pytest.mark.parametrize("kw, cls, match", [
    (dict(method="newton", jac0=np.eye(N)), InvalidOptionError, "needs method='chord'"),
    (dict(method="chord", jac="sparse", jac0=np.eye(N + 1)), ShapeError,
     r"must be an \(12, 12\) matrix"),
    (dict(method="chord", jac="sparse", jac0=sd.sparse.from_dense(np.eye(N))), ShapeError,
     "detected pattern"),
])
def test_a_wrong_jac0_is_refused(kw, cls, match):
    with pytest.raises(cls, match=match):
        sd.trace(lambda f: sd.optimize.root(diffusion, snp.zeros(N), (f,), **kw).x, np.ones(N))


def test_the_detected_pattern_is_the_stencil_and_the_graph_shows_it():
    f = np.ones(N)
    graph = sd.trace(lambda f: sd.optimize.root(diffusion, snp.zeros(N), (f,),
                                                jac="sparse").x, f)
    (node,) = [n for n in graph.nodes if n.primitive.name == "optimize.root"]
    pattern = node.params["pattern"]
    dense = np.zeros((N, N), bool)
    dense[pattern.rows, pattern.indices] = True
    want = np.abs(np.subtract.outer(np.arange(N), np.arange(N))) <= 1
    np.testing.assert_array_equal(dense, want)
    assert node.params["colors"] == 3
    text = str(graph)
    assert "optimize.root[" in text and f"<{N}x{N}, nnz={3 * N - 2}>" in text
    assert "colors=3" in text and "graph diffusion(" in text


def test_two_dimensional_root_with_sparse_jacobian():
    m = 8

    def bratu(u, lam):
        U = snp.pad(snp.reshape(u, (m, m)), 1)
        lap = (U[:-2, 1:-1] + U[2:, 1:-1] + U[1:-1, :-2] + U[1:-1, 2:] - 4 * U[1:-1, 1:-1])
        return snp.reshape(lap * (m + 1) ** 2 + lam * snp.exp(U[1:-1, 1:-1]), (m * m,))

    res = sd.optimize.root(bratu, np.zeros(m * m), (np.asarray(2.0),), jac="sparse")
    u = np.asarray(res.x).reshape(m, m)
    U = np.pad(u, 1)
    lap = U[:-2, 1:-1] + U[2:, 1:-1] + U[1:-1, :-2] + U[1:-1, 2:] - 4 * u
    assert np.abs(lap * (m + 1) ** 2 + 2.0 * np.exp(u)).max() < 1e-8
    assert u.max() > 0.05  # the lower branch, not the trivial start


def _solve(jac):
    def solve(f, c):
        return sd.optimize.root(lambda u, f, c: diffusion(u, f, c), snp.zeros(6), (f, c),
                                jac=jac).x
    return solve


@pytest.mark.skipif(not _klu_usable(), reason="needs klujax on the CPU")
def test_klu_jacobians_iterate_as_superlus_in_the_program(rng, monkeypatch):
    """`jac="klu"`: the same iterates as `"sparse"` (Newton, and the chord
    method with `jac0`), the same implicit derivatives, no SuperLU
    factorization on the host (each iteration one KLU call in the
    program), and a singular Jacobian is a failed solve, diagnosed."""
    from sciad.solvers.direct import _sparse_direct as sdir

    f = 20.0 + 5.0 * rng.standard_normal(N)
    x0 = np.asarray(sd.optimize.root(diffusion, np.zeros(N), (f,)).x) * 1.01
    J0 = sd.sparse.jacobian(lambda x: diffusion(x, f))(x0)
    factored = []
    make = sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or make(*a))
    for method, kw in (("newton", {}), ("chord", {"jac0": J0})):
        factored.clear()
        a = sd.optimize.root(diffusion, x0, (f,), method=method, jac="klu", **kw)
        assert not factored  # (KLU, in the program)
        b = sd.optimize.root(diffusion, x0, (f,), method=method, jac="sparse", **kw)
        assert a.success and a.nit == b.nit and factored
        np.testing.assert_allclose(np.asarray(a.x), np.asarray(b.x), rtol=1e-12)
    factored.clear()
    g = [np.asarray(sd.grad(lambda f, j=j: snp.sum(
        sd.optimize.root(diffusion, x0, (f,), jac=j).x ** 2))(f)) for j in ("klu", "sparse")]
    np.testing.assert_allclose(g[0], g[1], rtol=1e-9)
    graph = sd.trace(lambda f: sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="klu").x, f)
    assert "jac='klu'" in str(graph) and "factor<" not in str(graph)  # (none kept)

    def singular(x, f):  # x's first two entries only through their sum
        return snp.concatenate([(x[:1] + x[1:2]) * snp.ones(2) - f[:2], x[2:] - f[2:]])

    res = sd.optimize.root(singular, np.zeros(N), (f,), jac="klu", throw=False)
    assert not res.success
    with pytest.raises(ConvergenceError, match="singular"):
        sd.optimize.root(singular, np.zeros(N), (f,), jac="klu")


def test_klu_jacobians_are_refused_off_the_cpu(monkeypatch):
    from sciad.solvers.nonlinear import _jacobian_klu

    monkeypatch.setattr(_jacobian_klu, "usable", lambda: False)
    with pytest.raises(InvalidOptionError, match="jac='klu'.*CPU.*jac='sparse'"):
        # (a residual of its own: no program compiled before for it)
        sd.optimize.root(lambda u, f: diffusion(u, f) * 1.0, np.zeros(N), (np.ones(N),),
                         jac="klu")


def test_band_jacobians_iterate_as_superlus_with_one_factor_per_chord_solve(rng, monkeypatch):
    """`jac="band"` (a 1-D residual's tridiagonal Jacobian, sciad's banded
    LU in the program): the same iterates as `"sparse"` (Newton, and the
    chord method from `jac0`, which factors once: no SuperLU factorization
    on the host), the same implicit derivative; a singular Jacobian is a
    failed solve, diagnosed; a pattern that is no narrow band (a dense
    coupling) is refused, naming the forms to use instead."""
    from sciad.solvers.direct import _band, _sparse_direct as sdir

    if not _band.usable(np.float64):
        pytest.skip("the banded LU is not built here")
    f = 20.0 + 5.0 * rng.standard_normal(N)
    x0 = np.asarray(sd.optimize.root(diffusion, np.zeros(N), (f,)).x) * 1.01
    J0 = sd.sparse.jacobian(lambda x: diffusion(x, f))(x0)
    factored, host = [], sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or host(*a))
    for method, kw in (("newton", {}), ("chord", {"jac0": J0})):
        factored.clear()
        a = sd.optimize.root(diffusion, x0, (f,), method=method, jac="band", **kw)
        assert not factored  # (the banded LU, in the program)
        b = sd.optimize.root(diffusion, x0, (f,), method=method, jac="sparse", **kw)
        assert a.success and a.nit == b.nit and factored
        np.testing.assert_allclose(np.asarray(a.x), np.asarray(b.x), rtol=1e-12)
    g = [np.asarray(sd.grad(lambda f, j=j: snp.sum(
        sd.optimize.root(diffusion, x0, (f,), jac=j).x ** 2))(f)) for j in ("band", "sparse")]
    np.testing.assert_allclose(g[0], g[1], rtol=1e-9)

    def singular(x, f):  # x's first two entries only through their sum
        return snp.concatenate([(x[:1] + x[1:2]) * snp.ones(2) - f[:2], x[2:] - f[2:]])

    with pytest.raises(ConvergenceError, match="singular"):
        sd.optimize.root(singular, np.zeros(N), (f,), jac="band")
    with pytest.raises(InvalidOptionError, match="jac='band'.*narrow band.*jac='klu'"):
        sd.optimize.root(lambda x, f: x + snp.sum(x) ** 2 / 9.0 - f, np.zeros(80),
                         (np.ones(80),), jac="band")


@pytest.mark.skipif(not _klu_usable(), reason="needs klujax on the CPU")
def test_klu_jacobian_rules_pass_check_rules(rng):
    sd.testing.check_rules(_solve("klu"), 10.0 + rng.standard_normal(6), np.asarray(1.3))


_JAX_TRANSFORMS_OF_A_KLU_ROOT = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import sciad as sd, sciad.numpy as snp

def diffusion(u, f, c):
    up = snp.pad(u, (1, 1))
    k = c * (1.0 + up ** 2)
    flux = 0.5 * (k[1:] + k[:-1]) * (up[1:] - up[:-1]) * 7.0
    return -(flux[1:] - flux[:-1]) * 7.0 - f

def fn(jac):
    return sd.to_jax(lambda f: snp.sum(sd.optimize.root(
        diffusion, snp.zeros(6), (f, 1.3), jac=jac).x ** 3))

f = jnp.linspace(8.0, 12.0, 6)
v = jnp.linspace(-1.0, 1.0, 6)
out = {}
for jac in ("klu", "dense"):
    g = fn(jac)
    out[jac] = [np.ravel(np.asarray(r)).tolist() for r in (
        jax.jit(g)(f), jax.jit(jax.grad(g))(f), jax.jacfwd(jax.grad(g))(f),
        jax.jit(jax.hessian(g))(f), jax.vmap(lambda t: jax.jvp(g, (f,), (t,))[1])(
            jnp.stack([v, 2 * v])))]
json.dump(out, sys.stdout)
"""


@pytest.mark.slow  # ~9 s (jacfwd and hessian compile); the rules: check_rules above
@pytest.mark.skipif(not _klu_usable(), reason="needs klujax on the CPU")
def test_jax_transforms_of_to_jax_through_a_klu_root():
    """`jax.jit`, `grad`, `jacfwd` of `grad`, `hessian` and `vmap` of `jvp` of
    `sd.to_jax(f)` through a root with `jac="klu"` (its Newton solves and
    its derivatives' solves KLU calls in the program) agree with the same
    through `jac="dense"`; in a child process, where a crash fails the test."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _JAX_TRANSFORMS_OF_A_KLU_ROOT],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    for got, want in zip(out["klu"], out["dense"]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # the registry's check_rules runs the same (tests/registry_examples.py)
def test_implicit_rules_pass_check_rules(rng):
    # JVP against finite differences, VJP by the dot-product test, second
    # order and batching: in the source `f` and the coefficient `c`
    sd.testing.check_rules(_solve("sparse"), 10.0 + rng.standard_normal(6), np.asarray(1.3))


@pytest.mark.parametrize("jac", ["dense", pytest.param("gmres", marks=pytest.mark.slow)])
def test_dense_and_matrix_free_derivatives_agree_with_sparse(jac, rng):
    f, c = 10.0 + rng.standard_normal(6), np.asarray(1.3)
    w = rng.standard_normal(6)

    def loss(solve):
        return lambda f, c: snp.sum(w * solve(f, c) ** 2)

    want = sd.grad(loss(_solve("sparse")), argnums=(0, 1))(f, c)
    got = sd.grad(loss(_solve(jac)), argnums=(0, 1))(f, c)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-9)
    _, t_want = sd.jvp(_solve("sparse"), (f, c), (w, np.asarray(0.5)))
    _, t_got = sd.jvp(_solve(jac), (f, c), (w, np.asarray(0.5)))
    np.testing.assert_allclose(np.asarray(t_got), np.asarray(t_want), rtol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("jac", ["dense", "gmres"])
def test_implicit_rules_pass_check_rules_dense_and_matrix_free(jac, rng):
    sd.testing.check_rules(_solve(jac), 10.0 + rng.standard_normal(6), np.asarray(1.3),
                           batch=False)


def test_gradient_and_hvp_against_finite_differences(rng):
    f0 = 10.0 + rng.standard_normal(N)
    target = rng.standard_normal(N) * 0.1

    def loss(f):
        u = sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="sparse").x
        return snp.sum((u - target) ** 2)

    d = rng.standard_normal(N)
    grad = sd.grad(loss)  # one gradient, compiled once for its three calls
    g = np.asarray(grad(f0))
    eps = 1e-5
    fd = (loss(f0 + eps * d) - loss(f0 - eps * d)) / (2 * eps)
    assert abs(g @ d - fd) <= 1e-7 * abs(fd)
    hv = np.asarray(sd.hvp(loss, f0, d))
    fd_h = (np.asarray(grad(f0 + eps * d)) - np.asarray(grad(f0 - eps * d)))
    np.testing.assert_allclose(hv, fd_h / (2 * eps), rtol=1e-6, atol=1e-9)
    rates = sd.testing.taylor_test(loss, f0, d)
    assert min(rates) > 1.9


def test_jax_grad_of_to_jax_through_a_root(rng):
    def loss(f):
        return snp.sum(sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="sparse").x ** 3)

    f0 = 10.0 + rng.standard_normal(N)
    with sd.config.x64_scope():
        g = jax.grad(sd.to_jax(loss))(jax.numpy.asarray(f0))
    np.testing.assert_allclose(np.asarray(g), np.asarray(sd.grad(loss)(f0)), rtol=1e-12)


def test_the_iterations_are_not_differentiated(rng):
    # the derivative is the implicit one: a solve stopped early (loose tol)
    # still differentiates as the root it reached, exactly: d/df of the root
    # solve equals that of the exact solution map to the solve's accuracy
    f0 = 10.0 + rng.standard_normal(N)

    def x_of(f, tol):
        return sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="dense", tol=tol).x

    jt = np.asarray(sd.jacfwd(lambda f: x_of(f, 1e-12))(f0))
    jl = np.asarray(sd.jacfwd(lambda f: x_of(f, 1e-4))(f0))
    np.testing.assert_allclose(jl, jt, rtol=1e-3, atol=1e-6)
    graph = sd.trace(sd.grad(lambda f: snp.sum(x_of(f, 1e-12))), f0)
    assert sum(n.primitive.name == "optimize.root" for n in graph.nodes) == 1


def test_vmap_of_root_is_one_map_and_agrees_with_a_loop(rng):
    F = rng.uniform(5.0, 15.0, (3, N))

    def solve(f):
        return sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="sparse").x

    got = np.asarray(sd.vmap(solve)(F))
    want = np.stack([np.asarray(solve(f)) for f in F])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    graph = sd.trace(sd.vmap(solve), F)
    assert [n.primitive.name for n in graph.nodes if n.primitive.name == "map"] == ["map"]


def test_fixed_point_agrees_with_scipy_and_differentiates(rng):
    a = rng.uniform(0.3, 0.9, 5)
    res = sd.optimize.fixed_point(lambda x, a: a * snp.cos(x), np.zeros(5), (a,))
    want = scipy.optimize.fixed_point(lambda x: a * np.cos(x), np.zeros(5), xtol=1e-14)
    assert res.success
    np.testing.assert_allclose(np.asarray(res.x), want, rtol=1e-10)
    picard = sd.optimize.fixed_point(lambda x, a: a * snp.cos(x), np.zeros(5), (a,),
                                     method="picard")
    assert picard.success and picard.nit > res.nit
    x = np.asarray(res.x)
    J = np.asarray(sd.jacfwd(lambda a: sd.optimize.fixed_point(
        lambda x, a: a * snp.cos(x), snp.zeros(5), (a,)).x)(a))
    np.testing.assert_allclose(J, np.diag(np.cos(x) / (1 + a * np.sin(x))), rtol=1e-9,
                               atol=1e-12)
    g = np.asarray(sd.grad(lambda a: snp.sum(sd.optimize.fixed_point(
        lambda x, a: a * snp.cos(x), snp.zeros(5), (a,), jac="sparse").x))(a))
    np.testing.assert_allclose(g, np.cos(x) / (1 + a * np.sin(x)), rtol=1e-9)


@pytest.mark.slow
def test_fixed_point_rules_pass_check_rules(rng):
    a = rng.uniform(0.3, 0.9, 5)
    sd.testing.check_rules(lambda a: sd.optimize.fixed_point(
        lambda x, a: a * snp.cos(x), snp.zeros(5), (a,), jac="dense").x, a, batch=False)


# ---------------------------------------------------------------------------
# failures


def test_iteration_limit_names_iterations_residual_and_tolerance():
    with pytest.raises(ConvergenceError) as e:
        sd.optimize.root(lambda x: snp.exp(x) - 1e6, np.zeros(2), maxiter=3)
    msg = str(e.value)
    assert "iteration limit" in msg and "after 3 iterations" in msg
    assert "||F||_inf = " in msg and "(atol = 0.000e+00)" in msg and "maxiter" in msg
    assert "estimated error in x is" in msg and "tol = 1.0e-10" in msg
    assert e.value.iterations == 3 and e.value.residual > 0 and e.value.tolerance == 1e-10
    assert e.value.error > e.value.tolerance
    assert "test_root.py" in msg  # the user's line


# a user primitive whose JVP rule has the wrong sign: Newton's direction
# then climbs ||F||, and the line search finds no decrease
_cubic_p = sd.primitive("test_root.cubic_wrong_jvp", params={})
_cubic_p.def_abstract_eval(lambda x: x)
_cubic_p.def_impl(lambda x: x ** 3 + x - 2.0)


@_cubic_p.def_jvp
def _cubic_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _cubic_p.bind(x), -(3.0 * x ** 2 + 1.0) * t


@pytest.mark.parametrize("fun, x0, words", [
    (lambda x: x ** 2 + 1.0, np.ones(2), "Jacobian is singular"),       # no real root
    (lambda x: snp.log(x), -np.ones(2), "not finite"),                   # outside the domain
    (lambda x: _cubic_p(x), np.zeros(2), "line search failed"),          # a wrong JVP rule
    (lambda x: snp.abs(x) ** (1 / 3) * snp.sign(x), np.ones(2), "iteration limit"),
])
def test_each_failure_has_its_diagnosis(fun, x0, words):
    with pytest.raises(ConvergenceError, match=words):
        sd.optimize.root(fun, x0, jac="dense")


def test_throw_false_returns_the_status_and_refuses_the_derivative():
    def solve(c):
        return sd.optimize.root(lambda x, c: x ** 2 + c, snp.ones(2), (c,), throw=False)

    res = solve(np.ones(2))
    assert not res.success and res.status == 2 and "singular" in res.message
    ok = solve(-np.ones(2))
    assert ok.success
    g = np.asarray(sd.grad(lambda c: snp.sum(solve(c).x))(-np.ones(2)))
    np.testing.assert_allclose(g, -0.5 * np.ones(2))
    with pytest.raises(ConvergenceError, match="cannot differentiate a root solve that failed") \
            as e:
        sd.grad(lambda c: snp.sum(solve(c).x))(np.ones(2))
    assert str(e.value).startswith("optimize.root: ")  # (the solve, not its guard)
    with pytest.raises(ConvergenceError, match="cannot differentiate"):
        sd.jvp(lambda c: solve(c).x, (np.ones(2),), (np.ones(2),))


def test_bad_input_is_refused_at_trace_time():
    with pytest.raises(ShapeError, match="as many values as x has"):
        sd.optimize.root(lambda x: snp.sum(x), np.zeros(3))
    with pytest.raises(InvalidOptionError, match="`jac` must be"):
        sd.optimize.root(lambda x: x, np.zeros(3), jac="banded")
    with pytest.raises(InvalidOptionError, match="`method` must be"):
        sd.optimize.root(lambda x: x, np.zeros(3), method="broyden1")
    with pytest.raises(sd.errors.DTypeError, match="real float"):
        sd.optimize.root(lambda x: x, np.zeros(3, complex))


@pytest.mark.parametrize("distance", [1e-6, 0.5])
def test_a_kept_factor_of_a_nearby_matrix_is_refined_or_replaced(distance, rng):
    # the adjoint at a root reads the last Newton iteration's factor: a solve
    # with the factor of a nearby matrix refines to the matrix's own accuracy,
    # and one of a far matrix is factored again
    import scipy.sparse as sp

    from sciad.graph import Pattern
    from sciad.solvers.direct import _sparse_direct as sdir

    n = 30
    A = (sp.random(n, n, density=0.2, random_state=3) + 4 * sp.eye(n)).tocsr()
    A.sort_indices()
    pattern = Pattern(A.shape, A.indptr, A.indices)
    B = A.copy()
    B.data = B.data * (1 + distance * rng.standard_normal(B.nnz))
    b = rng.standard_normal(n)
    held = sdir.held()
    with sd.config.x64_scope():
        (h,) = jax.jit(lambda d: sdir.factor(pattern, d, uses=1))(A.data)
        x = jax.jit(lambda h, d, b: sdir.solve(pattern, (h,), d, b, False,
                                               refine_above=1e-14))(h, B.data, b)
    np.testing.assert_allclose(B @ np.asarray(x), b, rtol=0, atol=1e-12)
    assert sdir.held() <= held  # its one use released it


def test_the_jax_level_newton_serves_other_nodes(rng):
    # the loop `optimize.root` lowers to, called on a plain JAX residual with
    # the pattern and coloring of sciad's detection (as an implicit time step
    # will): the root of the 1-D diffusion, as `root` finds it
    import jax.numpy as jnp

    from sciad.solvers._coloring import coloring
    from sciad.solvers.nonlinear import _nonlinear
    from sciad.primitives._newton_systems import _pattern

    f = 20.0 + 5.0 * rng.standard_normal(N)
    pattern = _pattern(sd.sparse.jacobian_sparsity(diffusion, np.zeros(N), f))

    def F(u):
        return residual_in(jnp)(u, f)

    with sd.config.x64_scope():
        values = _nonlinear.colored_values(F, pattern, coloring(pattern))
        res = jax.jit(lambda x0: _nonlinear.newton(
            F, x0, _nonlinear.sparse_lu(pattern, values, x0.dtype), tol=1e-10, atol=0.0,
            maxiter=20))(jnp.zeros(N))
    assert int(res.status) == 0 and int(res.aux) == 0  # nothing kept
    want = sd.optimize.root(diffusion, np.zeros(N), (f,), jac="sparse").x
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(want), rtol=1e-10)



def test_cost_reports_a_newton_iteration():
    f = np.ones(N)
    report = sd.cost(lambda f: sd.optimize.root(diffusion, snp.zeros(N), (f,), jac="sparse").x, f)
    (row,) = [r for r in report.rows if r.node.primitive.name == "optimize.root"]
    assert "per Newton iteration" in row.note
    body = sd.cost(lambda u: diffusion(u, f), np.zeros(N)).flops
    assert row.flops > 3 * 3 * body  # three colors of JVPs, and more


def test_float32_defaults_to_a_reachable_tolerance_and_diagnoses_the_floor():
    f = np.full(N, 10.0, np.float32)
    res = sd.optimize.root(diffusion, np.zeros(N, np.float32), (f,), jac="sparse")
    assert res.success and res.x.dtype == np.float32
    want = sd.optimize.root(diffusion, np.zeros(N), (f.astype(np.float64),), jac="sparse").x
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(want), rtol=1e-4)
    with pytest.raises(ConvergenceError, match="floor of rounding errors in float32"):
        sd.optimize.root(diffusion, np.zeros(N, np.float32), (f,), jac="sparse", tol=1e-12)


def _steep(x):  # a unit in the last place of x near sqrt(2) moves F by ~1e-7
    return 1e8 * (x * x - 2.0)


def test_a_tolerance_below_the_rounding_floor_is_diagnosed_or_met_at_the_floor():
    # ||F|| cannot go below ~1e-8 here (F(fl(sqrt 2)) = 4.4e-8): atol=1e-12
    # asks for more than floating point allows
    with pytest.raises(ConvergenceError,
                       match=r"floor of rounding errors in float64 \(about [0-9.]+e-0[67]:.* "
                             r"no iterate can do better; loosen `tol`/`atol` above"):
        sd.optimize.root(_steep, np.ones(2), tol=0.0, atol=1e-12, jac="dense")
    res = sd.optimize.root(_steep, np.ones(2), tol=0.0, atol=1e-12, jac="dense",
                           at_floor=True)
    assert res.success and 1e-12 < res.residual < 1e-6
    np.testing.assert_allclose(res.x, np.sqrt(2.0), rtol=4e-16)


def _bratu(u, lam):  # -u'' = lam exp(u) on (0, 1), u(0) = u(1) = 0, 16 cells
    h = 1.0 / 16
    up = snp.concatenate([snp.zeros(1), u, snp.zeros(1)])
    return -(up[2:] - 2.0 * up[1:-1] + up[:-2]) / h ** 2 - lam * snp.exp(u)


def test_a_stall_far_above_the_rounding_floor_says_there_may_be_no_solution():
    # Bratu's problem has no solution past its fold (lam ~ 3.51): Newton
    # stalls at a minimum of ||F|| of about 1, far above rounding; at_floor
    # does not make that a root
    assert sd.optimize.root(_bratu, np.zeros(15), (3.0,)).success
    for at_floor in (False, True):
        with pytest.raises(ConvergenceError,
                           match=r"stalls far above its floor of rounding errors .* there may "
                                 r"be no solution near `x0`, or none at all \(a parameter "
                                 r"beyond a fold"):
            sd.optimize.root(_bratu, np.zeros(15), (4.0,), at_floor=at_floor)


def test_the_floor_diagnosis_and_acceptance_with_nan():
    # a NaN residual or floor is neither at the floor nor far above it
    import jax.numpy as jnp

    from sciad.graph import Site
    from sciad.primitives._root import judge_root
    from sciad.solvers.nonlinear import _nonlinear

    kw = dict(status=3, nit=4, goal=1e-10, kind="root", method="newton", jac="dense",
              maxiter=50, tol=1e-10, dtype=np.dtype(np.float64))
    for residual, floor in ((np.nan, 1e-9), (1e-9, np.nan), (1.0, np.nan)):
        with pytest.raises(RuntimeError, match="the Jacobian may be wrong") as e:
            judge_root(Site("optimize.root"), residual=residual, floor=floor, **kw)
        assert "do better" not in str(e.value) and "far above" not in str(e.value)
    # and a stalled solve with a NaN residual or floor has not converged
    with sd.config.x64_scope():
        x, stalled = jnp.ones(2), jnp.int32(_nonlinear.LINE_SEARCH)
        for fx, F in ((x, lambda x: x * jnp.nan), (x * jnp.nan, lambda x: x)):
            status, _ = _nonlinear._finish(F, x, fx, stalled, at_floor=True)
            assert int(status) == _nonlinear.LINE_SEARCH


def test_the_replayed_implicit_stages_accept_their_rounding_floor():
    # the roots whose tolerance sciad sets itself (an implicit step's stages,
    # replayed for the discrete adjoint) must not be tighter than rounding
    from sciad.primitives._ode_replay import rk_step

    def field(t, y, k):
        return -k * y

    graph = sd.trace(field, 0.0, np.ones(2), 1.0)
    step = sd.trace(lambda y, h: rk_step(graph, [1e3], "kvaerno5", 0.0, h, y, "dense",
                                         1e-10, 1e-14), np.ones(2), 0.1)
    roots = [n for n in step.nodes if n.primitive.name == "optimize.root"]
    assert roots and all(n.params["at_floor"] for n in roots)


def test_a_residual_with_a_sparse_solve_inside(rng):
    # Newton's Jacobian comes from sciad's rules of the body, so a body whose
    # lowering calls the host (SuperLU) works; the solve's pattern is dense
    import scipy.sparse as sp

    n = 10
    L = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n)).tocsr()

    def F(u, f):
        w = sd.linalg.solve(sd.sparse.from_scipy(L), u)
        return u + 0.1 * w ** 3 - f

    f = 1.0 + 0.1 * rng.standard_normal(n)
    res = sd.optimize.root(F, np.zeros(n), (f,))
    u = np.asarray(res.x)
    np.testing.assert_allclose(u + 0.1 * sp.linalg.spsolve(L.tocsc(), u) ** 3, f, atol=1e-9)
    d = rng.standard_normal(n)

    def loss(f):
        return snp.sum(sd.optimize.root(F, snp.zeros(n), (f,)).x ** 2)

    g = np.asarray(sd.grad(loss)(f))
    fd = (float(loss(f + 1e-6 * d)) - float(loss(f - 1e-6 * d))) / 2e-6
    assert abs(g @ d - fd) <= 1e-6 * abs(fd)
