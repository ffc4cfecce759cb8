"""Recover the initial temperature of a periodic 2D heat equation from a
noisy, blurred picture of its final state.

The forward model: `u_t = kappa (u_xx + u_yy)` on the periodic unit square,
advanced spectrally on an N x N grid: each of `steps` time steps is
`u <- irfft2(exp(-kappa |k|^2 dt) * rfft2(u))`, the exact propagator of every
Fourier mode. The observation is the final state blurred by a Gaussian point
spread function (a convolution, also applied by FFT) plus 1% Gaussian noise.
Built-in data: two warm blobs, a cold ring and a hot square.

The objective is the mean squared misfit in units of the noise plus a
Tikhonov penalty, `ALPHA/2` times the mean of `|grad u0|^2` (periodic
differences). Its gradient comes from the
transposes of sciad's FFT primitives: the adjoint of each step is the same
spectral multiplier applied by the adjoint transforms, with no tape of the
`steps` intermediate fields beyond what reverse mode saves. L-BFGS-B
minimizes it, one compiled value-and-gradient call per iteration.

Every operator here is diagonal in Fourier space, so the minimizer has a
closed form: `u0_hat = a d_hat / (a^2 + ALPHA sigma^2 lambda)` with `a` the
symbol of blur-after-propagation and `lambda` the symbol of the periodic
difference Laplacian. The example computes it with `numpy.fft` and reports
how far L-BFGS got from it: an end-to-end check of the gradients.

Run: `python examples/spectral_inverse_heat.py` (128 x 128 grid, a few seconds
on two cores); `--n 256` for a finer grid; `--plot out.png` for the figure
(needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

KAPPA = 1e-3     # diffusivity; final time T = 1
STEPS = 10       # spectral time steps
BLUR = 0.015     # the point spread function's standard deviation (the square is 1 x 1)
NOISE = 0.01     # noise level, relative to the largest observed value
ALPHA = 1.6e-3   # Tikhonov weight on the mean of |grad u0|^2 (in units of the noise)


class Problem:
    """The grid and the spectral symbols for an `n x n` grid."""

    def __init__(self, n: int, steps: int = STEPS):
        self.n, self.steps, self.h = n, steps, 1.0 / n
        kx = 2 * np.pi * np.fft.fftfreq(n, self.h)[:, None]       # along axis 0
        ky = 2 * np.pi * np.fft.rfftfreq(n, self.h)[None, :]      # the half axis
        # one time step's propagator and the blur, on the rfft2 half spectrum
        self.step_symbol = np.exp(-KAPPA * (kx ** 2 + ky ** 2) / steps)
        self.blur_symbol = np.exp(-0.5 * BLUR ** 2 * (kx ** 2 + ky ** 2))
        x = (np.arange(n) + 0.5) * self.h
        self.X, self.Y = np.meshgrid(x, x, indexing="ij")

    def true_field(self) -> np.ndarray:
        X, Y = self.X, self.Y
        u = np.exp(-((X - 0.3) ** 2 + (Y - 0.3) ** 2) / 0.004)
        u += 0.7 * np.exp(-((X - 0.75) ** 2 + (Y - 0.4) ** 2) / 0.01)
        r = np.sqrt((X - 0.35) ** 2 + (Y - 0.72) ** 2)
        u -= 0.6 * np.exp(-((r - 0.13) ** 2) / 0.0008)
        u += 0.8 * ((np.abs(X - 0.72) < 0.1) & (np.abs(Y - 0.75) < 0.1))
        return u


def forward(problem: Problem, u0, xp=snp):
    """The blurred final state: `steps` spectral heat steps, then the blur.
    `xp` is the array namespace (`jax.numpy` works too: the benchmark's JAX
    peer uses it); `xp.fft` is `sciad.fft` or `jax.numpy.fft`."""
    shape = (problem.n, problem.n)
    u = u0
    for _ in range(problem.steps):
        u = xp.fft.irfft2(xp.fft.rfft2(u) * problem.step_symbol, s=shape)
    return xp.fft.irfft2(xp.fft.rfft2(u) * problem.blur_symbol, s=shape)


def objective(u0, data, sigma, problem: Problem, xp=snp):
    """Mean squared misfit in units of the noise plus `ALPHA/2` times the mean
    of `|grad u0|^2` (periodic forward differences): both are averages over
    the grid, so the problem is the same at every resolution."""
    r = (forward(problem, u0, xp) - data) / sigma
    gx = (xp.roll(u0, -1, axis=0) - u0) / problem.h
    gy = (xp.roll(u0, -1, axis=1) - u0) / problem.h
    return 0.5 * xp.mean(r * r) + 0.5 * ALPHA * xp.mean(gx * gx + gy * gy)


def make_data(problem: Problem, seed: int = 0) -> tuple[np.ndarray, float]:
    """The blurred final state of the true field plus Gaussian noise of 1% of
    its largest value, and that noise level."""
    clean = np.asarray(sd.function(lambda u: forward(problem, u))(problem.true_field()))
    sigma = NOISE * float(np.max(np.abs(clean)))
    rng = np.random.default_rng(seed)
    return clean + sigma * rng.standard_normal(clean.shape), sigma


def closed_form(problem: Problem, data: np.ndarray, sigma: float) -> np.ndarray:
    """The exact minimizer of `objective`, diagonal in Fourier space (numpy.fft).

    With `M = n^2` pixels the objective is `(|A u - d|^2 / sigma^2 +
    ALPHA |D u|^2) / (2 M)`, so `(A^T A + ALPHA sigma^2 D^T D) u = A^T d`, with
    real symbols `a` (blur times propagator) and `lambda` (the difference
    Laplacian's `4 sin^2(theta/2) / h^2` per axis)."""
    n, h = problem.n, problem.h
    a = problem.blur_symbol * problem.step_symbol ** problem.steps
    tx = 2 * np.pi * np.fft.fftfreq(n)[:, None]
    ty = 2 * np.pi * np.fft.rfftfreq(n)[None, :]
    lam = (4 * np.sin(tx / 2) ** 2 + 4 * np.sin(ty / 2) ** 2) / h ** 2
    d_hat = np.fft.rfft2(data)
    u_hat = a * d_hat / (a ** 2 + ALPHA * sigma ** 2 * lam)
    return np.fft.irfft2(u_hat, s=(n, n))


def main(n: int = 128, maxiter: int = 500, plot: str | None = None, verbose: bool = True):
    problem = Problem(n)
    data, sigma = make_data(problem)
    u_true = problem.true_field()
    u0 = np.zeros((n, n))
    say = print if verbose else (lambda *a, **k: None)
    say(f"spectral inverse heat: {n} x {n} periodic grid, {problem.steps} spectral steps "
        f"(kappa T = {KAPPA:g}), blur {BLUR:g}, noise {NOISE:.0%}")

    f = lambda u: objective(u, data, sigma, problem)  # noqa: E731
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), u0))
    kinds = sorted({node.params["kind"] for node in g.nodes if node.primitive.name == "fft"})
    n_fft = sum(node.primitive.name == "fft" for node in g.nodes)
    say(f"value-and-gradient graph: {len(g.nodes)} nodes, {n_fft} FFTs ({', '.join(kinds)})")
    rng = np.random.default_rng(1)
    rates = sd.testing.taylor_test(f, u0 + 0.1 * rng.standard_normal((n, n)),
                                   rng.standard_normal((n, n)))
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    history = []
    t0 = time.perf_counter()
    f_value = sd.function(f)

    def progress(u):
        history.append(float(f_value(u)))
        if verbose and (len(history) % 25 == 0 or len(history) == 1):
            err = np.linalg.norm(u - u_true) / np.linalg.norm(u_true)
            say(f"  iter {len(history):3d}  objective {history[-1]:.6e}  "
                f"|u0 - u_true|/|u_true| {err:.4f}  ({time.perf_counter() - t0:.2f} s)")

    res = sd.optimize.minimize(f, u0, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter, "ftol": 1e-15, "gtol": 1e-10})
    elapsed = time.perf_counter() - t0
    u_rec = np.asarray(res.x)
    exact = closed_form(problem, data, sigma)
    err = np.linalg.norm(u_rec - u_true) / np.linalg.norm(u_true)
    gap = np.linalg.norm(u_rec - exact) / np.linalg.norm(exact)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; "
        f"objective {res.fun:.6e}; relative error of u0 {err:.4f}")
    say(f"distance to the closed-form Tikhonov minimizer: {gap:.2e} (relative)")
    if plot:
        if _plot(u_true, data, u_rec, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, u_true, exact


def _plot(u_true, data, u_rec, history, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    vmin, vmax = float(np.min(u_true)), float(np.max(u_true))
    for ax, field, title in ((axes[0], u_true, "true initial temperature"),
                             (axes[1], data, "observed: blurred final state + noise"),
                             (axes[2], u_rec, "recovered initial temperature")):
        im = ax.imshow(field.T, origin="lower", extent=(0, 1, 0, 1), cmap="inferno",
                       vmin=vmin if field is not data else None,
                       vmax=vmax if field is not data else None)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    axes[3].semilogy(np.arange(1, len(history) + 1), history)
    axes[3].set_xlabel("L-BFGS iteration")
    axes[3].set_ylabel("objective")
    axes[3].set_title("objective history")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=128, help="grid size per side (default 128)")
    p.add_argument("--maxiter", type=int, default=500, help="L-BFGS iterations (default 500)")
    p.add_argument("--plot", default="examples/spectral_inverse_heat.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.maxiter, args.plot or None)
