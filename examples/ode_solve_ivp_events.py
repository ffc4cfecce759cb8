"""SciPy's solve_ivp options on sciad: a projectile with drag, its dense
output and events, and the derivative of where it lands.

A ball is thrown at speed 20 m/s with quadratic drag; `sd.ode.solve_ivp`
integrates it as SciPy's would, with `dense_output=True` (the trajectory
`sol(t)` at any time) and two events: the apex (`vh = 0`, non-terminal)
and the landing (`h = 0` downwards, terminal: the integration stops
there, `status` 1). Inside `sd.grad` the landing is one terminal event,
whose time is differentiated by the implicit function theorem, so the
range's derivative in the launch angle comes out exactly (checked here
against central differences), and its zero (the best angle, below 45
degrees with drag) is found by Newton's method on it.

Run `python examples/ode_solve_ivp_events.py` (add `--plot out.png` for the
figure; needs matplotlib).
"""

from __future__ import annotations

import argparse

import numpy as np

import sciad as sd
import sciad.numpy as snp

SPEED, G, DRAG = 20.0, 9.81, 0.02
TIGHT = dict(rtol=1e-10, atol=1e-10)


def ball(t, y, drag):
    """`[x, h, vx, vh]'` with quadratic drag."""
    v = snp.sqrt(y[2] ** 2 + y[3] ** 2)
    return snp.stack([y[2], y[3], -drag * v * y[2], -G - drag * v * y[3]])


def apex(t, y, drag):
    return y[3]


def ground(t, y, drag):
    return y[1]


ground.terminal, ground.direction = True, -1


def launch(angle):
    return snp.stack([0.0, 0.0, SPEED * snp.cos(angle), SPEED * snp.sin(angle)])


def flight(angle: float):
    """SciPy's call: dense output, the apex and the landing."""
    return sd.ode.solve_ivp(ball, (0.0, 10.0), launch(angle), args=(DRAG,),
                            dense_output=True, events=[apex, ground], **TIGHT)


def range_of(angle):
    """Where the ball lands (differentiable: a terminal event)."""
    res = sd.ode.solve_ivp(ball, (0.0, 10.0), launch(angle), args=(DRAG,),
                           events=ground, **TIGHT)
    return res.y_events[0][0, 0]


def main(plot: str | None = None, verbose: bool = True) -> dict:
    say = print if verbose else (lambda *a: None)
    angle = np.deg2rad(40.0)
    res = flight(angle)
    t_land = float(res.t_events[1][0])
    say(f"status {res.status} ({res.message}); apex at t = {res.t_events[0][0]:.4f} s, "
        f"h = {res.y_events[0][0, 1]:.4f} m; lands at t = {t_land:.4f} s, "
        f"x = {res.y_events[1][0, 0]:.4f} m")
    dR = float(sd.grad(range_of)(np.array(angle)))
    eps = 1e-5
    fd = (float(range_of(angle + eps)) - float(range_of(angle - eps))) / (2 * eps)
    say(f"d range / d angle = {dR:.6f} m/rad (central differences {fd:.6f})")
    best = angle  # Newton on d range / d angle = 0
    d2 = sd.grad(sd.grad(range_of))
    for _ in range(4):
        best = best - float(sd.grad(range_of)(np.array(best))) / float(d2(np.array(best)))
    say(f"the longest throw: {np.rad2deg(best):.3f} degrees, {float(range_of(best)):.4f} m")
    out = dict(res=res, t_land=t_land, dR=dR, fd=fd, best=best)
    if plot:
        if _plot(out, plot):
            say(f"figure written to {plot}")
    return out


def _plot(out, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    res = out["res"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    t = np.linspace(0.0, out["t_land"], 200)
    y = res.sol(t)
    axes[0].plot(y[0], y[1], "-", label="sol(t), dense output")
    axes[0].plot(res.y_events[0][:, 0], res.y_events[0][:, 1], "o", label="apex event")
    axes[0].plot(res.y_events[1][:, 0], res.y_events[1][:, 1], "s",
                 label="landing (terminal event)")
    axes[0].set(xlabel="x (m)", ylabel="h (m)", title="a 40 degree throw with drag")
    axes[0].legend()
    angles = np.deg2rad(np.linspace(25.0, 55.0, 7))
    ranges = [float(range_of(a)) for a in angles]
    a0 = np.deg2rad(40.0)
    r0 = float(range_of(a0))
    axes[1].plot(np.rad2deg(angles), ranges, "o-", label="range (landing event)")
    da = np.deg2rad(np.array([-6.0, 6.0]))
    axes[1].plot(np.rad2deg(a0 + da), r0 + out["dR"] * da, "--",
                 label="tangent from sd.grad of the event")
    axes[1].axvline(np.rad2deg(out["best"]), color="gray", lw=0.8, label="best angle")
    axes[1].set(xlabel="launch angle (degrees)", ylabel="range (m)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plot", default=None, help="write the figure to this path")
    args = p.parse_args()
    main(args.plot)
