"""Topology optimization: SIMP compliance minimization in 2-D and 3-D.

The classic density method (Andreassen et al., "Efficient topology
optimization in MATLAB using 88 lines of code", 2011), with sciad computing
the compliance and its gradient. A design `x` (one density per element, in
[0, 1]) is smoothed by a density filter (`rho = H x / H 1`, the weights
`H_ij = max(0, r - |c_i - c_j|)` a SciPy sparse matrix built once, applied
in the program as a constant `sd.sparse` matrix); each element's Young's
modulus is `E(rho) = Emin + rho^p (E0 - Emin)` (E0 = 1, Emin = 1e-9, p = 3,
Poisson's ratio 0.3). The stiffness matrix is the per-element moduli times
the unit element matrix, summed by `sd.sparse.assemble_elements` onto a
pattern computed once from each element's degrees of freedom numbered among
the free ones (the supports' rows and columns dropped), tagged `spd`; the
compliance is `c = f . K(rho)^-1 f`. `sd.value_and_grad` gives its gradient
with sciad's rule for the sparse solve, no hand adjoint: the adjoint solve
`K^T lambda = f` of an `spd` matrix with the forward solve's right-hand side
is the forward solve itself, and the optimized graph holds one solve. The
value and gradient are compiled once by `sd.function` and called once per
step. The gradient is checked by a Taylor test before optimizing. The update
is the optimality-criteria (OC) step with a move limit of 0.2 and bisection
on the volume constraint's multiplier, stopped when no density moves by more
than 0.01 or after `--iters` steps.

- 2-D: the MBB half-beam (a 3:1 rectangle, symmetric about its left edge,
  rollers at its bottom-right corner, a unit load down at its top-left
  corner), 300 x 100 bilinear plane-stress quads (60,802 degrees of freedom),
  volume fraction 0.5, filter radius 2 elements. The solve is "auto" (a
  direct sparse factorization on the CPU).
- 3-D: a cantilever (clamped at x = 0, a line load down along the bottom
  edge of its free end), 24 x 12 x 24 eight-node hexahedra by default (6,912
  cells, 24,375 degrees of freedom), volume fraction 0.12, filter radius 1.5
  elements. A 3-D direct factorization fills in badly, so the solve is
  conjugate gradients preconditioned by algebraic multigrid fitted to the
  rigid-body modes (`sd.linalg.AMG(near_null_space=rigid_body_modes(points),
  block_size=3)`, relative residual 1e-8): a few tens of CG steps, more as
  the design's contrast grows (the plain `"amg"`, one constant per
  aggregate, takes about 240 on this mesh). Ten OC iterations by default,
  about 2 s each on two cores; the Taylor test runs on a 12 x 6 x 12 mesh.
  `--nx 60 --ny 30 --nz 60` (108,000 cells, 3.4 * 10^5 degrees of freedom,
  6.1 * 10^7 element-matrix entries) runs too: measured (before the CPU's
  sparse products moved to padded rows, about twice as fast), its first
  value and gradient traced in 26 s and compiled in 20 s, and the OC steps
  took 70 to 180 s each (CG takes more steps as the design's contrast
  grows): ten in 20 minutes on two cores.

Run: `python examples/topology_optimization.py` (both; `--dim 2` or
`--dim 3` for one); `--nx --ny [--nz]` for the mesh, `--iters` for the OC
iterations (default 150 in 2-D, 10 in 3-D), `--plot PATH` for the figure
(needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp

E0, EMIN, NU, PENAL = 1.0, 1e-9, 0.3, 3.0
MOVE = 0.2  # the OC step's move limit
RTOL_3D = 1e-8  # relative residual of the 3-D CG solves
TAYLOR_3D = (12, 6, 12)  # the mesh of the 3-D Taylor test (or the problem's, if smaller)


def element_stiffness(dim: int, nu: float = NU) -> np.ndarray:
    """The stiffness matrix of a unit square (plane stress) or cube element
    with E = 1, by 2-point Gauss quadrature (exact for these elements). Local
    nodes in the order of `itertools.product((0, 1), repeat=dim)` (the last
    coordinate fastest); degrees of freedom interleaved, `dim * node + axis`."""
    corners = np.array(list(itertools.product((0.0, 1.0), repeat=dim)))  # (nodes, dim)
    if dim == 2:
        D = np.array([[1.0, nu, 0.0], [nu, 1.0, 0.0], [0.0, 0.0, (1.0 - nu) / 2]]) / (1 - nu ** 2)
        shear = [(0, 1)]
    else:
        lam, mu = nu / ((1 + nu) * (1 - 2 * nu)), 1.0 / (2 * (1 + nu))
        D = np.zeros((6, 6))
        D[:3, :3] = lam
        D[:3, :3] += 2 * mu * np.eye(3)
        D[3:, 3:] = mu * np.eye(3)
        shear = [(1, 2), (0, 2), (0, 1)]
    gauss = 0.5 + np.array([-0.5, 0.5]) / np.sqrt(3.0)  # on [0, 1], weights 1/2
    KE = np.zeros((dim * len(corners),) * 2)
    for q in itertools.product(gauss, repeat=dim):
        q = np.asarray(q)
        # d N_a / d x_k of N_a = prod_j (c_aj q_j + (1 - c_aj)(1 - q_j))
        factors = corners * q + (1 - corners) * (1 - q)  # (nodes, dim)
        dN = np.empty_like(corners)
        for k in range(dim):
            others = np.prod(np.delete(factors, k, axis=1), axis=1)
            dN[:, k] = (2 * corners[:, k] - 1) * others
        B = np.zeros((len(D), dim * len(corners)))
        for k in range(dim):
            B[k, k::dim] = dN[:, k]
        for row, (i, j) in enumerate(shear, start=dim):
            B[row, i::dim] = dN[:, j]
            B[row, j::dim] = dN[:, i]
        KE += B.T @ D @ B * 0.5 ** dim
    return KE


class Problem:
    """A structured mesh of `shape` (elements per axis) unit elements, its
    supports and load, the pattern of the reduced stiffness matrix and the
    density filter: everything built once with NumPy and SciPy."""

    def __init__(self, shape: tuple[int, ...], kind: str, volfrac: float, rmin: float):
        self.shape, self.dim, self.volfrac = tuple(shape), len(shape), volfrac
        dim = self.dim
        nodes_shape = tuple(s + 1 for s in shape)
        node = np.arange(np.prod(nodes_shape)).reshape(nodes_shape)
        self.n_elem = int(np.prod(shape))
        # each element's nodes, in element_stiffness's order
        corners = [node[tuple(slice(c, c + s) for c, s in zip(off, shape))].ravel()
                   for off in itertools.product((0, 1), repeat=dim)]
        enodes = np.stack(corners, axis=1)                          # (elements, 2^dim)
        edofs = (dim * enodes[:, :, None] + np.arange(dim)).reshape(self.n_elem, -1)
        ndof = dim * node.size
        grid = np.stack(np.meshgrid(*[np.arange(s) for s in nodes_shape], indexing="ij"), -1)
        grid = grid.reshape(-1, dim)                                 # node coordinates
        self.points = grid.astype(np.float64)
        f = np.zeros(ndof)
        fixed = np.zeros(ndof, bool)
        if kind == "mbb":   # 2-D: x to the right, y up; symmetry at x = 0
            nx, ny = shape
            fixed[dim * np.flatnonzero(grid[:, 0] == 0)] = True                  # u_x = 0
            fixed[dim * np.flatnonzero((grid[:, 0] == nx) & (grid[:, 1] == 0)) + 1] = True
            f[dim * np.flatnonzero((grid[:, 0] == 0) & (grid[:, 1] == ny)) + 1] = -1.0
        elif kind == "cantilever":  # 3-D: clamped at x = 0; load along (x = nx, y = 0)
            nx = shape[0]
            fixed[(dim * np.flatnonzero(grid[:, 0] == 0)[:, None] + np.arange(dim)).ravel()] = True
            end = np.flatnonzero((grid[:, 0] == nx) & (grid[:, 1] == 0))
            f[dim * end + 1] = -1.0 / end.size
        else:
            raise ValueError(f"unknown problem {kind!r}: 'mbb' or 'cantilever'")
        free = np.flatnonzero(~fixed)
        number = np.full(ndof, -1, np.int64)
        number[free] = np.arange(free.size)
        # each element's dofs numbered among the free ones (-1: a support)
        self.local = number[edofs]                                   # (elements, 8 or 24)
        self.KE = element_stiffness(dim)
        # the element-matrix entries between two free dofs
        self.n_entries = int(np.sum((self.local >= 0).sum(axis=1) ** 2))
        self.n_free, self.f, self.free, self.ndof = free.size, f[free], free, ndof
        self.edofs = edofs
        self.H, self.Hs = density_filter(shape, rmin)
        self.dv = self.H.T @ (1.0 / self.Hs) / self.n_elem  # d volume / d x

    def amg(self) -> sd.linalg.AMG:
        """Algebraic multigrid fitted to the rigid-body modes of the free
        degrees of freedom (elasticity's near-null space, node by node)."""
        modes = sd.linalg.rigid_body_modes(self.points)[self.free]
        return sd.linalg.AMG(near_null_space=modes, block_size=self.dim)

    def filter(self, x):
        """`rho = H x / H 1`, in the program (`H` a constant sparse matrix)."""
        return sd.sparse.from_scipy(self.H) @ x / self.Hs

    def stiffness(self, rho):
        E = EMIN + rho ** PENAL * (E0 - EMIN)
        return sd.sparse.assemble_elements(E[:, None, None] * self.KE, self.local,
                                           shape=(self.n_free, self.n_free), tags=["spd"])


def density_filter(shape, rmin: float) -> tuple[sp.csr_matrix, np.ndarray]:
    """The filter's weights `H_ij = max(0, rmin - |c_i - c_j|)` between element
    centres (a sparse matrix, built from the offsets within the radius, no loop
    over elements) and their row sums."""
    dim, r = len(shape), int(np.ceil(rmin)) - 1
    idx = np.arange(np.prod(shape)).reshape(shape)
    rows, cols, vals = [], [], []
    for off in itertools.product(range(-r, r + 1), repeat=dim):
        w = rmin - np.sqrt(np.sum(np.square(off)))
        if w <= 0:
            continue
        src = tuple(slice(max(0, -o), s - max(0, o)) for o, s in zip(off, shape))
        dst = tuple(slice(max(0, o), s - max(0, -o)) for o, s in zip(off, shape))
        rows.append(idx[src].ravel())
        cols.append(idx[dst].ravel())
        vals.append(np.full(rows[-1].size, w))
    n = idx.size
    H = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n, n))
    return H, np.asarray(H.sum(axis=1)).ravel()


def compliance(problem: Problem, x, **solve_options):
    """`c(x) = f . K(rho(x))^-1 f`, a sciad function of the design."""
    u = sd.linalg.solve(problem.stiffness(problem.filter(x)), problem.f, **solve_options)
    return snp.dot(problem.f, u)


def oc_update(problem: Problem, x: np.ndarray, dc: np.ndarray) -> np.ndarray:
    """The optimality-criteria step: `x * sqrt(-dc / (lambda dv))` within the
    move limit and [0, 1], `lambda` by bisection so that the filtered
    volume is the target."""
    dv, target = problem.dv, problem.volfrac
    lo, hi = 0.0, 1e9
    scale = np.sqrt(np.maximum(-dc, 0.0) / dv)
    while (hi - lo) / (hi + lo) > 1e-3:
        mid = 0.5 * (lo + hi)
        xnew = np.clip(x * scale / np.sqrt(mid), np.maximum(0.0, x - MOVE),
                       np.minimum(1.0, x + MOVE))
        if np.mean(problem.H @ xnew / problem.Hs) > target:
            lo = mid
        else:
            hi = mid
    return xnew


def _no_options(problem: Problem) -> dict:
    return {}


def taylor_check(problem: Problem, say, label: str, value_and_grad=None,
                 options=_no_options) -> np.ndarray:
    """The Taylor test of the compliance (sciad's gradient, by
    `value_and_grad` if given) at a perturbed uniform design, in a random
    direction, the solve's options `options(problem)`; printed and
    asserted."""
    fun = lambda x: compliance(problem, x, **options(problem))  # noqa: E731
    value_and_grad = value_and_grad or sd.function(sd.value_and_grad(fun))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    x = np.clip(problem.volfrac + 0.1 * rng.uniform(-1, 1, problem.n_elem), 0.01, 1.0)
    rates = sd.testing.taylor_test(fun, x, rng.standard_normal(x.size),
                                   grad=lambda x: np.asarray(value_and_grad(x)[1]))
    mesh = " x ".join(map(str, problem.shape))
    say(f"Taylor test of the compliance on the {mesh} mesh (remainder rates, want ~2): "
        f"{np.array2string(rates, precision=3)} ({time.perf_counter() - t0:.1f} s)")
    assert np.all(np.abs(rates - 2.0) < 0.2), f"{label}: Taylor test failed: rates {rates}"
    return rates


def optimize(problem: Problem, iters: int, say, label: str, every: int = 10,
             taylor_problem: Problem | None = None, options=_no_options) -> dict:
    """The Taylor test of the compliance (on `taylor_problem`, by default
    `problem` itself), then at most `iters` OC iterations from the uniform
    design; the solves' options `options(problem)`. Returns the history, the
    final design (filtered) and the timings."""
    fun = lambda x: compliance(problem, x, **options(problem))  # noqa: E731
    value_and_grad = sd.function(sd.value_and_grad(fun))  # compiled once, called per step
    rates = taylor_check(taylor_problem or problem, say, label,
                         None if taylor_problem else value_and_grad, options)
    x = np.full(problem.n_elem, problem.volfrac)

    history, times = [], []
    t_start = time.perf_counter()
    it, change = 0, 1.0
    while it < iters and change > 0.01:
        it += 1
        t = time.perf_counter()
        c, dc = value_and_grad(x)
        c, dc = float(c), np.asarray(dc)
        x_new = oc_update(problem, x, dc)
        change = float(np.max(np.abs(x_new - x)))
        x = x_new
        history.append(c)
        times.append(time.perf_counter() - t)
        if it % every == 0 or it == 1 or it == iters or change <= 0.01:
            vol = float(np.mean(problem.H @ x / problem.Hs))
            say(f"  iter {it:3d}  compliance {c:.6e}  volume {vol:.4f}  change {change:.3f}"
                f"  ({times[-1]:.2f} s/iter, {time.perf_counter() - t_start:.1f} s)")
    elapsed = time.perf_counter() - t_start
    rho = problem.H @ x / problem.Hs
    c_final = float(value_and_grad(x)[0])
    say(f"done: {it} OC iterations in {elapsed:.1f} s ({elapsed / it:.2f} s each); compliance "
        f"{history[0]:.4f} -> {c_final:.4f}; volume {np.mean(rho):.4f} (target "
        f"{problem.volfrac}); largest change in the last step {change:.3f}")
    return {"history": history + [c_final], "x": x, "rho": rho, "rates": rates,
            "times": times, "elapsed": elapsed, "compliance": c_final,
            "volume": float(np.mean(rho))}


def run_2d(nx: int, ny: int, iters: int, say) -> dict:
    problem = Problem((nx, ny), "mbb", volfrac=0.5, rmin=2.0)
    say(f"2-D MBB beam: {nx} x {ny} quads, {problem.ndof} dofs ({problem.n_free} free), "
        f"{problem.n_entries} element-matrix entries, volume fraction {problem.volfrac}, "
        f"filter radius 2")
    out = optimize(problem, iters, say, "2-D")
    out["problem"] = problem
    return out


def run_3d(nx: int, ny: int, nz: int, iters: int, say) -> dict:
    problem = Problem((nx, ny, nz), "cantilever", volfrac=0.12, rmin=1.5)
    say(f"3-D cantilever: {nx} x {ny} x {nz} = {problem.n_elem} hexahedra, {problem.ndof} "
        f"dofs ({problem.n_free} free), {problem.n_entries} element-matrix entries, "
        f"volume fraction {problem.volfrac}; CG + AMG (rigid-body modes) to rtol {RTOL_3D:g}")
    # the Taylor test on a small mesh of the same problem and solver (each of
    # its six evaluations is an OC step's solve on the full mesh)
    small = Problem(tuple(min(s, t) for s, t in zip((nx, ny, nz), TAYLOR_3D)), "cantilever",
                    volfrac=0.12, rmin=1.5)
    out = optimize(problem, iters, say, "3-D", every=1, taylor_problem=small,
                   options=lambda p: dict(solver="cg", preconditioner=p.amg(), tol=RTOL_3D,
                                          maxiter=5000))
    out["problem"] = problem
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", choices=("2", "3", "both"), default="both",
                   help="which problem to run (default both)")
    p.add_argument("--nx", type=int, default=None,
                   help="elements along x (default 300 in 2-D, 24 in 3-D)")
    p.add_argument("--ny", type=int, default=None,
                   help="elements along y (default 100 in 2-D, 12 in 3-D)")
    p.add_argument("--nz", type=int, default=24, help="elements along z, 3-D (default 24)")
    p.add_argument("--iters", type=int, default=None,
                   help="OC iterations (default 150 in 2-D, 10 in 3-D)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write the figure to PATH")
    args = p.parse_args(argv)
    for name in ("nx", "ny", "nz", "iters"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "iters" else 2):
            p.error(f"--{name} must be at least {1 if name == 'iters' else 2}, got {value}")
    return args


def main(argv=None, verbose: bool = True) -> dict:
    """Runs the problems `argv` asks for (`--dim 2|3|both`); returns
    `{"2d": ..., "3d": ...}` (each: the compliance history, the design, the
    Taylor rates, the timings)."""
    args = parse_args(argv)
    say = print if verbose else (lambda *a, **k: None)
    results = {}
    if args.dim in ("2", "both"):
        results["2d"] = run_2d(args.nx or 300, args.ny or 100, args.iters or 150, say)
    if args.dim in ("3", "both"):
        results["3d"] = run_3d(args.nx or 24, args.ny or 12, args.nz, args.iters or 10, say)
    if args.plot:
        if _plot(results, args.plot):
            say(f"figure written to {args.plot}")
    return results


def _plot(results: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    panels = [("2d", "design")] if "2d" in results else []
    panels += [("3d", "design")] if "3d" in results else []
    fig = plt.figure(figsize=(15, 4.2 * len(panels)))
    grid = fig.add_gridspec(len(panels), 3, width_ratios=(2.2, 1.3, 1))
    for row, (key, _) in enumerate(panels):
        out, problem = results[key], results[key]["problem"]
        hist_ax = fig.add_subplot(grid[row, 2])
        hist_ax.semilogy(np.arange(1, len(out["history"]) + 1), out["history"])
        hist_ax.set_xlabel("OC iteration")
        hist_ax.set_ylabel("compliance")
        hist_ax.set_title(f"{key[0]}-D: compliance history")
        if key == "2d":
            nx, ny = problem.shape
            ax = fig.add_subplot(grid[row, :2])
            rho = out["rho"].reshape(nx, ny).T
            full = np.hstack([rho[:, ::-1], rho])  # the whole beam: mirror the half
            ax.imshow(1.0 - full, cmap="gray", origin="lower", vmin=0, vmax=1,
                      extent=(-nx, nx, 0, ny), interpolation="nearest")
            ax.set_title(f"2-D MBB beam, {nx} x {ny} half (mirrored), "
                         f"compliance {out['compliance']:.1f}")
            ax.set_axis_off()
        else:
            nx, ny, nz = problem.shape
            rho = out["rho"].reshape(nx, ny, nz)
            ax = fig.add_subplot(grid[row, 0], projection="3d")
            step = max(1, max(problem.shape) // 40)  # at most ~40 voxels a side
            solid = rho[::step, ::step, ::step] > 0.5
            ax.voxels(solid, facecolors="#7f9fcf", edgecolor="none")
            ax.set_box_aspect(solid.shape)
            ax.set_xlabel("x")
            ax.set_ylabel("y")
            ax.set_zlabel("z")
            ax.view_init(elev=20, azim=-60)
            ax.set_title(f"3-D cantilever {nx} x {ny} x {nz}: rho > 0.5 "
                         f"({len(out['history']) - 1} OC iterations)")
            ax2 = fig.add_subplot(grid[row, 1])
            ax2.imshow(1.0 - rho[:, :, nz // 2].T, cmap="gray", origin="lower", vmin=0, vmax=1,
                       interpolation="nearest")
            ax2.set_title(f"3-D: slice z = {nz // 2} (mid-width)")
            ax2.set_xlabel("x")
            ax2.set_ylabel("y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


if __name__ == "__main__":
    main()
