"""The stiff methods of sciad's own: BDF (`solver="bdf"`,
`solve_ivp(method="BDF")`, variable order 1-5 in the NDF form) and Radau IIA
of order 5 (`"radau"`, `method="Radau"`), each one compiled loop: BDF's
step-size rescaling and Radau's constants against SciPy's, their solutions
and work counts against SciPy's methods of the same names on stiff and
non-stiff problems, dense and sparse iteration matrices, their derivatives
(forward sensitivities and the continuous adjoint) against an exact one,
and their failures and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate as si

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError


def robertson(t, y, k1=0.04, k2=3e7, k3=1e4):
    return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2,
            k2 * y[1] ** 2]


ROBERTSON_TIMES = [0.4, 4.0, 40.0, 400.0, 4e3, 4e4, 4e5]


def test_step_change_matches_scipys():
    # the differences rescaled to a new step size, at every order, against
    # SciPy's change_D (jax.numpy, eagerly: no program)
    import jax.numpy as jnp
    from scipy.integrate._ivp.bdf import change_D

    from sciad.solvers.ode import _bdf

    rng = np.random.default_rng(0)
    for order in range(1, _bdf.MAX_ORDER + 1):
        for factor in (0.3, 1.7):
            D = rng.normal(size=(_bdf.MAX_ORDER + 3, 4))
            ref = D.copy()
            change_D(ref, order, factor)
            mine = np.asarray(_bdf.change_D(jnp.asarray(D), jnp.asarray(order), factor))
            np.testing.assert_allclose(mine, ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_the_step_is_a_loop_of_its_own_without_the_record(solver):
    """Each attempted step runs as a loop of its own whose carry holds only
    the step's own small arrays, never the record (the states and times of
    up to `max_steps` steps, BDF's history): XLA's CPU runtime runs a
    sequence of operations on the calling thread only where every buffer
    they touch is small, and hands them between threads otherwise, which
    made Robertson's 3-state BDF 2.8x slower (`_steps.run`). Checked on the
    jaxpr: the integration's loop holds one loop (the step) and the record's
    in-place updates."""
    import jax
    import jax.numpy as jnp

    from sciad.solvers.ode import _bdf, _radau

    method = {"bdf": _bdf, "radau": _radau}[solver]
    extra = {"history": True} if solver == "bdf" else {}
    max_steps = 500

    def integrate(y0):
        return method.integrate(lambda t, y: jnp.asarray(robertson(t, y)), y0,
                                jnp.array([0.0, 1.0, 10.0]), rtol=1e-6, atol=1e-10,
                                max_steps=max_steps, record=True, dense=True, **extra)

    jaxpr = jax.make_jaxpr(integrate)(jnp.array([1.0, 0.0, 0.0])).jaxpr
    outer = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    assert len(outer) == 1
    body = outer[0].params["body_jaxpr"].jaxpr
    carried = [v.aval for v in body.invars]
    assert max(a.size for a in carried) >= max_steps  # (the record is in this loop)
    steps = [e for e in body.eqns if e.primitive.name == "while"]
    assert len(steps) == 1  # the step
    inside = steps[0].params["body_jaxpr"].jaxpr
    assert max(v.aval.size for v in inside.invars) < 64  # (3 states: D is 8 x 3)
    # around the step: only the record's updates and their indices
    assert {e.primitive.name for e in body.eqns} <= {
        "while", "dynamic_update_slice", "dynamic_slice", "select_n", "min", "lt", "add",
        "convert_element_type", "broadcast_in_dim", "squeeze", "reshape", "clamp",
        "scatter", "gather", "pjit", "jit", "concatenate", "iota", "ge", "and", "sub"}


def _loops_in_one_function(text: str) -> tuple[int, int]:
    """(loops, loops XLA compiled as one function each) in a compiled
    program's text: each of the latter is the whole of a call XLA marked."""
    lines = text.splitlines()
    loops = sum(" while(" in line for line in lines)
    small = sum(" call(" in line and 'xla_cpu_small_call="true"' in line for line in lines)
    return loops, small


@pytest.mark.parametrize("solver,derivative", [("bdf", True), ("radau", False)])
def test_a_small_problems_loops_are_each_compiled_as_one_function(solver, derivative):
    """On a few states every loop of the integration, and of BDF's discrete
    adjoint, is compiled by XLA as one function (`sciad.config.loops_policy`:
    no runtime dispatch between a step's ~150 operations, Robertson's solve
    1.4 -> 0.27 ms): none holds a library call (a matrix product, a scatter)
    that would keep it dispatched operation by operation. Radau's adjoint
    factors its 9 x 9 stage system with LAPACK, so its forward only."""
    import jax

    if not sd.config.loops_policy.startswith("on"):
        pytest.skip(sd.config.loops_policy)
    k = np.array([0.04, 3e7, 1e4])

    def field(t, y, k):
        return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                          k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2,
                          k[1] * y[1] ** 2])

    def solution(k):
        return sd.ode.odeint(field, np.array([1.0, 0.0, 0.0]), np.array([0.0, 40.0]), k,
                             solver=solver, rtol=1e-6, atol=1e-10)

    fn = sd.grad(lambda k: solution(k)[-1, 0]) if derivative else solution
    loops, small = _loops_in_one_function(jax.jit(sd.to_jax(fn)).lower(k).compile().as_text())
    assert loops >= (4 if derivative else 2) and small == loops, (loops, small)


@pytest.mark.parametrize("mode", ["jvp", "grad"])
def test_an_explicit_methods_derivative_passes_are_each_compiled_as_one_function(mode):
    """Tsit5's forward mode and checkpointed reverse mode on Lotka-Volterra:
    their passes over the recorded steps (`bounded_while_loop`: the steps
    cannot pass the bound, so no check of it in the loop) and the replayed
    intervals are each compiled as one function, as the solve is."""
    import jax

    if not sd.config.loops_policy.startswith("on"):
        pytest.skip(sd.config.loops_policy)
    ts, y0 = np.linspace(0.0, 10.0, 6), np.array([1.0, 1.0])

    def loss(p):
        ys = sd.ode.odeint(lambda t, y, p: snp.stack([p[0] * y[0] - p[1] * y[0] * y[1],
                                                       -p[2] * y[1] + p[3] * y[0] * y[1]]),
                           y0, ts, p, rtol=1e-8, atol=1e-8)
        return snp.sum(ys ** 2)

    p, v = np.array([1.5, 1.0, 3.0, 1.0]), np.array([0.1, -0.2, 0.3, 0.05])
    fn = sd.grad(loss) if mode == "grad" else (lambda p: sd.jvp(loss, (p,), (v,))[1])
    loops, small = _loops_in_one_function(jax.jit(sd.to_jax(fn)).lower(p).compile().as_text())
    assert loops >= 3 and small == loops, (loops, small)


def test_radau_constants_against_scipys():
    # A^-1's eigenvalues (the shifts of the real and complex systems) and the
    # collocation polynomial's coefficients, derived, against SciPy's tables
    from scipy.integrate._ivp import radau

    from sciad.solvers.ode import _radau

    mu_r, mu_c, T, TI, P = _radau.constants()
    assert abs(mu_r - radau.MU_REAL) < 1e-13 and abs(mu_c - radau.MU_COMPLEX) < 1e-13
    np.testing.assert_allclose(P, radau.P, atol=1e-13)
    np.testing.assert_allclose(TI @ np.linalg.inv(_radau.A) @ T,
                               [[mu_r, 0, 0], [0, mu_c.real, -mu_c.imag],
                                [0, mu_c.imag, mu_c.real]], atol=1e-12)


@pytest.mark.parametrize("method", ["BDF", pytest.param("Radau", marks=pytest.mark.slow)])
def test_robertson_against_scipys_method_of_the_same_name(method):
    """The stiff Robertson kinetics over 4e5 (rtol 1e-6, atol 1e-10): at
    least the accuracy of SciPy's method of the same name against a tight
    Radau solve, and its work (`nfev`, `njev`, `nlu`) within 2x of SciPy's,
    counted as SciPy's."""
    kw = dict(fun=robertson, t_span=(0.0, 4e5), y0=[1.0, 0.0, 0.0], method=method, rtol=1e-6,
              atol=1e-10, t_eval=ROBERTSON_TIMES)
    res, ref = sd.ode.solve_ivp(**kw), si.solve_ivp(**kw)
    exact = si.solve_ivp(**{**kw, "method": "Radau", "rtol": 1e-12, "atol": 1e-16}).y
    assert res.success and res.status == 0
    err, err_scipy = np.abs(res.y - exact).max(), np.abs(ref.y - exact).max()
    assert err <= 2 * err_scipy, (err, err_scipy)
    for mine, theirs in ((res.nfev, ref.nfev), (res.njev, ref.njev), (res.nlu, ref.nlu)):
        assert theirs / 2 <= mine <= 2 * theirs, (res.nfev, res.njev, res.nlu, ref.nfev,
                                                   ref.njev, ref.nlu)
    np.testing.assert_allclose(res.y.sum(axis=0), 1.0, atol=1e-6)  # mass is conserved


@pytest.mark.slow
@pytest.mark.parametrize("method", ["BDF", "Radau"])
def test_nonstiff_and_backwards_against_scipy(method):
    # Lotka-Volterra forwards and a decay backwards (t_span decreasing)
    def lv(t, y):
        return [1.5 * y[0] - y[0] * y[1], -3.0 * y[1] + y[0] * y[1]]

    for fun, span, y0 in ((lv, (0.0, 5.0), [10.0, 5.0]),
                          (lambda t, y: [-0.5 * y[0], np.cos(t) * y[0]], (2.0, -1.0),
                           [1.0, 0.0])):
        te = np.linspace(*span, 6)
        kw = dict(fun=fun, t_span=span, y0=y0, method=method, t_eval=te, rtol=1e-8,
                  atol=1e-10)
        res, ref = sd.ode.solve_ivp(**kw), si.solve_ivp(**kw)
        exact = si.solve_ivp(**{**kw, "method": "DOP853", "rtol": 1e-13, "atol": 1e-13}).y
        assert res.success
        assert np.abs(res.y - exact).max() <= 3 * max(np.abs(ref.y - exact).max(), 1e-9)


def brusselator(t, y, a, xp=snp):
    # the 1-D Brusselator by the method of lines, u and v interleaved (in
    # sciad ops, or NumPy's for SciPy)
    n = y.shape[0] // 2
    u, v = y[0::2], y[1::2]
    up, vp = xp.pad(u, 1, constant_values=1.0), xp.pad(v, 1, constant_values=3.0)
    c = a / (1.0 / (n + 1)) ** 2
    du = 1.0 + u * u * v - 4.0 * u + c * (up[:-2] - 2 * u + up[2:])
    dv = 3.0 * u - u * u * v + c * (vp[:-2] - 2 * v + vp[2:])
    return xp.reshape(xp.stack([du, dv], axis=1), (-1,))


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_sparse_iteration_matrix_agrees_with_dense(solver):
    # the Brusselator's iteration matrices on its detected pattern (SuperLU
    # on the host; Radau's complex one as a real one of twice the size) and
    # dense: the same solution to the tolerance, and SciPy's
    n = 16
    x = np.linspace(0, 1, n + 2)[1:-1]
    y0 = np.stack([1.0 + np.sin(2 * np.pi * x), np.full(n, 3.0)], axis=1).reshape(-1)
    ts = np.array([0.0, 1.0, 5.0])
    f = sd.function(lambda y0, jac: sd.ode.odeint(brusselator, y0, ts, 0.02, solver=solver,
                                                  jac=jac, rtol=1e-8, atol=1e-8),
                    static_argnames="jac")
    sparse, dense = np.asarray(f(y0, jac="sparse")), np.asarray(f(y0, jac="dense"))
    ref = si.solve_ivp(lambda t, y: brusselator(t, y, 0.02, np), (0.0, 5.0), y0, "Radau", ts,
                       rtol=1e-12, atol=1e-12).y.T
    assert np.abs(sparse - ref).max() <= 1e-5 and np.abs(dense - ref).max() <= 1e-5
    np.testing.assert_allclose(sparse, dense, atol=1e-6)


@pytest.mark.parametrize("solver", ["bdf", pytest.param("radau", marks=pytest.mark.slow)])
def test_gradient_and_forward_mode_against_an_exact_derivative(solver):
    """Forward mode (the sensitivity system, by the same method) and reverse
    mode (the continuous adjoint against the interpolated solution) of a BDF
    or Radau solve of a stiff linear system, against the exact derivative of
    its exact solution `expm(A(k) t) y0` (Frechet derivatives of `expm`)."""
    from scipy.linalg import expm, expm_frechet

    rng = np.random.default_rng(3)
    k, y0 = rng.uniform(1.0, 2.0, 2), rng.uniform(0.5, 1.0, 2)
    ts = np.array([0.0, 0.5, 1.0])
    w = rng.normal(size=(3, 2))

    def matrix(k, xp=np):
        return xp.stack([xp.stack([-50.0 * k[0], k[1]]), xp.stack([k[1], -k[0] - k[1]])])

    def loss(k, y0):
        ys = sd.ode.odeint(lambda t, y, k: matrix(k, snp) @ y, y0, ts, k, solver=solver,
                           rtol=1e-10, atol=1e-12)
        return snp.sum(ys * w)

    A = matrix(k)
    dA = [matrix(np.eye(2)[j]) - matrix(np.zeros(2)) for j in range(2)]
    exact_k = [sum(w[i] @ expm_frechet(A * t, d * t, compute_expm=False) @ y0
                   for i, t in enumerate(ts)) for d in dA]
    exact_y0 = sum(expm(A * t).T @ w[i] for i, t in enumerate(ts))
    exact = np.concatenate([exact_k, exact_y0])
    grad = np.concatenate(sd.grad(loss, argnums=(0, 1))(k, y0))
    v = rng.normal(size=4)
    _, tangent = sd.jvp(loss, (k, y0), (v[:2], v[2:]))
    scale = np.abs(exact).max()
    # both to about the tolerance
    assert abs(float(tangent) - exact @ v) <= 1e-8 * scale * np.abs(v).sum()
    np.testing.assert_allclose(grad, exact, rtol=0, atol=1e-8 * scale)


def _decay_pair(k, y0, solver="bdf", rtol=1e-10, checkpoints=None):
    # a nonlinear two-state system with a time-dependent coupling: smooth in
    # its inputs
    return sd.ode.odeint(lambda t, y, k: snp.stack([-k[0] * y[0] + y[1] ** 2,
                                                    -k[1] * y[1] + snp.sin(t) * y[0]]),
                         y0, np.array([0.0, 0.5, 1.0]), k, solver=solver, rtol=rtol,
                         atol=rtol * 1e-2, checkpoints=checkpoints)


@pytest.mark.slow
@pytest.mark.parametrize("solver,checkpoints", [("bdf", None), ("radau", None), ("bdf", 3),
                                                ("radau", 3)])
def test_check_rules(solver, checkpoints):
    # (checkpoints: the reverse pass replays the steps from 3 snapshots an
    # output interval, forward mode integrates the sensitivities)
    rng = np.random.default_rng(0)
    # (second order: finite differences of an adaptive solve's VJP carry its
    # tolerance over their step, 1e-10 / 1e-6; checked below against the
    # other orders of differentiation instead)
    sd.testing.check_rules(lambda k, y0: _decay_pair(k, y0, solver, checkpoints=checkpoints),
                           rng.uniform(1.0, 2.0, 2),
                           rng.uniform(0.5, 1.0, 2), rtol=1e-5, dot_tol=1e-7,
                           second_order=False)


@pytest.mark.slow
def test_second_order_through_bdfs_discrete_adjoint():
    """The Hessian of a BDF solve's loss three ways: forward over reverse
    (the JVP of the discrete adjoint, `sd.hvp`), reverse over reverse (its
    VJP: the states' cotangents), forward over forward (the sensitivities of
    the sensitivities). They agree to the solves' tolerance."""
    rng = np.random.default_rng(4)
    k, y0 = rng.uniform(1.0, 2.0, 2), rng.uniform(0.5, 1.0, 2)

    def loss(k):
        return snp.sum(_decay_pair(k, y0) ** 2)

    v = rng.normal(size=2)
    hvp = np.asarray(sd.hvp(loss, k, v))
    rr = np.asarray(sd.jacrev(sd.grad(loss))(k)) @ v
    ff = np.asarray(sd.jacfwd(sd.jacfwd(loss))(k)) @ v
    scale = np.abs(ff).max()
    np.testing.assert_allclose(hvp, ff, rtol=0, atol=1e-7 * scale)
    np.testing.assert_allclose(rr, ff, rtol=0, atol=1e-7 * scale)


@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_refusals_name_the_fix(solver):
    f = lambda t, y, a: -y  # noqa: E731
    y0, ts = np.ones(2), np.array([0.0, 1.0])
    with pytest.raises(InvalidOptionError, match="constant steps"):
        sd.ode.odeint(f, y0, ts, solver=solver, adaptive=False, dt0=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["BDF", "Radau"])
def test_blow_up_stops_where_scipys_does(method):
    # y' = y^2 from 1: the step collapses near t = 1, as SciPy's
    kw = dict(fun=lambda t, y: [y[0] ** 2], t_span=(0.0, 2.0), y0=[1.0], method=method)
    res, ref = sd.ode.solve_ivp(**kw), si.solve_ivp(**kw)
    assert res.status == ref.status == -1
    assert abs(res.t_reached - ref.t[-1]) < 5e-3 and np.all(np.isfinite(res.y))
    assert res.y[0, -1] > 1e10


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_jax_transforms_of_to_jax(solver):
    # jax.jit, jax.grad and jax.vmap of the program sd.to_jax makes: the same
    # values and gradient as sciad's own
    import jax

    rng = np.random.default_rng(5)
    k, y0 = rng.uniform(1.0, 2.0, 2), rng.uniform(0.5, 1.0, 2)

    def loss(k):
        return snp.sum(_decay_pair(k, y0, solver) ** 2)

    f = sd.to_jax(loss)
    np.testing.assert_allclose(float(jax.jit(f)(k)), float(sd.function(loss)(k)), rtol=1e-12)
    # (two programs compiled apart: rounding may move an adaptive step, so
    # they agree to the solve's tolerance, 1e-10, not to rounding)
    np.testing.assert_allclose(np.asarray(jax.grad(f)(k)), np.asarray(sd.grad(loss)(k)),
                               rtol=1e-8)
    ks = np.stack([k, k * 1.1])
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(ks)),
                               [float(sd.function(loss)(x)) for x in ks], rtol=1e-9)
    # a batch of gradients whose solves take different numbers of steps (the
    # reverse passes' loops stop apart; the examples done must not fail)
    ks = np.stack([k, k * 1.7, k * 0.5])
    np.testing.assert_allclose(np.asarray(sd.vmap(sd.grad(loss))(ks)),
                               [np.asarray(sd.grad(loss)(x)) for x in ks], rtol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["bdf", "radau", "kvaerno5"])
def test_jax_hessian_of_to_jax_is_sciads(solver):
    """`jax.hessian` of `sd.to_jax` (JAX's forward mode over sciad's reverse
    mode, whose programs form the states at every step and their tangents
    apart) against sciad's forward over reverse and reverse over reverse.
    The states' tangents come from the steps the states were taken on: with
    a sensitivity system that took its own steps (BDF: 135 against 141),
    this was off by 1.2e-2 relative here (kvaerno5: 4e-5; Robertson: 1.3),
    and not symmetric. (JAX differentiates the tangent map of the loss,
    whose solve records no states: a sensitivity system, the discrete
    derivative of the steps to its Newton tolerance, so the two agree to a
    fraction of the solve's rtol, 1e-6, not to rounding; Radau's steps
    re-solve their stages to 1e-3 of it.)"""
    import jax

    def van_der_pol(t, y, k):
        return snp.stack([y[1], k[0] * (1 - y[0] ** 2) * y[1] - k[1] * y[0]])

    def loss(k):
        ys = sd.ode.odeint(van_der_pol, np.array([2.0, 0.0]), np.array([0.0, 0.5, 1.0, 2.0]),
                           k, solver=solver, rtol=1e-6, atol=1e-9)
        return snp.sum(ys[-1] * np.array([1.0, 0.3]))

    k = np.array([3.0, 1.0])
    with jax.enable_x64(True):
        hj = np.asarray(jax.hessian(sd.to_jax(loss))(k))
    # (programs compiled apart may round a step decision apart, each then
    # exact for its own steps, which differ by about rtol: 1e-5 relative)
    fr = np.asarray(sd.jacfwd(sd.jacrev(loss))(k))
    scale = np.abs(fr).max()
    np.testing.assert_allclose(hj, fr, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(hj, hj.T, rtol=0,
                               atol=(1e-6 if solver == "radau" else 1e-10) * scale)


def test_a_failed_solve_raises_under_the_derivatives():
    # a field that turns NaN (sqrt of a negative state) stops the solve; its
    # gradient reports the failure before any adjoint runs
    from sciad.errors import ConvergenceError

    def loss(a):
        return sd.ode.odeint(lambda t, y, a: -snp.sqrt(y) * a, np.array([1.0]),
                             np.array([0.0, 5.0]), a, solver="bdf")[-1, 0]

    with pytest.raises(ConvergenceError, match="bdf integration failed"):
        sd.grad(loss)(2.0)


# ---------------------------------------------------------------------------
# mass matrices: M dy/dt = f, index-1 DAEs (BDF and Radau)


def robertson_dae(t, y, k):
    # Robertson's kinetics with its third equation replaced by the
    # conservation law y1 + y2 + y3 = 1 (algebraic: the mass matrix's third
    # row is empty)
    return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2,
                      y[0] + y[1] + y[2] - 1.0])


def robertson_ode(t, y, k):
    return snp.stack(robertson(t, y, *k))


RATES = np.array([0.04, 3e7, 1e4])
DAE_MASS = np.diag([1.0, 1.0, 0.0])


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["bdf", "radau", "kvaerno5"])
def test_robertson_dae_agrees_with_the_ode_form_and_differentiates_forward(solver):
    """The DAE form against the ODE form at t = 0.4 ... 4e5 (to 1e-5), its
    consistency check and `dae_init="solve"`, and its forward-mode
    derivative in the rates against the ODE's."""
    from sciad.errors import InvalidOptionError

    ts = np.array([0.0] + ROBERTSON_TIMES)
    y0 = np.array([1.0, 0.0, 0.0])
    kw = dict(solver=solver, rtol=1e-6, atol=1e-10)
    dae = sd.ode.odeint(robertson_dae, y0, ts, RATES, mass=DAE_MASS, **kw)
    ode = sd.ode.odeint(robertson_ode, y0, ts, RATES, **kw)
    assert np.abs(np.asarray(dae) - np.asarray(ode)).max() <= 1e-5
    with pytest.raises(InvalidOptionError, match="violate the algebraic equations"):
        sd.ode.odeint(robertson_dae, np.array([1.0, 0.0, 0.5]), ts, RATES, mass=DAE_MASS, **kw)
    fixed = sd.ode.odeint(robertson_dae, np.array([1.0, 0.0, 0.5]), ts, RATES, mass=DAE_MASS,
                          dae_init="solve", **kw)
    np.testing.assert_allclose(np.asarray(fixed)[0], y0, atol=1e-12)  # y3 solved: 0
    v = np.array([1.0, 0.0, 0.0])
    tight = dict(solver=solver, rtol=1e-9, atol=1e-13)
    _, d_dae = sd.jvp(lambda k: sd.ode.odeint(robertson_dae, y0, ts, k, mass=DAE_MASS,
                                              **tight)[-1, 0], (RATES,), (v,))
    _, d_ode = sd.jvp(lambda k: sd.ode.odeint(robertson_ode, y0, ts, k, **tight)[-1, 0],
                      (RATES,), (v,))
    np.testing.assert_allclose(float(d_dae), float(d_ode), rtol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_heat_dae_with_sparse_iteration_matrices(solver):
    """The 1-D heat equation with its boundary values as algebraic
    equations (u = 0 there: SUNDIALS' idaHeat2D in one dimension), sparse
    iteration matrices (the mass on their pattern), against the exact decay
    of the semi-discrete system's first mode."""
    import scipy.sparse as sp

    n = 201
    x = np.linspace(0.0, 1.0, n)
    dx2 = (x[1] - x[0]) ** 2

    def heat(t, u, a):
        lap = a * (u[:-2] - 2 * u[1:-1] + u[2:]) / dx2
        return snp.concatenate([u[:1], lap, u[-1:]])  # (the ends: 0 = u)

    mass = sp.diags(np.r_[0.0, np.ones(n - 2), 0.0]).tocsr()
    ts = np.array([0.0, 0.05, 0.1])

    def solve(a):
        return sd.ode.odeint(heat, np.sin(np.pi * x), ts, a, solver=solver, jac="sparse",
                             mass=mass, rtol=1e-8, atol=1e-10)

    u, du = sd.jvp(solve, (1.0,), (1.0,))  # (forward mode: the sensitivities, same M)
    rate = 4.0 / dx2 * np.sin(np.pi * (x[1] - x[0]) / 2) ** 2
    mode = np.sin(np.pi * x)[None, :]
    exact = np.exp(-rate * ts)[:, None] * mode
    # (measured: BDF 1.7e-8 and 5.2e-8, Radau 1.4e-12 and 7.9e-12)
    assert np.abs(np.asarray(u) - exact).max() <= 1e-7
    assert np.abs(np.asarray(du) + (rate * ts * np.exp(-rate * ts))[:, None] * mode).max() \
        <= 5e-7


@pytest.mark.slow
def test_dae_gradient_by_the_discrete_adjoint():
    """Reverse mode through a DAE (Robertson's, the conservation law as its
    algebraic equation; BDF's discrete adjoint) against central differences
    in the rates, and against forward mode in the rates and the initial
    values."""
    ts = np.array([0.0, 0.4, 4.0, 40.0])
    y0 = np.array([1.0, 0.0, 0.0])
    w = np.array([1.0, 1e4, 1.0])

    def loss(k, y0=y0):
        ys = sd.ode.odeint(robertson_dae, y0, ts, k, mass=DAE_MASS, solver="bdf", rtol=1e-9,
                           atol=1e-13)
        return snp.sum(ys * w)

    grad = np.asarray(sd.grad(loss)(RATES))
    f = sd.function(loss)
    for j in range(3):
        e = np.zeros(3)
        e[j] = 1e-3 * RATES[j]  # (a longer step: the solves' own errors are 1e-9)
        fd = (float(f(RATES + e)) - float(f(RATES - e))) / (2 * e[j])
        # (to the differences' truncation, and their rounding by the
        # solves' tolerance: 1e-9 of the loss over the step)
        assert abs(grad[j] - fd) <= 1e-6 * abs(fd) + 1e-9 * abs(float(f(RATES))) / e[j], \
            (j, grad[j], fd)
    # y0's derivative in directions that keep it consistent (y1 + y2 + y3 = 1)
    v = np.array([0.5, 0.2, -0.7])
    gy0 = np.asarray(sd.grad(lambda y: loss(RATES, y))(y0))
    _, d = sd.jvp(lambda y: loss(RATES, y), (y0,), (v,))
    np.testing.assert_allclose(gy0 @ v, float(d), rtol=1e-6)
    _, d = sd.jvp(loss, (RATES,), (RATES * 0.1,))
    np.testing.assert_allclose(grad @ (RATES * 0.1), float(d), rtol=1e-6)


def test_mass_matrix_refusals():
    from sciad.errors import NotSupportedError, ShapeError

    ts, y0 = np.array([0.0, 1.0]), np.array([1.0, 0.0, 0.0])
    with pytest.raises(NotSupportedError, match="for the solvers 'bdf', 'kvaerno3'"):
        sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="tsit5", mass=DAE_MASS)
    with pytest.raises(NotSupportedError, match="diagonal mass matrix"):
        sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="radau", jac="sparse",
                      mass=DAE_MASS + np.eye(3, k=1))
    with pytest.raises(ShapeError, match=r"must be \(3, 3\)"):
        sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="bdf", mass=np.eye(2))
    with pytest.raises(NotSupportedError, match="must be a constant"):
        sd.trace(lambda m: sd.ode.odeint(robertson_dae, y0, ts, RATES, solver="bdf", mass=m),
                 DAE_MASS)
    with pytest.raises(NotSupportedError, match="reverse mode .* mass matrix.*'checkpoint'"):
        sd.trace(sd.grad(lambda k: sd.ode.odeint(robertson_dae, y0, ts, k, solver="radau",
                                                 mass=DAE_MASS, adjoint="interpolated")[-1, 0]),
                 RATES)
    # (Radau's default, the discrete adjoint, differentiates a DAE)
    sd.trace(sd.grad(lambda k: sd.ode.odeint(robertson_dae, y0, ts, k, solver="radau",
                                             mass=DAE_MASS)[-1, 0]), RATES)
    # an event inside a transformation is located along f as dy/dt: refused
    hit = lambda t, y, k: y[0] - 0.5  # noqa: E731
    hit.terminal = True
    with pytest.raises(NotSupportedError, match="event with a mass matrix"):
        sd.trace(lambda k: sd.ode.solve_ivp(robertson_dae, (0.0, 4e5), y0, method="BDF",
                                            args=(k,), events=hit, mass=DAE_MASS).t, RATES)


@pytest.mark.slow
def test_solve_ivp_dae_with_an_event_against_scipys_ode_form():
    # solve_ivp passes `mass` to BDF; its eager events are located along the
    # solution (re-integrated), so the DAE's event time is the ODE's
    def dae(t, y):
        return [-0.04 * y[0] + 1e4 * y[1] * y[2],
                0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, y[0] + y[1] + y[2] - 1.0]

    def half(t, y):
        return y[0] - 0.5

    half.terminal = True
    kw = dict(t_span=(0.0, 4e5), y0=[1.0, 0.0, 0.0], method="BDF", rtol=1e-6, atol=1e-10,
              events=half)
    res = sd.ode.solve_ivp(dae, mass=DAE_MASS, **kw)
    ref = si.solve_ivp(lambda t, y: robertson(t, y), **kw)
    assert res.status == ref.status == 1
    np.testing.assert_allclose(res.t_events[0], ref.t_events[0], rtol=1e-5)


# ---------------------------------------------------------------------------
# BDF's discrete adjoint (adjoint="checkpoint", its default)


def _replayed_bdf(A, M, y0, grid, history, steps: int, marks):
    """The BDF steps a solve took (their sizes, orders and rescalings, as
    recorded), re-run in NumPy on the linear system `M y' = A y`, whose step
    equations are solved exactly: `ys` at the output times (`marks`)."""
    from sciad.solvers.ode import _bdf

    D = np.zeros((_bdf.MAX_ORDER + 3, y0.shape[0]))
    D[0], D[1] = y0, np.linalg.pinv(M) @ A @ y0
    out = [y0]
    for j in range(1, steps + 1):
        q, R = int(history[j, 0]), history[j, 1:].reshape(6, 6)
        D[:6] = R @ D[:6]
        c = (grid[j] - grid[j - 1]) / _bdf.ALPHA[q]
        pred = D[:q + 1].sum(0)
        psi = sum(_bdf.GAMMA[i] * D[i] for i in range(1, q + 1)) / _bdf.ALPHA[q]
        d = np.linalg.solve(M - c * A, c * A @ pred - M @ psi)
        D[q + 2], D[q + 1] = d - D[q + 1], d
        for i in range(q, -1, -1):
            D[i] += D[i + 1]
        out.append(D[0].copy())
    return np.stack([out[m] for m in marks])


def _replayed_radau(A, M, y0, grid, steps: int, marks):
    """Radau IIA's steps on the recorded grid, re-run in NumPy on `M y' =
    A y` with the stage equations solved exactly (as `_replayed_bdf`)."""
    from sciad.solvers.ode import _radau

    n = y0.shape[0]
    K, MM = np.kron(_radau.A, A), np.kron(np.eye(3), M)
    out = [y0]
    for j in range(1, steps + 1):
        h = grid[j] - grid[j - 1]
        Z = np.linalg.solve(MM - h * K, h * K @ np.tile(out[-1], 3))
        out.append(out[-1] + Z[2 * n:])
    return np.stack([out[m] for m in marks])


def _replayed_esdirk(solver, A, M, y0, grid, steps: int, marks):
    """The ESDIRK steps a solve took (their sizes, from its grid), re-run in
    NumPy on `M y' = A y` with each stage equation solved exactly."""
    from sciad.solvers.ode._ode_steppers import STEPPERS, tableau

    c, As, b = tableau(STEPPERS[solver])
    a = As[-1]
    out = [y0]
    for j in range(1, steps + 1):
        h, y = grid[j] - grid[j - 1], out[-1]
        F = [A @ y]
        for i in range(1, len(b)):
            known = M @ y + h * sum(a[i, l] * F[l] for l in range(i))
            Y = np.linalg.solve(M - h * a[i, i] * A, known)
            F.append(A @ Y)
        out.append(Y)
    return np.stack([out[m] for m in marks])


@pytest.mark.parametrize("solver,mass", [("bdf", "dense"), *(
    pytest.param(*p, marks=pytest.mark.slow)
    for p in (("kvaerno5", "dense"), ("bdf", "sparse"), ("radau", "sparse"),
              ("kvaerno5", "sparse"), ("bdf", None), ("radau", None)))])
def test_discrete_adjoint_is_the_derivative_of_the_steps_taken(solver, mass):
    """The discrete adjoint (BDF's default reverse mode; Radau's with
    `adjoint="checkpoint"`; an ESDIRK method's with a mass matrix, which
    steps in sciad's own loop) against the derivatives of the same steps
    (BDF: sizes, orders, rescalings from the loop's record; Radau, Kvaerno5:
    sizes) re-run
    in NumPy on a linear system, whose step equations are then solved
    exactly: equal to rounding in `y0`, and to the Newton tolerance (the
    recorded states) in the matrix's parameters. With a mass matrix, an
    index-1 DAE (its third equation algebraic); sparse: sparse iteration
    matrices and a sparse mass matrix."""
    import jax.numpy as jnp
    import scipy.sparse as sp

    from sciad.graph._types import Pattern
    from sciad.solvers.ode import _bdf, _esdirk, _radau
    from sciad.solvers.ode._ode_steppers import STEPPERS, error_weights, tableau

    def matrix(k, xp):
        z = 0.0 * k[0]
        return xp.stack([xp.stack([-50.0 * k[0], k[1], z]),
                         xp.stack([k[1], -k[0] - k[1], 1.0 + z]),
                         xp.stack([z, k[0], -3.0 + z])])

    rng = np.random.default_rng(3)
    k, y0 = rng.uniform(1.0, 2.0, 2), rng.uniform(0.5, 1.0, 3)
    M = np.eye(3) if mass is None else np.diag([1.0, 1.0, 0.0])
    if mass is not None:
        y0[2] = k[0] * y0[1] / 3.0  # (consistent: 0 = k0 y1 - 3 y2)
    ts, w = np.array([0.0, 0.2, 0.5]), rng.normal(size=(3, 3))
    kw = dict(rtol=1e-5, atol=1e-8)
    option = {} if mass is None else {"mass": sp.csr_matrix(M) if mass == "sparse" else M}

    def loss(k, y0):
        ys = sd.ode.odeint(lambda t, y, k: matrix(k, snp) @ y, y0, ts, k, solver=solver,
                           jac="sparse" if mass == "sparse" else "dense", adjoint="checkpoint",
                           **option, **kw)
        return snp.sum(ys * w)

    grad = sd.grad(loss, argnums=(0, 1))(k, y0)
    # the loop as the node runs it (sparse: on the field's detected pattern,
    # all of the 3 x 3 here, the mass matrix's values on it)
    full = {}
    if mass == "sparse":
        rows, cols = np.nonzero(np.ones((3, 3)))
        full = dict(jac="sparse", pattern=Pattern.from_coo((3, 3), rows, cols)[0])
    method = {"bdf": _bdf, "radau": _radau, "kvaerno5": _esdirk}[solver]
    extra = {"history": True} if solver == "bdf" else {}
    if solver == "kvaerno5":  # (its tableau, and the embedded estimate's weights)
        c, As, b = tableau(STEPPERS[solver])
        extra = dict(tableau=(c, As[-1], b, error_weights(STEPPERS[solver])), order=5)
    r = method.integrate(lambda t, y: matrix(jnp.asarray(k), jnp) @ y, jnp.asarray(y0),
                         jnp.asarray(ts), max_steps=256, record=True, dense=True,
                         mass=None if mass is None else jnp.asarray(
                             M[rows, cols] if full else M), **full, **kw,
                         **extra)
    steps, grid = int(r.accepted), np.asarray(r.grid)
    assert steps > (10 if solver == "bdf" else 3)
    if solver == "bdf":
        history = np.asarray(r.history)
        assert history[1:steps + 1, 0].max() >= 3  # (variable order)
    marks = np.searchsorted(grid[:steps + 1], ts)

    def replayed(k, y0):
        A = matrix(k, np)
        if solver == "bdf":
            return _replayed_bdf(A, M, y0, grid, history, steps, marks)
        if solver == "kvaerno5":
            return _replayed_esdirk(solver, A, M, y0, grid, steps, marks)
        return _replayed_radau(A, M, y0, grid, steps, marks)

    def replayed_loss(k, y0):
        return float(np.sum(replayed(k, y0) * w))

    # (the Newton iterations stop within about 3e-3 of the error scale atol +
    # rtol |y|, 5e-6 here, a step: measured 2e-10 to 1.6e-9, by how the
    # iteration matrix's factorization rounds)
    assert np.abs(replayed(k, y0) - np.asarray(r.ys)).max() <= 1e-8
    # the replay's derivatives: in y0 exactly (it is linear in y0: its
    # values at the unit vectors), in k by central differences (smooth: no
    # step is chosen again; their error 1e-10)
    want_y0 = [replayed_loss(k, e) for e in np.eye(3)]
    want_k = [(replayed_loss(k + 1e-6 * e, y0) - replayed_loss(k - 1e-6 * e, y0)) / 2e-6
              for e in np.eye(2)]
    np.testing.assert_allclose(np.asarray(grad[1]), want_y0, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(grad[0]), want_k, rtol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("mass", [None, "dense", "sparse"])
def test_bdfs_forward_pass_on_its_steps_is_its_adjoints_transpose(mass):
    """Forward over reverse (the JVP of the discrete adjoint: the node
    records its states, so its tangents are the forward pass over its
    recorded steps, `bdf_jvp`) against reverse over reverse (the adjoint's
    own VJP): two linearisations of the same steps, with and without a mass
    matrix (a DAE: the first differences' `P f`); and symmetric to
    rounding."""
    import scipy.sparse as sp

    def field(t, y, k):
        return snp.stack([-50.0 * k[0] * y[0] + k[1] * y[1] + snp.sin(y[2]),
                          k[1] * y[0] - k[0] * k[1] * y[1] + y[2],
                          k[0] * y[1] - 3.0 * y[2] + 0.1 * y[0] ** 2])

    rng = np.random.default_rng(7)
    k, y0 = rng.uniform(1.0, 2.0, 2), rng.uniform(0.5, 1.0, 3)
    option = {}
    if mass is not None:
        M = np.diag([1.0, 1.0, 0.0])
        option = {"mass": sp.csr_matrix(M) if mass == "sparse" else M}
        y0[2] = (k[0] * y0[1] + 0.1 * y0[0] ** 2) / 3.0  # (consistent)
    w = rng.normal(size=(3, 3))

    def loss(k):
        ys = sd.ode.odeint(field, y0, np.array([0.0, 0.2, 0.5]), k, solver="bdf",
                           jac="sparse" if mass == "sparse" else "dense", rtol=1e-9,
                           atol=1e-12, **option)
        return snp.sum(ys * w)

    # (each program takes its own steps, which rounding may move apart
    # (measured: 1e-4 relative at rtol 1e-5, 6e-6 at 1e-7): a tight rtol)
    fr = np.asarray(sd.jacfwd(sd.jacrev(loss))(k))
    rr = np.asarray(sd.jacrev(sd.jacrev(loss))(k))
    np.testing.assert_allclose(fr, rr, rtol=0, atol=1e-7 * np.abs(rr).max())
    np.testing.assert_allclose(fr, fr.T, rtol=0, atol=1e-12 * np.abs(rr).max())


@pytest.mark.slow
@pytest.mark.parametrize("solver,m", [("bdf", 100), ("kvaerno5", 50)])
def test_heat_dae_in_two_dimensions(solver, m):
    """SUNDIALS' idaHeat2D at 100 x 100 (the boundary values algebraic): BDF
    with sparse iteration matrices against the semi-discrete system's exact
    solution, and its gradient (the discrete adjoint, through the DAE)
    against forward mode. Kvaerno5 at 50 x 50 (2,500 unknowns: its replayed
    stages factored once each by SuperLU, `_ode_replay._stage_jac`), the
    same."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import expm_multiply

    x = np.linspace(0.0, 1.0, m)
    h2 = (x[1] - x[0]) ** 2
    X, Y = np.meshgrid(x, x, indexing="ij")
    u0 = (16 * X * (1 - X) * Y * (1 - Y)).ravel()
    boundary = np.ones((m, m), bool)
    boundary[1:-1, 1:-1] = False
    ts = np.array([0.0, 0.01, 0.02, 0.04])

    def heat(t, u, a):
        U = snp.reshape(u, (m, m))
        lap = (U[:-2, 1:-1] + U[2:, 1:-1] + U[1:-1, :-2] + U[1:-1, 2:] - 4 * U[1:-1, 1:-1]) / h2
        return snp.reshape(snp.pad(a * lap, 1) + snp.where(boundary, U, 0.0), (m * m,))

    mass = sp.diags((~boundary).ravel().astype(float)).tocsr()

    def loss(a):
        ys = sd.ode.odeint(heat, u0, ts, a, solver=solver, jac="sparse", mass=mass, rtol=1e-6,
                           atol=1e-9)
        return snp.sum(ys ** 2), ys

    (value, ys), grad = sd.value_and_grad(loss, has_aux=True)(1.0)
    n = m - 2
    T = sp.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]) / h2
    exact = np.stack([expm_multiply(sp.kronsum(T, T).tocsr() * t,
                                    u0.reshape(m, m)[1:-1, 1:-1].ravel()) for t in ts])
    inner = np.asarray(ys).reshape(len(ts), m, m)[:, 1:-1, 1:-1].reshape(len(ts), -1)
    assert np.abs(inner - exact).max() <= 2e-6
    assert np.all(np.asarray(ys).reshape(len(ts), m, m)[:, boundary] == 0.0)
    _, tangent = sd.jvp(lambda a: loss(a)[0], (1.0,), (1.0,))
    np.testing.assert_allclose(float(grad), float(tangent), rtol=1e-5)


@pytest.mark.parametrize("solver", ["radau", pytest.param("kvaerno5", marks=pytest.mark.slow)])
def test_the_replayed_stages_derivative_solves_make_no_host_call(monkeypatch, solver):
    """The discrete adjoint's replayed implicit stages (Radau's, an ESDIRK
    method's) solve their transposed Jacobians checked in the program alone
    (`optimize.root[estimate=False]`: an ODE stage's `I - h g J` is
    well-conditioned by construction): no condition estimate on the host per
    step, which was most of a small system's reverse pass (Robertson with
    Radau to 1e5: 22 -> 8 ms). A user's root still estimates it."""
    from sciad.solvers._registry import lookup

    lu = lookup("lu", "linear")
    calls = []
    real = lu.rcond_host
    monkeypatch.setattr(lu, "rcond_host", lambda *a: calls.append(1) or real(*a))
    g = sd.grad(lambda k: sd.ode.odeint(robertson_ode, np.array([1.0, 0.0, 0.0]),
                                        np.array([0.0, 10.0]), k, solver=solver, rtol=1e-6,
                                        atol=1e-10)[-1, 0])(RATES)
    assert np.all(np.isfinite(np.asarray(g)))
    assert calls == []
    sd.grad(lambda c: snp.sum(sd.optimize.root(lambda x, c: x ** 3 + c * x - 1.0,
                                               np.ones(2), (c,), jac="dense").x))(2.0)
    assert calls  # (the counter counts)
