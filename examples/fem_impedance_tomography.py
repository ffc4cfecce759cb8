"""Electrical impedance tomography: a conductivity in a disc from boundary voltages.

The forward model: `-div(sigma grad u_j) = 0` in the unit disc with the
boundary current `sigma du_j/dn = g_j` for current patterns
`g_j = cos(j theta), sin(j theta)`, `j = 1..J` (2 J patterns), one boundary
node grounded (`u_j = 0` there: the Neumann problem fixes `u_j` up to a
constant). P1 finite elements on scikit-fem's disc mesh; the stiffness
matrix is assembled by `sd.fem.assemble` from the scikit-fem form with the
conductivity `sigma = exp(m)` (`m` nodal) as its coefficient, the ground
node removed with `sd.fem.condense`. The data: the voltages at the boundary
nodes for every pattern, for a true field with a conducting and a resistive
inclusion, plus 0.5% Gaussian noise.

The patterns are batched with `sd.vmap` (the matrix does not depend on the
pattern: one factorization for all of them, reused by the adjoint solves).
The objective is the misfit plus an H1 (gradient) penalty, itself a
scikit-fem `Functional` of `m` assembled by `sd.fem`; L-BFGS-B minimizes it
with sciad's gradient, after a Taylor test of that gradient.

Run: `python examples/fem_impedance_tomography.py` (545 nodes, about 15 s
on two cores); `--nrefs 5` for a finer mesh (2113 nodes), `--plot
out.png` for the figure (needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import skfem
from skfem.helpers import dot, grad

import sciad as sd
import sciad.numpy as snp

NOISE = 0.005
ALPHA = 5e-3  # weight of the H1 penalty 0.5 * int |grad m|^2


@skfem.BilinearForm
def conduction(u, v, w):
    return w.sigma * dot(grad(u), grad(v))


@skfem.LinearForm
def current(v, w):
    return w.g * v


@skfem.Functional
def gradient_energy(w):
    return dot(grad(w.m), grad(w.m))


class Problem:
    """The mesh, the bases, the current patterns' load vectors and where
    the voltages are read."""

    def __init__(self, nrefs: int = 4, n_freq: int = 8):
        self.mesh = skfem.MeshTri.init_circle(nrefs)
        self.basis = skfem.Basis(self.mesh, skfem.ElementTriP1())
        facets = skfem.FacetBasis(self.mesh, self.basis.elem)
        x, y = facets.global_coordinates()
        theta = np.arctan2(y, x)
        loads = []
        for j in range(1, n_freq + 1):
            for g in (np.cos(j * theta), np.sin(j * theta)):
                loads.append(current.assemble(facets, g=g))
        boundary = self.mesh.boundary_nodes()
        self.ground = boundary[:1]
        self.I = np.setdiff1d(np.arange(self.basis.N), self.ground)
        self.loads = np.stack(loads)[:, self.I]                    # (patterns, free dofs)
        # the boundary nodes but the ground, as positions among the free dofs
        self.sensors = np.searchsorted(self.I, boundary[1:])
        px, py = self.mesh.p

        def bump(cx, cy, r):
            return np.exp(-((px - cx) ** 2 + (py - cy) ** 2) / r ** 2)

        self.m_true = np.log(4.0) * bump(0.35, 0.25, 0.3) - np.log(4.0) * bump(-0.4, -0.2, 0.25)


def voltages(problem: Problem, m, load):
    """The boundary voltages of one current pattern (`load`: its load vector
    on the free dofs) for the log-conductivity `m`."""
    K = sd.fem.assemble(conduction, problem.basis, sigma=snp.exp(m), tags="spd")
    A = sd.fem.condense(K, I=problem.I, expand=False)
    u = sd.fem.solve(A, load)
    return snp.take(u, problem.sensors)


def forward(problem: Problem, m):
    """The voltages of every pattern: `sd.vmap` over the load vectors, `m`
    shared (one matrix, one factorization)."""
    return sd.vmap(lambda m, b: voltages(problem, m, b), in_axes=(None, 0))(m, problem.loads)


def objective(m, data, sigma, problem: Problem):
    r = (forward(problem, m) - data) / sigma
    penalty = sd.fem.assemble(gradient_energy, problem.basis, m=m)
    return 0.5 * snp.mean(r * r) + 0.5 * ALPHA * penalty


def make_data(problem: Problem, seed: int = 0) -> tuple[np.ndarray, float]:
    v = np.asarray(sd.function(lambda m: forward(problem, m))(problem.m_true))
    sigma = NOISE * float(np.max(np.abs(v)))
    rng = np.random.default_rng(seed)
    return v + sigma * rng.standard_normal(v.shape), sigma


def main(nrefs: int = 4, maxiter: int = 150, plot: str | None = None, verbose: bool = True):
    problem = Problem(nrefs)
    data, sigma = make_data(problem)
    m_true = problem.m_true
    n = problem.basis.N
    m0 = np.zeros(n)
    say = print if verbose else (lambda *a, **k: None)
    say(f"EIT in the unit disc: {n} nodes, {problem.mesh.nelements} triangles, "
        f"{problem.loads.shape[0]} current patterns, {data.size} voltages")

    f = lambda m: objective(m, data, sigma, problem)  # noqa: E731
    rates = sd.testing.taylor_test(f, m0 + 0.1, np.random.default_rng(1).standard_normal(n))
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    history = []
    f_value = sd.function(f)
    t0 = time.perf_counter()

    def progress(m):
        value = float(f_value(m))
        history.append(value)
        if len(history) % 10 == 0 or len(history) == 1:
            err = np.linalg.norm(m - m_true) / np.linalg.norm(m_true)
            say(f"  iter {len(history):3d}  objective {value:.6e}  |m - m_true|/|m_true| "
                f"{err:.4f}  ({time.perf_counter() - t0:.2f} s)")

    res = sd.optimize.minimize(f, m0, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; "
        f"objective {res.fun:.6e}; relative error of m {err:.4f}")
    if plot:
        if _plot(problem, res.x, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, m_true


def _plot(problem: Problem, m_rec, history, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    mesh = problem.mesh
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    lim = float(np.max(np.abs(problem.m_true)))
    for ax, field, title in ((axes[0], problem.m_true, "true log-conductivity"),
                             (axes[1], m_rec, "recovered")):
        im = ax.tripcolor(mesh.p[0], mesh.p[1], mesh.t.T, field, shading="gouraud",
                          vmin=-lim, vmax=lim, cmap="RdBu_r")
        ax.set_aspect("equal")
        ax.set_title(title)
        ax.set_axis_off()
        fig.colorbar(im, ax=ax, shrink=0.8)
    axes[2].semilogy(np.arange(1, len(history) + 1), history)
    axes[2].set_xlabel("L-BFGS iteration")
    axes[2].set_ylabel("objective")
    axes[2].set_title("objective history")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nrefs", type=int, default=4, help="disc mesh refinements (default 4)")
    p.add_argument("--maxiter", type=int, default=150, help="L-BFGS iterations (default 150)")
    p.add_argument("--plot", default="examples/fem_impedance_tomography.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.nrefs, args.maxiter, args.plot or None)
