"""`sd.ode.solve_ivp` against `scipy.integrate.solve_ivp`, option by option
as SciPy documents them: the result's counters, status and message; a
zero-length span; `rtol`/`atol` arrays; `max_step`, `first_step`; methods
as SciPy's classes; `vectorized`; `jac` and `jac_sparsity`; complex `y0`;
SciPy's input errors; `dense_output` (`sol(t)`, its derivatives) and
`events` (every crossing, `terminal`, `direction`, a terminal event's
differentiated time); and the options refused by name."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.integrate as si

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, NotSupportedError, ShapeError

TIGHT = dict(rtol=1e-10, atol=1e-12)


def decay(t, y, k):  # y0 = [1, 0]: y = [exp(-k t), (1 - exp(-k t)) / k]
    return [-k * y[0], y[0]]


def both(**kw):
    """SciPy's result and sciad's for the same call."""
    kw = {"fun": decay, "t_span": (0.0, 2.0), "y0": [1.0, 0.0], "args": (0.5,), **kw}
    return si.solve_ivp(**kw), sd.ode.solve_ivp(**kw)


# ---------------------------------------------------------------------------
# the result


def test_status_message_and_counters_as_scipy():
    ref, res = both(t_eval=[1.0, 2.0])
    assert res.status == ref.status == 0 and res.success and ref.success
    assert res.message == ref.message
    assert res.sol is None and res.t_events is None and res.y_events is None
    # explicit: a count of stage evaluations, no Jacobians or factorizations
    assert isinstance(res.nfev, int) and res.nfev > 6 and res.njev == res.nlu == 0
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-3)


@pytest.mark.slow
def test_counters_of_an_implicit_method():
    ref, res = both(method="Radau")
    assert res.njev > 0 and res.nlu > 0 and ref.njev > 0 and res.status == ref.status == 0


def test_a_failure_reads_as_scipys():
    fun = lambda t, y: [y[0] ** 2]     # noqa: E731  (blows up at t = 1)
    res = sd.ode.solve_ivp(fun, (0.0, 10.0), [1.0])
    ref = si.solve_ivp(fun, (0.0, 10.0), [1.0])
    assert res.status == ref.status == -1 and not res.success
    # (SciPy's words, and the time reached)
    assert res.message.startswith("Required step size is less than spacing between numbers")
    assert ref.message.startswith("Required step size is less than spacing between numbers")


def test_zero_length_span_is_y0_at_t0():
    ref, res = both(t_span=(1.0, 1.0))
    assert res.status == ref.status == 0 and res.success
    np.testing.assert_array_equal(res.t, ref.t)
    np.testing.assert_array_equal(res.y, ref.y)
    ref, res = both(t_span=(1.0, 1.0), dense_output=True)
    np.testing.assert_array_equal(res.sol(1.0), ref.sol(1.0))


# ---------------------------------------------------------------------------
# tolerances and steps


@pytest.mark.slow
def test_atol_array_scales_the_error_test():
    # a tight atol on the second component only: its error follows it, as in SciPy
    kw = dict(t_span=(0.0, 2.0), t_eval=[2.0], rtol=1e-12)
    exact = (1 - np.exp(-1.0)) / 0.5
    for atol in ([1e-2, 1e-13], [1e-13, 1e-13]):
        ref, res = both(atol=atol, **kw)
        assert abs(res.y[1, -1] - exact) < 1e-9 and abs(ref.y[1, -1] - exact) < 1e-9
    # a small, fast second component: atol 1e-2 leaves it uncontrolled
    small = lambda t, y, k: [-k * y[0], 1e-6 * snp.sin(20 * t)]     # noqa: E731
    exact = 1e-6 * (1 - np.cos(40.0)) / 20
    errors = []
    for atol in (1e-2, [1e-2, 1e-14]):
        ref, res = both(fun=small, atol=atol, rtol=1e-2, t_eval=[2.0])
        errors.append((abs(res.y[1, -1] - exact), res.nfev, abs(ref.y[1, -1] - exact)))
    (loose, loose_nfev, _), (mixed, mixed_nfev, scipy_mixed) = errors
    # (rtol 1e-2 bounds it then: the tight atol is the fast component's control)
    assert mixed_nfev > 2 * loose_nfev and mixed < 0.2 * exact and scipy_mixed < 0.2 * exact


def test_rtol_array_is_met_by_its_smallest_element():
    ref, res = both(rtol=np.array([1e-8, 1e-8]), atol=1e-10, t_eval=[2.0])
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-6)
    # (odeint's error test has one rtol: the smallest, every component at
    # least as accurate as asked; SciPy accepts an array too)
    mixed = sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], args=(0.5,), rtol=[1e-3, 1e-8],
                             atol=1e-10, t_eval=[2.0])
    np.testing.assert_allclose(mixed.y, res.y, rtol=1e-12)
    with pytest.raises(ShapeError, match=r"`atol` must be a scalar or an array of shape \(2,\)"):
        sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], args=(0.5,), atol=[1e-3, 1e-8, 1.0])


@pytest.mark.slow
def test_max_step_bounds_the_steps():
    ref, res = both(max_step=0.02, t_eval=[2.0])
    # at least 100 steps of 6 new stages each (dopri5), as SciPy takes
    assert res.nfev >= 600 and ref.nfev >= 600
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-6)
    # odeint's dtmax
    ys = sd.ode.odeint(lambda t, y, k: -k * y, np.array([1.0]), np.array([0.0, 2.0]),
                       np.array(0.5), dtmax=0.02, throw=False)
    assert ys.steps >= 100
    with pytest.raises(InvalidOptionError, match="`max_step` must be positive"):
        sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], args=(0.5,), max_step=0.0)


def test_first_step():
    ref, res = both(first_step=1e-3, t_eval=[2.0])
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-3)
    with pytest.raises(InvalidOptionError, match="`first_step` must be positive"):
        sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], args=(0.5,), first_step=-1.0)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [si.RK45, si.RK23, si.DOP853, si.Radau, si.BDF])
def test_methods_as_scipys_classes(cls):
    ref, res = both(method=cls, t_eval=[1.0, 2.0], **TIGHT)
    ref_named = sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], method=cls.__name__,
                                 t_eval=[1.0, 2.0], args=(0.5,), **TIGHT)
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-7)
    np.testing.assert_array_equal(res.y, ref_named.y)


def test_lsoda_is_refused_with_what_to_use():
    # (it ran Kvaerno5 under LSODA's name, which switches between Adams and BDF)
    for method in ("LSODA", si.LSODA):
        with pytest.raises(NotSupportedError, match="method='BDF'.*'RK45'"):
            sd.ode.solve_ivp(decay, (0.0, 1.0), [1.0, 0.0], method=method, args=(0.5,))


def test_other_method_classes_are_refused_by_name():
    class Mine(si.OdeSolver):
        pass

    with pytest.raises(NotSupportedError, match=r"the method class .*Mine is not one of "
                                                r"SciPy's.*RK45"):
        sd.ode.solve_ivp(decay, (0.0, 1.0), [1.0, 0.0], method=Mine, args=(0.5,))


def test_vectorized_is_accepted():
    def fun(t, y, k):  # a vectorized field: y of shape (n,) or (n, m)
        return snp.stack([-k * y[0], y[0]])

    ref, res = both(fun=fun, vectorized=True, t_eval=[2.0])
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-3)


@pytest.mark.slow
def test_jac_array_callable_and_sparsity_for_the_implicit_methods():
    J = np.array([[-0.5, 0.0], [1.0, 0.0]])
    for kw in (dict(jac=J), dict(jac=lambda t, y, k: J), dict(jac_sparsity=J != 0)):
        for method in ("Radau", "BDF"):
            ref, res = both(method=method, t_eval=[2.0], **TIGHT, **kw)
            np.testing.assert_allclose(res.y, ref.y, rtol=1e-7)

def test_jac_of_a_wrong_shape_is_refused():
    kw = dict(fun=decay, t_span=(0.0, 2.0), y0=[1.0, 0.0], args=(0.5,), method="BDF")
    with pytest.raises(ShapeError, match=r"`jac` must have shape \(2, 2\)"):
        sd.ode.solve_ivp(jac=np.eye(3), **kw)
    with pytest.raises(ShapeError, match=r"`jac_sparsity` must have shape \(2, 2\)"):
        sd.ode.solve_ivp(jac_sparsity=np.eye(3), **kw)


def test_complex_y0():
    fun = lambda t, y: [-1j * y[0], 0.5j * y[1] - y[0]]     # noqa: E731
    kw = dict(t_eval=[0.5, 1.0], **TIGHT)
    res = sd.ode.solve_ivp(fun, (0.0, 1.0), [1.0 + 0j, 0.5j], **kw)
    ref = si.solve_ivp(fun, (0.0, 1.0), [1.0 + 0j, 0.5j], **kw)
    assert res.y.dtype == ref.y.dtype == np.complex128
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-8)
    np.testing.assert_allclose(res.y[0], np.exp(-1j * res.t), rtol=1e-8)


# ---------------------------------------------------------------------------
# SciPy's input errors and the refused options


@pytest.mark.parametrize("kw, err, match", [
    (dict(y0=[np.nan, 0.0]), ValueError, "All components of the initial state `y0` must be "
                                         "finite"),
    (dict(args=-1), TypeError, r"Supplied 'args' cannot be unpacked.*args=\(-1,\)"),
    (dict(min_step=0.1), NotSupportedError, "`min_step`"),
    (dict(lband=1), NotSupportedError, "`lband`.*jac_sparsity"),
    (dict(method="RK99"), InvalidOptionError, "unknown method 'RK99'"),
])
def test_errors_as_scipys(kw, err, match):
    call = {"fun": decay, "t_span": (0.0, 1.0), "y0": [1.0, 0.0], "args": (0.5,), **kw}
    with pytest.raises(err, match=match):
        sd.ode.solve_ivp(**call)
    if err in (ValueError, TypeError):   # SciPy's own exception type
        with pytest.raises(err):
            si.solve_ivp(**call)


# ---------------------------------------------------------------------------
# dense output


@pytest.mark.slow
def test_dense_output_sol_as_scipys():
    ref, res = both(dense_output=True, **TIGHT)
    t = np.array([0.1, 0.7, 1.3, 2.0])
    np.testing.assert_allclose(res.sol(t), ref.sol(t), rtol=1e-8)
    assert res.sol(0.7).shape == ref.sol(0.7).shape == (2,)
    assert res.sol(t).shape == (2, 4)
    np.testing.assert_array_equal(res.sol(0.0), [1.0, 0.0])
    assert (res.sol.t_min, res.sol.t_max) == (ref.sol.t_min, ref.sol.t_max) == (0.0, 2.0)
    with pytest.raises(ShapeError, match=r"`sol\(t\)` needs times from t_span\[0\]"):
        res.sol(-1.0)
    # backwards
    ref, res = both(t_span=(2.0, 0.0), dense_output=True, **TIGHT)
    np.testing.assert_allclose(res.sol(t[::-1] - 0.05), ref.sol(t[::-1] - 0.05), rtol=1e-8)


@pytest.mark.slow
def test_dense_output_is_differentiable():
    def at(k, y0, t):
        res = sd.ode.solve_ivp(decay, (0.0, 2.0), y0, args=(k,), dense_output=True, **TIGHT)
        return res.sol(t)

    k, y0 = np.array(0.5), np.array([1.0, 0.5])
    sd.testing.check_rules(at, k, y0, np.array(1.3), batch=False, second_order=False)
    g = sd.grad(lambda k: at(k, y0, 1.3)[0])(k)
    np.testing.assert_allclose(g, -1.3 * np.exp(-0.5 * 1.3), rtol=1e-7)
    # an array of traced times
    dt = sd.grad(lambda t: snp.sum(at(k, y0, t)[0]))(np.array([0.5, 1.5]))
    np.testing.assert_allclose(dt, -0.5 * np.exp(-0.5 * np.array([0.5, 1.5])), rtol=1e-7)


# ---------------------------------------------------------------------------
# events


def osc(t, y):  # y = [sin t, cos t]
    return [y[1], -y[0]]


@pytest.mark.slow
def test_events_every_crossing_with_direction_as_scipy():
    def zero(t, y):
        return y[0]

    def up(t, y):
        return y[0] - 0.5

    up.direction = 1

    def down(t, y):
        return y[0] - 0.5

    down.direction = -1
    kw = dict(fun=osc, t_span=(0.0, 10.0), y0=[0.0, 1.0], events=[zero, up, down], **TIGHT)
    ref, res = si.solve_ivp(**kw), sd.ode.solve_ivp(**kw)
    assert res.status == ref.status == 0
    for te, tr, ye, yr in zip(res.t_events, ref.t_events, res.y_events, ref.y_events):
        assert te.shape == tr.shape and ye.shape == yr.shape
        np.testing.assert_allclose(te, tr, rtol=1e-8)
        np.testing.assert_allclose(ye, yr, atol=1e-8)
    # (a zero at t0 followed by a crossing counts, as in SciPy)
    np.testing.assert_allclose(res.t_events[0], [0.0, np.pi, 2 * np.pi, 3 * np.pi],
                               rtol=1e-8)


@pytest.mark.slow
def test_terminal_event_stops_and_cuts_t_eval():
    def hit(t, y, k):
        return y[0] - 0.5

    hit.terminal = True
    ref, res = both(t_span=(0.0, 5.0), events=hit, t_eval=[1.0, 2.0, 3.0], **TIGHT)
    assert res.status == ref.status == 1 and res.message == ref.message and res.success
    np.testing.assert_allclose(res.t_events[0], [2 * np.log(2)], rtol=1e-9)
    np.testing.assert_allclose(res.t_events[0], ref.t_events[0], rtol=1e-9)
    np.testing.assert_array_equal(res.t, ref.t)                  # [1.0]: cut at 1.386
    np.testing.assert_allclose(res.y, ref.y, rtol=1e-8)
    ref, res = both(t_span=(0.0, 5.0), events=hit, **TIGHT)     # no t_eval: ends at it
    np.testing.assert_allclose(res.t[-1], ref.t[-1], rtol=1e-9)
    np.testing.assert_allclose(res.y[:, -1], ref.y[:, -1], rtol=1e-8)


@pytest.mark.slow
def test_terminal_count_and_backwards():
    def zero(t, y):
        return y[0]

    zero.terminal = 2   # SciPy: stop at the second crossing
    kw = dict(fun=osc, t_span=(0.0, 10.0), y0=[0.0, 1.0], events=zero, **TIGHT)
    ref, res = si.solve_ivp(**kw), sd.ode.solve_ivp(**kw)
    assert res.status == ref.status == 1
    np.testing.assert_allclose(res.t_events[0], ref.t_events[0], rtol=1e-8)
    np.testing.assert_allclose(res.t_events[0], [0.0, np.pi], rtol=1e-8)
    zero.terminal, zero.direction = False, 1
    kw.update(t_span=(10.0, 0.0), y0=[np.sin(10.0), np.cos(10.0)])
    ref, res = si.solve_ivp(**kw), sd.ode.solve_ivp(**kw)
    np.testing.assert_allclose(res.t_events[0], ref.t_events[0], rtol=1e-8)


def _low(t, y, k):
    return y[0] - 0.01   # (t* = ln(100) / k, past the first horizon)


def _half(t, y, k):
    return y[0] - 0.5


_low.terminal = True


@pytest.mark.slow  # (the first eager event solve compiles for seconds)
@pytest.mark.parametrize("t1, k, events", [(np.inf, 0.5, [_low]),
                                           (-np.inf, -0.5, [_half, _low])])
def test_a_span_without_end_stops_at_its_terminal_event(t1, k, events):
    """SciPy's `t_span = (t0, inf)` (and `-inf`): the integration runs until
    the terminal event; the events and the state there as SciPy's (a
    non-terminal one on the way too)."""
    kw = dict(fun=decay, t_span=(0.0, t1), y0=[1.0, 0.0], args=(k,), events=events,
              **TIGHT)
    ref, res = si.solve_ivp(**kw), sd.ode.solve_ivp(**kw)
    assert res.status == ref.status == 1 and res.message == ref.message
    for a, b in zip(res.t_events, ref.t_events):
        np.testing.assert_allclose(a, b, rtol=1e-8)
    np.testing.assert_allclose(res.t_events[-1], [np.log(100) / k], rtol=1e-8)
    np.testing.assert_allclose(res.y[:, -1], ref.y[:, -1], rtol=1e-8, atol=1e-10)
    assert res.t[-1] == res.t_events[-1][0]


def test_a_span_without_end_needs_a_terminal_event_and_an_eager_call():
    with pytest.raises(InvalidOptionError, match="needs a terminal event"):
        sd.ode.solve_ivp(decay, (0.0, np.inf), [1.0, 0.0], args=(0.5,), events=_half)
    with pytest.raises(NotSupportedError, match="the span must be finite"):
        sd.grad(lambda k: sd.ode.solve_ivp(decay, (0.0, np.inf), [1.0, 0.0], args=(k,),
                                           events=_low).t_events[0][0])(np.array(0.5))


@pytest.mark.slow
def test_terminal_event_time_is_differentiable():
    def hit(t, y, k):
        return y[0] - 0.5

    hit.terminal = True

    def t_star(k, y0):
        res = sd.ode.solve_ivp(decay, (0.0, 5.0), y0, args=(k,), events=hit, **TIGHT)
        return res.t_events[0][0] + 0.1 * res.y_events[0][0, 1]

    k, y0 = np.array(0.5), np.array([1.0, 0.0])
    g = sd.grad(lambda k: sd.ode.solve_ivp(decay, (0.0, 5.0), y0, args=(k,), events=hit,
                                           **TIGHT).t_events[0][0])(k)
    np.testing.assert_allclose(g, -np.log(2) / k ** 2, rtol=1e-7)    # t* = ln 2 / k
    sd.testing.check_rules(t_star, k, y0, batch=False, second_order=False)


def test_non_terminal_events_inside_a_transformation_are_refused():
    def zero(t, y, k):
        return y[0] - 0.5

    with pytest.raises(NotSupportedError, match="one terminal event"):
        sd.grad(lambda k: sd.ode.solve_ivp(decay, (0.0, 5.0), [1.0, 0.0], args=(k,),
                                           events=zero).y[0, -1])(np.array(0.5))


@pytest.mark.slow
def test_odeint_backwards_in_time():
    # strictly decreasing times integrate backwards, as solve_ivp's t1 < t0
    ts = np.array([2.0, 1.0, 0.0])
    ys = sd.ode.odeint(lambda t, y, k: -k * y + 0.1 * t, np.array([1.0]), ts, np.array(0.5),
                       **TIGHT)
    ref = si.solve_ivp(lambda t, y: -0.5 * y + 0.1 * t, (2.0, 0.0), [1.0], t_eval=ts, **TIGHT)
    np.testing.assert_allclose(np.asarray(ys)[:, 0], ref.y[0], rtol=1e-8)
    g = sd.grad(lambda k: sd.ode.odeint(lambda t, y, k: -k * y, np.array([1.0]), ts, k,
                                        **TIGHT)[-1, 0])(np.array(0.5))
    np.testing.assert_allclose(g, 2.0 * np.exp(0.5 * 2.0), rtol=1e-7)    # y = e^(k (2 - t))


def test_eager_call_again_is_not_compiled_again():
    # the same `fun`, called again eagerly with the same options: the compiled
    # program is found (a new closure per call compiled every time, 0.7-1.5 s)
    traced = []

    def lv(t, y, a, b, c, d):
        traced.append(1)  # (a sciad function runs in Python only when traced)
        return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]

    def call():
        return sd.ode.solve_ivp(lv, (0.0, 15.0), [10.0, 5.0], args=(1.5, 1.0, 3.0, 1.0),
                                rtol=1e-6)

    first = call()
    n = len(traced)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        again = call()
        times.append(time.perf_counter() - t)
    assert len(traced) == n  # not traced again
    assert min(times) <= 0.05  # SciPy's solve_ivp: 3.3-3.6 ms
    np.testing.assert_array_equal(again.y, first.y)


def lotka_volterra(t, y, a, b, c, d):
    return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]


def test_eager_solve_takes_the_steps_the_span_needs():
    # RK23 at rtol 1e-9 over [0, 20]: about 4,700 steps, past odeint's
    # default limit of 4,096 (it returned status -1 and y all inf)
    kw = dict(fun=lotka_volterra, t_span=(0.0, 20.0), y0=[10.0, 5.0], method="RK23",
              args=(1.5, 1.0, 3.0, 1.0), rtol=1e-9, atol=1e-9)
    res = sd.ode.solve_ivp(**kw)
    ref = si.solve_ivp(**{**kw, "method": "DOP853", "rtol": 1e-13, "atol": 1e-13})
    assert res.status == 0 and res.success and res.nfev > 3 * 4096
    np.testing.assert_allclose(res.y[:, -1], ref.y[:, -1], rtol=1e-5)


def test_a_blow_up_reports_the_time_reached_as_scipy():
    # y' = y^2 from 1: y = 1 / (1 - t) blows up at t = 1
    kw = dict(fun=lambda t, y: [y[0] ** 2], t_span=(0.0, 2.0), y0=[1.0])
    res, ref = sd.ode.solve_ivp(**kw), si.solve_ivp(**kw)
    assert res.status == ref.status == -1 and not res.success
    assert res.message.startswith(ref.message.rstrip("."))
    assert "at t = 0.9999" in res.message
    assert abs(res.t[-1] - ref.t[-1]) < 1e-3 and res.t[0] == 0.0
    assert np.all(np.isfinite(res.y)) and res.y[0, -1] > 1e10
    assert res.t_reached == res.t[-1]  # (and the end of the span on success: below)


def test_a_given_step_limit_is_named_with_the_time_reached():
    res = sd.ode.solve_ivp(lotka_volterra, (0.0, 20.0), [10.0, 5.0], args=(1.5, 1.0, 3.0, 1.0),
                           max_steps=20, t_eval=[1.0, 2.0, 19.0])
    assert res.status == -1 and "max_steps = 20" in res.message
    t_hit = float(res.message.split("at t = ")[1].split(";")[0])
    assert 2.0 < t_hit < 19.0
    np.testing.assert_array_equal(res.t, [1.0, 2.0])  # the output times reached
    assert np.all(np.isfinite(res.y))


def test_traced_solve_states_its_step_limit():
    # a traced y0: the limit is max_steps, which the message names
    said = []

    def final(y0):
        res = sd.ode.solve_ivp(decay, (0.0, 2.0), y0, args=(0.5,), rtol=1e-8, atol=1e-10)
        said.append(res.message)
        return res.y[0, -1]

    g = sd.grad(final)(np.array([1.0, 0.0]))
    np.testing.assert_allclose(g, [np.exp(-1.0), 0.0], atol=1e-7)
    assert "max_steps = 4096" in said[0]
    ok = sd.ode.solve_ivp(decay, (0.0, 2.0), [1.0, 0.0], args=(0.5,))
    assert ok.success and ok.t_reached == 2.0


def test_traced_failure_reports_the_time_reached_and_nan_past_it():
    # the blow-up of y' = y^2 at t = 1, traced: t_reached is where it
    # stopped, y is finite up to it and NaN past it (it was inf everywhere)
    def run(y0):
        res = sd.ode.solve_ivp(lambda t, y: [y[0] ** 2], (0.0, 2.0), y0,
                               t_eval=[0.5, 0.9, 1.5, 2.0])
        return res.y, res.t_reached, res.success

    y, reached, success = sd.function(run)(np.array([1.0]))
    assert not bool(success) and 0.9999 < float(reached) < 1.0
    np.testing.assert_allclose(np.asarray(y)[0, :2], [2.0, 10.0], rtol=1e-3)  # (rtol 1e-3)
    assert np.all(np.isnan(np.asarray(y)[0, 2:]))


def test_odeint_without_throw_gives_the_time_reached_both_ways():
    # y' = y^2: y = 1 / (1 - t) from 1 blows up at t = 1 (eager), and
    # -1 / (1 + t) from -1 at t = -1 backwards (traced)
    f = lambda t, y, a: y ** 2  # noqa: E731
    eager = sd.ode.odeint(f, np.array([1.0]), np.array([0.0, 0.5, 2.0]), throw=False)
    assert eager.status != 0 and abs(eager.t_reached - 1.0) < 1e-3
    assert eager.nfev > 0 and eager.njev == eager.nlu == 0  # (an explicit method)
    traced = float(sd.function(lambda y0: sd.ode.odeint(
        f, y0, np.array([0.0, -0.5, -2.0]), throw=False).t_reached)(np.array([-1.0])))
    assert abs(traced + 1.0) < 1e-3


def test_scipy_edge_cases_of_its_own_suite():
    # (from SciPy's test_ivp.py) an empty state over any span, an infinite one too
    for span in ((0.0, 10.0), (0.0, np.inf)):
        res = sd.ode.solve_ivp(lambda t, y: np.zeros((0,)), span, np.zeros((0,)),
                               dense_output=True)
        assert res.success and res.y.shape == (0, 2)
        np.testing.assert_array_equal(res.sol(10.0), np.zeros((0,)))
        np.testing.assert_array_equal(res.sol([1.0, 2.0, 3.0]), np.zeros((0, 3)))
    # a zero-length span's dense output is y0 at every time
    res = sd.ode.solve_ivp(lambda t, y: -y, [4.0, 4.0], [2.0, 3.0], dense_output=True)
    np.testing.assert_array_equal(res.sol(4.0), [2.0, 3.0])
    np.testing.assert_array_equal(res.sol([4.0, 5.0, 6.0]), [[2.0] * 3, [3.0] * 3])
    # a bad `terminal`: SciPy's ValueError (checked before anything runs)
    ev = lambda t, y: y[0] - 0.5  # noqa: E731
    for bad in (-1, 3.5):
        ev.terminal = bad
        with pytest.raises(ValueError, match="The `terminal` attribute"):
            sd.ode.solve_ivp(lambda t, y: [-y[0]], (0.0, 2.0), [1.0], events=ev)


@pytest.mark.slow
def test_scipy_event_edge_cases():
    # `terminal = None` is not terminal (SciPy's test_event_terminal_iv)
    ev = lambda t, y: y[0] - 0.5  # noqa: E731
    ev.terminal = None
    res = sd.ode.solve_ivp(lambda t, y: [-y[0]], (0.0, 2.0), [1.0], events=ev)
    assert res.status == 0 and res.t_events[0].shape == (1,)
    # an event that never occurs: y_events of shape (0,), as SciPy's
    never = lambda t, y: y[0] + 1.0  # noqa: E731
    res = sd.ode.solve_ivp(lambda t, y: [-y[0]], (0.0, 1.0), [1.0], events=never)
    ref = si.solve_ivp(lambda t, y: [-y[0]], (0.0, 1.0), [1.0], events=never)
    assert res.y_events[0].shape == ref.y_events[0].shape == (0,)


@pytest.mark.slow
def test_array_rtol_below_100_eps_warns_as_scipy():
    # (SciPy's test_array_rtol) met by its smallest element; one below 100
    # eps warns in SciPy's words and is raised
    with pytest.warns(UserWarning, match="At least one element of `rtol` is too small"):
        res = sd.ode.solve_ivp(lambda t, y: [y[0], y[1]], (0.0, 1.0), [1.0, 1.0],
                               rtol=[1e-1, 1e-16])
    loose = sd.ode.solve_ivp(lambda t, y: [y[0], y[1]], (0.0, 1.0), [1.0, 1.0], rtol=[1e-1, 1e-1])
    assert abs(res.y[0, -1] - np.e) < 1e-5 < abs(loose.y[0, -1] - np.e)  # (atol 1e-6 bounds it)


def test_dense_output_outlives_the_functions_it_was_given():
    # `sol` integrates again later: the field must still reach `fun` after
    # the caller dropped it (a lambda passed inline)
    import gc

    res = sd.ode.solve_ivp(lambda t, y: [-2.0 * y[0]], (0.0, 1.0), [1.0], dense_output=True,
                           rtol=1e-10, atol=1e-12)
    gc.collect()
    np.testing.assert_allclose(res.sol(0.5), [np.exp(-1.0)], rtol=1e-8)
