"""Mosaic's thermal_mesh task as a sciad program, against Mosaic's reference
values and SciPy on the same machine.

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

sciad's program: the matrix's values `k_e Ke[a, b]` traced on a pattern
fixed per mesh (`sd.sparse.coo_matrix`: the duplicate entries of
neighbouring cells summed by a map made once), the Dirichlet nodes
eliminated, the solve tagged `spd` (`solver="auto"`), `C = f . T`; its
gradient by `sd.value_and_grad` (the adjoint of the solve, sciad's rule).
SciPy's: `scipy.sparse.coo_matrix(...).tocsr()`, `spsolve`, and the gradient
written by hand (compliance is self-adjoint: `dC/drho_e = -k'(rho_e)
T_e . Ke T_e`).

Run from the repository root:

    .venv/bin/python bench/mosaic.py                 # nx up to 512 (~5 min on 2 cores)
    .venv/bin/python bench/mosaic.py --big           # and nx = 1024 (1.05 M nodes, ~8 GB)
    .venv/bin/python bench/mosaic.py --quick --no-write

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
   Gauss-Newton on its Jacobian, for Mosaic's target and for a target of
   the same physics (Mosaic's target lumps the face flux differently from
   the solvers, so its error need not reach 0), beside Mosaic's published
   final errors.
4. Cost over Mosaic's resolution sweep (nx = 16 ... 512, 1024 with
   `--big`): forward and value + gradient, medians after the first call,
   the first call (trace, compile, analysis), and the peak resident memory,
   each (tool, nx) in a fresh process; sciad's time against SciPy's, and
   Mosaic's published rows beside them (their hardware: GitHub Actions
   runners, a Tesla T4 for the GPU solvers).
"""

from __future__ import annotations

import argparse
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


def conductance(dx: float, dy: float, dz: float) -> np.ndarray:
    """The 8 x 8 conductance matrix of a `dx x dy x dz` trilinear brick, by
    2 x 2 x 2 Gauss quadrature (Mosaic's `_compute_K_ref_simple`)."""
    ref = np.array([[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1],
                    [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1]], float)
    jinv = np.diag([2.0 / dx, 2.0 / dy, 2.0 / dz])
    K = np.zeros((8, 8))
    for a in (-1.0, 1.0):
        for b in (-1.0, 1.0):
            for c in (-1.0, 1.0):
                xi, eta, zeta = np.array([a, b, c]) / np.sqrt(3.0)
                dN = np.stack([ref[:, 0] * (1 + ref[:, 1] * eta) * (1 + ref[:, 2] * zeta),
                               (1 + ref[:, 0] * xi) * ref[:, 1] * (1 + ref[:, 2] * zeta),
                               (1 + ref[:, 0] * xi) * (1 + ref[:, 1] * eta) * ref[:, 2]],
                              axis=1) / 8.0
                B = dN @ jinv
                K += dx * dy * dz / 8.0 * B @ B.T
    return K


def random_density(nx: int, ny: int, nz: int = 1, seed: int = 0) -> np.ndarray:
    """Mosaic's `random` initial condition: `0.5 + 0.3 N(0, 1)` per cell
    (NumPy's default generator, `seed`), float32, clipped to [0.05, 0.95]."""
    rng = np.random.default_rng(seed)
    rho = 0.5 + 0.3 * rng.standard_normal(nx * ny * nz).astype(np.float32)
    return np.clip(rho, 0.05, 0.95).astype(np.float32)


class Thermal:
    """One mesh of the task: what every call shares (built once, O(cells)
    index arrays): the free nodes, the load on them, and for each stored
    entry of the element matrices between two free nodes its cell, its
    element-matrix entry and its (row, column) among the free nodes."""

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
        number = np.full(n, -1, np.int64)
        number[free] = np.arange(free.size)
        local = number[cells]                                   # (m, 8), -1: fixed
        a, b = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
        rows, cols = local[:, a.ravel()], local[:, b.ravel()]   # (m, 64)
        keep = (rows >= 0) & (cols >= 0)
        self.cell = np.nonzero(keep)[0].astype(np.int32)
        self.Ke = conductance(dx, dy, dz)
        self.ke = np.broadcast_to(self.Ke.ravel(), keep.shape)[keep]
        self.rows, self.cols = rows[keep].astype(np.int32), cols[keep].astype(np.int32)
        self.n_free, self.f = free.size, f[free]
        self.local = local
        self.n_cells = cells.shape[0]
        self.free, self.n_nodes, self.points, self.qn = free, n, points, qn
        self.dy, self.dz = dy, dz

    def temperature(self, rho):
        """The temperature at the free nodes (the others are 0), a sciad
        function of the per-cell density."""
        import sciad as sd
        import sciad.numpy as snp

        k = K_MIN + (K_MAX - K_MIN) * snp.clip(rho, 0.0, 1.0) ** P
        A = sd.sparse.coo_matrix((k[self.cell] * self.ke, (self.rows, self.cols)),
                                 shape=(self.n_free, self.n_free), tags=["spd"])
        return sd.linalg.solve(A, self.f)

    # --- sciad ---

    def compliance(self, rho):
        """`C(rho)`, a sciad function of the per-cell density."""
        import sciad.numpy as snp

        return snp.dot(self.f, self.temperature(rho))

    # --- SciPy, and its gradient by hand ---

    def scipy_matrix(self, rho):
        """`(K(rho) on the free nodes, CSC, clip(rho, 0, 1))` by SciPy."""
        import scipy.sparse as sp

        r = np.clip(np.asarray(rho, np.float64), 0.0, 1.0)
        k = K_MIN + (K_MAX - K_MIN) * r ** P
        return sp.coo_matrix((k[self.cell] * self.ke, (self.rows, self.cols)),
                             shape=(self.n_free, self.n_free)).tocsc(), r

    def scipy_value_and_grad(self, rho, grad: bool = True):
        import scipy.sparse.linalg as spla

        A, r = self.scipy_matrix(rho)
        T = spla.spsolve(A, self.f)
        C = float(self.f @ T)
        if not grad:
            return C, None
        Tc = np.where(self.local >= 0, T[np.maximum(self.local, 0)], 0.0)  # (m, 8)
        energy = np.einsum("ma,ab,mb->m", Tc, self.Ke, Tc)
        dk = (K_MAX - K_MIN) * P * r ** (P - 1) * ((np.asarray(rho) >= 0) & (np.asarray(rho) <= 1))
        return C, -dk * energy


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
    ad = np.array([g @ v for v in dirs])
    out = {}
    for eps in (1.0, 1e-1, 1e-2, 1e-3, 1e-4):
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
    factorization, a solve per density; `budget` evaluations)."""
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
        t0 = time.perf_counter()
        res = so.least_squares(lambda r: np.asarray(temperature(r)) - tf, start,
                               jac=lambda r: np.asarray(jacobian(r)), bounds=(1e-3, 1.0),
                               method="trf", xtol=1e-15, ftol=1e-15, gtol=1e-12,
                               max_nfev=budget)
        rows.append({"target": name, "method": "Gauss-Newton (Jacobian)",
                     "final": 2 * float(res.cost) + rest, "steps": f"{res.nfev} evaluations",
                     "converged": res.status > 0,
                     "rho_error": float(np.linalg.norm(res.x - truth) / np.linalg.norm(truth)),
                     "seconds": time.perf_counter() - t0, "initial": rows[-1]["initial"]})
    return rows


#: Mosaic's published L-BFGS recovery (its results page, v0.2.0): the final
#: identification error within 200 iterations; none converged
PUBLISHED_RECOVERY = {"torch-fem": 6.87e2, "JAX-FEM": 9.22e2, "FEniCS": 4.67e4,
                      "Firedrake": 1.29e5}


# ---------------------------------------------------------------------------
# 4. cost, each (tool, nx) in a process of its own


def _child(tool: str, nx: int, repeats: int) -> dict:
    """Times and peak memory of one tool at one size, in this process."""
    from _harness import reset_peak, status_mb

    import jax

    jax.config.update("jax_enable_x64", True)
    base = status_mb("VmRSS")
    reset_peak()
    t0 = time.perf_counter()
    task = Thermal(nx)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    inputs = [np.clip(0.5 + 0.1 * rng.standard_normal(task.n_cells), 0.05, 0.95)
              for _ in range(repeats + 1)]
    out = {"tool": tool, "nx": nx, "nodes": task.n_nodes,
           "setup_s": setup, "base_mb": base}
    if tool == "sciad":
        import sciad as sd

        fwd = sd.function(task.compliance)
        vg = sd.function(sd.value_and_grad(task.compliance))
        t0 = time.perf_counter()
        jax.block_until_ready(vg(inputs[0]))
        out["first_s"] = time.perf_counter() - t0 + setup
        jax.block_until_ready(fwd(inputs[0]))
        run_f = lambda x: jax.block_until_ready(fwd(x))  # noqa: E731
        run_vg = lambda x: jax.block_until_ready(vg(x))  # noqa: E731
    else:
        t0 = time.perf_counter()
        task.scipy_value_and_grad(inputs[0])
        out["first_s"] = time.perf_counter() - t0 + setup
        run_f = lambda x: task.scipy_value_and_grad(x, grad=False)  # noqa: E731
        run_vg = task.scipy_value_and_grad
    for name, run in (("fwd_s", run_f), ("vg_s", run_vg)):
        times = []
        for x in inputs[1:]:
            t0 = time.perf_counter()
            run(x)
            times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times))
    out["peak_mb"] = status_mb("VmHWM")
    return out


def cost(sizes, repeats: int) -> list[dict]:
    rows = []
    for nx in sizes:
        for tool in ("sciad", "scipy"):
            reps = repeats if nx <= 256 else max(2, repeats // 2)
            done = subprocess.run([sys.executable, __file__, "--child", tool, str(nx),
                                   str(reps)], capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"{tool} at nx = {nx} failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {tool} nx = {nx}: {rows[-1]['vg_s']:.3f} s value+grad", file=sys.stderr)
    return rows


# ---------------------------------------------------------------------------
# report


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
        out += ["", "## Conductivity recovery, Mosaic's `optimization/conductivity_recovery_bfgs`",
                "", "nx = 16, Lz = 1, from a uniform density 0.5, bounds [1e-3, 1], a budget of "
                "200 iterations (L-BFGS-B) or evaluations (Gauss-Newton); the identification "
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
    out += ["", "Mosaic's published rows for this task (its hardware: GitHub Actions runners, "
            "the GPU solvers on a Tesla T4, the CPU ones on a CPU node; forward + VJP, s):", "",
            "| solver | nx | forward | VJP |", "|---|---:|---:|---:|"]
    for (name, nx), (f, v) in PUBLISHED.items():
        out.append(f"| {name} | {nx} | {f} | {v} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", action="store_true", help="also nx = 1024")
    parser.add_argument("--quick", action="store_true", help="nx up to 64, 2 repeats")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("TOOL", "NX", "REPEATS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        tool, nx, reps = args.child
        print(json.dumps(_child(tool, int(nx), int(reps))))
        return 0

    import jax

    jax.config.update("jax_enable_x64", True)
    from _harness import command_line, load_average, machine_info, publish

    load = load_average()
    agree = agreement()
    fd = fd_check()
    recov = recovery()
    sizes = [16, 32, 64] if args.quick else [16, 32, 64, 128, 256, 512] + (
        [1024] if args.big else [])
    costs = cost(sizes, 2 if args.quick else 5)
    text = render(agree, fd, costs, machine_info(load), command_line("bench/mosaic.py", argv),
                  recov)
    publish(RESULTS, text, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
