"""Elasticity identification: a Young's modulus field from displacements.

The forward model: plane-stress linear elasticity in a cantilever plate
`[0, 2] x [0, 1]`, clamped on its left edge (`u = 0` there), loaded by a
traction on its right edge; two load cases, a downward shear (bending) and
a pull (tension). P1 vector elements on a refined scikit-fem rectangle; the
stiffness matrix is assembled by `sd.fem.assemble` from a scikit-fem form
whose Young's modulus `E = exp(m)` (`m` nodal, on the scalar P1 basis of
the same mesh) comes in through `sd.fem.interpolate`; Poisson's ratio 0.3.
The clamped degrees of freedom are removed with `sd.fem.condense`. The data:
both displacement components at every free node for both load cases, for a
true field with a stiff and a soft inclusion, plus 1% Gaussian noise.

The load cases are batched with `sd.vmap` (one matrix, one factorization
for both, reused by the adjoint solves). The objective is the misfit plus an
H1 (gradient) penalty on `m`, a scikit-fem `Functional` assembled by
`sd.fem`; L-BFGS-B minimizes it with sciad's gradient, after a Taylor test
of that gradient.

Run: `python examples/fem_elasticity_identification.py` (a 41 x 21 node
grid, 861 nodes, 1722 displacement unknowns, about 13 s on two cores);
`--nx 61` for a finer mesh, `--plot out.png` for the figure (needs
matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import skfem
from skfem.helpers import ddot, dot, grad, sym_grad, trace

import sciad as sd
import sciad.numpy as snp

NU = 0.3        # Poisson's ratio (known)
NOISE = 0.01    # 1% of the largest displacement
ALPHA = 1e-2    # weight of the H1 penalty 0.5 * int |grad m|^2


@skfem.BilinearForm
def plane_stress(u, v, w):
    # Lame parameters of plane stress: lambda* = E nu / (1 - nu^2), mu = E / (2 (1 + nu))
    lam, mu = w.E * NU / (1.0 - NU ** 2), w.E / (2.0 * (1.0 + NU))
    eu, ev = sym_grad(u), sym_grad(v)
    return 2.0 * mu * ddot(eu, ev) + lam * trace(eu) * trace(ev)


@skfem.LinearForm
def traction(v, w):
    return w.tx * v[0] + w.ty * v[1]


@skfem.Functional
def gradient_energy(w):
    return dot(grad(w.m), grad(w.m))


class Problem:
    """The mesh, the vector and scalar bases, the load vectors of the two
    load cases and the free (measured) degrees of freedom."""

    def __init__(self, nx: int = 41):
        ny = (nx + 1) // 2
        self.mesh = skfem.MeshTri.init_tensor(np.linspace(0.0, 2.0, nx), np.linspace(0.0, 1.0, ny))
        self.vbasis = skfem.Basis(self.mesh, skfem.ElementVector(skfem.ElementTriP1()))
        self.scalar = self.vbasis.with_element(skfem.ElementTriP1())
        right = self.mesh.facets_satisfying(lambda x: np.isclose(x[0], 2.0))
        facets = skfem.FacetBasis(self.mesh, self.vbasis.elem, facets=right)
        clamped = self.vbasis.get_dofs(lambda x: np.isclose(x[0], 0.0))
        self.I = np.setdiff1d(np.arange(self.vbasis.N), clamped.flatten())
        loads = [traction.assemble(facets, tx=0.0, ty=-1.0),     # bending
                 traction.assemble(facets, tx=1.0, ty=0.0)]      # tension
        self.loads = np.stack(loads)[:, self.I]                  # (cases, free dofs)
        px, py = self.mesh.p

        def bump(cx, cy, r):
            return np.exp(-((px - cx) ** 2 + (py - cy) ** 2) / r ** 2)

        # log E: a stiff inclusion (E about 3) near the clamp, a soft one (E about 1/3) mid-span
        self.m_true = np.log(3.0) * bump(0.55, 0.65, 0.22) - np.log(3.0) * bump(1.3, 0.35, 0.22)


def displacements(problem: Problem, m, load):
    """The displacement at the free dofs for one load case (`load`: its load
    vector on the free dofs) and the log-modulus `m` (nodal, scalar basis)."""
    E = sd.fem.interpolate(problem.scalar, snp.exp(m))
    K = sd.fem.assemble(plane_stress, problem.vbasis, E=E, tags="spd")
    A = sd.fem.condense(K, I=problem.I, expand=False)
    return sd.fem.solve(A, load)


def forward(problem: Problem, m):
    """The displacements of every load case: `sd.vmap` over the load
    vectors, `m` shared (one matrix, one factorization)."""
    return sd.vmap(lambda m, b: displacements(problem, m, b), in_axes=(None, 0))(m, problem.loads)


def objective(m, data, sigma, problem: Problem):
    r = (forward(problem, m) - data) / sigma
    penalty = sd.fem.assemble(gradient_energy, problem.scalar, m=m)
    return 0.5 * snp.mean(r * r) + 0.5 * ALPHA * penalty


def make_data(problem: Problem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy displacements; the noise level of each load case is 1% of its
    largest displacement (returned as `sigma`, shape `(cases, 1)`)."""
    u = np.asarray(sd.function(lambda m: forward(problem, m))(problem.m_true))
    sigma = NOISE * np.max(np.abs(u), axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    return u + sigma * rng.standard_normal(u.shape), sigma


def main(nx: int = 41, maxiter: int = 100, plot: str | None = None, verbose: bool = True):
    problem = Problem(nx)
    data, sigma = make_data(problem)
    m_true = problem.m_true
    n = problem.scalar.N
    m0 = np.zeros(n)
    say = print if verbose else (lambda *a, **k: None)
    say(f"elasticity identification in a cantilever plate: {n} nodes, "
        f"{problem.mesh.nelements} triangles, {problem.I.size} free displacement dofs, "
        f"{problem.loads.shape[0]} load cases, {data.size} measurements")

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
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.2), width_ratios=(1.25, 1.25, 1))
    E_true, E_rec = np.exp(problem.m_true), np.exp(m_rec)
    lim = float(np.max(np.abs(problem.m_true)))
    norm = matplotlib.colors.LogNorm(vmin=np.exp(-lim), vmax=np.exp(lim))
    for ax, field, title in ((axes[0], E_true, "true Young's modulus E"),
                             (axes[1], E_rec, "recovered E")):
        im = ax.tripcolor(mesh.p[0], mesh.p[1], mesh.t.T, field, shading="gouraud",
                          norm=norm, cmap="RdBu_r")
        ax.set_aspect("equal")
        ax.set_title(title)
        ax.set_axis_off()
        bar = fig.colorbar(im, ax=ax, shrink=0.75)
        bar.set_ticks([1 / 3, 0.5, 1.0, 2.0, 3.0], labels=["1/3", "1/2", "1", "2", "3"])
        bar.minorticks_off()
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
    p.add_argument("--nx", type=int, default=41,
                   help="nodes along the plate's length (default 41; half as many across)")
    p.add_argument("--maxiter", type=int, default=100, help="L-BFGS iterations (default 100)")
    p.add_argument("--plot", default="examples/fem_elasticity_identification.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.nx, args.maxiter, args.plot or None)
