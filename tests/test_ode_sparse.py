"""The sparse Newton solver of implicit ODE steps (`SparseNewtonSolver`):
standalone against lineax's dense LU (plain, transposed, under `vmap` and
`grad`), inside diffrax's Kvaerno5 against its default dense root finder,
and through `sd.ode.odeint(jac="sparse")` (values, forward and reverse
derivatives) against `jac="dense"`, on one small stiff reaction-diffusion
problem."""

from __future__ import annotations

import functools

import diffrax
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
from helpers import rss_mib
import sciad.numpy as snp
from sciad.primitives._newton_systems import _pattern
from sciad.solvers.ode import _ode
from sciad.solvers.ode._ode import SparseNewtonSolver

N = 16
X = np.linspace(0.0, 1.0, N)
Y0 = np.exp(-40.0 * (X - 0.3) ** 2)
TS = np.linspace(0.0, 0.5, 4)
#: df/dy of the heat equation below is tridiagonal
TRIDIAGONAL = sp.diags([np.ones(N - 1), np.ones(N), np.ones(N - 1)], [-1, 0, 1],
                       format="csr").astype(bool)


def laplacian(y, xp):
    """Neumann boundaries, `(N + 1)^2` scaled: stiff (eigenvalues to ~-1e3)."""
    return xp.concatenate([y[1:2] - y[:1], y[2:] - 2 * y[1:-1] + y[:-2],
                           y[-2:-1] - y[-1:]]) * (N + 1) ** 2


def heat(t, y, k):
    """Heat equation with a logistic reaction, in JAX (for diffrax)."""
    return laplacian(y, jnp) + k * y * (1 - y)


def heat_sd(t, y, k):
    """The same vector field in sciad ops (for `sd.ode.odeint`)."""
    return laplacian(y, snp) + k * y * (1 - y)


@pytest.mark.slow  # (the solver inside diffrax: the next test)
def test_standalone_solve_matches_dense_lu():
    """`lineax.linear_solve` on the Jacobian of a function with a tridiagonal
    Jacobian (minus the diagonal: the solver adds it) against `lx.LU()`:
    plain and transposed solves, batched by `jax.vmap`, differentiated."""
    def F(y, a):
        return 3.0 * y - a * (jnp.roll(y, 1).at[0].set(0.0) + jnp.roll(y, -1).at[-1].set(0.0)) \
            + jnp.sin(y) * y

    off = _pattern(TRIDIAGONAL - sp.eye(N, dtype=bool, format="csr"))
    solver = SparseNewtonSolver(off)
    assert solver.pattern.nnz == TRIDIAGONAL.nnz
    b = jnp.cos(jnp.arange(N) * 1.3)

    @jax.jit
    def solves(y, b, a):
        op = lx.linearise(lx.JacobianLinearOperator(F, y, a))
        return [lx.linear_solve(o, b, s).value for o in (op, op.T) for s in (solver, lx.LU())]

    y = jnp.linspace(0.1, 1.0, N)
    for xs in (solves(y, b, 0.7), jax.vmap(solves, (0, None, None))(jnp.stack([y, 2 * y]), b,
                                                                       0.7)):
        for sparse, dense in (xs[:2], xs[2:]):
            np.testing.assert_allclose(sparse, dense, rtol=1e-12, atol=1e-14)

    def loss(a, s):
        op = lx.linearise(lx.JacobianLinearOperator(F, y, a))
        return jnp.sum(lx.linear_solve(op, b, s).value ** 2)

    np.testing.assert_allclose(jax.grad(loss)(0.7, solver), jax.grad(loss)(0.7, lx.LU()),
                               rtol=1e-12)
    assert _ode.held() <= 8 + 2  # a bounded cache, whatever the number of solves


def _diffrax_solve(linear_solver):
    extra = {} if linear_solver is None else dict(linear_solver=linear_solver)
    root = diffrax.VeryChord(rtol=1e-8, atol=1e-8, **extra)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(heat), diffrax.Kvaerno5(root_finder=root), 0.0, float(TS[-1]), None,
        jnp.asarray(Y0), 5.0, saveat=diffrax.SaveAt(ts=jnp.asarray(TS)),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8), max_steps=4096)
    return sol.ys, sol.stats["num_steps"]


@pytest.mark.slow  # (the default suite's time budget)
def test_kvaerno5_with_the_sparse_solver_matches_the_dense_root_finder():
    ys, steps = jax.jit(lambda: _diffrax_solve(SparseNewtonSolver(_pattern(TRIDIAGONAL))))()
    ref, ref_steps = jax.jit(lambda: _diffrax_solve(None))()
    assert int(steps) == int(ref_steps)  # the same steps: the same Newton iterates
    np.testing.assert_allclose(ys, ref, rtol=1e-7, atol=1e-9)
    assert _ode.held() <= 8 + 1  # hundreds of steps, a few factors kept


def test_odeint_jac_sparse_matches_dense_and_keeps_its_factorization(monkeypatch):
    """The solution of `sd.ode.odeint(jac="sparse")`, whose node shows the
    detected pattern, against `jac="dense"`. A step of the same `h gamma`
    solves with the last factorization (the controller holds the step size
    where it would change it little): far fewer factorizations than steps.
    The decision reads only the solve's own state, and a factor the store
    let go is made again from its values, so a solve gives the same result
    to the bit after other solves."""
    from sciad.solvers.direct import _sparse_direct as sdir

    def solve(k, jac, throw=True):
        return sd.ode.odeint(heat_sd, Y0, TS, k, solver="kvaerno5", rtol=1e-8, atol=1e-8,
                             jac=jac, throw=throw)

    graph = sd.trace(functools.partial(solve, jac="sparse"), 5.0)
    (node,) = [n for n in graph.nodes if n.primitive.name == "ode.odeint"]
    assert node.params["jac"] == "sparse" and node.params["pattern"].nnz == 3 * 16 - 2
    factored = []
    make = sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or make(*a))
    sparse = sd.function(lambda k: solve(k, "sparse", throw=False))
    first = sparse(5.0)
    steps, made = int(first.steps), len(factored)
    assert int(first.status) == 0 and 0 < made < steps / 2, (made, steps)
    np.testing.assert_allclose(np.asarray(first.ys), np.asarray(solve(5.0, "dense")),
                               rtol=1e-8, atol=1e-10)
    sparse(7.0)
    for h in list(_ode._store.entries):  # as if other solves had pushed them out
        _ode._store.discard(h)
    np.testing.assert_array_equal(np.asarray(sparse(5.0).ys), np.asarray(first.ys))


@pytest.mark.slow
@pytest.mark.parametrize("klu", [True, False])
def test_odeint_jac_sparse_matches_dense_with_derivatives(monkeypatch, klu):
    """`sd.ode.odeint(jac="sparse")`: the solution, its reverse-mode gradient
    (the discrete adjoint) and its forward mode (an odeint of the
    sensitivity system, whose Newton matrices are solved sparsely too)
    against the forward mode of `jac="dense"` (cheaper to compile than its
    reverse mode; the two agree to ~1e-11). On the CPU the reverse pass's
    implicit stages factor with KLU in the program: no SuperLU factorization
    on the host (checks off: with them on, every sparse solve's measures are
    refined on the host); elsewhere they share one SuperLU factorization per
    step (`root(jac0=...)`), not one per stage."""
    from sciad.solvers.direct import _sparse_direct as sdir
    from sciad.solvers.nonlinear import _jacobian_klu

    if not klu:  # (as where KLU does not run: SuperLU on the host)
        monkeypatch.setattr(_jacobian_klu, "usable", lambda: False)
    elif not _jacobian_klu.usable():
        pytest.skip("needs klujax on the CPU")

    def solve(k, jac, throw=True):
        return sd.ode.odeint(heat_sd, Y0, TS, k, solver="kvaerno5", rtol=1e-8, atol=1e-8,
                             jac=jac, throw=throw)

    def loss(k):
        ys = solve(k, "sparse")
        return snp.sum(ys[-1] ** 2), ys

    factored = []
    make = sdir._factor_one
    monkeypatch.setattr(sdir, "_factor_one", lambda *a: factored.append(1) or make(*a))
    with sd.config.checks(False):
        value_and_grad = sd.function(sd.value_and_grad(loss, has_aux=True))
        value_and_grad(5.0)
        factored.clear()
        (_, ys), g = value_and_grad(5.0)
        total = len(factored)
        factored.clear()
        steps = int(sd.function(lambda k: solve(k, "sparse", throw=False).steps)(5.0))
    reverse = total - len(factored)  # (the forward solve's own are the same)
    if klu:
        assert reverse == 0, (total, len(factored), steps)
    else:
        assert reverse <= 1.3 * steps, (total, len(factored), steps)
    ys_ref, dys_ref = (np.asarray(v) for v in
                       sd.jvp(functools.partial(solve, jac="dense"), (5.0,), (1.0,)))
    g_ref = np.sum(2 * ys_ref[-1] * dys_ref[-1])
    # (the jvp's primal is the sensitivity system's: the same steps, other
    # Newton iterates, equal to far below the tolerance)
    np.testing.assert_allclose(np.asarray(ys), ys_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(float(g), g_ref, rtol=1e-8)
    _, dys = sd.jvp(functools.partial(solve, jac="sparse"), (5.0,), (1.0,))
    np.testing.assert_allclose(np.asarray(dys), dys_ref, rtol=1e-8, atol=1e-10)



def test_factors_made_in_a_program_are_given_back():
    """Every step of a sparse stiff solve factors in a host callback, and the
    bounded store lets the old factors go. SciPy frees a SuperLU factor's
    memory only on the Python thread state that made it, and XLA runs the
    callbacks of a solve's loop on its own threads, each callback with a new
    thread state: factored in the callbacks, these solves kept every factor
    (0.2 MB each, about 70 MB here). sciad factors on its own threads."""
    n = 400
    x = np.linspace(0.0, 1.0, n)

    def heat(t, y, k):
        lap = snp.concatenate([y[1:2] - y[:1], y[2:] - 2 * y[1:-1] + y[:-2],
                               y[-2:-1] - y[-1:]]) * (n + 1) ** 2
        return lap + k * y * (1 - y)

    solve = sd.function(lambda k: sd.ode.odeint(heat, np.exp(-40 * (x - 0.3) ** 2), TS, k,
                                                solver="kvaerno5", rtol=1e-6, atol=1e-6,
                                                jac="sparse"))

    for _ in range(2):  # compiled, the allocator warmed up, the store full
        np.asarray(solve(5.0))
    before = rss_mib()
    for _ in range(6):
        np.asarray(solve(5.0))
    grown = rss_mib() - before
    assert grown < 25.0, f"{grown:.0f} MB kept by six solves"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-v", "--durations=0"])
