"""sciad's ODE integration and its derivatives against diffrax and SciPy.

Run from the repository root:

    .venv/bin/python bench/ode.py            # the full set: about 5 min on 2 cores
    .venv/bin/python bench/ode.py --quick    # smoke check (small stiff problem)
    .venv/bin/python bench/ode.py --no-write

Float64 throughout (`jax_enable_x64` on at start-up).

1. Lotka-Volterra (2 states, 4 parameters, 21 output times on [0, 10],
   Tsit5, rtol = atol = 1e-8), the loss `sum(y(ts)^2)`:
   - its gradient, sciad's `adjoint="checkpoint"` (the discrete adjoint of
     the steps taken) against diffrax's `RecursiveCheckpointAdjoint` (JAX's
     reverse mode through the steps), and sciad's `"backsolve"` against
     diffrax's `BacksolveAdjoint`. Target: sciad <= 1.1x diffrax.
   - forward mode (one JVP): sciad's odeint of the sensitivity system
     against `jax.jvp` of diffrax with `ForwardMode`.
   - the solve alone, for reference.
2. The stiff Brusselator (examples/ode_fit.py: method of lines, `2n` states,
   Kvaerno5, rtol = atol = 1e-6, 11 output times on [0, 10]):
   - sciad's forward solve (the Newton matrices sparse: the pattern
     detected from the vector field's graph, colored JVPs, SuperLU) against
     SciPy's `solve_ivp` BDF and Radau with `jac_sparsity` (the same pattern;
     a NumPy vector field) and diffrax's Kvaerno5 (dense Jacobian, LU).
     The two codes' errors differ at the same tolerance, so BDF is also
     timed at the loosest tolerance that matches sciad's error.
     Targets: sciad <= 2x SciPy's BDF (at the same accuracy); >= 10x faster
     than diffrax dense at 2048 states.
   - the gradient of `sum((u(ts) - 1)^2)` (checkpointed discrete adjoint),
     and its ratio to the forward solve. Target: <= 4.

diffrax's dense Kvaerno5 at 2048 states takes minutes per solve: it is
timed on its first 20 steps and the time per step multiplied by sciad's
accepted steps (a lower bound: diffrax's own controller takes more steps),
marked "extrapolated".

Medians over interleaved repeats (bench/_harness.py). The Markdown table
goes to stdout and to bench/results/ode.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import (  # noqa: E402  (bench/ must be on sys.path first)
    HostCall, command_line, load_average, load_example, machine_info, medians, publish,
    report_head, yes_no,
)

RESULTS = os.path.join(HERE, "results", "ode.md")
SIZES, QUICK_SIZES = (256, 1024), (64,)
REPEATS, QUICK_REPEATS = 5, 3
LV_TARGET, BDF_TARGET, DENSE_TARGET, GRAD_TARGET = 1.1, 2.0, 10.0, 4.0


def lotka_volterra(repeats: int) -> dict:
    import diffrax
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    ts = np.linspace(0.0, 10.0, 21)
    th = np.array([1.5, 1.0, 3.0, 1.0])
    y0 = np.array([1.0, 1.0])
    tol = dict(rtol=1e-8, atol=1e-8)

    def f_sd(t, y, p):
        return snp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])

    def f_jax(t, y, p):
        return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])

    def loss_sd(p, adjoint="checkpoint"):
        return snp.sum(sd.ode.odeint(f_sd, y0, ts, p, adjoint=adjoint, **tol) ** 2)

    def loss_dx(p, adjoint=None):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(f_jax), diffrax.Tsit5(), ts[0], ts[-1], None, jnp.asarray(y0), p,
            saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
            stepsize_controller=diffrax.PIDController(**tol), max_steps=4096,
            adjoint=adjoint or diffrax.RecursiveCheckpointAdjoint())
        return jnp.sum(sol.ys ** 2)

    v = np.array([0.1, -0.2, 0.3, 0.05])
    fns = {
        "sd_fwd": sd.function(loss_sd),
        "dx_fwd": jax.jit(loss_dx),
        "sd_ckpt": sd.function(sd.grad(loss_sd)),
        "dx_ckpt": jax.jit(jax.grad(loss_dx)),
        "sd_back": sd.function(sd.grad(lambda p: loss_sd(p, "backsolve"))),
        "dx_back": jax.jit(jax.grad(lambda p: loss_dx(p, diffrax.BacksolveAdjoint()))),
        "sd_interp": sd.function(sd.grad(lambda p: loss_sd(p, "interpolated"))),
        "sd_jvp": sd.function(lambda p: sd.jvp(loss_sd, (p,), (v,))[1]),
        "dx_jvp": jax.jit(lambda p: jax.jvp(lambda q: loss_dx(q, diffrax.ForwardMode()),
                                            (p,), (jnp.asarray(v),))[1]),
    }
    th_dev = jnp.asarray(th)
    g_sd, g_dx = fns["sd_ckpt"](th_dev), fns["dx_ckpt"](th_dev)
    agree = float(np.max(np.abs(np.asarray(g_sd) - np.asarray(g_dx))) /
                  np.max(np.abs(np.asarray(g_dx))))
    t = medians(fns, (th_dev,), repeats)
    return {"t": t, "agree": agree}


def brusselator_field(n: int, p, xp):
    """examples/ode_fit.py's Brusselator (`n` cells, `p = (log alpha, B)`) as
    `f(t, y, *args)` in NumPy or jax.numpy (`xp`), for SciPy and diffrax."""
    import numpy as np

    alpha, B = float(np.exp(p[0])), float(p[1])
    dx2 = (1.0 / (n + 1)) ** 2

    def f(t, y, *_):
        w = y.reshape(n, 2)
        u, v = w[:, 0], w[:, 1]
        up = xp.pad(u, 1, constant_values=1.0)
        vp = xp.pad(v, 1, constant_values=3.0)
        uuv = u * u * v
        du = 1.0 + uuv - (B + 1.0) * u + alpha * (up[:-2] - 2 * u + up[2:]) / dx2
        dv = B * u - uuv + alpha * (vp[:-2] - 2 * v + vp[2:]) / dx2
        return xp.stack([du, dv], axis=1).reshape(-1)

    return f


def brusselator(n: int, repeats: int) -> dict:
    import diffrax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import scipy.integrate

    import sciad as sd
    import sciad.numpy as snp

    ex = load_example(os.path.join(ROOT, "examples", "ode_fit.py"))
    p = ex.BRUSS_TRUE
    ts = np.linspace(0.0, 10.0, 11)
    y0 = ex.brusselator_start(n)
    tol = dict(rtol=1e-6, atol=1e-6)

    def solve(p):
        return sd.ode.odeint(ex.brusselator, y0, ts, p, solver="kvaerno5", jac="sparse", **tol)

    def loss(p):
        return snp.sum((solve(p)[1:] - 1.0) ** 2)

    fwd, grad = sd.function(solve), sd.function(sd.grad(loss))
    steps = int(sd.function(lambda p: sd.ode.odeint(
        ex.brusselator, y0, ts, p, solver="kvaerno5", jac="sparse", throw=False,
        **tol).steps)(p))
    pattern = sd.sparse.jacobian_sparsity(lambda y: ex.brusselator(0.0, y, p), y0)

    f_np, f_jax = brusselator_field(n, p, np), brusselator_field(n, p, jnp)

    def scipy_solve(method):
        return HostCall(lambda p: scipy.integrate.solve_ivp(
            f_np, (0.0, 10.0), y0, method=method, t_eval=ts, jac_sparsity=pattern, **tol))

    ref = scipy.integrate.solve_ivp(f_np, (0.0, 10.0), y0, "Radau", ts, rtol=1e-11,
                                    atol=1e-11, jac_sparsity=pattern).y.T
    err = {"sd": float(np.abs(np.asarray(fwd(p)) - ref).max())}
    # BDF at sciad's accuracy: the loosest tolerance whose error is no larger
    for matched in (1e-7, 1e-8, 1e-9, 1e-10, 1e-11):
        out = scipy.integrate.solve_ivp(f_np, (0.0, 10.0), y0, "BDF", ts, rtol=matched,
                                        atol=matched, jac_sparsity=pattern)
        if np.abs(out.y.T - ref).max() <= err["sd"]:
            break

    def bdf_matched(p):
        return scipy.integrate.solve_ivp(f_np, (0.0, 10.0), y0, "BDF", ts, rtol=matched,
                                         atol=matched, jac_sparsity=pattern)

    fns = {"sd_fwd": fwd, "sd_grad": grad, "bdf": scipy_solve("BDF"),
           "radau": scipy_solve("Radau"), "bdf_matched": HostCall(bdf_matched)}
    t = medians(fns, (jnp.asarray(p),), repeats, seconds=0.5)
    err["bdf"] = float(np.abs(fns["bdf"](p).out.y.T - ref).max())
    err["bdf_matched"] = float(np.abs(fns["bdf_matched"](p).out.y.T - ref).max())
    err["matched_tol"] = matched

    def dense(max_steps, throw=True):
        return jax.jit(lambda y: diffrax.diffeqsolve(
            diffrax.ODETerm(f_jax), diffrax.Kvaerno5(), 0.0, 10.0, None, y, None,
            saveat=diffrax.SaveAt(ts=jnp.asarray(ts)),
            stepsize_controller=diffrax.PIDController(**tol), max_steps=max_steps,
            throw=throw))

    if n <= 256:
        d = dense(4096)
        d(jnp.asarray(y0)).ys.block_until_ready()
        t0 = time.perf_counter()
        sol = d(jnp.asarray(y0))
        sol.ys.block_until_ready()
        t["dense"], extrapolated = time.perf_counter() - t0, False
    else:  # a lower bound: 20 steps' time times sciad's accepted steps (diffrax's
        # own controller takes more: 629 steps against sciad's 73 at 512 states)
        d = dense(20, throw=False)
        d(jnp.asarray(y0)).ys.block_until_ready()
        t0 = time.perf_counter()
        d(jnp.asarray(y0)).ys.block_until_ready()
        t["dense"], extrapolated = (time.perf_counter() - t0) / 20 * steps, True
    return {"n": n, "t": t, "steps": steps, "err": err, "extrapolated": extrapolated,
            "nnz": int(pattern.nnz)}


def render(lv: dict, stiff: list, machine: dict, argv: str) -> str:
    t = lv["t"]

    def row(what, key, target=True):  # sciad's `sd_key` against diffrax's `dx_key`
        sd, dx = t["sd_" + key], t["dx_" + key]
        met = f" {yes_no(sd <= LV_TARGET * dx)} " if target else " "
        return f"| {what} | {sd * 1e3:.2f} | {dx * 1e3:.2f} | {sd / dx:.2f} |{met}|"

    lines = report_head("sciad ODE benchmark", argv, machine)
    lines += [
        "## Lotka-Volterra: 2 states, Tsit5, rtol = atol = 1e-8, 21 outputs (target <= 1.1x)",
        "",
        f"sciad's checkpointed gradient and diffrax's agree to {lv['agree']:.1e} (relative; "
        "diffrax differentiates its step-size controller too, sciad holds the steps).",
        "",
        "| what | sciad ms | diffrax ms | sciad/diffrax | target met |",
        "|---|---:|---:|---:|---|",
        row("solve", "fwd", target=False),
        row("gradient, checkpointed discrete adjoint", "ckpt"),
        row("gradient, backsolve adjoint", "back"),
        f"| gradient, interpolated adjoint | {t['sd_interp'] * 1e3:.2f} | (none) | | |",
        row("forward mode (one JVP)", "jvp"),
        "",
        "## Stiff Brusselator, Kvaerno5, rtol = atol = 1e-6",
        "",
        "sciad: sparse Newton matrices (pattern from the graph, colored JVPs, SuperLU). "
        "SciPy: `solve_ivp` with `jac_sparsity`, a NumPy vector field. diffrax: Kvaerno5 "
        "with its dense Jacobian. Max error against a Radau solve at 1e-11: sciad's and "
        "BDF's.",
        "",
        "| states | sciad fwd ms | SciPy BDF ms | BDF at sciad's accuracy ms "
        "| SciPy Radau ms | diffrax dense ms | sciad/BDF (same tol / same accuracy) "
        "| diffrax/sciad | sciad grad ms | grad/fwd | max error: sciad / BDF / BDF matched "
        "| targets met (BDF same accuracy, dense, grad) |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for r in stiff:
        t = r["t"]
        dense = f"{t['dense'] * 1e3:.0f}" + (" (extrapolated)" if r["extrapolated"] else "")
        gf = t["sd_grad"] / t["sd_fwd"]
        e = r["err"]
        lines.append(
            f"| {2 * r['n']:,} | {t['sd_fwd'] * 1e3:.0f} | {t['bdf'] * 1e3:.0f} "
            f"| {t['bdf_matched'] * 1e3:.0f} (tol {e['matched_tol']:.0e}) "
            f"| {t['radau'] * 1e3:.0f} | {dense} | {t['sd_fwd'] / t['bdf']:.1f} / "
            f"{t['sd_fwd'] / t['bdf_matched']:.1f} "
            f"| {t['dense'] / t['sd_fwd']:.0f} | {t['sd_grad'] * 1e3:.0f} | {gf:.1f} "
            f"| {e['sd']:.1e} / {e['bdf']:.1e} / {e['bdf_matched']:.1e} "
            f"| {yes_no(t['sd_fwd'] <= BDF_TARGET * t['bdf_matched'])}, "
            f"{yes_no(t['dense'] >= DENSE_TARGET * t['sd_fwd'])}, {yes_no(gf <= GRAD_TARGET)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small stiff problem, 3 repeats")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-write", action="store_true", help="do not write bench/results/ode.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    load = load_average()
    t0 = time.perf_counter()
    lv = lotka_volterra(repeats)
    print(f"  Lotka-Volterra done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
          flush=True)
    stiff = []
    for n in (QUICK_SIZES if args.quick else SIZES):
        stiff.append(brusselator(n, repeats))
        print(f"  Brusselator {2 * n} done ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    text = render(lv, stiff, machine_info(load), command_line("bench/ode.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
