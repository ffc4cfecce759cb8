"""Fit the parameters of stiff ODE models to noisy data.

Two problems, each an `sd.ode.odeint` node inside a least-squares objective
minimized by L-BFGS-B with sciad's gradients:

1. **Stiff chemical kinetics** (Robertson's reactions, rate constants 0.04,
   3e7 and 1e4: time scales from 1e-8 to 1e4). The three log rate
   constants are recovered from the three concentrations observed at 15
   log-spaced times with 1% noise, starting a factor of two off. The
   integrator is the ESDIRK method Kvaerno5; the gradient is the discrete
   adjoint of the steps it took (the implicit stages replayed as root
   solves, their derivatives by the implicit function theorem).

2. **Reaction-diffusion** (the Brusselator on `[0, 1]`, method of lines with
   `n` cells: `2n` states):

       u' = A + u^2 v - (B + 1) u + alpha u_xx,   v' = B u - u^2 v + alpha v_xx,

   with `u = 1`, `v = 3` at both ends. The diffusion coefficient `alpha`
   (and the reaction's `B`) are recovered from noisy snapshots of `u`.
   The Newton matrices of the implicit steps, `I - h gamma df/dy`, use the
   Jacobian's sparsity detected from the vector field's graph (a band of
   width 5 in the interleaved `(u, v)` ordering), its values from a few
   colored JVPs, factored by SuperLU.

Each objective passes a Taylor test (remainder rates about 2). An adaptive
solve is smooth in the parameters only between changes of its step
sequence, which move the solution by about the tolerance: the Brusselator
is solved at rtol 1e-8, so that those jumps stay below the Taylor test's
smallest remainders.

Run: `python examples/ode_fit.py` (about 80 s on two cores); `--n 32`
for a quicker reaction-diffusion part, `--plot out.png` for the figure
(needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

NOISE = 0.01

# ---------------------------------------------------------------------------
# 1. Robertson's stiff kinetics

RATES = np.array([0.04, 3e7, 1e4])
KINETICS_TIMES = np.concatenate([[0.0], np.logspace(-3, 4, 15)])
SCALE = np.array([1.0, 1e4, 1.0])  # y2 stays below 4e-5: observed in its own units


def robertson(t, y, k):
    """The Robertson reactions A -> B (k0), 2B -> B + C (k1), B + C -> A + C (k2)."""
    a, b, c = y[0], y[1], y[2]
    return snp.stack([-k[0] * a + k[2] * b * c,
                      k[0] * a - k[2] * b * c - k[1] * b ** 2,
                      k[1] * b ** 2])


def concentrations(logk):
    """The concentrations at `KINETICS_TIMES` for log rate constants `logk`."""
    return sd.ode.odeint(robertson, np.array([1.0, 0.0, 0.0]), KINETICS_TIMES,
                         snp.exp(logk), solver="kvaerno5", rtol=1e-8, atol=1e-12)


def kinetics_objective(logk, data):
    r = (concentrations(logk) * SCALE - data)[1:] / NOISE
    return 0.5 * snp.mean(r * r)


# ---------------------------------------------------------------------------
# 2. The Brusselator


def brusselator(t, y, p):
    """Method-of-lines Brusselator on `n` cells; `y` interleaves `(u, v)` per
    cell; `p = (log alpha, B)`."""
    alpha, B = snp.exp(p[0]), p[1]
    n = y.shape[0] // 2
    w = snp.reshape(y, (n, 2))
    u, v = w[:, 0], w[:, 1]
    dx2 = (1.0 / (n + 1)) ** 2
    up = snp.pad(u, 1, mode="constant", constant_values=1.0)
    vp = snp.pad(v, 1, mode="constant", constant_values=3.0)
    lap_u = (up[:-2] - 2.0 * u + up[2:]) / dx2
    lap_v = (vp[:-2] - 2.0 * v + vp[2:]) / dx2
    uuv = u * u * v
    du = 1.0 + uuv - (B + 1.0) * u + alpha * lap_u
    dv = B * u - uuv + alpha * lap_v
    return snp.reshape(snp.stack([du, dv], axis=1), (2 * n,))


def brusselator_start(n: int) -> np.ndarray:
    x = np.arange(1, n + 1) / (n + 1)
    return np.stack([1.0 + np.sin(2 * np.pi * x), np.full(n, 3.0)], axis=1).ravel()


BRUSS_TRUE = np.array([np.log(0.02), 3.0])
BRUSS_TIMES = np.linspace(0.0, 10.0, 11)


def snapshots(p, n: int):
    """`u` at `BRUSS_TIMES[1:]`, `(10, n)`."""
    ys = sd.ode.odeint(brusselator, brusselator_start(n), BRUSS_TIMES, p, solver="kvaerno5",
                       rtol=1e-8, atol=1e-10, jac="sparse")
    return snp.reshape(ys[1:], (BRUSS_TIMES.size - 1, n, 2))[:, :, 0]


def brusselator_objective(p, data, n: int):
    r = (snapshots(p, n) - data) / NOISE
    return 0.5 * snp.mean(r * r)


def odeint_line(graph) -> str:
    """The printed `ode.odeint` node of a graph (its first line), shortened."""
    line = next(s.strip() for s in str(graph).splitlines() if "ode.odeint[" in s)
    return line if len(line) < 220 else line[:217] + "..."


# ---------------------------------------------------------------------------


def fit(objective, x0, say, name, maxiter):
    t0 = time.perf_counter()
    history = []
    f = sd.function(objective)
    res = sd.optimize.minimize(objective, x0, method="L-BFGS-B", options={"maxiter": maxiter},
                               callback=lambda x: history.append(float(f(x))))
    say(f"  {name}: {res.nit} L-BFGS-B iterations, {time.perf_counter() - t0:.1f} s, "
        f"objective {res.fun:.4f} (noise level: about 0.5)")
    return res, history


def main(n: int = 64, plot: str | None = None, verbose: bool = True, maxiter: int = 100):
    say = print if verbose else (lambda *a, **k: None)
    rng = np.random.default_rng(0)
    out = {}

    # -- 1. kinetics
    clean = np.asarray(sd.function(concentrations)(np.log(RATES)))
    data = clean * SCALE * (1.0 + NOISE * rng.standard_normal(clean.shape))
    f1 = lambda logk: kinetics_objective(logk, data)  # noqa: E731
    x0 = np.log(RATES) + np.array([0.7, -0.7, 0.7])
    say("1. Robertson kinetics, Kvaerno5, rates from 15 noisy snapshots")
    say(f"  {odeint_line(sd.trace(f1, x0))}")
    rates1 = sd.testing.taylor_test(f1, x0, rng.standard_normal(3))
    say(f"  Taylor test (remainder rates, want ~2): {np.array2string(rates1, precision=3)}")
    res1, hist1 = fit(f1, x0, say, "fit", maxiter)
    k = np.exp(res1.x)
    say("  rate constants: " + ", ".join(f"{a:.4g} (true {b:.4g})" for a, b in zip(k, RATES)))
    out["kinetics"] = (res1, rates1, hist1, data)

    # -- 2. Brusselator
    clean = np.asarray(sd.function(lambda p: snapshots(p, n))(BRUSS_TRUE))
    data2 = clean + NOISE * rng.standard_normal(clean.shape)
    f2 = lambda p: brusselator_objective(p, data2, n)  # noqa: E731
    p0 = np.array([np.log(0.05), 2.5])
    say(f"2. Brusselator, {n} cells ({2 * n} states), Kvaerno5 with a sparse Jacobian")
    graph = sd.trace(f2, p0)
    node = next(nd for nd in graph.nodes if nd.primitive.name == "ode.odeint")
    say(f"  {odeint_line(graph)}")
    pattern = node.params.get("pattern")
    if pattern is not None:
        say(f"  detected Jacobian of f plus the diagonal: {pattern.shape[0]} x "
            f"{pattern.shape[1]}, {pattern.nnz} entries ({pattern.nnz / pattern.shape[0]:.2f}"
            f" per row)")
    rates2 = sd.testing.taylor_test(f2, p0, rng.standard_normal(2))
    say(f"  Taylor test (remainder rates, want ~2): {np.array2string(rates2, precision=3)}")
    res2, hist2 = fit(f2, p0, say, "fit", maxiter)
    say(f"  alpha {np.exp(res2.x[0]):.5f} (true {np.exp(BRUSS_TRUE[0]):.5f}), "
        f"B {res2.x[1]:.4f} (true {BRUSS_TRUE[1]:.4f})")
    out["brusselator"] = (res2, rates2, hist2, data2, node)
    if plot:
        if _plot(out, n, plot):
            say(f"figure written to {plot}")
    return out


def _plot(out, n: int, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    res1, _, hist1, data = out["kinetics"]
    res2, _, hist2, data2, _ = out["brusselator"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    fine = np.asarray(sd.function(concentrations)(res1.x)) * SCALE
    for j, label in enumerate(["A", "B (x 1e4)", "C"]):
        axes[0].semilogx(KINETICS_TIMES[1:], data[1:, j], "o", ms=4, label=f"{label} data")
        axes[0].semilogx(KINETICS_TIMES[1:], fine[1:, j], "-", label=f"{label} fit")
    axes[0].set_xlabel("t")
    axes[0].set_title("Robertson kinetics: data and fit")
    axes[0].legend(fontsize=7)
    fit_u = np.asarray(sd.function(lambda p: snapshots(p, n))(res2.x))
    x = np.arange(1, n + 1) / (n + 1)
    for i in (0, 4, 9):
        axes[1].plot(x, data2[i], ".", ms=3)
        axes[1].plot(x, fit_u[i], "-", label=f"t = {BRUSS_TIMES[i + 1]:g}")
    axes[1].set_xlabel("x")
    axes[1].set_title("Brusselator u: noisy snapshots and fit")
    axes[1].legend(fontsize=7)
    axes[2].semilogy(hist1, label="kinetics")
    axes[2].semilogy(hist2, label="Brusselator")
    axes[2].set_xlabel("L-BFGS-B iteration")
    axes[2].set_title("objective")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=64, help="Brusselator cells (default 64)")
    p.add_argument("--plot", default="examples/ode_fit.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.plot or None)
