"""`sd.ode.odeint`: solutions against SciPy (explicit and stiff solvers),
derivatives with respect to `y0`, `args` and the times (forward mode, both
adjoints, second order, through `jax.grad(sd.to_jax(...))`) against finite
differences and each other, pytrees, batching, `solve_ivp`, and the
failures: trace-time errors and each run-time diagnosis."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.integrate

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, InvalidOptionError, ShapeError

TS = np.linspace(0.0, 4.0, 9)
THETA = np.array([1.5, 1.0, 3.0, 1.0])
Y0 = np.array([1.0, 1.0])
TIGHT = dict(rtol=1e-10, atol=1e-10)


def lotka_volterra(t, y, th):
    return snp.stack([th[0] * y[0] - th[1] * y[0] * y[1],
                      -th[2] * y[1] + th[3] * y[0] * y[1]])


def lotka_volterra_np(t, y, th):
    return [th[0] * y[0] - th[1] * y[0] * y[1], -th[2] * y[1] + th[3] * y[0] * y[1]]


def loss(th, y0, ts, **kw):
    ys = sd.ode.odeint(lotka_volterra, y0, ts, th, **{**TIGHT, **kw})
    return snp.sum(ys[:, 0] ** 2 + 0.5 * ys[:, 1])


def fd_grad(f, x, eps=1e-6):
    return np.array([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(x.size)])


@pytest.fixture(scope="module")
def compiled():
    """The compiled loss and its gradient (checkpointed adjoint) in all
    three arguments, shared by the tests below."""
    return sd.function(loss), sd.function(sd.grad(loss, argnums=(0, 1, 2)))


def test_explicit_solution_agrees_with_scipy():
    ys = sd.ode.odeint(lotka_volterra, Y0, TS, THETA, solver="dopri5", **TIGHT)
    ref = scipy.integrate.solve_ivp(lotka_volterra_np, TS[[0, -1]], Y0, "DOP853", TS,
                                    args=(THETA,), rtol=1e-13, atol=1e-13).y.T
    assert ys.shape == (TS.size, 2)
    np.testing.assert_allclose(np.asarray(ys), ref, rtol=1e-8, atol=1e-9)


def robertson(t, y, k):
    return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2,
                      k[1] * y[1] ** 2])


K = np.array([0.04, 3e7, 1e4])
TS_STIFF = np.array([0.0, 1.0, 10.0, 100.0])


def _robertson_conc(logk, **kw):
    return sd.ode.odeint(robertson, np.array([1.0, 0.0, 0.0]), TS_STIFF, snp.exp(logk),
                         **{"solver": "kvaerno5", "rtol": 1e-8, "atol": 1e-10, **kw})


def test_stiff_solution_agrees_with_scipy():
    """Robertson's kinetics with Kvaerno5 against SciPy's Radau."""
    ref = scipy.integrate.solve_ivp(
        lambda t, y: [-K[0] * y[0] + K[2] * y[1] * y[2],
                      K[0] * y[0] - K[2] * y[1] * y[2] - K[1] * y[1] ** 2, K[1] * y[1] ** 2],
        (0, 100), [1, 0, 0], "Radau", TS_STIFF, rtol=1e-12, atol=1e-14).y.T
    np.testing.assert_allclose(np.asarray(_robertson_conc(np.log(K))), ref, rtol=1e-5,
                               atol=1e-9)


@pytest.mark.slow
def test_stiff_gradient_on_constant_steps():
    """The discrete adjoint of implicit steps (each stage a root node in the
    replay, differentiated implicitly) against differences: implicit Euler
    on constant steps (a smooth function of the rates; the first steps'
    chord iterations fail and are retried shorter)."""
    def objective(logk):
        ys = sd.ode.odeint(robertson, np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 2.0]),
                           snp.exp(logk), solver="implicit_euler", adaptive=False, dt0=0.25)
        return snp.sum(ys[:, 1]) * 1e4

    g = sd.grad(objective)(np.log(K))
    fd = fd_grad(sd.function(objective), np.log(K), eps=1e-6)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_stiff_gradient_with_adaptive_steps():
    """Kvaerno5 with adaptive steps: the discrete adjoint against differences
    in the log of the rates."""
    objective = lambda logk: snp.sum(_robertson_conc(logk)[:, 0])  # noqa: E731
    g = sd.grad(objective)(np.log(K))
    fd = fd_grad(sd.function(objective), np.log(K), eps=1e-5)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-9)


@pytest.mark.slow
def test_stiff_gradient_at_tolerances_near_the_rounding_floor():
    """Kvaerno5 to t = 1e4 at rtol=1e-10, atol=1e-14: the replayed implicit
    stages' own tolerance (1e-3 rtol) lies below their floor of rounding
    errors on the long steps (the chord iterations stalled at ||F|| = 1.4e-13
    against 1e-13); a stage at its floor has converged, and the gradient
    agrees with differences."""
    ts = np.array([0.0, 1e-2, 1.0, 1e2, 1e4])

    def objective(logk):
        ys = sd.ode.odeint(robertson, np.array([1.0, 0.0, 0.0]), ts, snp.exp(logk),
                           solver="kvaerno5", rtol=1e-10, atol=1e-14)
        return snp.sum(ys[:, 0]) + 1e4 * snp.sum(ys[:, 1])

    g = sd.grad(objective)(np.log(K))
    fd = fd_grad(sd.function(objective), np.log(K), eps=1e-5)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-9)


def test_gradients_against_finite_differences(compiled):
    """The checkpointed adjoint in `theta`, `y0` and every output time (the
    initial one included) against central differences of the compiled
    solve."""
    f, g = compiled
    gth, gy0, gts = (np.asarray(v) for v in g(THETA, Y0, TS))
    np.testing.assert_allclose(gth, fd_grad(lambda th: f(th, Y0, TS), THETA), rtol=1e-6)
    np.testing.assert_allclose(gy0, fd_grad(lambda y: f(THETA, y, TS), Y0), rtol=1e-6)
    np.testing.assert_allclose(gts, fd_grad(lambda ts: f(THETA, Y0, ts), TS), rtol=1e-5,
                               atol=1e-6)


def test_forward_mode_is_an_odeint_of_the_sensitivities_and_agrees_with_reverse(compiled):
    _, g = compiled
    v = (np.array([0.1, -0.2, 0.3, 0.05]), np.array([0.3, -0.1]),
         np.linspace(0.0, 0.1, TS.size))
    graph = sd.trace(lambda th, y0, ts: sd.jvp(loss, (th, y0, ts), (th, y0, ts))[1],
                     THETA, Y0, TS)
    assert str(graph).count("ode.odeint[") == 1, "one node: the sensitivity system"
    _, jv = sd.jvp(loss, (THETA, Y0, TS), v)
    dot = sum(float(np.dot(np.asarray(a), b)) for a, b in zip(g(THETA, Y0, TS), v))
    np.testing.assert_allclose(float(jv), dot, rtol=1e-9)


@pytest.mark.parametrize("adjoint, tol", [pytest.param("backsolve", 1e-7, marks=pytest.mark.slow),
                                          ("interpolated", 2e-6)])
def test_continuous_adjoints_agree_to_their_accuracy(compiled, adjoint, tol):
    """The continuous adjoints against the discrete one: backsolve to the
    solver's tolerance, interpolated to its cubic Hermite interpolation's
    accuracy; and forward over reverse through them."""
    _, g = compiled
    back = sd.grad(lambda th, y0, ts: loss(th, y0, ts, adjoint=adjoint),
                   argnums=(0, 1, 2))(THETA, Y0, TS)
    for a, b in zip(back, g(THETA, Y0, TS)):
        scale = np.abs(np.asarray(b)).max()
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol * scale)
    # constant steps: the adjoint integrates on steps of the same dt0 (an
    # adjoint node without it was refused at trace time)
    graph = sd.trace(sd.grad(lambda th: snp.sum(sd.ode.odeint(
        lotka_volterra, Y0, TS, th, adaptive=False, dt0=0.05, adjoint=adjoint))), THETA)
    nodes = [n for n in _nodes(graph) if n.primitive.name == "ode.odeint"]
    assert len(nodes) == 2 and all(n.params["dt0"] == 0.05 and not n.params["adaptive"]
                                   for n in nodes)


@pytest.mark.slow  # (second order: also the registry's check_rules sweep, jvp of vjp)
def test_hessian_vector_product_against_differences_of_the_gradient(compiled):
    _, g = compiled
    v = np.array([0.1, 0.2, -0.3, 0.1])
    hv = sd.hvp(lambda th: loss(th, Y0, TS), THETA, v)
    eps = 1e-5
    fd = (np.asarray(g(THETA + eps * v, Y0, TS)[0]) -
          np.asarray(g(THETA - eps * v, Y0, TS)[0])) / (2 * eps)
    np.testing.assert_allclose(np.asarray(hv), fd, rtol=1e-5)


def test_pytree_state_and_args():
    def field(t, y, p):
        return {"x": y["v"], "v": -p["w"] ** 2 * y["x"]}

    def final_x(w):
        ys = sd.ode.odeint(field, {"x": snp.asarray(1.0), "v": snp.asarray(0.0)},
                           np.array([0.0, 1.0]), {"w": w}, **TIGHT)
        return ys["x"][-1]

    np.testing.assert_allclose(float(sd.function(final_x)(2.0)), np.cos(2.0), rtol=1e-8)


@pytest.mark.slow
def test_composes_with_jax_grad(compiled):
    """`jax.grad(sd.to_jax(...))` is sciad's adjoint. (`sd.vmap`: the batching
    sweep over the registry's example.)"""
    _, g = compiled
    grad = jax.grad(sd.to_jax(lambda th: loss(th, Y0, TS)))(THETA)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(g(THETA, Y0, TS)[0]), rtol=1e-10)


def test_solve_ivp_has_scipys_interface():
    # SciPy's forms: `y0` a list, `fun` returning a list, `args` a list
    # unpacked into it (the list state had come back transposed, (T, n))
    res = sd.ode.solve_ivp(lambda t, y, a, b, c, d: [a * y[0] - b * y[0] * y[1],
                                                     -c * y[1] + d * y[0] * y[1]],
                           (0.0, 4.0), [1.0, 1.0], t_eval=TS[1:], args=list(THETA),
                           rtol=1e-10, atol=1e-10)
    ref = scipy.integrate.solve_ivp(lotka_volterra_np, (0.0, 4.0), Y0, t_eval=TS[1:],
                                    args=(THETA,), rtol=1e-12, atol=1e-12)
    assert res.success and res.status == 0 and res.y.shape == ref.y.shape == (2, 8)
    np.testing.assert_allclose(np.asarray(res.y), ref.y, rtol=1e-7)
    np.testing.assert_array_equal(res.t, ref.t)


def _decay(t, y, k, c):  # a list, as SciPy's examples return it
    return [-k * y[0], k * y[0] - c * y[1] + 0.1 * t]


@pytest.mark.slow
@pytest.mark.parametrize("y0, fun, args", [
    ([1.0, 0.5], _decay, [0.7, 0.3]),                       # a list: it had come back (T, n)
    ((1, 0), lambda t, y, k, c: snp.stack(_decay(t, y, k, c)), np.array([0.7, 0.3])),
    (np.array([1.0, 0.5], np.float32), lambda t, y, k, c: tuple(_decay(t, y, k, c)),
     (0.7, 0.3)),
])
def test_solve_ivp_takes_scipys_input_forms(y0, fun, args):
    # y0 a list, tuple or array (ints, float32), fun returning a list, tuple
    # or array, args unpacked from a list or an array: SciPy's y, (n, len(t))
    te = np.array([0.5, 1.0, 2.0])
    res = sd.ode.solve_ivp(fun, (0.0, 2.0), y0, t_eval=te, args=args, rtol=1e-10, atol=1e-12)
    ref = scipy.integrate.solve_ivp(_decay, (0.0, 2.0), y0, t_eval=te, args=args, rtol=1e-12,
                                    atol=1e-13)
    assert res.y.shape == ref.y.shape == (2, 3) and res.y.dtype == ref.y.dtype
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-8)
    np.testing.assert_array_equal(res.t, ref.t)
    assert res.status == ref.status == 0 and res.success


@pytest.mark.slow
def test_solve_ivp_times_as_scipy():
    # backwards (t1 < t0), t_eval from t0, only t0, empty, and the default
    # (the ends of t_span, where SciPy returns its steps)
    f = lambda t, y: [-y[0] + 0.1 * t]     # noqa: E731
    kw = dict(rtol=1e-10, atol=1e-12)
    for t_span, t_eval in [((2.0, 0.0), [1.5, 0.5, 0.0]), ((2.0, 0.5), None),
                           ((0.0, 1.0), [0.0]), ((0.0, 1.0), [0.0, 1.0])]:
        res = sd.ode.solve_ivp(f, t_span, [1.0], t_eval=t_eval, **kw)
        ref = scipy.integrate.solve_ivp(f, t_span, [1.0], t_eval=t_eval or list(t_span), **kw)
        assert res.y.shape == ref.y.shape, t_span
        np.testing.assert_allclose(res.y, ref.y, rtol=1e-8, err_msg=str(t_span))
        np.testing.assert_array_equal(res.t, ref.t)
    res = sd.ode.solve_ivp(f, (0.0, 1.0), [1.0], t_eval=[])
    assert res.y.shape == (1, 0) and res.t.shape == (0,)   # (SciPy's y: an empty list)


def test_solve_ivp_failure_is_scipys_status():
    # SciPy's status -1 (sciad's code 1, the step limit, had read as SciPy's
    # "a termination event occurred")
    fun = lambda t, y: [y[0] ** 2]     # noqa: E731
    res = sd.ode.solve_ivp(fun, (0.0, 10.0), [1.0], t_eval=[0.5, 5.0])
    ref = scipy.integrate.solve_ivp(fun, (0.0, 10.0), [1.0], t_eval=[0.5, 5.0])
    assert res.status == ref.status == -1 and not res.success and not ref.success
    assert "step" in res.message
    # (as SciPy's: the output times reached, and finite values there)
    np.testing.assert_array_equal(res.t, ref.t)
    assert res.y.shape == ref.y.shape == (1, 1)
    np.testing.assert_allclose([res.y[0, 0], ref.y[0, 0]], 2.0, rtol=1e-3)   # 1 / (1 - t)


@pytest.mark.parametrize("kw, err, match", [
    (dict(y0=1.0), ShapeError, "`y0` must be 1-dimensional"),
    (dict(y0=np.ones((2, 1))), ShapeError, "`y0` must be 1-dimensional"),
    (dict(y0=[1.0, np.nan]), ShapeError, "must be finite"),
    (dict(args=0.5), sd.errors.DTypeError, r"pass args=\(0.5,\)"),
    (dict(t_eval=[0.5, 1.5]), ShapeError, "not within `t_span`"),
    (dict(t_eval=[0.5, np.nan]), ShapeError, "not within `t_span`"),
    (dict(t_eval=[0.7, 0.5]), ShapeError, "strictly increasing"),
    (dict(t_eval=[[0.5]]), ShapeError, "`t_eval` must be 1-dimensional"),
])
def test_solve_ivp_refuses_what_scipy_refuses(kw, err, match):
    # (before anything is traced: no compile)
    call = {"fun": lambda t, y, *a: -y, "t_span": (0.0, 1.0), "y0": [1.0, 2.0], **kw}
    with pytest.raises(err, match=match):
        sd.ode.solve_ivp(**call)


# ---------------------------------------------------------------------------
# failures


@pytest.mark.parametrize("ts, kw, cls, match", [
    (np.array([0.0, 1.0, 1.0]), {}, InvalidOptionError,
     r"not strictly increasing: ts\[1\] = 1.0, ts\[2\] = 1.0\. Times must increase, or all "
     r"decrease"),
    (np.array([1.0, 1.0]), {}, InvalidOptionError, r"t1 <= t0: ts\[0\] = 1.0, ts\[1\] = 1.0"),
    (np.array([0.0, np.nan]), {}, InvalidOptionError, r"finite times, got \[0.0, nan\]"),
    (np.array([0.0]), {}, ShapeError, "at least 2 times"),
    (TS, {"dt0": 0.0}, InvalidOptionError, "dt0"),
    (TS, {"solver": "rk4"}, InvalidOptionError, "unknown solver 'rk4'; one of tsit5"),
    (TS, {"adjoint": "magic"}, InvalidOptionError, "adjoint"),
    (TS, {"adaptive": False}, InvalidOptionError, "need `dt0`"),
    (TS, {"rtol": 0.0}, InvalidOptionError, r"needs rtol > 0 and atol >= 0, got rtol=0.0"),
    (TS, {"rtol": np.nan}, InvalidOptionError, r"got rtol=nan"),
    (TS, {"atol": np.float64(np.nan)}, InvalidOptionError, r"atol=nan\.\n"),
    (TS, {"max_steps": np.int64(0)}, InvalidOptionError, r"an int >= 1, got 0\.\n"),
])
def test_trace_time_errors(ts, kw, cls, match):
    # an invalid option is not a shape, and numbers print as numbers (not np.float64(1.0))
    with pytest.raises(cls, match=match) as err:
        sd.trace(lambda th: sd.ode.odeint(lotka_volterra, Y0, ts, th, **kw), THETA)
    assert err.value.op == "ode.odeint" and "test_ode.py" in str(err.value)
    assert "np." not in str(err.value)


def test_a_tolerance_below_100_eps_warns_and_is_raised_as_in_scipy():
    with pytest.warns(sd.errors.SciadWarning,
                      match=r"ode.odeint: rtol=1e-20 is below 100 eps \(2.22e-14\).* raised "
                            r"to 2.22e-14, as SciPy's solve_ivp does"):
        graph = sd.trace(lambda th: sd.ode.odeint(lotka_volterra, Y0, TS, th, rtol=1e-20),
                         THETA)
    (node,) = [n for n in graph.nodes if n.primitive.name == "ode.odeint"]
    assert node.params["rtol"] == 100 * np.finfo(np.float64).eps


@pytest.mark.parametrize("kw, match", [
    # the span needs ~120 steps of the last one (0.09): too few max_steps, not stiffness
    ({"max_steps": 20}, r"`max_steps` \(it is 20\) is too small for the span at this step "
                        r"size: about 1\d\d steps of 0.0\d+ cover \[0, 10\]\. Raise "
                        r"`max_steps` to about \d+"),
    # rtol = 100 eps: every step is short
    ({"rtol": 2.3e-14, "atol": 1e-20, "max_steps": 300},
     r"The tolerance is near the rounding level \(rtol = 2.3e-14, 104 eps\)"),
])
def test_a_step_limit_is_diagnosed_from_the_steps(kw, match):
    ts = np.linspace(0.0, 10.0, 11)
    with pytest.raises(ConvergenceError, match=match) as err:
        sd.ode.odeint(lambda t, y, a: snp.stack([1.5 * y[0] - y[0] * y[1],
                                                 -3.0 * y[1] + y[0] * y[1]]),
                      np.array([10.0, 5.0]), ts, **kw)
    assert "stiff" not in str(err.value)


def test_the_step_limit_diagnosis_with_nan():
    # a NaN step size or state is never read as a healthy step count
    from sciad.graph import Site
    from sciad.primitives._ode import judge_ode

    kw = dict(status=1, t_reached=1.0, steps=100, accepted=95, y0max=1.0, t0=0.0, t1=10.0,
              solver="tsit5", max_steps=100, rtol=1e-6)
    for h, ymax, want in ((np.nan, 1.0, "step size collapsed"), (0.1, np.nan, "NaN or infinite")):
        with pytest.raises(RuntimeError, match=want) as err:
            judge_ode(Site("ode.odeint"), h_last=h, ymax=ymax, **kw)
        assert "too small for the span" not in str(err.value)


def test_a_reverse_pass_that_meets_a_non_finite_derivative_says_so():
    """The continuous adjoint's system goes NaN where the field's derivative
    in its parameters is not finite (0 times sqrt's at 0; the field is
    finite): the failure says it is the reverse pass and why, where it said
    the state became NaN at t = 0 (the adjoint's time); the same diagnosis
    of the forward solve does not (the judge, with and without `reverse`)."""
    from sciad.graph import Site
    from sciad.primitives._ode import judge_ode

    def field(t, y, k):
        return -k[0] * y + 0.0 * snp.sqrt(k[1] - 1.0)

    def loss(k):
        return snp.sum(sd.ode.odeint(field, np.ones(2), np.array([0.0, 0.5]), k,
                                     adjoint="interpolated", max_steps=64) ** 2)

    with pytest.raises(ConvergenceError, match="This is the reverse pass: the continuous "
                                               "adjoint's system"):
        sd.function(sd.grad(loss))(np.array([2.0, 1.0]))
    kw = dict(status=3, t_reached=0.0, h_last=0.0, steps=64, accepted=0, ymax=np.inf,
              y0max=1.0, t0=0.0, t1=0.5, solver="tsit5", max_steps=64)
    with pytest.raises(RuntimeError, match="The state became NaN or infinite"):  # (as text)
        judge_ode(Site("ode.odeint"), **kw)
    with pytest.raises(RuntimeError, match="This is the reverse pass"):
        judge_ode(Site("ode.odeint"), reverse=True, **kw)


@pytest.mark.slow  # (a reverse pass to compile)
def test_a_failed_forward_solve_is_reported_as_such_under_a_derivative():
    # the interpolated adjoint integrates back from where the forward solve
    # stopped: the forward's own failure is reported, not the adjoint's
    def loss(y0):
        return snp.sum(sd.ode.odeint(lotka_volterra, y0, TS, THETA, max_steps=5,
                                     adjoint="interpolated"))

    with pytest.raises(ConvergenceError, match=r"integrating from 0 to .*`max_steps` \(it is "
                                               r"5\) is too small") as err:
        sd.grad(loss)(Y0)
    assert "integrating from -" not in str(err.value)


def test_wrong_field_output_is_a_trace_time_error():
    with pytest.raises(ShapeError, match="shapes"):
        sd.trace(lambda y0: sd.ode.odeint(lambda t, y, a: y[:1], y0, TS), Y0)


def test_stiff_problem_with_an_explicit_solver_is_diagnosed():
    with pytest.raises(ConvergenceError, match="likely stiff") as err:
        sd.ode.odeint(robertson, np.array([1.0, 0.0, 0.0]), TS_STIFF, K, max_steps=200)
    msg = str(err.value)
    assert "step limit" in msg and "at t = " in msg and "last accepted step size" in msg
    assert "test_ode.py" in msg


def test_blow_up_and_singular_fields_are_diagnosed():
    with pytest.raises(ConvergenceError, match="grows without bound") as err:
        sd.ode.odeint(lambda t, y, a: y ** 2, np.array([1.0]), np.array([0.0, 2.0]))
    assert "at t = 1 " in str(err.value)  # y = 1 / (1 - t)
    # y' = -1 / (y - 1/2) reaches its pole at t = 1/8
    with pytest.raises(ConvergenceError, match="step size collapsed") as err:
        sd.ode.odeint(lambda t, y, a: -1.0 / (y - 0.5), np.array([1.0]),
                      np.array([0.0, 1.0]), max_steps=500)
    assert "at t = 0.125" in str(err.value) and "singular or not finite" in str(err.value)


def test_throw_false_returns_the_status():
    """The status instead of the error (past t = 0.3 the field is NaN: the
    step size collapses below its floor, ten spacings of floating-point
    numbers at t, as SciPy's)."""
    res = sd.ode.odeint(lambda t, y, a: snp.where(t > 0.3, np.nan, -y), np.array([1.0]),
                        np.array([0.0, 0.2, 1.0]), max_steps=300, throw=False)
    assert not res.success and res.status == 2 and 0 < res.steps <= 300
    np.testing.assert_allclose(float(res.ys[1, 0]), np.exp(-0.2), rtol=1e-6)


def test_the_derivative_of_a_failed_throw_false_solve_names_the_ode():
    def final(k):
        res = sd.ode.odeint(lambda t, y, k: snp.where(t > 0.3, np.nan, -k * y), np.array([1.0]),
                            np.array([0.0, 1.0]), k, max_steps=300, throw=False)
        return res.ys[-1, 0]

    with pytest.raises(ConvergenceError, match="cannot differentiate an ODE integration") as e:
        sd.grad(final)(1.0)
    assert str(e.value).startswith("ode.odeint: ")  # (it named optimize.root_guard)


def _nodes(graph):
    """Every node of `graph` and of the bodies its nodes hold."""
    for node in graph.nodes:
        yield node
        for v in node.params.values():
            if isinstance(v, sd.Graph):
                yield from _nodes(v)


@pytest.mark.slow
def test_reverse_mode_reruns_each_step_once_or_replays_with_checkpoints():
    """The gradient's graph. By default (the states at every step fit in 64
    MiB) the forward node records its state at every step (a sixth output),
    and the reverse pass re-runs each step once from it: a reverse scan over
    the output intervals of `while` loops down their steps, no replay of the
    solve. With `checkpoints` set, the solve is replayed (a scan over the
    output intervals of `while` loops of Runge-Kutta steps on the recorded
    grid) and its reverse pass is `while_adjoint` nodes storing that many
    states. Both give the same gradient, that of the computed solution."""
    graph = sd.trace(sd.grad(lambda th: loss(th, Y0, TS, checkpoints=3)), THETA)
    names = [n.primitive.name for n in _nodes(graph)]
    assert names.count("ode.odeint") == 1 and "while" in names and "scan" in names
    adj = [n for n in _nodes(graph) if n.primitive.name == "while_adjoint"]
    assert adj and all(n.params["snapshots"] == 3 and n.params["max_steps"] == 4096
                       for n in adj)
    graph = sd.trace(sd.grad(lambda th: loss(th, Y0, TS)), THETA)
    nodes = list(_nodes(graph))
    (ode,) = [n for n in nodes if n.primitive.name == "ode.odeint"]
    assert len(ode.outputs) == 6 and ode.outputs[5].type.shape == (4097, 2)
    names = [n.primitive.name for n in nodes]
    assert "while_adjoint" not in names and "while" in names and "scan" in names
    stored = np.asarray(sd.grad(lambda th: loss(th, Y0, TS))(THETA))
    replayed = np.asarray(sd.grad(lambda th: loss(th, Y0, TS, checkpoints=3))(THETA))
    np.testing.assert_allclose(stored, replayed, rtol=1e-11)


def test_a_solve_nothing_differentiates_records_no_steps():
    """`dce` (in every compiled program) sets `record=False` on a solve
    whose step grid and states nothing reads: its loop records no steps, and
    the node has three outputs."""
    graph = sd.trace(lambda th: loss(th, Y0, TS), THETA)
    fast = sd.graph.passes.optimize(graph)
    (node,) = [n for n in _nodes(fast) if n.primitive.name == "ode.odeint"]
    assert node.params["record"] is False and len(node.outputs) == 3
    assert float(sd.graph.evaluate(fast, THETA)[0]) == float(sd.graph.evaluate(graph, THETA)[0])


@pytest.mark.parametrize("solver", ["bdf", pytest.param("radau", marks=pytest.mark.slow),
                                    pytest.param("tsit5", marks=pytest.mark.slow)])
def test_a_solve_that_reports_where_it_stopped_records_no_states(solver):
    """`odeint(throw=False)` reads the step grid (the time it reached), not
    the states: `dce` sets `states=False`, and the node records its grid
    alone (five outputs), sparing the loop a `(max_steps + 1, n)` record
    (a third of the Brusselator's forward time at 1,024 states); and a
    reverse rule meeting such a node solves again, recording."""
    from sciad.graph._body import inline

    def run(th):
        res = sd.ode.odeint(lambda t, y, th: -th[:2] * y, Y0, TS, th, solver=solver, throw=False)
        return res.ys, res.t_reached

    graph = sd.trace(run, THETA)
    fast = sd.graph.passes.optimize(graph)
    (node,) = [n for n in _nodes(fast) if n.primitive.name == "ode.odeint"]
    assert node.params.get("states", True) is False and len(node.outputs) == 5
    for a, b in zip(sd.graph.evaluate(fast, THETA), sd.graph.evaluate(graph, THETA)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(
        np.asarray(sd.grad(lambda th: snp.sum(inline(fast, [th])[0] ** 2))(THETA)),
        np.asarray(sd.grad(lambda th: snp.sum(run(th)[0] ** 2))(THETA)), rtol=1e-12)


@pytest.mark.slow
def test_a_node_that_records_no_steps_still_differentiates():
    """The reverse rule meeting a `record=False` node solves again,
    recording."""
    from sciad.graph._body import inline

    fast = sd.graph.passes.optimize(sd.trace(lambda th: loss(th, Y0, TS), THETA))
    np.testing.assert_allclose(np.asarray(sd.grad(lambda th: inline(fast, [th])[0])(THETA)),
                               np.asarray(sd.grad(lambda th: loss(th, Y0, TS))(THETA)),
                               rtol=1e-12)


def test_a_param_the_field_does_not_differentiate_beside_one_it_does():
    """`args` with an int array, a float vector whose cotangent is a
    symbolic zero (read only through `stop_gradient`) and a scalar: each
    param's cotangent keeps its own size in the adjoint's flat accumulator
    (the stored-states adjoint once sized them out of order)."""
    def f(t, y, p):
        k, a, b = p
        return -b * y * snp.astype(k, y.dtype)[0] + snp.sum(sd.stop_gradient(a)) * 0.0

    ts = np.linspace(0.0, 1.0, 3)

    def loss(a, b):
        ys = sd.ode.odeint(f, np.array([1.0, 2.0]), ts, (np.array([1]), a, b), rtol=1e-10,
                           atol=1e-12)
        return snp.sum(ys ** 2)

    ga, gb = sd.grad(loss, argnums=(0, 1))(np.array([0.3, 0.4]), 0.5)
    np.testing.assert_array_equal(np.asarray(ga), np.zeros(2))
    want = np.sum(-2.0 * ts * 5.0 * np.exp(-2.0 * 0.5 * ts))  # y = y0 exp(-b t)
    np.testing.assert_allclose(float(gb), want, rtol=1e-8)


@pytest.mark.slow
def test_second_order_in_the_times_and_reverse_over_reverse():
    """`y(T) = y0 exp(-k T)`: the mixed derivative in `k` and the output time
    `T` (the reverse pass runs on the step grid, whose last point is `T`:
    it moves with it) and `d2/dk2` by reverse over reverse (the reverse
    pass reads the states at every step, which then get cotangents),
    against the closed forms."""
    def y_end(k, T):
        return sd.ode.odeint(lambda t, y, k: -k * y, np.array([1.5]), snp.stack([0.0, T]), k,
                             **TIGHT)[-1, 0]

    k, T = 0.7, 1.9
    e = 1.5 * np.exp(-k * T)
    mixed = sd.grad(lambda T: sd.grad(y_end)(k, T))(T)
    np.testing.assert_allclose(float(mixed), -e + k * T * e, rtol=1e-8)
    np.testing.assert_allclose(float(sd.grad(sd.grad(y_end))(k, T)), T * T * e, rtol=1e-8)


@pytest.mark.slow
def test_a_gradient_taken_inside_another_trace_of_a_constant_argument():
    """`sd.grad(g)(0.7)` inside a traced function: the arguments, constants
    in that trace, are lifted into it, so the node's VJP forms their
    cotangents (it forms only traced operands': it had given zero), for the
    parameters and the times (also tests/test_autodiff.py)."""
    def y_end(k, T):
        return sd.ode.odeint(lambda t, y, k: -k * y, np.array([1.5]), snp.stack([0.0, T]),
                             k, **TIGHT)[-1, 0]

    want = np.asarray(sd.grad(y_end, argnums=(0, 1))(0.7, 1.9))
    got = sd.function(lambda s: s * snp.stack(sd.grad(y_end, argnums=(0, 1))(0.7, 1.9)))(1.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    assert np.all(np.abs(want) > 0.1)


def test_the_steppers_and_adjoints_are_records():
    # each stepper's record agrees with its tableau (what the replay steps),
    # an IMEX one names an ESDIRK stepper of its order for the summed field,
    # and each adjoint strategy is registered under its own name
    from sciad.primitives._ode import OdeintOutputs, odeint_p
    from sciad.primitives._ode_adjoint import ADJOINTS
    from sciad.solvers.ode._ode_steppers import STEPPERS, tableau

    assert sd.ode.SOLVERS is STEPPERS and sd.ode.SOLVERS["kvaerno5"][:2] == ("Kvaerno5", True)
    for s in STEPPERS.values():
        if not s.replayable:  # (BDF, Radau: no tableau; their discrete adjoints their own)
            assert s.discrete and s.lowering in ("bdf", "radau")
            with pytest.raises(ValueError, match="no explicit or diagonally implicit"):
                tableau(s)
            continue
        c, As, b = tableau(s)
        assert len(As) == s.parts and all(A.shape == (len(b), len(b)) for A in As)
        assert s.implicit == bool(np.any(np.diag(As[-1]))) and c.shape == b.shape
        if s.imex:
            summed = STEPPERS[s.summed]
            assert summed.implicit and not summed.imex and summed.order == s.order
    assert all(a.name == name for name, a in ADJOINTS.items())
    # (both are families of the one solver registry, found as every record is)
    from sciad.solvers import lookup, names
    assert names("ode stepper") == tuple(STEPPERS) and names("ode adjoint") == tuple(ADJOINTS)
    assert lookup("kvaerno5", "ode stepper") is STEPPERS["kvaerno5"]
    assert lookup("checkpoint", "ode adjoint") is ADJOINTS["checkpoint"]
    # the node's outputs, by name: five with the step grid, six with the states
    g = sd.trace(lambda t, y: [-y], 0.0, np.ones(2))
    ops_ = (sd.TensorType((2,), np.float64), sd.TensorType((3,), np.float64))

    def outputs(**params):
        params = dict(body=g, rtol=1e-6, atol=1e-9, max_steps=16, **params)
        return OdeintOutputs.of(odeint_p.abstract_eval_rule(*ops_, **params), params)

    for adjoint, n in (("backsolve", 5), ("interpolated", 6)):
        outs = outputs(solver="tsit5", adjoint=adjoint)
        assert len(outs.present()) == n and outs.ys.shape == (3, 2)
    # and the work counted last, where asked for; BDF's states come with its
    # record of its steps (seven, eight counted), which its discrete
    # derivatives read, the continuous adjoint's forward mode too
    for adjoint in ("interpolated", "checkpoint"):
        outs = outputs(solver="bdf", adjoint=adjoint, count=True)
        assert len(outs.present()) == 8 and outs.work.shape == (3,)
        assert outs.states is not None and outs.history.shape == (17, 37)
    outs = outputs(solver="bdf", adjoint="backsolve")
    assert len(outs.present()) == 5
    # BDF's checkpointed adjoint replays the steps from its record, not its
    # states (six outputs); Radau's from its step grid (five)
    outs = outputs(solver="bdf", checkpoints=4)
    assert len(outs.present()) == 6 and outs.states is None and outs.history.shape == (17, 37)
    assert len(outputs(solver="radau", checkpoints=4).present()) == 5
