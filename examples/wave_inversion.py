"""Full-waveform inversion in miniature: recover a velocity model from
recorded seismic traces.

The forward model: the 2-D acoustic wave equation `u_tt = c(x)^2 lap(u) + s`
on the unit square, second-order finite differences in space and time
(leapfrog), an absorbing sponge along the edges, on an n x n grid. A few
sources along the left edge fire a Ricker wavelet each (all shots run at
once: the wavefield has a leading shot axis); a line of receivers along the
right edge records the pressure at every step. Built-in data: a background
velocity of 1.5 with a fast disc (2.0) and a slow one (1.25) between the
sources and the receivers.

The time loop is one `sd.scan` node. Its gradient is a reverse scan; with
`checkpoints=s` (binomial checkpointing) reverse mode stores at most `s`
wavefields instead of one per step, for the same gradient: `sd.cost` prints
the gradient's memory both ways. `--budget 16MiB` says how much memory the
stored wavefields may take instead (`sd.MemoryBudget`): the schedule is
chosen from the wavefield's size; with `--disk DIR` as well, wavefields
that do not fit may go to disk (`sd.MemoryBudget(ram=..., disk=DIR)`). L-BFGS-B minimizes the misfit of the
traces plus a small smoothness penalty, one compiled value-and-gradient
call per evaluation, starting from the constant background.

Run: `python examples/wave_inversion.py` (128 x 128 grid, 1500 steps, four
shots; a few minutes on two cores); `--n 64 --steps 800` for a quick run,
`--plot out.png` for the figure (needs matplotlib: `pip install -e
".[plot]"`).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

C0 = 1.5  # background velocity
ALPHA = 1e-4  # smoothness weight on |grad m|^2


class Survey:
    """The grid, time step, sources, receivers and absorbing taper."""

    def __init__(self, n: int = 128, steps: int = 1500, shots: int = 4, f0: float | None = None):
        self.n, self.steps, self.shots = n, steps, shots
        self.h = 1.0 / (n - 1)
        self.sponge = sp = max(6, n // 10)  # the absorbing layer, in grid points
        self.dt = 0.3 * self.h / 2.0  # CFL number 0.3 at the fastest velocity
        # the peak frequency keeps about 12 points per wavelength at c0
        self.f0 = f0 or C0 / (12 * self.h * 2.5)
        t = np.arange(steps) * self.dt
        t0 = 1.2 / self.f0
        a = (np.pi * self.f0 * (t - t0)) ** 2
        self.wavelet = (1 - 2 * a) * np.exp(-a)  # Ricker
        rows = np.linspace(sp + 4, n - sp - 5, shots).round().astype(int)
        self.src = np.zeros((shots, n, n))
        self.src[np.arange(shots), rows, sp + 3] = 1.0 / self.h ** 2
        self.rec_col = n - sp - 4  # a line of receivers, every other row
        d = np.minimum(np.arange(n), np.arange(n)[::-1])
        ramp = np.exp(-(0.6 * np.maximum(sp - d, 0) / sp) ** 2)
        self.taper = np.outer(ramp, ramp)
        x = np.linspace(0.0, 1.0, n)
        self.X, self.Y = np.meshgrid(x, x, indexing="xy")

    def true_velocity(self) -> np.ndarray:
        c = np.full((self.n, self.n), C0)
        c[(self.X - 0.42) ** 2 + (self.Y - 0.38) ** 2 < 0.11 ** 2] = 2.0
        c[(self.X - 0.58) ** 2 + (self.Y - 0.66) ** 2 < 0.09 ** 2] = 1.25
        return c


def simulate(survey: Survey, c2, checkpoints=None):
    """The traces `(steps, shots, receivers)` for squared velocity `c2`."""
    s, h2, dt2 = survey, survey.h ** 2, survey.dt ** 2
    shape = (s.shots, s.n, s.n)

    def step(carry, w):
        u_prev, u = carry
        lap = (snp.roll(u, 1, axis=1) + snp.roll(u, -1, axis=1) + snp.roll(u, 1, axis=2)
               + snp.roll(u, -1, axis=2) - 4.0 * u) / h2
        u_next = (2.0 * u - u_prev + dt2 * c2 * lap + dt2 * w * s.src) * s.taper
        return (u * s.taper, u_next), u_next[:, ::2, s.rec_col]

    init = (snp.zeros(shape), snp.zeros(shape))
    _, traces = sd.scan(step, init, s.wavelet, checkpoints=checkpoints)
    return traces


def velocity(survey: Survey, m):
    """The squared velocity for the model `m`: relative perturbations of c0^2."""
    return C0 ** 2 * (1.0 + snp.reshape(m, (survey.n, survey.n)))


def objective(m, data, survey: Survey, checkpoints=None):
    """Half the squared trace misfit (relative to the data's energy) plus
    `ALPHA/2 |grad m|^2`."""
    r = simulate(survey, velocity(survey, m), checkpoints) - data
    mm = snp.reshape(m, (survey.n, survey.n))
    gx, gy = snp.diff(mm, axis=1), snp.diff(mm, axis=0)
    scale = 1.0 / float(np.sum(data ** 2))
    return 0.5 * scale * snp.sum(r * r) + 0.5 * ALPHA * (snp.sum(gx * gx) + snp.sum(gy * gy))


def default_checkpoints(steps: int) -> int:
    """About 2 log2(steps) stored wavefields: a few recomputations per step."""
    return max(2, 2 * math.ceil(math.log2(max(steps, 2))))


def main(n: int = 128, steps: int = 1500, shots: int = 4, maxiter: int = 25,
         checkpoints: int | None = -1, plot: str | None = None, verbose: bool = True,
         budget: str | None = None, disk: str | None = None):
    """`budget` (bytes, or a string such as "16MiB"): the memory reverse mode's
    stored wavefields may take (`sd.MemoryBudget`), instead of `checkpoints`;
    `disk`: a directory where the wavefields that do not fit may go."""
    say = print if verbose else (lambda *a, **k: None)
    survey = Survey(n, steps, shots)
    if budget is not None:
        checkpoints = sd.MemoryBudget(ram=budget, disk=disk)
    elif checkpoints == -1:
        checkpoints = default_checkpoints(steps)
    c_true = survey.true_velocity()
    m_true = (c_true ** 2 / C0 ** 2 - 1.0).ravel()
    data = np.asarray(sd.function(lambda m: simulate(survey, velocity(survey, m)))(m_true))
    say(f"wave inversion: {n} x {n} grid, {steps} steps, {shots} shots, "
        f"{data.shape[2]} receivers; checkpoints={checkpoints}")

    f = lambda m: objective(m, data, survey, checkpoints)  # noqa: E731
    m0 = np.zeros(n * n)
    shown = f"binomial({checkpoints})" if isinstance(checkpoints, int) else \
        f"a {budget} budget" + (f" and disk ({disk})" if disk else "")
    for label, ck in (("every step stored", None), (shown, checkpoints)):
        if ck is None or checkpoints is not None:
            rep = sd.cost(lambda m, ck=ck: objective(m, data, survey, ck), m0)
            say(f"gradient memory, {label}: peak {rep.grad_peak / 2 ** 20:.1f} MiB "
                f"({rep.saved / 2 ** 20:.1f} MiB saved for the backward pass), "
                f"{rep.grad_flops / 1e9:.2f} GFLOP")

    direction = np.random.default_rng(1).standard_normal(n * n) * 0.05
    rates = sd.testing.taylor_test(f, m0 + 0.02, direction)
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    history = []
    t0 = time.perf_counter()
    f_value = sd.function(f)

    def progress(m):
        value = float(f_value(m))
        history.append(value)
        err = np.linalg.norm(m - m_true) / np.linalg.norm(m_true)
        say(f"  iter {len(history):3d}  objective {value:.4e}  |m - m_true|/|m_true| "
            f"{err:.4f}  ({time.perf_counter() - t0:.1f} s)")

    res = sd.optimize.minimize(f, m0, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; objective "
        f"{res.fun:.4e} (from {float(f_value(m0)):.4e}); relative error of m {err:.4f}")
    if plot:
        if _plot(survey, data, m_true, res.x, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, m_true


def _plot(survey: Survey, data, m_true, m_rec, history, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n = survey.n
    pred = np.asarray(sd.function(lambda m: simulate(survey, velocity(survey, m)))(m_rec))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    c_true = C0 * np.sqrt(1 + m_true.reshape(n, n))
    c_rec = C0 * np.sqrt(np.maximum(1 + m_rec.reshape(n, n), 0))
    for ax, field, title in ((axes[0], c_true, "true velocity"),
                             (axes[1], c_rec, "recovered velocity")):
        im = ax.imshow(field, origin="lower", extent=(0, 1, 0, 1), vmin=1.2, vmax=2.0,
                       cmap="viridis")
        ax.plot([survey.X[0, survey.rec_col]] * 2, [0.1, 0.9], "w--", lw=0.8)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    shot = survey.shots // 2
    t = np.arange(survey.steps) * survey.dt
    for k in range(0, data.shape[2], max(1, data.shape[2] // 8)):
        off = k / data.shape[2] * 2.0
        scale = 1.0 / (np.max(np.abs(data[:, shot])) + 1e-30)
        axes[2].plot(t, off + scale * data[:, shot, k], "k", lw=0.8)
        axes[2].plot(t, off + scale * pred[:, shot, k], "r--", lw=0.8)
    axes[2].set_title(f"traces, shot {shot} (black: data, red: recovered)")
    axes[2].set_xlabel("time")
    axes[3].semilogy(np.arange(1, len(history) + 1), history)
    axes[3].set_xlabel("L-BFGS iteration")
    axes[3].set_title("objective")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=128, help="grid size per side (default 128)")
    p.add_argument("--steps", type=int, default=1500, help="time steps (default 1500)")
    p.add_argument("--shots", type=int, default=4, help="sources (default 4)")
    p.add_argument("--maxiter", type=int, default=25, help="L-BFGS iterations (default 25)")
    p.add_argument("--checkpoints", type=int, default=-1,
                   help="stored wavefields in reverse mode (default about 2 log2(steps); "
                        "0 stores every step)")
    p.add_argument("--budget", default=None,
                   help="the memory reverse mode's stored wavefields may take, e.g. 16MiB "
                        "(sd.MemoryBudget; instead of --checkpoints)")
    p.add_argument("--disk", default=None,
                   help="with --budget: a directory where the wavefields that do not fit "
                        "may go")
    p.add_argument("--plot", default="examples/wave_inversion.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.steps, args.shots, args.maxiter,
         None if args.checkpoints == 0 else args.checkpoints, args.plot or None,
         budget=args.budget, disk=args.disk)
