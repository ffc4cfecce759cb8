"""Eigenvalue design: distribute a membrane's mass to raise its fundamental
frequency, then to open a gap above it, through a sparse eigensolver's
derivatives.

The model: a square membrane, clamped on its boundary, with mass density
`rho` at the nodes of an N x N grid of interior points (N = 100 by default:
10^4 unknowns). Its vibration modes solve the generalized eigenproblem

    K v = lambda M v,    K: the 5-point Laplacian (stiffness), M = diag(rho)

and the frequencies are `sqrt(lambda)`. The design is `theta`, one value per
node, with `rho = exp(theta) / mean(exp(theta))`: the mass budget (the mean
density is 1) holds exactly for every design, and `theta` in [-1.5, 1.5]
bounds the contrast. `sd.linalg.eigsh(K, k, M=M, sigma=0)` computes the few
lowest modes (ARPACK, shift-invert, on the host); its derivative
`dlambda = -lambda v^T dM v` costs a product, not a solve.

Two designs:

1. Maximize the fundamental `lambda_1` (a simple eigenvalue): mass moves
   towards the clamped edge, where the mode does not move it.
2. Maximize `(lambda_2 + lambda_3) / (2 lambda_1)`, the gap between the
   fundamental and the next pair. On the uniform square `lambda_2 = lambda_3`
   exactly (modes (1, 2) and (2, 1)), and every design with the square's
   symmetry keeps them equal: `lambda_2` alone has no derivative there
   (sciad refuses it with `DegenerateEigenvalueError`), their sum does, and
   it is what this objective uses.

Each objective passes a Taylor test, the second at the degenerate uniform
design itself. L-BFGS-B (bounds on `theta`) minimizes, one compiled
value-and-gradient call per iteration.

Run: `python examples/eigen_design.py` (100 x 100 grid, about a minute on
two cores); `--n 48` for a quick one; `--plot out.png` for the figure of the
designs and their modes (needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

ALPHA = 1e-4      # weight of the smoothness penalty on |grad theta|^2
BOUND = 1.5       # |theta| <= BOUND: density contrast at most e^3


class Membrane:
    """The grid, the stiffness matrix (fixed) and the mass matrix's pattern."""

    def __init__(self, n: int):
        self.n = n
        h = 1.0 / (n + 1)
        self.h = h
        idx = np.arange(n * n).reshape(n, n)
        p = np.concatenate([idx[:, :-1].ravel(), idx[:-1, :].ravel()])
        q = np.concatenate([idx[:, 1:].ravel(), idx[1:, :].ravel()])
        d = np.arange(n * n)
        rows = np.concatenate([d, p, q])
        cols = np.concatenate([d, q, p])
        data = np.concatenate([np.full(n * n, 4.0), -np.ones(2 * p.size)]) / h ** 2
        self.K = sd.sparse.coo_matrix((data, (rows, cols)), shape=(n * n, n * n))
        x = (np.arange(n) + 1) * h
        self.X, self.Y = np.meshgrid(x, x, indexing="xy")

    def density(self, theta):
        e = snp.exp(theta)
        return e / snp.mean(e)

    def modes(self, theta, k: int):
        """The `k` lowest eigenpairs of `K v = lambda M v` for the design."""
        n2 = self.n * self.n
        i = np.arange(n2)
        M = sd.sparse.coo_matrix((self.density(theta), (i, i)), shape=(n2, n2))
        return sd.linalg.eigsh(self.K, k, M=M, sigma=0.0)

    def penalty(self, theta):
        t = snp.reshape(theta, (self.n, self.n))
        gx, gy = snp.diff(t, axis=1), snp.diff(t, axis=0)
        return 0.5 * ALPHA * (snp.sum(gx * gx) + snp.sum(gy * gy))


def fundamental(theta, mem: Membrane, scale: float):
    """Design 1: minus the fundamental eigenvalue (relative to the uniform
    membrane's), plus the smoothness penalty."""
    w, _ = mem.modes(theta, 1)
    return -w[0] / scale + mem.penalty(theta)


def gap(theta, mem: Membrane):
    """Design 2: minus the mean of the second and third eigenvalues over the
    first (a cluster-invariant function: the pair enters by its sum only),
    plus the smoothness penalty."""
    w, _ = mem.modes(theta, 3)
    return -(w[1] + w[2]) / (2.0 * w[0]) + mem.penalty(theta)


def _design(f, theta0, say, label: str, maxiter: int):
    history = []
    value = sd.function(f)
    t0 = time.perf_counter()

    def progress(theta):
        history.append(float(value(theta)))
        k = len(history)
        if k <= 2 or k % 10 == 0:
            say(f"  {label} iter {k:3d}  objective {history[-1]:.6f}  "
                f"({time.perf_counter() - t0:.1f} s)")

    res = sd.optimize.minimize(f, theta0, method="L-BFGS-B", bounds=(-BOUND, BOUND),
                               callback=progress, options={"maxiter": maxiter})
    say(f"  {label}: {res.nit} iterations, {res.nfev} evaluations, "
        f"{time.perf_counter() - t0:.1f} s; {res.message}")
    return res, history


def main(n: int = 100, maxiter: int = 60, plot: str | None = None, verbose: bool = True):
    say = print if verbose else (lambda *a, **k: None)
    mem = Membrane(n)
    N = n * n
    uniform = np.zeros(N)
    w0 = np.asarray(sd.function(lambda t: mem.modes(t, 4)[0])(uniform))
    exact = np.pi ** 2 * np.array([2.0, 5.0, 5.0, 8.0])
    say(f"membrane: {n} x {n} grid ({N} unknowns), {mem.K.nnz} stored entries in K")
    say(f"uniform density: lambda_1..4 = {np.array2string(w0, precision=4)} (continuum "
        f"{np.array2string(exact, precision=4)}); lambda_3 - lambda_2 = {w0[2] - w0[1]:.1e}")

    # lambda_2 alone is not differentiable at the uniform design: refused
    try:
        sd.grad(lambda t: mem.modes(t, 3)[0][1])(uniform)
        say("lambda_2 alone: no error (unexpected)")
    except sd.errors.DegenerateEigenvalueError as e:
        say("d lambda_2 / d theta at the uniform design: DegenerateEigenvalueError:\n  "
            + str(e).splitlines()[0][:160] + " ...")

    rng = np.random.default_rng(0)
    f1 = lambda t: fundamental(t, mem, float(w0[0]))  # noqa: E731
    f2 = lambda t: gap(t, mem)  # noqa: E731
    direction = rng.standard_normal(N)
    rates = {
        "fundamental": sd.testing.taylor_test(f1, 0.3 * rng.standard_normal(N), direction),
        "gap (at the degenerate uniform design)": sd.testing.taylor_test(f2, uniform,
                                                                         direction),
    }
    for name, r in rates.items():
        say(f"Taylor test, {name} (rates, want ~2): {np.array2string(r, precision=3)}")

    res1, hist1 = _design(f1, uniform, say, "fundamental", maxiter)
    res2, hist2 = _design(f2, uniform, say, "gap", maxiter)
    w1 = np.asarray(sd.function(lambda t: mem.modes(t, 3)[0])(res1.x))
    w2 = np.asarray(sd.function(lambda t: mem.modes(t, 3)[0])(res2.x))
    say(f"design 1: lambda_1 {w0[0]:.3f} -> {w1[0]:.3f} (x{w1[0] / w0[0]:.3f}, frequency "
        f"x{np.sqrt(w1[0] / w0[0]):.3f}); mean density {np.mean(mem_density(mem, res1.x)):.6f}")
    say(f"design 2: (lambda_2 + lambda_3) / (2 lambda_1) {(w0[1] + w0[2]) / (2 * w0[0]):.4f} "
        f"-> {(w2[1] + w2[2]) / (2 * w2[0]):.4f}; lambda_3 - lambda_2 = {w2[2] - w2[1]:.1e}; "
        f"mean density {np.mean(mem_density(mem, res2.x)):.6f}")
    if plot:
        if _plot(mem, res1.x, res2.x, plot):
            say(f"figure written to {plot}")
    return dict(w0=w0, w1=w1, w2=w2, rates=rates, res1=res1, res2=res2, hist1=hist1,
                hist2=hist2)


def mem_density(mem: Membrane, theta) -> np.ndarray:
    return np.asarray(sd.function(mem.density)(theta))


def _plot(mem: Membrane, theta1, theta2, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n = mem.n
    modes = sd.function(lambda t: mem.modes(t, 3))
    fig, axes = plt.subplots(2, 4, figsize=(15, 7))
    for row, (theta, title) in enumerate(((theta1, "max lambda_1"),
                                          (theta2, "max gap"))):
        w, v = (np.asarray(x) for x in modes(theta))
        im = axes[row, 0].imshow(mem_density(mem, theta).reshape(n, n), origin="lower",
                                 extent=(0, 1, 0, 1), cmap="magma")
        axes[row, 0].set_title(f"density: {title}")
        fig.colorbar(im, ax=axes[row, 0], shrink=0.8)
        for j in range(3):
            ax = axes[row, j + 1]
            ax.imshow(v[:, j].reshape(n, n), origin="lower", extent=(0, 1, 0, 1),
                      cmap="RdBu_r")
            ax.set_title(f"mode {j + 1}: lambda = {w[j]:.2f}")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=100, help="grid size per side (default 100)")
    p.add_argument("--maxiter", type=int, default=60, help="L-BFGS iterations per design")
    p.add_argument("--plot", default="examples/eigen_design.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.maxiter, args.plot or None)
