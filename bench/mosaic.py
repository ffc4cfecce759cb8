"""Mosaic's thermal_mesh and structural_mesh tasks as sciad programs, against
Mosaic's reference values and SciPy on the same machine.

Mosaic (github: pasteurlabs/mosaic, v0.2.0, Apache-2.0) benchmarks
differentiable PDE solvers on fixed tasks. Its `thermal_mesh` task: steady
heat conduction on a quasi-2-D slab `[0, 2] x [0, 1] x [0, Lz]` of one layer
of HEX8 elements (`nx x nx/2 x 1`, `Lz = 2 / nx` so the elements stay
cubic), SIMP conductivity `k(rho) = k_min + (k_max - k_min) rho^3` per cell
(`k_max = 1`, `k_min = 1e-3`, `rho` clipped to [0, 1]), `T = 0` on the face
`x = 0`, a heat flux `q_n = Q / (Ly Lz)` (Q = 1) on the face `x = 2`
(each face quad's `q_n A / 4` to its four nodes), and the thermal compliance
`C = f . T`, with `K(rho) T = f` (the element matrices of trilinear HEX8 by
2 x 2 x 2 Gauss quadrature). Everything here is rebuilt from Mosaic's task
definition (`mosaic/benchmarks/problems/thermal_mesh/physics.py`,
`shared/mesh.py`: its node and cell numbering, so its per-cell fields mean
the same cells).

sciad's program: the element matrices `k_e Ke` traced, summed onto a
pattern fixed per mesh (`sd.sparse.assemble_elements` with each cell's
nodes numbered among the free ones: the pattern and the map from element
entries to stored ones made once per mesh), the Dirichlet nodes
eliminated, the solve tagged `spd` (`solver="auto"`), `C = f . T`; its
gradient by `sd.value_and_grad` (the adjoint of the solve, sciad's rule).
SciPy's: `scipy.sparse.coo_matrix(...).tocsr()`, `spsolve`, and the gradient
written by hand (compliance is self-adjoint: `dC/drho_e = -k'(rho_e)
T_e . Ke T_e`).

Run from the repository root:

    .venv/bin/python bench/mosaic.py                 # nx up to 512 (~5 min on 2 cores)
    .venv/bin/python bench/mosaic.py --big           # and nx = 1024 (1.05 M nodes, ~3 GB)
    .venv/bin/python bench/mosaic.py --recovery-only # the recovery alone (~1 min)
    .venv/bin/python bench/mosaic.py --quick --no-write
    .venv/bin/python bench/mosaic.py --task structural   # ~2 min; keeps the thermal section

1. Forward agreement with Mosaic's shipped references
   (`references/forward_agreement.npz`: uniform `rho_0` from 0.05 to 0.95 at
   nx = 16; `forward_baseline.npz`: Mosaic's random density, seed 0, at
   nx = 2 ... 24), relative error.
2. The gradient check as Mosaic's `gradient/fd_check` computes it (nx = 8,
   its random density, the loss `C^2`, unit random directions, central
   differences at `eps * rms(rho)` for eps = 1 ... 1e-4): each eps's mean
   relative error over the directions, the best, and `1 - cos` between the
   finite differences and the gradient's directional derivatives (our own
   seeded directions: Mosaic draws them with JAX's PRNG).
3. Mosaic's conductivity recovery (`optimization/conductivity_recovery_bfgs`:
   nx = 16, Lz = 1, the identification error of the temperatures, from a
   uniform density, 200 iterations), by L-BFGS-B on sciad's gradient and by
   Gauss-Newton on its Jacobian (in the density, and in the conductivity,
   where it converges), for Mosaic's target and for a target of
   the same physics (Mosaic's target lumps the face flux differently from
   the solvers, so its error need not reach 0), beside Mosaic's published
   final errors.
4. Cost over Mosaic's resolution sweep (nx = 16 ... 512, 1024 with
   `--big`): forward and value + gradient, medians after the first call,
   the first call (trace, compile, analysis), and the peak resident memory,
   each (tool, nx) in a fresh process; sciad's time against SciPy's and
   torch-fem's (where installed: `bench/_torchfem.py`), and Mosaic's
   published rows beside them (their hardware: GitHub Actions runners, a
   Tesla T4 for the GPU solvers).

The structural task (`Structural`; `--task structural` runs it alone and
keeps the file's thermal section): Mosaic's `structural_mesh`
(`problems/structural_mesh/physics.py`, `config.py`, the solvers'
`tesseracts/structural-mesh/*/tesseract_api.py`), the SIMP compliance of a
linear-elastic HEX8 cantilever on `[0, 2] x [0, 1] x [0, 1]` of `nx x 2 x
nz` cells (`nz = nx / 2` unless an experiment says otherwise), Young's
modulus `E(rho) = E_min + (E_max - E_min) rho^3` per cell (`E_max =
70,000`, `E_min = 1e-3 E_max`, Poisson ratio 0.3), clamped at x = 0, and
`C = f . u` with `K(rho) u = f`. Two loads, both of total 1: the full face
x = 2 pulled down (`-z`), and (gradient check, optimisation) `+z` on the one
face quad at the corner y = 0, z = 0. Mosaic gives the full-face load two
ways: the FEM solvers (JAX-FEM, FEniCS, Firedrake, deal.II) integrate a
traction `F / (Ly Lz)` over the face quads (a corner node gets 1/4 of a
quad's share, an edge node 1/2, an inner one 1); TopOpt.jl puts `F /
n_face_nodes` on every node of the face. Mosaic's shipped references are the
former's: sciad matches them to their float32 rounding, while the nodal
load is 4.4e-3 ... 6.3e-3 off (Mosaic publishes TopOpt.jl's mean error,
5.53e-3, and 0 for the others). For the corner load the two conventions
agree (`F / 4` on each of the quad's nodes). The density is clipped to
[0, 1] in `E` (as FEniCS's solver does; JAX-FEM does not clip): it keeps `K`
positive definite where the gradient check's largest steps leave the box.

5. Forward agreement (`forward_agreement.npz`: uniform rho_0 on 8 x 2 x 4
   cells; `forward_baseline.npz`: rho_0 = 0.5 on N x 2 x 4, N = 4 ... 16),
   beside the nodal load's values.
6. The gradient check as Mosaic's `gradient/fd_check` runs it for this
   task (8 x 2 x 4 cells, the corner load, the random density, the loss
   `C^2`, 6 directions drawn as Mosaic draws them, eps = 2 ... 1e-4).
7. Mosaic's `optimization/topopt`: 16 x 2 x 8 cells, the corner load,
   Adam (lr 0.05) on `C + 50 (mean(rho) - 0.5)^2` from a uniform 0.5, the
   density clipped to [1e-3, 1], 2500 iterations with early stopping after
   100 without improvement (Mosaic uses no density filter and no OC/MMA
   update), beside Mosaic's published final compliance.
8. Cost at Mosaic's sizes (N x 2 x N/2 cells, N = 4 ... 16) and ours (32,
   64; 128 with `--big`), as for the thermal task (torch-fem's `Solid`
   beside it), beside Mosaic's published rows at N = 16.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "mosaic.md")
K_MAX, K_MIN, P = 1.0, 1e-3, 3.0
LX, LY, Q_TOTAL = 2.0, 1.0, 1.0

#: Mosaic v0.2.0's shipped references (float32 scalars, the thermal
#: compliance), `mosaic/benchmarks/problems/thermal_mesh/references/`
REFERENCES = {
    "agreement": {  # forward_agreement.npz: uniform rho_0 at nx = 16
        "sweep": [0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.95],
        "C": [14223.803, 8004.0015, 1779.3594, 246.39644, 73.806175, 31.220243, 18.65851]},
    "baseline": {  # forward_baseline.npz: Mosaic's random density (seed 0) at nx = N
        "sweep": [2, 3, 4, 6, 8, 12, 16, 24],
        "C": [16.552181, 19.562195, 23.414675, 85.65075, 99.867744, 85.6194, 122.75734,
              329.5523]},
}

#: Mosaic's published cost rows for this task (seconds; forward, VJP), as
#: Mosaic's results page and paper give them: GitHub Actions runners, the
#: GPU solvers on a Tesla T4, the CPU ones on a CPU node
PUBLISHED = {
    ("torch-fem", 1024): (13.3, 29.1),
    ("FEniCS", 512): (11.8, 29.0),
    ("JAX-FEM", 512): (85.8, 33.8),
}


# ---------------------------------------------------------------------------
# the task, from Mosaic's definition


def mesh(nx: int, ny: int, nz: int, lx: float, ly: float, lz: float):
    """Mosaic's structured HEX8 mesh: `(points (n, 3), cells (m, 8))`, nodes
    x fastest, then y, then z; cells in Abaqus order, x fastest."""
    xs = np.linspace(0.0, lx, nx + 1, dtype=np.float32)
    ys = np.linspace(0.0, ly, ny + 1, dtype=np.float32)
    zs = np.linspace(0.0, lz, nz + 1, dtype=np.float32)
    Z, Y, X = np.meshgrid(zs, ys, xs, indexing="ij")
    points = np.stack([X.ravel(), Y.ravel(), Z.ravel()], axis=-1)
    iz, iy, ix = (a.ravel() for a in np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx),
                                                 indexing="ij"))

    def nid(a, b, c):
        return c * (nx + 1) * (ny + 1) + b * (nx + 1) + a

    cells = np.stack([nid(ix, iy, iz), nid(ix + 1, iy, iz), nid(ix + 1, iy + 1, iz),
                      nid(ix, iy + 1, iz), nid(ix, iy, iz + 1), nid(ix + 1, iy, iz + 1),
                      nid(ix + 1, iy + 1, iz + 1), nid(ix, iy + 1, iz + 1)], axis=1)
    return points, cells.astype(np.int64)


def brick_gradients(dx: float, dy: float, dz: float) -> list[np.ndarray]:
    """The trilinear shape functions' gradients `(8 nodes, 3)` at the 2 x 2
    x 2 Gauss points of a `dx x dy x dz` brick (nodes in VTK's order), each
    point's weight `dx dy dz / 8`."""
    ref = np.array([[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1],
                    [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1]], float)
    jinv = np.diag([2.0 / dx, 2.0 / dy, 2.0 / dz])
    out = []
    for a in (-1.0, 1.0):
        for b in (-1.0, 1.0):
            for c in (-1.0, 1.0):
                xi, eta, zeta = np.array([a, b, c]) / np.sqrt(3.0)
                dN = np.stack([ref[:, 0] * (1 + ref[:, 1] * eta) * (1 + ref[:, 2] * zeta),
                               (1 + ref[:, 0] * xi) * ref[:, 1] * (1 + ref[:, 2] * zeta),
                               (1 + ref[:, 0] * xi) * (1 + ref[:, 1] * eta) * ref[:, 2]],
                              axis=1) / 8.0
                out.append(dN @ jinv)
    return out


def conductance(dx: float, dy: float, dz: float) -> np.ndarray:
    """The 8 x 8 conductance matrix of a `dx x dy x dz` trilinear brick, by
    2 x 2 x 2 Gauss quadrature (Mosaic's `_compute_K_ref_simple`)."""
    return sum(dx * dy * dz / 8.0 * B @ B.T for B in brick_gradients(dx, dy, dz))


def free_numbering(dofs: np.ndarray, free: np.ndarray, n: int) -> np.ndarray:
    """Each cell's degrees of freedom numbered among the `free` ones of `n`,
    -1 where fixed: `(m, k)`, what sciad's assembly takes."""
    number = np.full(n, -1, np.int64)
    number[free] = np.arange(free.size)
    return number[dofs]


def free_entries(local: np.ndarray, Ke: np.ndarray):
    """`(cell, ke, rows, cols)`: for each entry of the element matrices
    between two free degrees of freedom (`local`, as `free_numbering`
    gives), its cell, its value in `Ke` and its (row, column) among the free
    ones (int32): the COO coordinates SciPy's assembly takes."""
    k = local.shape[1]
    a, b = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    rows, cols = local[:, a.ravel()], local[:, b.ravel()]       # (m, k^2)
    keep = (rows >= 0) & (cols >= 0)
    cell = np.nonzero(keep)[0].astype(np.int32)
    ke = np.broadcast_to(Ke.ravel(), keep.shape)[keep]
    return cell, ke, rows[keep].astype(np.int32), cols[keep].astype(np.int32)


def random_density(nx: int, ny: int, nz: int = 1, seed: int = 0) -> np.ndarray:
    """Mosaic's `random` initial condition: `0.5 + 0.3 N(0, 1)` per cell
    (NumPy's default generator, `seed`), float32, clipped to [0.05, 0.95]."""
    rng = np.random.default_rng(seed)
    rho = 0.5 + 0.3 * rng.standard_normal(nx * ny * nz).astype(np.float32)
    return np.clip(rho, 0.05, 0.95).astype(np.float32)


class _Simp:
    """What the two tasks share once a mesh is built (`local`, each cell's
    degrees of freedom numbered among the free ones, -1 where fixed; the
    element matrix `Ke`; `n_free`; the load `f`): the SIMP law `LOW + (HIGH -
    LOW) clip(rho, 0, 1)^P` per cell, the solution and the compliance
    `f . u` as sciad functions, and SciPy's `spsolve` with the adjoint by
    hand (compliance is self-adjoint: `dC/drho_e = -law'(rho_e) u_e . Ke
    u_e`)."""

    LOW = HIGH = 0.0

    def law(self, rho):
        """The per-cell coefficient of `rho` (sciad's or NumPy's arrays)."""
        import sciad.numpy as snp

        return self.LOW + (self.HIGH - self.LOW) * snp.clip(rho, 0.0, 1.0) ** P

    def density(self, k):
        """The law's inverse on `[LOW, HIGH]` (NumPy): the density of the
        coefficient `k`."""
        return (np.clip((np.asarray(k) - self.LOW) / (self.HIGH - self.LOW), 0.0, 1.0)
                ) ** (1.0 / P)

    def density_derivative(self, k):
        """`d density / d k` at `k` (NumPy): `1 / law'(density(k))`."""
        r = np.maximum(self.density(k), 1e-300)
        return 1.0 / (P * (self.HIGH - self.LOW) * r ** (P - 1))

    # --- sciad ---

    def solution(self, rho):
        """The solution at the free degrees of freedom (the others are 0), a
        sciad function of the per-cell density."""
        import sciad as sd

        A = sd.sparse.assemble_elements(self.law(rho)[:, None, None] * self.Ke, self.local,
                                        shape=(self.n_free, self.n_free), tags=["spd"])
        return sd.linalg.solve(A, self.f)

    def compliance(self, rho):
        """`C(rho) = f . u`, a sciad function of the per-cell density."""
        import sciad.numpy as snp

        return snp.dot(self.f, self.solution(rho))

    # --- SciPy, and its gradient by hand ---

    @functools.cached_property
    def coo(self):
        """`(cell, ke, rows, cols)` of the element-matrix entries between free
        degrees of freedom (`free_entries`), made on SciPy's first call."""
        return free_entries(self.local, self.Ke)

    def scipy_matrix(self, rho):
        """`(K(rho) on the free degrees of freedom, CSC, clip(rho, 0, 1))`."""
        import scipy.sparse as sp

        r = np.clip(np.asarray(rho, np.float64), 0.0, 1.0)
        k = self.LOW + (self.HIGH - self.LOW) * r ** P
        cell, ke, rows, cols = self.coo
        return sp.coo_matrix((k[cell] * ke, (rows, cols)),
                             shape=(self.n_free, self.n_free)).tocsc(), r

    def scipy_value_and_grad(self, rho, grad: bool = True):
        import scipy.sparse.linalg as spla

        A, r = self.scipy_matrix(rho)
        u = spla.spsolve(A, self.f)
        C = float(self.f @ u)
        if not grad:
            return C, None
        ue = np.where(self.local >= 0, u[np.maximum(self.local, 0)], 0.0)  # (m, dofs)
        energy = np.einsum("ma,ab,mb->m", ue, self.Ke, ue)
        rho = np.asarray(rho)
        dk = (self.HIGH - self.LOW) * P * r ** (P - 1) * ((rho >= 0) & (rho <= 1))
        return C, -dk * energy


class Thermal(_Simp):
    """One mesh of the task: what every call shares (built once, O(cells)
    index arrays): the free nodes, the load on them, and each cell's 8
    nodes numbered among the free ones."""

    LOW, HIGH = K_MIN, K_MAX

    def __init__(self, nx: int, ny: int | None = None, lz: float | None = None):
        self.nx, self.ny = nx, ny or max(1, nx // 2)
        nz, lz = 1, (LX / nx if lz is None else lz)
        points, cells = mesh(self.nx, self.ny, nz, LX, LY, lz)
        n = points.shape[0]
        dx, dy, dz = LX / self.nx, LY / self.ny, lz / nz
        tol = 1e-6 * max(LX, LY, lz)
        fixed = points[:, 0] < tol
        # the flux: each quad of the face x = Lx gives q_n A / 4 to its nodes
        qn = np.float32(Q_TOTAL / (LY * lz))
        f = np.zeros(n)
        right = cells[np.arange(self.nx - 1, cells.shape[0], self.nx)][:, [1, 2, 5, 6]]
        np.add.at(f, right.ravel(), float(qn) * dy * dz / 4.0)
        free = np.flatnonzero(~fixed)
        self.Ke = conductance(dx, dy, dz)
        self.local = free_numbering(cells, free, n)
        self.n_free, self.f = free.size, f[free]
        self.n_cells = cells.shape[0]
        self.free, self.n_nodes, self.points, self.qn = free, n, points, qn
        self.dy, self.dz = dy, dz

    def temperature(self, rho):
        """The temperature at the free nodes (the others are 0)."""
        return self.solution(rho)


# ---------------------------------------------------------------------------
# 1. forward agreement, 2. the gradient check


def agreement() -> list[dict]:
    import sciad as sd

    rows = []
    ref = REFERENCES["agreement"]
    task = Thermal(16)
    fn = sd.function(task.compliance)
    for rho0, want in zip(ref["sweep"], ref["C"]):
        got = float(fn(np.full(task.n_cells, rho0, np.float32).astype(np.float64)))
        rows.append({"case": f"agreement rho_0 = {rho0}", "C": got, "ref": want})
    ref = REFERENCES["baseline"]
    for N, want in zip(ref["sweep"], ref["C"]):
        task = Thermal(N)
        rho = random_density(task.nx, task.ny).astype(np.float64)
        got = float(sd.function(task.compliance)(rho))
        rows.append({"case": f"baseline nx = {N} (random)", "C": got, "ref": want})
    for r in rows:
        r["rel"] = abs(r["C"] - r["ref"]) / abs(r["ref"])
    return rows


def fd_check(n_dirs: int = 6, seed: int = 0) -> dict:
    """Mosaic's `gradient/fd_check` on `C^2` at nx = 8 (see the module
    docstring)."""
    import sciad as sd

    task = Thermal(8)
    rho = random_density(8, 4).astype(np.float64)
    loss = sd.function(lambda r: task.compliance(r) ** 2)
    g = np.asarray(sd.function(sd.grad(lambda r: task.compliance(r) ** 2))(rho))
    scale = float(np.sqrt(np.mean(rho ** 2)))
    rng = np.random.default_rng(seed)
    dirs = [v / np.linalg.norm(v) for v in rng.standard_normal((n_dirs, rho.size))]
    return _fd_table(loss, g, rho, dirs, (1.0, 1e-1, 1e-2, 1e-3, 1e-4), scale)


def _fd_table(loss, g, rho, dirs, eps_values, scale=None) -> dict:
    """Per eps: the mean over `dirs` of the relative error of the central
    difference of `loss` at `eps * scale` (default `rms(rho)`) against
    `g . v`, and `1 - cos` between the two vectors of directional
    derivatives."""
    scale = float(np.sqrt(np.mean(rho ** 2))) if scale is None else scale
    ad = np.array([g @ v for v in dirs])
    out = {}
    for eps in eps_values:
        h = eps * scale
        fd = np.array([(float(loss(rho + h * v)) - float(loss(rho - h * v))) / (2 * h)
                       for v in dirs])
        rel = np.abs(fd - ad) / np.maximum(np.maximum(np.abs(fd), np.abs(ad)), 1e-30)
        cos = float(fd @ ad / (np.linalg.norm(fd) * np.linalg.norm(ad) + 1e-30))
        out[eps] = {"rel": float(np.mean(rel)), "one_minus_cos": 1.0 - cos}
    return out


# ---------------------------------------------------------------------------
# 3. Mosaic's conductivity recovery (`optimization/conductivity_recovery_bfgs`)


def two_gaussians(nx: int, ny: int) -> np.ndarray:
    """Mosaic's `two_gaussians` field per cell (float32): Gaussians of width
    0.15 at `(0.3 Lx, 0.5 Ly)` and `(0.7 Lx, 0.5 Ly)`, from the cell centres."""
    X, Y = np.meshgrid((np.arange(nx) + 0.5) * LX / nx, (np.arange(ny) + 0.5) * LY / ny,
                       indexing="xy")
    w = 0.15 * min(LX, LY)
    g = sum(np.exp(-((X - cx * LX) ** 2 + (Y - 0.5 * LY) ** 2) / (2 * w * w))
            for cx in (0.3, 0.7))
    return g.ravel().astype(np.float32)


def mosaic_target(task: "Thermal", rho_truth: np.ndarray) -> np.ndarray:
    """The target temperature at every node as Mosaic makes it
    (`_approx_target_temperature`): the truth's conductivity, but the flux
    lumped as `q_n dy dz / 4` once per node of the face x = Lx, where the
    solvers (and `Thermal`) give each node that share from each face quad
    it belongs to; float32, as Mosaic stores it."""
    import scipy.sparse.linalg as spla

    A, _ = task.scipy_matrix(rho_truth)
    right = np.flatnonzero(task.points[:, 0] > LX - 1e-6 * LX)
    f = np.zeros(task.n_nodes)
    f[right] = float(task.qn) * task.dy * task.dz / 4.0
    T = np.zeros(task.n_nodes)
    T[task.free] = spla.spsolve(A, f[task.free])
    return T.astype(np.float32)


def recovery(budget: int = 200) -> list[dict]:
    """Mosaic's conductivity recovery (its published settings: nx = 16,
    Lz = 1, from a uniform 0.5, bounds [1e-3, 1], a budget of 200
    iterations): the identification error `sum (T - T_target)^2` over the
    nodes, for Mosaic's target and for the target of the same physics (the
    flux as the solvers apply it), minimized by SciPy's L-BFGS-B on sciad's
    value and gradient (Mosaic's method: `budget` iterations) and by
    Gauss-Newton with bounds (SciPy's `least_squares`, trust-region
    reflective) on sciad's Jacobian of the temperatures (`sd.jacfwd`: one
    factorization, a solve per density; `budget` evaluations), in the
    density and in the conductivity `k = law(rho)` (bounds `law(1e-3)`,
    `law(1)`; the Jacobian by the chain rule, its columns' norms as the
    variables' scales: `x_scale="jac"`). In the density the problem
    is ill-conditioned (`dk / drho = 3 (k_max - k_min) rho^2` vanishes
    where the truth is small: the Jacobian's condition number at the truth
    is about 2e9) and no method converges within the budget; in the
    conductivity Gauss-Newton converges (SciPy's tolerances met) for both
    targets, to the box's best fit (the truth is below the lower bound in 16
    of the 128 cells)."""
    import scipy.optimize as so

    import sciad as sd
    import sciad.numpy as snp

    task = Thermal(16, 8, lz=1.0)
    truth = np.clip(two_gaussians(16, 8), 0.0, 1.0).astype(np.float64)
    temperature = sd.function(task.temperature)
    jacobian = sd.function(sd.jacfwd(task.temperature))
    consistent = np.zeros(task.n_nodes)
    consistent[task.free] = np.asarray(temperature(truth))
    start = np.full(task.n_cells, 0.5)
    rows = []
    for name, target in (("Mosaic's target", mosaic_target(task, truth).astype(np.float64)),
                         ("consistent target", consistent)):
        tf, rest = target[task.free], float(np.sum(np.delete(target, task.free) ** 2))
        vg = sd.function(sd.value_and_grad(
            lambda r: snp.sum((task.temperature(r) - tf) ** 2) + rest))

        def fun(r):
            v, g = vg(r)
            return float(v), np.asarray(g, np.float64)

        t0 = time.perf_counter()
        res = so.minimize(fun, start, jac=True, method="L-BFGS-B",
                          bounds=[(1e-3, 1.0)] * task.n_cells,
                          options={"maxiter": budget, "maxfun": 10 * budget, "ftol": 1e-15,
                                   "gtol": 1e-10})
        rows.append({"target": name, "method": "L-BFGS-B (gradient)", "final": float(res.fun),
                     "steps": f"{res.nit} iterations", "converged": bool(res.success),
                     "rho_error": float(np.linalg.norm(res.x - truth) / np.linalg.norm(truth)),
                     "seconds": time.perf_counter() - t0, "initial": fun(start)[0]})
        for method, to_u, rho_of, drho, scale in (
                ("Gauss-Newton (Jacobian)", lambda r: r, lambda u: u, np.ones_like, 1.0),
                ("Gauss-Newton on the conductivity", task.law, task.density,
                 task.density_derivative, "jac")):
            t0 = time.perf_counter()
            res = so.least_squares(
                lambda u: np.asarray(temperature(rho_of(u))) - tf, to_u(start),
                jac=lambda u: np.asarray(jacobian(rho_of(u))) * drho(u)[None, :],
                bounds=(to_u(1e-3), to_u(1.0)), method="trf", xtol=1e-15, ftol=1e-15,
                gtol=1e-12, max_nfev=budget, x_scale=scale)
            rho = np.clip(rho_of(res.x), 1e-3, 1.0)
            rows.append({"target": name, "method": method,
                         "final": 2 * float(res.cost) + rest,
                         "steps": f"{res.nfev} evaluations", "converged": res.status > 0,
                         "rho_error": float(np.linalg.norm(rho - truth) / np.linalg.norm(truth)),
                         "seconds": time.perf_counter() - t0, "initial": rows[-1]["initial"]})
    return rows


#: Mosaic's published L-BFGS recovery (its results page, v0.2.0): the final
#: identification error within 200 iterations; none converged
PUBLISHED_RECOVERY = {"torch-fem": 6.87e2, "JAX-FEM": 9.22e2, "FEniCS": 4.67e4,
                      "Firedrake": 1.29e5}


# ---------------------------------------------------------------------------
# 5. Mosaic's structural_mesh task (see `Structural`)

E_MAX, NU, XMIN = 70_000.0, 0.3, 1e-3
E_MIN = XMIN * E_MAX
LZ_S, F_TOTAL = 1.0, 1.0

#: Mosaic v0.2.0's shipped references (float32 scalars, the compliance),
#: `mosaic/benchmarks/problems/structural_mesh/references/`; both with a
#: uniform density and the full-face load
STRUCTURAL_REFERENCES = {
    "agreement": {  # forward_agreement.npz: uniform rho_0 on 8 x 2 x 4 cells
        "sweep": [0.2, 0.4, 0.5, 0.7, 0.9],
        "C": [0.0556488, 0.0077059567, 0.003975325, 0.0014560857, 0.00068615656]},
    "baseline": {  # forward_baseline.npz: rho_0 = 0.5 on N x 2 x 4 cells
        "sweep": [4, 6, 8, 12, 16],
        "C": [0.0036651825, 0.0038867774, 0.003975325, 0.004044013, 0.0040695816]},
}

#: Mosaic's published cost rows for this task, all at its largest size
#: N = 16 (16 x 2 x 8 cells; seconds: forward, VJP; deal.II forward only),
#: from its results page (v0.2.0): GitHub Actions runners, GPU-capable
#: solvers on a Tesla T4 node, the CPU-only ones (deal.II, FEniCS,
#: Firedrake) on a CPU node
PUBLISHED_STRUCTURAL = {
    ("TopOpt.jl", 16): (0.0127, 0.0342),
    ("Firedrake", 16): (0.103, 0.285),
    ("FEniCS", 16): (0.138, 0.472),
    ("JAX-FEM", 16): (0.154, 0.52),
    ("deal.II", 16): (1.54, None),
}

#: Mosaic's published topology optimisation (Adam, 2500 iterations): the
#: final compliance as its results page rounds it; none converged
PUBLISHED_TOPOPT = {"JAX-FEM": 1.00e-3, "FEniCS": 1.00e-3, "Firedrake": 1.00e-3,
                    "TopOpt.jl": 1.00e-3}

#: Mosaic's published gradient check for this task (FEniCS, Firedrake and
#: TopOpt.jl alike): best-eps finite-difference error and 1 - cos
PUBLISHED_STRUCTURAL_FD = (2.10e-5, 1.96e-10)


def elasticity(dx: float, dy: float, dz: float, nu: float = NU) -> np.ndarray:
    """The 24 x 24 stiffness of a `dx x dy x dz` trilinear brick of unit
    Young's modulus (isotropic, Poisson ratio `nu`), by 2 x 2 x 2 Gauss
    quadrature; degrees of freedom `3 a + c` (node `a` in Abaqus order,
    component `c`)."""
    lam, mu = nu / ((1 + nu) * (1 - 2 * nu)), 1.0 / (2 * (1 + nu))
    D = np.zeros((6, 6))
    D[:3, :3] = lam
    D[np.arange(3), np.arange(3)] += 2 * mu
    D[np.arange(3, 6), np.arange(3, 6)] = mu
    K = np.zeros((24, 24))
    for dN in brick_gradients(dx, dy, dz):                      # (8, 3) each
        B = np.zeros((6, 24))
        for i, (j, k) in enumerate([(0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2)]):
            B[i, j::3] += dN[:, k]
            if j != k:
                B[i, k::3] += dN[:, j]
        K += dx * dy * dz / 8.0 * B.T @ D @ B
    return K


class Structural(_Simp):
    """One mesh of Mosaic's `structural_mesh` task (see the module
    docstring): `nx x ny x nz` HEX8 cells on
    `[0, 2] x [0, 1] x [0, 1]` (Mosaic's numbering, `nz = nx // 2` unless
    given), clamped at x = 0, and one of Mosaic's loads: the full face x = 2
    pulled down (`-z`) by a total `F_TOTAL`, as a uniform traction integrated
    over the face quads (`load="traction"`, the FEM solvers') or split evenly
    over the face's nodes (`load="nodal"`, TopOpt.jl's), or (`corner=True`)
    `+z` on the one face quad at the corner y = 0, z = 0 (each of its four
    nodes `F/4`, the same in both conventions). What every call shares is
    built once: the free degrees of freedom, the load on them, and each
    cell's 24 degrees of freedom numbered among the free ones."""

    LOW, HIGH = E_MIN, E_MAX

    def __init__(self, nx: int, ny: int = 2, nz: int | None = None, corner: bool = False,
                 load: str = "traction"):
        nz = max(1, nx // 2) if nz is None else nz
        self.nx, self.ny, self.nz = nx, ny, nz
        points, cells = mesh(nx, ny, nz, LX, LY, LZ_S)
        n = points.shape[0]
        dx, dy, dz = LX / nx, LY / ny, LZ_S / nz
        tol = 1e-6 * max(LX, LY, LZ_S)
        f = np.zeros((n, 3))
        faces = cells[np.arange(nx - 1, cells.shape[0], nx)][:, [1, 2, 5, 6]]  # x = Lx quads
        if corner:
            f[faces[0], 2] = F_TOTAL / 4.0
        elif load == "traction":
            np.add.at(f[:, 2], faces.ravel(), -F_TOTAL / (LY * LZ_S) * dy * dz / 4.0)
        elif load == "nodal":
            right = np.flatnonzero(points[:, 0] > LX - tol)
            f[right, 2] = -F_TOTAL / right.size
        else:
            raise ValueError(f"load must be 'traction' or 'nodal', not {load!r}")
        fixed = np.repeat(points[:, 0] < tol, 3)
        free = np.flatnonzero(~fixed)
        dofs = (3 * cells[:, :, None] + np.arange(3)).reshape(-1, 24)
        self.Ke = elasticity(dx, dy, dz)
        self.local = free_numbering(dofs, free, 3 * n)
        self.n_free, self.f = free.size, f.ravel()[free]
        self.n_cells, self.n_nodes = cells.shape[0], n
        self.free, self.points = free, points


def structural_agreement() -> list[dict]:
    """sciad's compliance at Mosaic's reference cases, beside TopOpt.jl's
    load convention (SciPy, nodal load) on the same cases."""
    import sciad as sd

    rows = []
    cases = [(f"agreement rho_0 = {r0}", 8, r0, want) for r0, want in
             zip(STRUCTURAL_REFERENCES["agreement"]["sweep"],
                 STRUCTURAL_REFERENCES["agreement"]["C"])]
    cases += [(f"baseline N = {N} (rho_0 = 0.5)", N, 0.5, want) for N, want in
              zip(STRUCTURAL_REFERENCES["baseline"]["sweep"],
                  STRUCTURAL_REFERENCES["baseline"]["C"])]
    for case, N, r0, want in cases:
        task = Structural(N, 2, 4)
        rho = np.full(task.n_cells, np.float32(r0), np.float64)
        got = float(sd.function(task.compliance)(rho))
        nodal = Structural(N, 2, 4, load="nodal").scipy_value_and_grad(rho, grad=False)[0]
        rows.append({"case": case, "C": got, "ref": want, "rel": abs(got - want) / abs(want),
                     "nodal": nodal, "nodal_rel": abs(nodal - want) / abs(want)})
    return rows


#: Mosaic's `gradient/fd_check` for this task: its perturbation sizes
STRUCTURAL_FD_EPS = (2.0, 0.5, 0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4, 1e-4)


def mosaic_directions(n: int, n_dirs: int = 6, seed: int = 0) -> list[np.ndarray]:
    """Mosaic's fd_check directions: `jax.random.split(PRNGKey(seed),
    n_dirs)`, each a float32 standard normal vector normalized (the same
    numbers where this JAX draws as Mosaic's did)."""
    import jax
    import jax.numpy as jnp

    out = []
    for k in jax.random.split(jax.random.PRNGKey(seed), n_dirs):
        v = jax.random.normal(k, (n,), dtype=jnp.float32)
        out.append(np.asarray(v / (jnp.linalg.norm(v) + 1e-30), np.float64))
    return out


def structural_fd_check(eps_values=STRUCTURAL_FD_EPS) -> dict:
    """Mosaic's `gradient/fd_check` for this task: 8 x 2 x 4 cells, the
    corner load, its random density (seed 0), the loss `C^2`, its 6
    directions, central differences at `eps * rms(rho)` (float64 here;
    Mosaic's solvers return float32)."""
    import sciad as sd

    task = Structural(8, 2, 4, corner=True)
    rho = random_density(8, 2, 4).astype(np.float64)
    loss = sd.function(lambda r: task.compliance(r) ** 2)
    g = np.asarray(sd.function(sd.grad(lambda r: task.compliance(r) ** 2))(rho))
    dirs = mosaic_directions(rho.size)
    out = _fd_table(loss, g, rho, dirs, eps_values)
    # how far the largest step leaves the box [0, 1], where the clip bites
    h = max(eps_values) * float(np.sqrt(np.mean(rho ** 2)))
    out["outside"] = int(sum(np.sum((rho + s * h * v < 0) | (rho + s * h * v > 1))
                             for v in dirs for s in (1, -1)))
    return out


def topopt(nx: int = 16, ny: int = 2, nz: int = 8, iters: int = 2500, patience: int = 100,
           lr: float = 0.05, v_frac: float = 0.5, penalty: float = 50.0,
           x_min: float = 1e-3) -> dict:
    """Mosaic's `optimization/topopt` (Adam): the corner load, from a
    uniform `v_frac`, the loss `C + penalty (mean(rho) - v_frac)^2`, Adam
    (optax's defaults: b1 0.9, b2 0.999, eps 1e-8) at `lr`, the density
    clipped to [x_min, 1] after each step, stopped after `patience`
    iterations without a new best loss or at `iters`; Mosaic reports the
    compliance of the last evaluated density."""
    import sciad as sd
    import sciad.numpy as snp

    task = Structural(nx, ny, nz, corner=True)
    vg = sd.function(sd.value_and_grad(
        lambda r: task.compliance(r) + penalty * (snp.mean(r) - v_frac) ** 2))
    x = np.full(task.n_cells, v_frac)
    m, v = np.zeros_like(x), np.zeros_like(x)
    history, best, stale = [], np.inf, 0
    t0 = time.perf_counter()
    for i in range(1, iters + 1):
        loss, g = vg(x)
        loss, g = float(loss), np.asarray(g, np.float64)
        history.append((loss - penalty * (x.mean() - v_frac) ** 2, float(x.mean())))
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        x = np.clip(x - lr * (m / (1 - 0.9 ** i)) / (np.sqrt(v / (1 - 0.999 ** i)) + 1e-8),
                    x_min, 1.0)
        best, stale = (loss, 0) if loss < best else (best, stale + 1)
        if stale >= patience:
            break
    seconds = time.perf_counter() - t0
    C = [c for c, _ in history]
    return {"nx": nx, "ny": ny, "nz": nz, "iters": len(history), "budget": iters,
            "converged": len(history) < iters, "initial": C[0], "final": C[-1],
            "best": min(C), "final_vol": history[-1][1], "rho": x,
            "grey": float(np.mean((x > 0.1) & (x < 0.9))), "seconds": seconds,
            "per_iter_ms": 1e3 * seconds / len(history)}


# ---------------------------------------------------------------------------
# 4. cost, each (tool, nx) in a process of its own


def _child(tool: str, nx: int, repeats: int, task_name: str = "thermal") -> dict:
    """Times and peak memory of one tool at one size of one task (`thermal`:
    `Thermal(nx)`; `structural`: `Structural(nx)`, Mosaic's cost mesh
    `nx x 2 x nx/2` with the full-face load), in this process."""
    from _harness import reset_peak, status_mb

    import sciad  # noqa: F401  (before JAX, as sciad's guides import it: JAX then passes
    import jax    # large constants to the executable, `sciad.config.constants_policy`)

    jax.config.update("jax_enable_x64", True)
    base = status_mb("VmRSS")
    reset_peak()
    t0 = time.perf_counter()
    task = Thermal(nx) if task_name == "thermal" else Structural(nx)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    inputs = [np.clip(0.5 + 0.1 * rng.standard_normal(task.n_cells), 0.05, 0.95)
              for _ in range(repeats + 1)]
    out = {"task": task_name, "tool": tool, "nx": nx, "nodes": task.n_nodes,
           "cells": task.n_cells, "unknowns": task.n_free, "setup_s": setup, "base_mb": base}
    if tool == "sciad":
        import sciad as sd

        fwd = sd.function(task.compliance)
        vg = sd.function(sd.value_and_grad(task.compliance))
        t0 = time.perf_counter()
        first = jax.block_until_ready(vg(inputs[0]))
        out["first_s"] = time.perf_counter() - t0 + setup
        jax.block_until_ready(fwd(inputs[0]))
        run_f = lambda x: jax.block_until_ready(fwd(x))  # noqa: E731
        run_vg = lambda x: jax.block_until_ready(vg(x))  # noqa: E731
    elif tool == "torch-fem":  # (bench/_torchfem.py)
        from _torchfem import TorchFemStructural, TorchFemThermal

        t0 = time.perf_counter()
        peer = (TorchFemThermal if task_name == "thermal" else TorchFemStructural)(task)
        first = peer.value_and_grad(inputs[0])
        out["first_s"] = time.perf_counter() - t0 + setup
        run_f = lambda x: peer.value_and_grad(x, grad=False)  # noqa: E731
        run_vg = peer.value_and_grad
    else:
        t0 = time.perf_counter()
        first = task.scipy_value_and_grad(inputs[0])
        out["first_s"] = time.perf_counter() - t0 + setup
        run_f = lambda x: task.scipy_value_and_grad(x, grad=False)  # noqa: E731
        run_vg = task.scipy_value_and_grad
    out["C"] = float(first[0])  # (at inputs[0]: the tools' values compared)
    for name, run in (("fwd_s", run_f), ("vg_s", run_vg)):
        times = []
        for x in inputs[1:]:
            t0 = time.perf_counter()
            run(x)
            times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times))
    out["peak_mb"] = status_mb("VmHWM")
    return out


def _has_torchfem() -> bool:
    """Whether torch-fem (the peer, `pip install torch-fem`) is installed."""
    import importlib.util

    return importlib.util.find_spec("torchfem") is not None


def cost(sizes, repeats: int, task: str = "thermal") -> list[dict]:
    rows = []
    tools = ("sciad", "scipy") + (("torch-fem",) if _has_torchfem() else ())
    for nx in sizes:
        for tool in tools:
            reps = repeats if nx <= 256 else max(2, repeats // 2)
            done = subprocess.run([sys.executable, __file__, "--child", tool, str(nx),
                                   str(reps), task], capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"{task}: {tool} at nx = {nx} failed:\n"
                                   f"{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {task} {tool} nx = {nx}: {rows[-1]['vg_s']:.3g} s value+grad",
                  file=sys.stderr)
    return rows


# ---------------------------------------------------------------------------
# report


def render_recovery(recov) -> list[str]:
    """The recovery section's lines (`recovery()`'s rows), beside Mosaic's
    published final errors."""
    out = ["", "## Conductivity recovery, Mosaic's `optimization/conductivity_recovery_bfgs`",
           "", "nx = 16, Lz = 1, from a uniform density 0.5, bounds [1e-3, 1], a budget of "
           "200 iterations (L-BFGS-B) or evaluations (Gauss-Newton, in the density or in "
           "the conductivity `k(rho)`: the density's Jacobian vanishes where the truth is "
           "small, condition number ~2e9); the identification "
           "error `sum (T - T_target)^2` over the nodes (initially "
           f"{recov[0]['initial']:.3g} for Mosaic's target). Mosaic's target is made "
           "with the face flux lumped as `q_n dy dz / 4` once per node, where the solvers "
           "give each node that share from each face quad it belongs to (here 0.5625 of "
           "the total flux), so its error need not reach 0. The consistent target is "
           "the truth density's temperature under the solvers' flux.", "",
           "| target | method | final error | budget used | converged | relative "
           "error of rho | s |", "|---|---|---:|---|---|---:|---:|"]
    for r in recov:
        out.append(f"| {r['target']} | {r['method']} | {r['final']:.3g} | {r['steps']} | "
                   f"{'yes' if r['converged'] else 'no'} | {r['rho_error']:.3f} | "
                   f"{r['seconds']:.1f} |")
    out += ["", "Mosaic's published final errors on its target (L-BFGS, 200 iterations, "
            "none converged): " + ", ".join(f"{k} {v:.3g}" for k, v in
                                            PUBLISHED_RECOVERY.items()) + "."]
    return out


def render(agree, fd, costs, machine, argv, recov=()) -> str:
    from _harness import report_head, yes_no

    out = report_head("Mosaic's thermal_mesh task: sciad against Mosaic's references and SciPy",
                      argv, machine)
    out += ["", "## Forward agreement with Mosaic's references", "",
            "Thermal compliance `C`; the references are Mosaic v0.2.0's shipped float32 "
            "values (`references/forward_agreement.npz`, `forward_baseline.npz`).", "",
            "| case | sciad C | Mosaic's reference | relative error |",
            "|---|---:|---:|---:|"]
    for r in agree:
        out.append(f"| {r['case']} | {r['C']:.7g} | {r['ref']:.8g} | {r['rel']:.1e} |")
    worst = max(r["rel"] for r in agree)
    out += ["", f"Largest relative error: {worst:.1e} (the references are float32: "
            f"about 6e-8 of rounding).", "",
            "## The gradient check, as Mosaic's `gradient/fd_check` computes it", "",
            "nx = 8, Mosaic's random density (seed 0), the loss `C^2`, 6 unit random "
            "directions, central differences at `eps * rms(rho)`.", "",
            "| eps | mean relative error | 1 - cos |", "|---:|---:|---:|"]
    for eps, v in fd.items():
        out.append(f"| {eps:g} | {v['rel']:.1e} | {v['one_minus_cos']:.1e} |")
    best = min(v["rel"] for v in fd.values())
    out += ["", f"Best-eps error: {best:.1e}."]
    if recov:
        out += render_recovery(recov)
    out += ["", "## Cost over Mosaic's resolution sweep", "",
            "Seconds, medians after the first call, each call on new densities; `first "
            "call` includes building the mesh's index maps and (sciad) tracing, compiling "
            "and the solver's analysis; peak resident memory of the process (MB). SciPy: "
            "`spsolve` and the hand-written adjoint.", "",
            "| nx | nodes | sciad fwd | sciad value+grad | SciPy fwd | SciPy value+grad | "
            "vg sciad/SciPy | sciad first call | SciPy first call | first sciad/SciPy | "
            "peak sciad MB | peak SciPy MB | peak sciad/SciPy |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(c["tool"], c["nx"]): c for c in costs}
    for nx in sorted({c["nx"] for c in costs}):
        s, p = by[("sciad", nx)], by[("scipy", nx)]
        out.append(
            f"| {nx} | {s['nodes']:,} | {s['fwd_s']:.3g} | {s['vg_s']:.3g} | {p['fwd_s']:.3g} | "
            f"{p['vg_s']:.3g} | {s['vg_s'] / p['vg_s']:.2f} | {s['first_s']:.3g} | "
            f"{p['first_s']:.3g} | {s['first_s'] / p['first_s']:.2f} | {s['peak_mb']:.0f} | "
            f"{p['peak_mb']:.0f} | {s['peak_mb'] / p['peak_mb']:.2f} |")
    if any(nx == 512 for _, nx in by):
        s, p = by[("sciad", 512)], by[("scipy", 512)]
        out += ["", "Targets at nx = 512 (issue 51): value + gradient <= 0.5x SciPy's: "
                f"{s['vg_s'] / p['vg_s']:.2f} ({yes_no(s['vg_s'] <= 0.5 * p['vg_s'])}); "
                f"first call <= 0.5x SciPy's whole call: {s['first_s'] / p['first_s']:.2f} "
                f"({yes_no(s['first_s'] <= 0.5 * p['first_s'])}); peak memory <= 1.2x "
                f"SciPy's: {s['peak_mb'] / p['peak_mb']:.2f} "
                f"({yes_no(s['peak_mb'] <= 1.2 * p['peak_mb'])})."]
    if any(nx == 1024 for _, nx in by):
        s = by[("sciad", 1024)]
        out += [f"At nx = 1024: peak {s['peak_mb'] / 1024:.2f} GB (target <= 3 GB: "
                f"{yes_no(s['peak_mb'] <= 3 * 1024)})."]
    out += torchfem_rows(by, "its `SolidHeat` with the SIMP-scaled conductivity as Mosaic's "
                         "torch-fem solver builds it", "nx")
    out += ["", "Mosaic's published rows for this task (its hardware: GitHub Actions runners, "
            "the GPU solvers on a Tesla T4, the CPU ones on a CPU node; forward + VJP, s):", "",
            "| solver | nx | forward | VJP |", "|---|---:|---:|---:|"]
    for (name, nx), (f, v) in PUBLISHED.items():
        out.append(f"| {name} | {nx} | {f} | {v} |")
    return "\n".join(out) + "\n"


def torchfem_rows(by: dict, model: str, size: str) -> list[str]:
    """The torch-fem table of a task's report (`by`: its cost rows by
    `(tool, size)`), or nothing where torch-fem did not run."""
    peers = sorted(nx for tool, nx in by if tool == "torch-fem")
    if not peers:
        return []
    out = ["", f"torch-fem (the peer, on this machine, in the same harness: {model}, its "
           "default linear solver (direct below 10,000 unknowns, conjugate gradients with "
           "algebraic multigrid above), the gradient by torch's autograd through its "
           "implicit adjoint; `bench/_torchfem.py`). Its compliance against sciad's on the "
           "same densities:", "",
           f"| {size} | torch-fem fwd | torch-fem value+grad | vg sciad/torch-fem | torch-fem "
           "first call | first sciad/torch-fem | peak torch-fem MB | C: relative "
           "difference to sciad |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for nx in peers:
        t, s = by[("torch-fem", nx)], by[("sciad", nx)]
        out.append(f"| {nx} | {t['fwd_s']:.3g} | {t['vg_s']:.3g} | "
                   f"{s['vg_s'] / t['vg_s']:.2f} | {t['first_s']:.3g} | "
                   f"{s['first_s'] / t['first_s']:.2f} | {t['peak_mb']:.0f} | "
                   f"{abs(t['C'] - s['C']) / abs(s['C']):.1e} |")
    return out


STRUCTURAL_TITLE = "Mosaic's structural_mesh task: sciad against Mosaic's references and SciPy"


def render_structural(agree, fd, costs, opt, machine, argv) -> str:
    """The structural task's section of the results (its own title, command
    line and machine: it may be run apart from the thermal one)."""
    from _harness import report_head

    out = report_head(STRUCTURAL_TITLE, argv, machine)
    out += ["", "The task (`Structural` in `bench/mosaic.py`): SIMP compliance `C = f . u`, "
            "`K(rho) u = f`, of a linear-elastic HEX8 cantilever on `[0, 2] x [0, 1] x [0, 1]` "
            f"(E_max {E_MAX:,.0f}, E_min = {XMIN:g} E_max, p = 3, Poisson ratio {NU}), clamped "
            "at x = 0, loaded on the face x = 2; `nx x 2 x nz` cells.", "",
            "## Forward agreement with Mosaic's references", "",
            "Uniform density, the full-face load (total 1, `-z`) as a traction integrated over "
            "the face (the FEM solvers' convention); references: Mosaic v0.2.0's shipped "
            "float32 values (`forward_agreement.npz`: 8 x 2 x 4 cells; `forward_baseline.npz`: "
            "N x 2 x 4 cells). The last columns: the same cases with TopOpt.jl's load (the "
            "total split evenly over the face's nodes), by SciPy.", "",
            "| case | sciad C | Mosaic's reference | relative error | nodal-load C | its "
            "relative error |", "|---|---:|---:|---:|---:|---:|"]
    for r in agree:
        out.append(f"| {r['case']} | {r['C']:.8g} | {r['ref']:.8g} | {r['rel']:.1e} | "
                   f"{r['nodal']:.6g} | {r['nodal_rel']:.1e} |")
    worst = max(r["rel"] for r in agree)
    nodal = float(np.mean([r["nodal_rel"] for r in agree]))
    out += ["", f"Largest relative error: {worst:.1e} (the references are float32: "
            "their rounding is up to 6e-8). TopOpt.jl's nodal load is a "
            f"different discretized load: mean relative error {nodal:.2e} (Mosaic publishes "
            "5.53e-03 for TopOpt.jl, 0 for deal.II, FEniCS and Firedrake).", "",
            "## The gradient check, as Mosaic's `gradient/fd_check` computes it", "",
            "8 x 2 x 4 cells, the corner load (`+z` on the face quad at x = 2, y = 0, z = 0), "
            "Mosaic's random density (seed 0), the loss `C^2`, Mosaic's 6 unit directions "
            "(`jax.random`, key 0), central differences at `eps * rms(rho)`, in float64. The "
            "density is clipped to [0, 1] (as FEniCS's solver does); the largest steps leave "
            f"the box ({fd['outside']} perturbed entries at eps = {max(STRUCTURAL_FD_EPS):g}), "
            "which adds to the truncation error there.", "",
            "| eps | mean relative error | 1 - cos |", "|---:|---:|---:|"]
    for eps, v in fd.items():
        if eps != "outside":
            out.append(f"| {eps:g} | {v['rel']:.1e} | {v['one_minus_cos']:.1e} |")
    best = min(v["rel"] for k, v in fd.items() if k != "outside")
    out += ["", f"Best-eps error: {best:.1e}. Mosaic's published best-eps error for this task "
            f"(FEniCS, Firedrake, TopOpt.jl alike): {PUBLISHED_STRUCTURAL_FD[0]:.2e}, 1 - cos "
            f"{PUBLISHED_STRUCTURAL_FD[1]:.2e} (float32 outputs)."]
    if opt:
        out += ["", "## Topology optimisation, Mosaic's `optimization/topopt`", "",
                f"{opt['nx']} x {opt['ny']} x {opt['nz']} cells, the corner load, from a "
                "uniform 0.5; Mosaic's method: Adam (lr 0.05) on `C + 50 (mean(rho) - 0.5)^2` "
                "(a soft volume constraint), the density clipped to [1e-3, 1] after each step, "
                f"at most {opt['budget']} iterations, stopped after 100 without a new best "
                "loss; sciad's value and gradient each iteration. `grey`: the fraction of "
                "cells with 0.1 < rho < 0.9.", "",
                "| iterations | converged | initial C | final C | best C | final volume "
                "fraction | grey | s | ms / iteration |",
                "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
                f"| {opt['iters']} | {'yes' if opt['converged'] else 'no'} | "
                f"{opt['initial']:.4g} | {opt['final']:.4g} | {opt['best']:.4g} | "
                f"{opt['final_vol']:.5f} | {opt['grey']:.3f} | {opt['seconds']:.1f} | "
                f"{opt['per_iter_ms']:.1f} |", "",
                "Mosaic's published final compliance (2500 iterations, none converged): "
                + ", ".join(f"{k} {v:.2e}" for k, v in PUBLISHED_TOPOPT.items()) + "."]
    out += ["", "## Cost", "",
            "Mosaic's cost mesh `N x 2 x N/2` cells, uniform-ish densities (0.5 + 0.1 noise), "
            "the full-face load; seconds, medians after the first call; `first call` includes "
            "building the index maps and (sciad) tracing, compiling and the solver's analysis; "
            "peak resident memory of the process (MB). SciPy: `spsolve` and the hand-written "
            "adjoint. Mosaic's sweep is N = 4 ... 16; larger N are ours.", "",
            "| N | cells | unknowns | sciad fwd | sciad value+grad | SciPy fwd | SciPy "
            "value+grad | vg sciad/SciPy | sciad first call | SciPy first call | peak sciad "
            "MB | peak SciPy MB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(c["tool"], c["nx"]): c for c in costs}
    for nx in sorted({c["nx"] for c in costs}):
        s, p = by[("sciad", nx)], by[("scipy", nx)]
        out.append(f"| {nx} | {s['cells']:,} | {s['unknowns']:,} | {s['fwd_s']:.3g} | "
                   f"{s['vg_s']:.3g} | {p['fwd_s']:.3g} | {p['vg_s']:.3g} | "
                   f"{s['vg_s'] / p['vg_s']:.2f} | {s['first_s']:.3g} | {p['first_s']:.3g} | "
                   f"{s['peak_mb']:.0f} | {p['peak_mb']:.0f} |")
    out += torchfem_rows(by, "its `Solid` with an `IsotropicElasticity3D` material whose "
                         "stiffness tensor is scaled per cell by the SIMP factor", "N")
    out += ["", "Mosaic's published rows for this task (its results page, v0.2.0: GitHub "
            "Actions runners, GPU-capable solvers on a Tesla T4 node, the CPU-only ones "
            "(deal.II, FEniCS, Firedrake) on a CPU node; seconds; VJP: the backward pass), "
            "beside sciad's forward and value + gradient here:", "",
            "| solver | N | forward | VJP | sciad fwd / it | sciad value+grad / its VJP |",
            "|---|---:|---:|---:|---:|---:|"]
    for (name, nx), (f, v) in PUBLISHED_STRUCTURAL.items():
        s = by.get(("sciad", nx))
        out.append(f"| {name} | {nx} | {f} | {v if v is not None else '—'} | "
                   + (f"{s['fwd_s'] / f:.2g}" if s else "—") + " | "
                   + (f"{s['vg_s'] / v:.2g}" if s and v else "—") + " |")
    return "\n".join(out) + "\n"


def merge(path: str, thermal: str | None = None, structural: str | None = None) -> str:
    """The results file with one task's section replaced (None: kept from
    the file at `path`, the thermal one checked to still hold its tables)."""
    old = open(path).read() if os.path.exists(path) else ""
    head = "# " + STRUCTURAL_TITLE
    old_thermal, found, old_structural = old.partition(head)
    if thermal is None:
        if "## Cost over Mosaic's resolution sweep" not in old_thermal:
            raise RuntimeError(f"{path} has no thermal section to keep: run with "
                               "--task thermal (or both) to write it")
        thermal = old_thermal.rstrip("\n") + "\n"
    if structural is None:
        structural = head + old_structural if found else ""
    return thermal + ("\n" + structural if structural else "")


def replace_recovery(text: str, recov) -> str:
    """`text` (the results file) with its recovery section replaced by one
    of `recov` (the rest of the file kept as it was measured)."""
    head = "## Conductivity recovery"
    start = text.index(head)
    end = text.index("## Cost over Mosaic's resolution sweep", start)
    return text[:start] + "\n".join(render_recovery(recov)[1:]) + "\n\n" + text[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", action="store_true",
                        help="also nx = 1024 (thermal), N = 128 (structural)")
    parser.add_argument("--quick", action="store_true",
                        help="nx up to 64 (thermal), N up to 16 and 300 Adam iterations "
                             "(structural), 2 repeats")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--task", choices=("both", "thermal", "structural"), default="both",
                        help="which of Mosaic's tasks to run (the file keeps the other's "
                             "section)")
    parser.add_argument("--recovery-only", action="store_true",
                        help="run the conductivity recovery alone and replace its section of "
                             "the results file (the other sections kept)")
    parser.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        tool, nx, reps, *task = args.child
        print(json.dumps(_child(tool, int(nx), int(reps), *task)))
        return 0

    import jax

    jax.config.update("jax_enable_x64", True)
    from _harness import command_line, load_average, machine_info, publish

    load = load_average()
    argline = command_line("bench/mosaic.py", argv)
    if args.recovery_only:
        text = replace_recovery(open(RESULTS).read(), recovery())
        publish(RESULTS, text, not args.no_write)
        return 0
    thermal = structural = None
    if args.task in ("both", "thermal"):
        agree = agreement()
        fd = fd_check()
        recov = recovery()
        sizes = [16, 32, 64] if args.quick else [16, 32, 64, 128, 256, 512] + (
            [1024] if args.big else [])
        costs = cost(sizes, 2 if args.quick else 5)
        thermal = render(agree, fd, costs, machine_info(load), argline, recov)
    if args.task in ("both", "structural"):
        s_agree = structural_agreement()
        s_fd = structural_fd_check()
        s_opt = topopt(iters=300 if args.quick else 2500)
        s_sizes = [4, 8, 16] if args.quick else [4, 6, 8, 12, 16, 32, 64] + (
            [128] if args.big else [])
        s_costs = cost(s_sizes, 2 if args.quick else 5, "structural")
        structural = render_structural(s_agree, s_fd, s_costs, s_opt, machine_info(load),
                                       argline)
    if args.no_write:
        text = (thermal or "") + ("\n" if thermal and structural else "") + (structural or "")
    else:
        text = merge(RESULTS, thermal, structural)
    publish(RESULTS, text, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
