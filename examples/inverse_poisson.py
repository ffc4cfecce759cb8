"""Recover a conductivity field from noisy observations of a PDE's solution.

The forward model: `-div(exp(m) grad u) = f_s` on the unit square with
`u = 0` on the boundary, discretized with the 5-point finite-volume stencil
on an N x N grid of interior nodes, for a few source terms `f_s` at once
(one sparse matrix, several right-hand sides). The unknown is the
log-conductivity `m` at the nodes. Built-in data: a smooth background with a
bump and a more conductive square; the observations are the solutions plus
1% Gaussian noise.

The objective is the data misfit plus a Tikhonov (gradient) penalty. Its
gradient comes from sciad's implicit rule for the sparse solve: one
factorization of the stiffness matrix per evaluation, used by the forward
solves and by the transposed (here: the same, the matrix is tagged `spd`)
adjoint solves. L-BFGS-B minimizes it, one compiled value-and-gradient call
per iteration.

Run: `python examples/inverse_poisson.py` (64 x 64 grid, under a minute on
two cores); `--n 128` for a finer grid, `--plot out.png` for the figure
(needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

NOISE = 0.01
ALPHA = 1e-3  # Tikhonov weight on |grad m|^2


class Problem:
    """The grid, the static sparsity pattern and the sources for size `n`."""

    def __init__(self, n: int):
        self.n = n
        self.h = 1.0 / (n + 1)
        idx = np.arange(n * n).reshape(n, n)
        right_p, right_q = idx[:, :-1].ravel(), idx[:, 1:].ravel()  # horizontal faces
        down_p, down_q = idx[:-1, :].ravel(), idx[1:, :].ravel()  # vertical faces
        diag = idx.ravel()
        # COO coordinates, in the order `entries` below produces the values
        self.rows = np.concatenate([diag, right_p, right_q, down_p, down_q])
        self.cols = np.concatenate([diag, right_q, right_p, down_q, down_p])
        x = (np.arange(n) + 1) * self.h
        X, Y = np.meshgrid(x, x, indexing="xy")
        centers = [(0.25, 0.25), (0.75, 0.3), (0.3, 0.75), (0.7, 0.7)]
        self.sources = np.stack([np.exp(-((X - cx) ** 2 + (Y - cy) ** 2) / 0.02).ravel()
                                 for cx, cy in centers], axis=1)  # (n*n, 4)
        self.X, self.Y = X, Y

    def true_field(self) -> np.ndarray:
        X, Y = self.X, self.Y
        m = 0.3 * np.sin(2 * np.pi * X) * np.cos(np.pi * Y)
        m += 0.8 * np.exp(-((X - 0.35) ** 2 + (Y - 0.6) ** 2) / 0.01)
        m += 0.6 * ((np.abs(X - 0.7) < 0.12) & (np.abs(Y - 0.3) < 0.12))
        return m.ravel()


def entries(problem: Problem, m, xp=snp):
    """The stiffness matrix's stored values from the nodal log-conductivity:
    face conductivities are averages of the two nodes' (the node's own on the
    boundary faces). `xp` is the array namespace (`jax.numpy` works too: the
    benchmark's JAX peers use it)."""
    n, h2 = problem.n, problem.h ** 2
    k = xp.reshape(xp.exp(m), (n, n))
    kx = 0.5 * (k[:, :-1] + k[:, 1:])  # faces between horizontal neighbours
    ky = 0.5 * (k[:-1, :] + k[1:, :])
    left = xp.concatenate([k[:, :1], kx], axis=1)
    right = xp.concatenate([kx, k[:, -1:]], axis=1)
    up = xp.concatenate([k[:1, :], ky], axis=0)
    down = xp.concatenate([ky, k[-1:, :]], axis=0)
    diag = (left + right + up + down) / h2
    offx, offy = -xp.ravel(kx) / h2, -xp.ravel(ky) / h2
    return xp.concatenate([xp.ravel(diag), offx, offx, offy, offy])


def stiffness(problem: Problem, m):
    N = problem.n * problem.n
    return sd.sparse.coo_matrix((entries(problem, m), (problem.rows, problem.cols)),
                                shape=(N, N), tags={"spd"})


def forward(problem: Problem, m, solver: str = "auto"):
    """The solutions for every source: one matrix, four right-hand sides
    (`solver`: any of `sd.linalg.solve`'s, e.g. "cudss" on an NVIDIA GPU)."""
    return sd.linalg.solve(stiffness(problem, m), problem.sources, solver=solver)


def objective(m, data, sigma, problem: Problem, solver: str = "auto"):
    """Mean squared misfit in units of the noise, plus `ALPHA/2 |grad m|^2`
    (differences between neighbouring nodes)."""
    n = problem.n
    r = (forward(problem, m, solver) - data) / sigma
    mm = snp.reshape(m, (n, n))
    gx, gy = snp.diff(mm, axis=1), snp.diff(mm, axis=0)
    return 0.5 * snp.mean(r * r) + 0.5 * ALPHA * (snp.sum(gx * gx) + snp.sum(gy * gy))


def make_data(problem: Problem, seed: int = 0,
              solver: str = "auto") -> tuple[np.ndarray, float]:
    """The solutions for the true field plus Gaussian noise of 1% of their
    largest value, and that noise level."""
    u = np.asarray(sd.function(lambda m: forward(problem, m, solver))(problem.true_field()))
    sigma = NOISE * float(np.max(np.abs(u)))
    rng = np.random.default_rng(seed)
    return u + sigma * rng.standard_normal(u.shape), sigma


def main(n: int = 64, maxiter: int = 200, plot: str | None = None, verbose: bool = True,
         solver: str = "auto"):
    problem = Problem(n)
    data, sigma = make_data(problem, solver=solver)
    m_true = problem.true_field()
    m0 = np.zeros(n * n)
    say = print if verbose else (lambda *a, **k: None)
    say(f"inverse Poisson: {n} x {n} grid ({n * n} unknowns), {data.shape[1]} sources, "
        f"{problem.rows.size} stored entries, solver {solver!r}")

    f = lambda m: objective(m, data, sigma, problem, solver)  # noqa: E731
    rates = sd.testing.taylor_test(f, m0 + 0.1, np.random.default_rng(1).standard_normal(n * n))
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    history = []
    t0 = time.perf_counter()

    def progress(m):
        value = float(f_value(m))
        history.append(value)
        err = np.linalg.norm(m - m_true) / np.linalg.norm(m_true)
        say(f"  iter {len(history):3d}  objective {value:.6e}  |m - m_true|/|m_true| "
            f"{err:.4f}  ({time.perf_counter() - t0:.2f} s)")

    f_value = sd.function(f)
    res = sd.optimize.minimize(f, m0, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; "
        f"objective {res.fun:.6e}; relative error of m {err:.4f}; {res.message}")
    if plot:
        if _plot(problem, m_true, res.x, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, m_true


def _plot(problem: Problem, m_true, m_rec, history, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n = problem.n
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    vmin, vmax = float(np.min(m_true)), float(np.max(m_true))
    for ax, field, title in ((axes[0], m_true, "true log-conductivity"),
                             (axes[1], m_rec, "recovered")):
        im = ax.imshow(field.reshape(n, n), origin="lower", extent=(0, 1, 0, 1),
                       vmin=vmin, vmax=vmax, cmap="viridis")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    axes[2].semilogy(np.arange(1, len(history) + 1), history)
    axes[2].set_xlabel("L-BFGS iteration")
    axes[2].set_ylabel("objective")
    axes[2].set_title("misfit history")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=64, help="grid size per side (default 64)")
    p.add_argument("--maxiter", type=int, default=200, help="L-BFGS iterations (default 200)")
    p.add_argument("--plot", default="examples/inverse_poisson.png",
                   help="where to write the figure ('' for none)")
    p.add_argument("--solver", default="auto",
                   help="the sparse solver (default auto; cudss on an NVIDIA GPU)")
    args = p.parse_args()
    main(args.n, args.maxiter, args.plot or None, solver=args.solver)
