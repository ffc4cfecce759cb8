"""`sd.ode.odeint_event`: a terminal event's time and state against closed
forms, with the direction of the crossing; the event time's implicit
derivatives (first order in the initial state, the parameters and the
span's start, second order by forward over reverse and by reverse over
reverse) against closed forms; and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError, InvalidOptionError, ShapeError

TIGHT = dict(rtol=1e-10, atol=1e-12)


def ball(t, y, g):  # height and velocity under gravity g
    return snp.stack([y[1], -g])


def height(level):
    return lambda t, y, g: y[0] - level


# (the event time's value by default: in the implicit-function-theorem test)
@pytest.mark.slow
@pytest.mark.parametrize("direction", [-1, 0, 1])
def test_the_crossings_of_a_thrown_ball(direction):
    """Thrown up at 10 m/s: it passes 3 m going up at t_up and going down at
    t_down, `3 = 10 t - g t^2 / 2`; `direction` picks the crossing (either:
    the first)."""
    g = 9.81
    t_up, t_down = np.sort(np.roots([-g / 2, 10.0, -3.0]))
    for want in ([t_down] if direction == -1 else [t_up]):
        ev = sd.ode.odeint_event(ball, np.array([0.0, 10.0]), (0.0, 5.0), height(3.0), g,
                                 direction=direction, **TIGHT)
        np.testing.assert_allclose(float(ev.t), want, rtol=1e-10)
        np.testing.assert_allclose(np.asarray(ev.y), [3.0, 10.0 - g * want], rtol=1e-9,
                                   atol=1e-9)


def _decay(t, y, k):
    return -k * y


def _event(k, y0, t0):
    """`y' = -k y` from `y0` at `t0` reaches 0.25 at `t0 + log(y0 / 0.25) / k`."""
    return sd.ode.odeint_event(_decay, snp.reshape(y0, (1,)), (t0, t0 + 10.0),
                               lambda t, y, k: y[0] - 0.25, k, **TIGHT)


def _t(k, y0, t0):
    return _event(k, y0, t0).t


K, YS, T0 = 0.7, 1.3, 0.2
T_STAR = T0 + np.log(YS / 0.25) / K


@pytest.mark.slow
def test_the_event_time_differentiates_by_the_implicit_function_theorem():
    """The event time, and its gradient in `(k, y0, t0)` (the implicit
    function theorem on `phi(t) = event(t, y(t))`, through the ODE's
    adjoint) against the closed forms. (Slow: 16 s, `odeint_event` traces
    eight solves; the default run differentiates an event time through
    `solve_ivp` in `test_examples`' Taylor test of the thrown ball's range.)"""
    t, g = sd.value_and_grad(_t, argnums=(0, 1, 2))(K, YS, T0)  # (one program)
    np.testing.assert_allclose(float(t), T_STAR, rtol=1e-10)
    np.testing.assert_allclose([float(v) for v in g],
                               [-(T_STAR - T0) / K, 1.0 / (K * YS), 1.0], rtol=1e-8)


@pytest.mark.slow
def test_the_event_time_at_second_order_and_forward_mode():
    """Forward mode, second order in `k` (forward over reverse and reverse
    over reverse: through the root node's rules, the ODE's rules in its
    output times and its stored-states adjoint differentiated again), and
    the state at the event (0.25, without derivative)."""
    _, dt = sd.jvp(_t, (K, YS, T0), (1.0, 1.0, 0.0))
    np.testing.assert_allclose(float(dt), -(T_STAR - T0) / K + 1.0 / (K * YS), rtol=1e-8)
    second = 2.0 * (T_STAR - T0) / K ** 2
    t_of_k = lambda k: _t(k, YS, T0)  # noqa: E731
    np.testing.assert_allclose(float(sd.hvp(t_of_k, K, 1.0)), second, rtol=1e-8)
    np.testing.assert_allclose(float(sd.grad(sd.grad(t_of_k))(K)), second, rtol=1e-8)
    assert abs(float(sd.grad(lambda k: _event(k, YS, T0).y[0])(K))) < 1e-8


@pytest.mark.slow
def test_no_event_is_an_error():
    # (the program runs before it can tell: 10 s of compilation, `-m slow`)
    with pytest.raises(ConvergenceError, match=r"no event: .* downwards on \(0, 1\]"):
        sd.ode.odeint_event(ball, np.array([0.0, 10.0]), (0.0, 1.0), height(3.0), 9.81,
                            direction=-1)


def test_a_wrong_event_is_an_error():
    with pytest.raises(ShapeError, match="must return a real scalar"):
        sd.ode.odeint_event(ball, np.array([0.0, 10.0]), (0.0, 1.0), lambda t, y, g: y, 9.81)
    with pytest.raises(InvalidOptionError, match="`direction` must be -1, 0 or 1, got 2"):
        sd.ode.odeint_event(ball, np.array([0.0, 10.0]), (0.0, 1.0), height(3.0), 9.81,
                            direction=2)
