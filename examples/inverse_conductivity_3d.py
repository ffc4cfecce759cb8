"""Recover a 3-D conductivity field from observations of a PDE's solution.

The flagship problem (examples/inverse_poisson.py) in three dimensions:
`-div(exp(m) grad u) = f_s` on the unit cube with `u = 0` on the boundary,
discretized with the 7-point finite-volume stencil on an n x n x n grid of
interior nodes (face conductivities: arithmetic means of the two nodes'
`exp(m)`, the node's own on boundary faces), for four sources at once. The
unknown is the nodal log-conductivity `m` (n^3 values). Built-in data: a
smooth background with a conductive blob and a resistive box; the
observations are the solutions for it plus 1% Gaussian noise.

At this size a direct factorization fills in badly (a 3-D grid's separators
are n^2 nodes), so the forward and the adjoint solves are conjugate
gradients with an algebraic-multigrid preconditioner (`solver="cg",
preconditioner="amg"`; the hierarchy is built from the matrix's values once
per evaluation and reused by the adjoint solves) to a relative residual of
1e-10: a memory footprint of O(nnz) and an iteration count nearly
independent of n. The objective is the data misfit plus a small smoothness
penalty; L-BFGS-B minimizes it, one compiled value-and-gradient call per
iteration (`scipy.optimize.minimize` with the value and gradient from
`sd.value_and_grad`).

Run: `python examples/inverse_conductivity_3d.py` (64^3 = 262,144 unknowns);
`--n 100` for 10^6 unknowns (7 * 10^6 stored entries), `--n 24` for a quick
run; `--plot` writes examples/inverse_conductivity_3d.png (three orthogonal
slices of the true and the recovered field; needs matplotlib:
`pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.optimize

import sciad as sd
import sciad.numpy as snp

NOISE = 0.01
ALPHA = 1e-3  # weight of the smoothness penalty |grad m|^2 (differences of neighbours)
RTOL = 1e-10  # relative residual of every forward and adjoint solve
FIGURE = "examples/inverse_conductivity_3d.png"


class Problem:
    """The grid, the static 7-point sparsity pattern and the sources for size `n`
    (n^3 unknowns). The pattern is built with NumPy index arithmetic: no loop
    over cells (at n = 100 it has 6.94 * 10^6 entries)."""

    def __init__(self, n: int, sources: int = 4):
        self.n = n
        self.h = 1.0 / (n + 1)
        idx = np.arange(n ** 3, dtype=np.int32).reshape(n, n, n)
        faces = []  # (p, q): the two nodes of each interior face, along each axis
        for axis in range(3):
            lo = [slice(None)] * 3
            hi = [slice(None)] * 3
            lo[axis], hi[axis] = slice(None, -1), slice(1, None)
            faces.append((idx[tuple(lo)].ravel(), idx[tuple(hi)].ravel()))
        diag = idx.ravel()
        # COO coordinates, in the order `entries` produces the values
        self.rows = np.concatenate([diag] + [a for p, q in faces for a in (p, q)])
        self.cols = np.concatenate([diag] + [a for p, q in faces for a in (q, p)])
        x = (np.arange(n) + 1) * self.h
        self.X, self.Y, self.Z = np.meshgrid(x, x, x, indexing="ij")
        centers = [(0.25, 0.25, 0.3), (0.75, 0.3, 0.7), (0.3, 0.75, 0.6),
                   (0.7, 0.7, 0.3), (0.5, 0.5, 0.5), (0.25, 0.7, 0.25)][:sources]
        self.sources = np.stack([self._bump(c, 0.02).ravel() for c in centers], axis=1)

    def _bump(self, c, width):
        X, Y, Z = self.X, self.Y, self.Z
        return np.exp(-((X - c[0]) ** 2 + (Y - c[1]) ** 2 + (Z - c[2]) ** 2) / width)

    @property
    def unknowns(self) -> int:
        return self.n ** 3

    def true_field(self) -> np.ndarray:
        X, Y, Z = self.X, self.Y, self.Z
        m = 0.3 * np.sin(2 * np.pi * X) * np.cos(np.pi * Y) * np.cos(np.pi * (Z - 0.5))
        m += 0.8 * self._bump((0.35, 0.6, 0.55), 0.015)
        m -= 0.6 * ((np.abs(X - 0.7) < 0.12) & (np.abs(Y - 0.3) < 0.12)
                    & (np.abs(Z - 0.45) < 0.15))
        return m.ravel()


def entries(problem: Problem, m, xp=snp):
    """The stiffness matrix's stored values from the nodal log-conductivity, in
    the order of `problem.rows`/`problem.cols`: the diagonal, then each axis'
    faces (both off-diagonal entries). Whole-array operations only. `xp` is
    the array namespace (`jax.numpy` and `numpy` work too: bench/scalable.py's
    peers use them)."""
    n, h2 = problem.n, problem.h ** 2
    k = xp.reshape(xp.exp(m), (n, n, n))
    diag = 0.0
    offs = []
    for axis in range(3):
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(None, -1), slice(1, None)
        first = [slice(None)] * 3
        last = [slice(None)] * 3
        first[axis], last[axis] = slice(None, 1), slice(-1, None)
        kf = 0.5 * (k[tuple(lo)] + k[tuple(hi)])  # the interior faces along `axis`
        # each node's two faces along `axis`: a boundary face takes the node's own k
        diag = diag + xp.concatenate([k[tuple(first)], kf], axis=axis) \
            + xp.concatenate([kf, k[tuple(last)]], axis=axis)
        off = -xp.ravel(kf) / h2
        offs += [off, off]
    return xp.concatenate([xp.ravel(diag) / h2] + offs)


def stiffness(problem: Problem, m):
    N = problem.unknowns
    return sd.sparse.coo_matrix((entries(problem, m), (problem.rows, problem.cols)),
                                shape=(N, N), tags={"spd"})


def forward(problem: Problem, m, preconditioner: str = "amg"):
    """The solutions for every source: one matrix, several right-hand sides,
    AMG-preconditioned CG (`preconditioner="jacobi"` for the diagonal one)."""
    return sd.linalg.solve(stiffness(problem, m), problem.sources, solver="cg",
                           preconditioner=preconditioner, tol=RTOL)


def objective(m, data, sigma, problem: Problem, preconditioner: str = "amg"):
    """Mean squared misfit in units of the noise, plus `ALPHA/2 |grad m|^2`
    (differences between neighbouring nodes along each axis)."""
    n = problem.n
    r = (forward(problem, m, preconditioner) - data) / sigma
    mm = snp.reshape(m, (n, n, n))
    penalty = sum(snp.sum(d * d) for d in (snp.diff(mm, axis=a) for a in range(3)))
    return 0.5 * snp.mean(r * r) + 0.5 * ALPHA * penalty


def make_data(problem: Problem, noise: float = NOISE, seed: int = 0,
              preconditioner: str = "amg") -> tuple[np.ndarray, float]:
    """The solutions for the true field plus Gaussian noise of `noise` times
    their largest value, and the misfit's scale `sigma` (that noise level; the
    largest value times 0.01 when `noise` is 0)."""
    u = np.asarray(sd.function(lambda m: forward(problem, m, preconditioner))(
        problem.true_field()))
    scale = float(np.max(np.abs(u)))
    sigma = (noise or NOISE) * scale
    rng = np.random.default_rng(seed)
    return u + noise * scale * rng.standard_normal(u.shape), sigma


def main(n: int = 64, maxiter: int = 50, plot: str | None = None, verbose: bool = True,
         preconditioner: str = "amg", noise: float = NOISE, taylor: bool = True):
    """Runs the inversion on an n^3 grid: the Taylor test of the objective
    (printed and asserted), then L-BFGS-B from m = 0 for at most `maxiter`
    iterations; `plot`: where to write the figure (None: no figure). Returns
    SciPy's result, the Taylor rates (None with `taylor=False`), the objective
    after each iteration (the first entry at the start) and the true field."""
    t_start = time.perf_counter()
    problem = Problem(n)
    data, sigma = make_data(problem, noise, preconditioner=preconditioner)
    m_true = problem.true_field()
    N = problem.unknowns
    m0 = np.zeros(N)
    say = print if verbose else (lambda *a, **k: None)
    say(f"inverse conductivity 3-D: {n}^3 grid ({N} unknowns), {data.shape[1]} sources, "
        f"{problem.rows.size} stored entries; CG + {preconditioner} to rtol {RTOL:g} "
        f"(setup and data {time.perf_counter() - t_start:.1f} s)")

    f = lambda m: objective(m, data, sigma, problem, preconditioner)  # noqa: E731
    value_and_grad = sd.function(sd.value_and_grad(f))  # one compiled call per iteration

    def fun(m):
        value, g = value_and_grad(m)
        return float(value), np.asarray(g)

    rates = None
    if taylor:
        t0 = time.perf_counter()
        direction = np.random.default_rng(1).standard_normal(N)
        rates = sd.testing.taylor_test(f, m0 + 0.1, direction, grad=lambda m: fun(m)[1])
        say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)} "
            f"({time.perf_counter() - t0:.1f} s)")
        assert np.all(np.abs(rates - 2.0) < 0.2), f"Taylor test failed: rates {rates}"

    history = [fun(m0)[0]]
    t0 = time.perf_counter()

    def progress(intermediate_result):
        history.append(float(intermediate_result.fun))
        err = np.linalg.norm(intermediate_result.x - m_true) / np.linalg.norm(m_true)
        say(f"  iter {len(history) - 1:3d}  objective {history[-1]:.6e}  "
            f"|m - m_true|/|m_true| {err:.4f}  ({time.perf_counter() - t0:.1f} s)")

    res = scipy.optimize.minimize(fun, m0, jac=True, method="L-BFGS-B", callback=progress,
                                  options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; objective "
        f"{history[0]:.4e} -> {res.fun:.4e}; relative error of m {err:.4f}; {res.message}")
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
    c = n // 2
    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5),
                             gridspec_kw={"width_ratios": [1, 1, 1, 1.15]})
    vmin, vmax = float(np.min(m_true)), float(np.max(m_true))
    for row, (field, title) in enumerate(((m_true, "true"), (m_rec, "recovered"))):
        cube = field.reshape(n, n, n)  # axes (x, y, z)
        slices = ((cube[c, :, :].T, "x = 0.5", "y", "z"), (cube[:, c, :].T, "y = 0.5", "x", "z"),
                  (cube[:, :, c].T, "z = 0.5", "x", "y"))
        for col, (img, where, xl, yl) in enumerate(slices):
            ax = axes[row, col]
            im = ax.imshow(img, origin="lower", extent=(0, 1, 0, 1), vmin=vmin, vmax=vmax,
                           cmap="viridis")
            ax.set_title(f"{title} m, slice {where}")
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
        fig.colorbar(im, ax=axes[row, 2], shrink=0.8)
    axes[0, 3].semilogy(np.arange(len(history)), history)
    axes[0, 3].set_xlabel("L-BFGS iteration")
    axes[0, 3].set_ylabel("objective")
    axes[0, 3].set_title("misfit history")
    axes[1, 3].axis("off")
    fig.suptitle(f"3-D inverse conductivity, {n}^3 unknowns")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=64,
                   help="grid size per side (default 64; 100 for 10^6 unknowns)")
    p.add_argument("--maxiter", type=int, default=50, help="L-BFGS iterations (default 50)")
    p.add_argument("--noise", type=float, default=NOISE,
                   help="relative noise on the data (default 0.01)")
    p.add_argument("--preconditioner", default="amg", help="'amg' (default) or 'jacobi'")
    p.add_argument("--plot", action="store_true", help=f"write the figure to {FIGURE}")
    args = p.parse_args()
    main(args.n, args.maxiter, FIGURE if args.plot else None, noise=args.noise,
         preconditioner=args.preconditioner)
