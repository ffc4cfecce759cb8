"""Recover a coefficient field of a nonlinear PDE from noisy observations.

The forward model: nonlinear diffusion

    -div(exp(m) (1 + u^2) grad u) = f    on the unit square, u = 0 on the boundary,

on an N x N grid of interior nodes (5-point finite-volume stencil, face
coefficients averaged from the nodes). The state `u` solves `F(u, m) = 0` by
Newton's method: `sd.optimize.root(F, 0, (m,))` is one node of the program,
its Jacobian's sparsity pattern detected from `F`'s graph (a 5-point stencil)
and its values computed by 7 colored JVPs, factored by SuperLU. The unknown
is the log-coefficient `m`; the built-in data are the state of a smooth
background with a bump and a low-diffusivity channel, plus 1% Gaussian noise.

The objective is the misfit plus a Tikhonov (gradient) penalty. Its gradient
comes from the implicit function theorem at the root: one transposed solve
with the Jacobian at the root (reading the last Newton factorization,
refined), never a differentiation through the Newton iterations. L-BFGS-B
minimizes it, one compiled value-and-gradient call per iteration.

Run: `python examples/nonlinear_inverse.py` (128 x 128 grid: 16,384 unknowns
and as many parameters, about a minute on two cores); `--n 64` for a quick
run, `--plot out.png` for the figure (needs matplotlib:
`pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

NOISE = 0.01
ALPHA = 1e-2  # Tikhonov weight on |grad m|^2 (the misfit then ends near the noise level)


class Problem:
    """The grid and the source for size `n`."""

    def __init__(self, n: int):
        self.n = n
        self.h = 1.0 / (n + 1)
        x = (np.arange(n) + 1) * self.h
        self.X, self.Y = np.meshgrid(x, x, indexing="xy")
        self.f = 20.0 + 40.0 * np.exp(-((self.X - 0.5) ** 2 + (self.Y - 0.5) ** 2) / 0.05)

    def true_field(self) -> np.ndarray:
        X, Y = self.X, self.Y
        m = 0.3 * np.cos(np.pi * X) * np.sin(2 * np.pi * Y)
        m += 0.7 * np.exp(-((X - 0.3) ** 2 + (Y - 0.65) ** 2) / 0.01)
        m -= 0.6 * (np.abs(Y - 0.3) < 0.07) * (np.abs(X - 0.55) < 0.3)
        return m.ravel()


def residual(u, m, problem: Problem):
    """`F(u, m)`: the discrete `-div(exp(m) (1 + u^2) grad u) - f`, flat."""
    n, h2 = problem.n, problem.h ** 2
    U = snp.pad(snp.reshape(u, (n, n)), 1)                  # zero boundary values
    K = snp.pad(snp.exp(snp.reshape(m, (n, n))), 1, mode="constant", constant_values=1.0)
    K = K * (1.0 + U ** 2)
    kx = 0.5 * (K[1:-1, 1:] + K[1:-1, :-1])                 # faces between x-neighbours
    ky = 0.5 * (K[1:, 1:-1] + K[:-1, 1:-1])
    fx = kx * (U[1:-1, 1:] - U[1:-1, :-1])
    fy = ky * (U[1:, 1:-1] - U[:-1, 1:-1])
    div = (fx[:, 1:] - fx[:, :-1] + fy[1:, :] - fy[:-1, :]) / h2
    return snp.reshape(-div - problem.f, (n * n,))


def state(m, problem: Problem):
    """The state `u(m)`: one `optimize.root` node (Newton, sparse Jacobian)."""
    n = problem.n
    return sd.optimize.root(residual, snp.zeros(n * n), (m, problem)).x


def objective(m, data, sigma, problem: Problem):
    """Mean squared misfit in units of the noise, plus `ALPHA/2 |grad m|^2`."""
    n = problem.n
    r = (state(m, problem) - data) / sigma
    mm = snp.reshape(m, (n, n))
    gx, gy = snp.diff(mm, axis=1), snp.diff(mm, axis=0)
    return 0.5 * snp.mean(r * r) + 0.5 * ALPHA * (snp.sum(gx * gx) + snp.sum(gy * gy))


def make_data(problem: Problem, seed: int = 0) -> tuple[np.ndarray, float]:
    """The state of the true field plus Gaussian noise of 1% of its largest
    value, and that noise level."""
    u = np.asarray(sd.function(lambda m: state(m, problem))(problem.true_field()))
    sigma = NOISE * float(np.max(np.abs(u)))
    rng = np.random.default_rng(seed)
    return u + sigma * rng.standard_normal(u.shape), sigma


def root_line(graph) -> str:
    """The printed `optimize.root` node of a graph (its first line)."""
    return next(line.strip() for line in str(graph).splitlines() if "optimize.root[" in line)


def main(n: int = 128, maxiter: int = 150, plot: str | None = None, verbose: bool = True):
    problem = Problem(n)
    data, sigma = make_data(problem)
    m_true = problem.true_field()
    m0 = np.zeros(n * n)
    say = print if verbose else (lambda *a, **k: None)
    f = lambda m: objective(m, data, sigma, problem)  # noqa: E731

    graph = sd.trace(f, m0)
    roots = [node for node in graph.nodes if node.primitive.name == "optimize.root"]
    say(f"nonlinear inverse problem: {n} x {n} grid ({n * n} unknowns and parameters)")
    say(f"the objective's graph holds {len(roots)} root node:\n  {root_line(graph)}")
    pattern = roots[0].params["pattern"]
    say(f"  detected Jacobian: {pattern.shape[0]} x {pattern.shape[1]}, {pattern.nnz} "
        f"entries ({pattern.nnz / pattern.shape[0]:.2f} per row), "
        f"{roots[0].params['colors']} colors")

    rates = sd.testing.taylor_test(f, m0 + 0.1, np.random.default_rng(1).standard_normal(n * n))
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    history = []
    t0 = time.perf_counter()
    f_value = sd.function(f)

    def progress(m):
        history.append(float(f_value(m)))
        if len(history) % 10 == 0 or len(history) == 1:
            err = np.linalg.norm(m - m_true) / np.linalg.norm(m_true)
            say(f"  iter {len(history):3d}  objective {history[-1]:.6e}  "
                f"|m - m_true|/|m_true| {err:.4f}  ({time.perf_counter() - t0:.1f} s)")

    res = sd.optimize.minimize(f, m0, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; "
        f"objective {res.fun:.6e}; relative error of m {err:.4f}")
    if plot:
        if _plot(problem, m_true, res.x, data, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, m_true, graph


def _plot(problem: Problem, m_true, m_rec, data, history, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n = problem.n
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    vmin, vmax = float(np.min(m_true)), float(np.max(m_true))
    panels = ((m_true, "true log-coefficient m", (vmin, vmax)),
              (m_rec, "recovered m", (vmin, vmax)),
              (data, "observed state u (1% noise)", (None, None)))
    for ax, (field, title, (lo, hi)) in zip(axes, panels):
        im = ax.imshow(np.reshape(field, (n, n)), origin="lower", extent=(0, 1, 0, 1),
                       vmin=lo, vmax=hi, cmap="viridis")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    axes[3].semilogy(np.arange(1, len(history) + 1), history)
    axes[3].set_xlabel("L-BFGS iteration")
    axes[3].set_ylabel("objective")
    axes[3].set_title("misfit history")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=128, help="grid size per side (default 128)")
    p.add_argument("--maxiter", type=int, default=150, help="L-BFGS iterations (default 150)")
    p.add_argument("--plot", default="examples/nonlinear_inverse.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.maxiter, args.plot or None)
