"""Recover a conductivity field from many sources: one matrix, a batch of solves.

The forward model of `examples/inverse_poisson.py`, `-div(exp(m) grad u_s) =
f_s` on the unit square (`u = 0` on the boundary, the 5-point
finite-volume stencil on an n x n grid of interior nodes), now with S
sources: Gaussian bumps spread over the square (Halton points). Each source's
state is observed at a grid of receivers (every third node), with 1%
Gaussian noise. The unknown is the log-conductivity `m` at the nodes; the
objective is the misfit summed over the sources plus a smoothness penalty.

The misfit is written for ONE source (`source_misfit(m, f, d)`: assemble the
matrix, solve, sample at the receivers) and batched with `sd.vmap` over the
sources, `m` shared (`in_axes=(None, 0, 0)`). `sd.vmap` is a graph
transform: the matrix does not depend on the source, so its assembly stays
unbatched, and the batch of right-hand sides against it becomes ONE solve
with S columns; after differentiation the forward and the adjoint solves
share ONE factorization. The example prints the solve nodes of the optimized
value-and-gradient graph and counts its factorizations.

Two more uses of the same per-source code:

- a batch of matrices on one pattern: each ensemble member has its own
  medium. Before the inversion, E constant backgrounds `m = c` are screened
  in one batched call (`sd.vmap` of the whole objective over the media: one
  `map[linalg.factor]` node, a factorization per member in one host call);
  L-BFGS starts from the best.
- sharding: the sources are split over the devices (`jax.devices()`; a mesh
  of one on a single device) with `sd.function(..., in_shardings=...)` and
  `sd.vmap(..., spmd_axis_name="batch")`; the sharded value and gradient are
  checked against the unsharded ones, and L-BFGS runs on the sharded
  arrays. On a CPU, `XLA_FLAGS=--xla_force_host_platform_device_count=4`
  (set before JAX is imported) gives four host devices to try it. Each
  device factors the shared matrix once and solves its own sources' columns
  (forward and adjoint) with that factorization.

Run: `python examples/multi_source_inversion.py` (48 x 48 grid, 16 sources,
about 20 s on two cores); `--n 64 --sources 64` for more, `--plot
out.png` for the figure (needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

# (sciad before JAX: it turns on JAX's hoisting of large constants)
import sciad  # noqa: E402, F401, I001
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sciad as sd
import sciad.numpy as snp


def _load_single_source():
    # examples/inverse_poisson.py, loaded by path (examples/ is no package)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inverse_poisson.py")
    spec = importlib.util.spec_from_file_location("_inverse_poisson_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_single = _load_single_source()

NOISE = 0.01
ALPHA = 1e-2  # smoothness weight on |grad m|^2: the misfit lands near the noise level
WIDTH = 0.004  # a source's Gaussian variance


def _halton(k: int, base: int) -> np.ndarray:
    """The first `k` points of the van der Corput sequence in `base`."""
    out = np.zeros(k)
    for i in range(k):
        f, j, x = 1.0, i + 1, 0.0
        while j:
            f /= base
            x += f * (j % base)
            j //= base
        out[i] = x
    return out


class Problem(_single.Problem):
    """examples/inverse_poisson.py's grid, sparsity pattern and true field,
    with `sources` sources of its own and the receivers."""

    def __init__(self, n: int = 48, sources: int = 16):
        super().__init__(n)
        self.S = sources
        # source centres: Halton points in [0.1, 0.9]^2
        self.centers = 0.1 + 0.8 * np.stack([_halton(sources, 2), _halton(sources, 3)], 1)
        self.F = np.stack([np.exp(-((self.X - cx) ** 2 + (self.Y - cy) ** 2) / (2 * WIDTH))
                           .ravel() for cx, cy in self.centers])  # (S, n*n)
        self.receivers = np.arange(n * n).reshape(n, n)[1::3, 1::3].ravel()  # every third node


# the SPD stiffness matrix for the nodal log-conductivity `m`
stiffness = _single.stiffness


def observe(problem: Problem, m, f):
    """One source's state at the receivers."""
    return sd.linalg.solve(stiffness(problem, m), f)[problem.receivers]


def source_misfit(problem: Problem, m, f, d, sigma):
    """Half the squared misfit of one source, in units of the noise."""
    r = (observe(problem, m, f) - d) / sigma
    return 0.5 * snp.sum(r * r)


def objective(m, F, D, sigma, problem: Problem, spmd_axis_name: str | None = None):
    """The misfit per datum summed over the sources (`sd.vmap` over the rows
    of `F` and `D`, `m` shared) plus `ALPHA/2 |grad m|^2`."""
    per_source = sd.vmap(lambda m, f, d: source_misfit(problem, m, f, d, sigma),
                         in_axes=(None, 0, 0), **_spmd(spmd_axis_name))
    n = problem.n
    mm = snp.reshape(m, (n, n))
    gx, gy = snp.diff(mm, axis=1), snp.diff(mm, axis=0)
    return (snp.sum(per_source(m, F, D)) / D.size
            + 0.5 * ALPHA * (snp.sum(gx * gx) + snp.sum(gy * gy)))


def ensemble_objective(Ms, F, D, sigma, problem: Problem):
    """The objective of each medium in `Ms` (E, n*n): E matrices on one pattern."""
    return sd.vmap(lambda m: objective(m, F, D, sigma, problem))(Ms)


def _spmd(axis):
    return {} if axis is None else {"spmd_axis_name": axis}


def make_data(problem: Problem, seed: int = 0) -> tuple[np.ndarray, float]:
    """The receivers' values for the true field plus Gaussian noise of 1% of
    their largest value, and that noise level."""
    obs = sd.function(lambda m, F: sd.vmap(lambda m, f: observe(problem, m, f),
                                           in_axes=(None, 0))(m, F))
    u = np.asarray(obs(problem.true_field(), problem.F))
    sigma = NOISE * float(np.max(np.abs(u)))
    rng = np.random.default_rng(seed)
    return u + sigma * rng.standard_normal(u.shape), sigma


def factorizations(graph) -> list[str]:
    """The factorization nodes of a graph, by primitive (`map[...]` for one
    inside a `map` node's body)."""
    found = []
    for node in graph.nodes:
        name = node.primitive.name
        if "factor" in name:
            found.append(name)
        body = node.params.get("body") if hasattr(node.params, "get") else None
        if body is not None and hasattr(body, "nodes"):
            found += [f"{name}[{inner}]" for inner in factorizations(body)]
    return found


# ---------------------------------------------------------------------------
# sharding the sources over the devices


def source_sharding(devices=None):
    """`(by_source, replicated)`: NamedShardings on a one-axis mesh `"batch"`
    of `devices` (default: all of `jax.devices()`) that split an array's
    leading (source) axis over the devices, and that copy it to each."""
    devices = list(devices or jax.devices())
    mesh = jax.make_mesh((len(devices),), ("batch",), devices=devices)
    return NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())


def sharded_value_and_grad(problem: Problem, sigma: float, devices=None):
    """The objective's value and gradient compiled with the sources (rows of
    `F` and `D`) split over the devices and `m` replicated; returns `(fn,
    put)`, `put(F)` placing an array of sources as `fn` expects it."""
    by_source, replicated = source_sharding(devices)
    fn = sd.function(
        sd.value_and_grad(lambda m, F, D: objective(m, F, D, sigma, problem, "batch")),
        in_shardings=(replicated, by_source, by_source),
        out_shardings=(replicated, replicated))
    return fn, (lambda a: jax.device_put(a, by_source))


# ---------------------------------------------------------------------------


def main(n: int = 48, sources: int = 16, maxiter: int = 200, ensemble: int = 8,
         plot: str | None = None, verbose: bool = True):
    say = print if verbose else (lambda *a, **k: None)
    problem = Problem(n, sources)
    F = problem.F
    D, sigma = make_data(problem)
    m_true = problem.true_field()
    N = n * n
    say(f"multi-source inverse Poisson: {n} x {n} grid ({N} unknowns), {sources} sources, "
        f"{D.shape[1]} receivers each ({D.size} data), {problem.rows.size} stored entries")

    f = lambda m: objective(m, F, D, sigma, problem)  # noqa: E731

    # one factorization for all the sources, forward and adjoint
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), np.zeros(N)))
    say("optimized value-and-gradient graph, its solves:")
    for line in g.pretty(source=False).splitlines():
        if "linalg." in line:
            say("  " + " ".join(line.split()))
    facs = factorizations(g)
    say(f"factorization nodes: {len(facs)} ({', '.join(facs)}) for {sources} sources")

    rng = np.random.default_rng(1)
    rates = sd.testing.taylor_test(f, 0.1 * rng.standard_normal(N), rng.standard_normal(N))
    say(f"Taylor test (remainder rates, want ~2): {np.array2string(rates, precision=3)}")

    # each ensemble member its own medium: E matrices on one pattern
    m0 = np.zeros(N)
    if ensemble > 1:
        levels = np.linspace(-0.5, 1.0, ensemble)
        Ms = levels[:, None] * np.ones(N)
        ge = sd.graph.passes.optimize(
            sd.trace(lambda Ms: ensemble_objective(Ms, F, D, sigma, problem), Ms))
        t = time.perf_counter()
        values = np.asarray(sd.function(
            lambda Ms: ensemble_objective(Ms, F, D, sigma, problem))(Ms))
        best = int(np.argmin(values))
        say(f"ensemble: {ensemble} constant backgrounds m = c, {ensemble} matrices on one "
            f"pattern, in one batched call ({time.perf_counter() - t:.2f} s with compilation; "
            f"factorization nodes: {', '.join(factorizations(ge))}); objective from "
            f"{values.min():.4e} to {values.max():.4e}; start from the best, c = "
            f"{levels[best] + 0.0:.3f}")
        m0 = Ms[best]

    # the sources split over the devices (a mesh of one on one device)
    fun, args = (lambda m, F, D: objective(m, F, D, sigma, problem)), (F, D)
    ndev = len(jax.devices())
    if sources % ndev:
        say(f"sharding: {sources} sources do not split evenly over {ndev} devices; unsharded")
    else:
        t = time.perf_counter()
        fn, put = sharded_value_and_grad(problem, sigma)
        args = (put(F), put(D))
        v_sh, g_sh = fn(m0, *args)
        v, g_ref = sd.value_and_grad(f)(m0)
        say(f"sharded over {ndev} device(s): {sources // ndev} sources each; against "
            f"unsharded, the value differs by {abs(float(v_sh) - float(v)):.1e}, the "
            f"gradient by {np.max(np.abs(np.asarray(g_sh) - np.asarray(g_ref))):.1e} "
            f"({time.perf_counter() - t:.2f} s)")
        fun = lambda m, F, D: objective(m, F, D, sigma, problem, "batch")  # noqa: E731

    history = []
    f_value = sd.function(fun)
    t0 = time.perf_counter()

    def progress(m):
        history.append(float(f_value(m, *args)))
        k = len(history)
        if verbose and (k <= 3 or k % 20 == 0):
            err = np.linalg.norm(m - m_true) / np.linalg.norm(m_true)
            print(f"  iter {k:3d}  objective {history[-1]:.6e}  |m - m_true|/|m_true| "
                  f"{err:.4f}  ({time.perf_counter() - t0:.2f} s)")

    start = float(f_value(m0, *args))
    res = sd.optimize.minimize(fun, m0, args=args, method="L-BFGS-B", callback=progress,
                               options={"maxiter": maxiter})
    elapsed = time.perf_counter() - t0
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    say(f"done: {res.nit} iterations, {res.nfev} evaluations, {elapsed:.1f} s; objective "
        f"{res.fun:.6e} (from {start:.6e}); relative error of m {err:.4f} "
        f"(from {np.linalg.norm(m0 - m_true) / np.linalg.norm(m_true):.4f}); {res.message}")
    if plot:
        if _plot(problem, m_true, res.x, history, plot):
            say(f"figure written to {plot}")
    return res, rates, history, m_true, start


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
    rx = problem.X.ravel()[problem.receivers]
    ry = problem.Y.ravel()[problem.receivers]
    for ax, field, title in ((axes[0], m_true, "true log-conductivity"),
                             (axes[1], m_rec, f"recovered ({problem.S} sources)")):
        im = ax.imshow(field.reshape(n, n), origin="lower", extent=(0, 1, 0, 1),
                       vmin=vmin, vmax=vmax, cmap="viridis")
        ax.plot(rx, ry, ".", color="w", ms=1.5)
        ax.plot(*problem.centers.T, "r*", ms=6)
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
    p.add_argument("--n", type=int, default=48, help="grid size per side (default 48)")
    p.add_argument("--sources", type=int, default=16,
                   help="number of sources, 1 to 64 (default 16)")
    p.add_argument("--maxiter", type=int, default=200, help="L-BFGS iterations (default 200)")
    p.add_argument("--ensemble", type=int, default=8,
                   help="constant backgrounds screened for the start (default 8; 0: m = 0)")
    p.add_argument("--plot", default="examples/multi_source_inversion.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    if not 1 <= args.sources <= 64:
        p.error("--sources must be between 1 and 64")
    main(args.n, args.sources, args.maxiter, args.ensemble, args.plot or None)
