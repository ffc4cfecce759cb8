"""The ESDIRK methods (`solver="kvaerno3"`, `"kvaerno4"`, `"kvaerno5"`) with
a mass matrix, `M dy/dt = f` (sciad's own loop, `sciad.solvers.ode._esdirk`,
and its discrete adjoint, the steps replayed with `M`): against exact
solutions with a nonsingular `M`, against the ODE form of a DAE, through
the transforms, and their failures and refusals. (Its discrete adjoint
against the same steps re-run in NumPy, beside BDF's and Radau's:
`test_stiff_methods.py`.)"""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, InvalidOptionError, NotSupportedError

RATES = np.array([0.04, 3e7, 1e4])
DAE_MASS = np.diag([1.0, 1.0, 0.0])


def robertson_dae(t, y, k):
    return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2,
                      y[0] + y[1] + y[2] - 1.0])


def _matrix(k, xp):
    z = 0.0 * k[0]
    return xp.stack([xp.stack([-50.0 * k[0], k[1], z]),
                     xp.stack([k[1], -k[0] - k[1], 1.0 + z]),
                     xp.stack([z, k[0], -3.0 + z])])


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["kvaerno3", "kvaerno4", "kvaerno5"])
def test_a_nonsingular_mass_against_the_exact_solution(solver):
    """`M y' = A y` with a full, nonsymmetric `M`: `expm(M^-1 A t) y0`, to
    the tolerance, its derivative in `y0` by forward and reverse mode to
    the exact one."""
    from scipy.linalg import expm

    rng = np.random.default_rng(1)
    A = _matrix(np.array([1.3, 1.7]), np)
    M = np.eye(3) + 0.3 * rng.normal(size=(3, 3))
    y0, ts, w = rng.uniform(0.5, 1.0, 3), np.array([0.0, 0.3, 1.0]), rng.normal(size=3)

    def solve(y0):
        return sd.ode.odeint(lambda t, y, *a: A @ y, y0, ts, solver=solver, mass=M, rtol=1e-9,
                             atol=1e-12)

    B = np.linalg.solve(M, A)
    exact = np.stack([expm(B * t) @ y0 for t in ts])
    np.testing.assert_allclose(np.asarray(solve(y0)), exact, rtol=0, atol=1e-8)
    grad = np.asarray(sd.grad(lambda y0: snp.sum(solve(y0)[-1] * w))(y0))
    np.testing.assert_allclose(grad, expm(B * ts[-1]).T @ w, rtol=1e-7)
    v = rng.normal(size=3)
    _, tangent = sd.jvp(lambda y0: snp.sum(solve(y0)[-1] * w), (y0,), (v,))
    np.testing.assert_allclose(float(tangent), grad @ v, rtol=1e-9)


@pytest.mark.slow
def test_robertson_dae_gradient_by_the_discrete_adjoint():
    """The gradient of Robertson's kinetics as a DAE (the conservation law
    algebraic) by Kvaerno5 in the rates: the discrete adjoint (the steps
    re-run from the recorded states) and a checkpointed replay of the steps
    agree, and match central differences and forward mode. (Its values and
    forward mode against the ODE form: `test_stiff_methods.py`.)"""
    ts, y0 = np.array([0.0, 0.4, 4.0, 40.0]), np.array([1.0, 0.0, 0.0])

    def loss(k, **extra):
        return sd.ode.odeint(robertson_dae, y0, ts, k, mass=DAE_MASS, solver="kvaerno5",
                             rtol=1e-9, atol=1e-13, **extra)[-1, 0]

    grad = np.asarray(sd.grad(loss)(RATES))
    replayed = np.asarray(sd.grad(lambda k: loss(k, checkpoints=8))(RATES))
    np.testing.assert_allclose(replayed, grad, rtol=1e-10)
    f = sd.function(loss)
    for j in range(3):
        e = np.zeros(3)
        e[j] = 1e-3 * RATES[j]
        fd = (float(f(RATES + e)) - float(f(RATES - e))) / (2 * e[j])
        assert abs(grad[j] - fd) <= 1e-6 * abs(fd) + 1e-9 / e[j], (j, grad[j], fd)
    v = RATES * np.array([0.1, -0.2, 0.3])
    _, tangent = sd.jvp(loss, (RATES,), (v,))
    np.testing.assert_allclose(grad @ v, float(tangent), rtol=1e-7)


@pytest.mark.slow
def test_heat_dae_with_sparse_iteration_matrices():
    """The 1-D heat equation with its boundary values algebraic (`u = 0`
    there), sparse iteration matrices and a sparse mass: against the exact
    decay of the semi-discrete system's first mode, the sensitivity by
    forward mode and the gradient by reverse mode against its exact
    derivative."""
    import scipy.sparse as sp

    n = 201
    x = np.linspace(0.0, 1.0, n)
    dx2 = (x[1] - x[0]) ** 2

    def heat(t, u, a):
        lap = a * (u[:-2] - 2 * u[1:-1] + u[2:]) / dx2
        return snp.concatenate([u[:1], lap, u[-1:]])

    mass = sp.diags(np.r_[0.0, np.ones(n - 2), 0.0]).tocsr()
    ts = np.array([0.0, 0.05, 0.1])

    def solve(a):
        return sd.ode.odeint(heat, np.sin(np.pi * x), ts, a, solver="kvaerno5", jac="sparse",
                             mass=mass, rtol=1e-8, atol=1e-10)

    u, du = sd.jvp(solve, (1.0,), (1.0,))
    rate = 4.0 / dx2 * np.sin(np.pi * (x[1] - x[0]) / 2) ** 2
    mode = np.sin(np.pi * x)[None, :]
    decay = np.exp(-rate * ts)[:, None]
    # (measured 3.7e-9 and 1.8e-8)
    assert np.abs(np.asarray(u) - decay * mode).max() <= 1e-7
    assert np.abs(np.asarray(du) + rate * ts[:, None] * decay * mode).max() <= 5e-7
    g = sd.grad(lambda a: snp.sum(solve(a)[-1] ** 2))(1.0)
    exact = -2 * rate * ts[-1] * np.exp(-2 * rate * ts[-1]) * np.sum(mode ** 2)
    np.testing.assert_allclose(float(g), exact, rtol=1e-6)


def test_robertson_dae_at_a_tight_tolerance():
    """Robertson's DAE from y = (1, 0, 0) at rtol 1e-10, atol 1e-14 (the
    guide's): the stages' first Jacobian, at the start, has none of the
    reactions' rates (renewed at the step's predicted end), and the
    algebraic variable's corrections stall at the rounding of the O(1)
    terms it is solved from (converged there): both made every step fail
    before. Against BDF's solve of the same DAE."""
    ts, y0 = np.array([0.0, 40.0, 4e3, 4e5]), np.array([1.0, 0.0, 0.0])
    kw = dict(mass=DAE_MASS, rtol=1e-10, atol=1e-14)
    ys = sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="kvaerno5", **kw)
    ref = sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="bdf", **kw)
    # (measured: 4.4e-9 relative, the two methods' errors at rtol 1e-10)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(ref), rtol=1e-8, atol=1e-14)


def _small_dae(t, y, k):
    # a nonlinear index-1 DAE: two differential states, one algebraic
    # (z = y1^2 / (1 + k1) solved by its equation)
    return snp.stack([-k[0] * y[0] + y[2], -y[1] + snp.sin(t) * y[0],
                      y[1] ** 2 - (1.0 + k[1]) * y[2]])


def _consistent(k, y0):
    return np.array([y0[0], y0[1], y0[1] ** 2 / (1.0 + k[1])])


@pytest.mark.slow
def test_check_rules():
    rng = np.random.default_rng(0)
    k = rng.uniform(1.0, 2.0, 2)
    y0 = _consistent(k, rng.uniform(0.5, 1.0, 2))

    def solve(k, d):  # (d: the differential states' initial values; z solved)
        y = snp.concatenate([d, (d[1:] ** 2) / (1.0 + k[1:])])
        return sd.ode.odeint(_small_dae, y, np.array([0.0, 0.5, 1.0]), k, solver="kvaerno5",
                             mass=DAE_MASS, rtol=1e-10, atol=1e-12)

    sd.testing.check_rules(solve, k, y0[:2], rtol=1e-5, dot_tol=1e-7, second_order=False)


@pytest.mark.slow
def test_batches_and_jax_transforms_of_to_jax():
    """`sd.vmap` of the gradient over rates whose solves take different
    numbers of steps, and `jax.jit`, `jax.grad` and `jax.vmap` of
    `sd.to_jax`, against sciad's own calls one by one."""
    import jax

    y0 = _consistent(np.array([1.0, 1.0]), np.array([0.8, 0.6]))

    def loss(k):
        ys = sd.ode.odeint(_small_dae, y0.copy(), np.array([0.0, 0.5, 1.0]), k,
                           solver="kvaerno5", mass=DAE_MASS, rtol=1e-9, atol=1e-12,
                           dae_init="solve")
        return snp.sum(ys ** 2)

    ks = np.array([[1.0, 1.0], [1.7, 0.5], [0.4, 2.0]])
    one_by_one = np.stack([np.asarray(sd.grad(loss)(k)) for k in ks])
    np.testing.assert_allclose(np.asarray(sd.vmap(sd.grad(loss))(ks)), one_by_one, rtol=1e-9)
    f = sd.to_jax(loss)
    with jax.enable_x64(True):
        np.testing.assert_allclose(float(jax.jit(f)(ks[1])), float(sd.function(loss)(ks[1])),
                                   rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f))(ks[1])), one_by_one[1],
                                   rtol=1e-7)
        np.testing.assert_allclose(np.asarray(jax.vmap(f)(ks)),
                                   [float(sd.function(loss)(k)) for k in ks], rtol=1e-9)


def test_failures_raise_under_the_derivatives():
    """An algebraic equation without a solution past t = 1 (`z^2 = 1 - t`):
    the steps collapse there (its root double), and the solve, its gradient and its tangent
    raise `ConvergenceError` with the time reached (and in forward mode,
    below; as does a singular iteration matrix, an algebraic variable no
    equation holds, not a NaN result)."""
    def ends(t, y, a):
        return snp.stack([-a * y[0], y[1] ** 2 - (1.0 - t)])

    y0, ts, M = np.array([1.0, 1.0]), np.array([0.0, 2.0]), np.diag([1.0, 0.0])

    def loss(a):
        return sd.ode.odeint(ends, y0, ts, a, solver="kvaerno5", mass=M)[-1, 0]

    for run in (sd.function(loss), sd.grad(loss)):
        with pytest.raises(ConvergenceError, match=r"kvaerno5 integration failed.*at t = 1 "):
            run(1.0)


@pytest.mark.slow
def test_failures_raise_in_forward_mode_and_with_a_singular_matrix():
    def ends(t, y, a):
        return snp.stack([-a * y[0], y[1] ** 2 - (1.0 - t)])

    y0, ts, M = np.array([1.0, 1.0]), np.array([0.0, 2.0]), np.diag([1.0, 0.0])
    with pytest.raises(ConvergenceError, match=r"kvaerno5 integration failed.*at t = 1 "):
        sd.jvp(lambda a: sd.ode.odeint(ends, y0, ts, a, solver="kvaerno5", mass=M)[-1, 0],
               (1.0,), (1.0,))

    def singular(t, y, a):  # (no equation holds y[1]: a zero column)
        return snp.stack([-a * y[0], 0.0 * y[1]])

    with pytest.raises(ConvergenceError, match="kvaerno5 integration failed"):
        sd.ode.odeint(singular, y0, ts, 1.0, solver="kvaerno5", mass=M)


def test_refusals_name_the_fix():
    ts, y0 = np.array([0.0, 1.0]), np.array([1.0, 0.0, 0.0])
    for solver in ("tsit5", "kencarp5", "implicit_euler"):
        with pytest.raises(NotSupportedError, match="'kvaerno5'.*use one of those"):
            sd.ode.odeint(robertson_dae, y0, ts, RATES, solver=solver, mass=DAE_MASS)
    with pytest.raises(InvalidOptionError, match="constant steps"):
        sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="kvaerno5", mass=DAE_MASS,
                      adaptive=False, dt0=0.1)
    with pytest.raises(NotSupportedError, match="reverse mode .* mass matrix.*'checkpoint'"):
        sd.trace(sd.grad(lambda k: sd.ode.odeint(robertson_dae, y0, ts, k, solver="kvaerno5",
                                                 mass=DAE_MASS,
                                                 adjoint="interpolated")[-1, 0]), RATES)


def test_replayed_stages_factor_once_where_the_fill_is_large():
    """The replayed stages' sparse Newton systems: a narrow band by the
    banded LU, once per stage; KLU at every chord iteration where a
    factorization is cheap (a small system); SuperLU once per stage, its
    factor kept, for a 2-D stencil."""
    import scipy.sparse as sp

    from sciad.graph._types import Pattern, SparseType
    from sciad.primitives import _ode_replay
    from sciad.solvers.nonlinear import _jacobian_klu

    def matrix(A):  # (a stand-in with the type a colored Jacobian has)
        A = sp.csr_matrix(A)
        pattern = Pattern(A.shape, A.indptr, A.indices)

        class J:
            type = SparseType(pattern, np.dtype(np.float64))
        return J()

    def laplacian(m):
        T = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(m, m))
        return sp.kronsum(T, T)

    if not _jacobian_klu.usable():
        pytest.skip("KLU's kernels are not built here")
    size = _ode_replay.KLU_EVERY_ITERATION
    band = sp.diags([1.0, 1.0, -4.0, 1.0, 1.0], [-2, -1, 0, 1, 2], shape=(4 * size, 4 * size))
    assert _ode_replay._stage_jac("sparse", matrix(band)) == "band"  # (the banded LU)
    assert _ode_replay._stage_jac("sparse", matrix(laplacian(32))) == "klu"  # (1,024)
    assert _ode_replay._stage_jac("sparse", matrix(laplacian(64))) == "sparse"  # (4,096)
    assert _ode_replay._stage_jac("dense", None) == "dense"
