"""sciad's stiff methods, BDF and Radau IIA, against SciPy's methods of the
same names and Rust's diffsol (pydiffsol), on the same problems in one run.

Run from the repository root:

    .venv/bin/python bench/stiff.py            # about 6 min on 2 cores
    .venv/bin/python bench/stiff.py --quick    # smoke check (3 repeats)
    .venv/bin/python bench/stiff.py --no-write

Float64 throughout (`jax_enable_x64` on at start-up).

1. Robertson's kinetics (3 states, rates 0.04, 3e7, 1e4; rtol 1e-6, atol
   1e-10), to t = 1e5 and 4e5: sciad's `solver="bdf"` and `"radau"`
   (compiled, dense iteration matrices) against SciPy's `solve_ivp` BDF and
   Radau (a NumPy vector field and its analytic Jacobian) and pydiffsol's
   BDF (its DiffSL model JIT-compiled by LLVM, nalgebra dense; where it is
   installed). The work each counts (`nfev`, `njev`, `nlu`), as SciPy
   counts it; the gradient of `y1(t1)` in the three rates (sciad: each
   method's default adjoint, the discrete one; the continuous adjoint
   beside it), and its ratio to the forward solve.
   Targets:
   counts within 2x of SciPy's same-named method; forward <= 1.5x
   pydiffsol.
2. The 1-D Brusselator by the method of lines (examples/ode_fit.py: `2n`
   states, rtol = atol = 1e-6, 11 output times on [0, 10]): sciad's BDF and
   Radau with sparse iteration matrices (the pattern from the graph, SuperLU)
   against SciPy's BDF and Radau with `jac_sparsity`. Max error against a
   Radau solve at 1e-11. Target: BDF forward <= 1.0x SciPy's BDF; gradient
   (the default adjoint) <= 3x the forward.
3. SUNDIALS' `idaHeat2D` at 100 x 100 = 10,000 unknowns: the heat equation
   on the unit square, its boundary values algebraic (`0 = u` there, a
   singular mass matrix), `u0 = 16 x (1 - x) y (1 - y)`, output at 0.01 ...
   1.28 (doubling), rtol 1e-5, atol 1e-8: sciad's BDF with sparse iteration
   matrices, value and gradient (the sum of the squared outputs, in the
   diffusivity), against scikit-sundae's IDA (SUNDIALS' DAE solver, its
   `sparse` linear solver, SuperLU_MT, on the 5-point pattern; where it is
   installed). Error: max |u - exact| over the outputs, the semi-discrete
   system's exact solution by `scipy.sparse.linalg.expm_multiply`.

Medians over repeats (bench/_harness.py). The Markdown table goes to stdout
and to bench/results/stiff.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import (  # noqa: E402  (bench/ must be on sys.path first)
    HostCall, command_line, load_average, load_example, machine_info, median_time, publish,
    report_head, timed_call, yes_no)
from ode import brusselator_field  # noqa: E402  (the same problem as bench/ode.py's)

RESULTS = os.path.join(ROOT, "bench", "results", "stiff.md")
REPEATS, QUICK_REPEATS = 7, 3
RATES = (0.04, 3e7, 1e4)
TOL = dict(rtol=1e-6, atol=1e-10)
#: issue targets
COUNT_RATIO, PEER_TARGET, BDF_TARGET, GRAD_TARGET = 2.0, 1.5, 1.0, 3.0

DIFFSL_ROBERTSON = """
in_i { k1 = 0.04, k2 = 30000000, k3 = 10000 }
u_i { x = 1, y = 0, z = 0 }
F_i {
  -k1 * x + k3 * y * z,
  k1 * x - k2 * y * y - k3 * y * z,
  k2 * y * y,
}
"""


def _timed(fn, repeats: int) -> float:
    return median_time(fn, repeats)[0]


def _continuous_gradient(loss, x, repeats: int) -> float:
    """The median time of `sd.grad(loss)` (compiled; its odeint with the
    continuous adjoint, beside each method's default)."""
    import jax

    import sciad as sd

    grad = sd.function(sd.grad(loss))
    timed_call(grad, (x,))
    return _timed(lambda: jax.block_until_ready(grad(x)), repeats)


def robertson(t1: float, repeats: int) -> dict:
    import jax
    import numpy as np
    import scipy.integrate as si

    import sciad as sd
    import sciad.numpy as snp

    k = np.array(RATES)
    y0 = np.array([1.0, 0.0, 0.0])
    ts = np.array([0.0, t1])

    def field(t, y, k):
        return snp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                          k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2,
                          k[1] * y[1] ** 2])

    def f_np(t, y):
        return [-k[0] * y[0] + k[2] * y[1] * y[2],
                k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2, k[1] * y[1] ** 2]

    def jac_np(t, y):
        return [[-k[0], k[2] * y[2], k[2] * y[1]],
                [k[0], -k[2] * y[2] - 2 * k[1] * y[1], -k[2] * y[1]],
                [0.0, 2 * k[1] * y[1], 0.0]]

    out = {"t1": t1, "t": {}, "counts": {}, "y": {}}
    for solver in ("bdf", "radau"):
        fwd = sd.function(lambda k, s=solver: sd.ode.odeint(field, y0, ts, k, solver=s,
                                                            throw=False, **TOL))
        grad = sd.function(sd.grad(lambda k, s=solver: sd.ode.odeint(
            field, y0, ts, k, solver=s, **TOL)[-1, 0]))
        compile_s, res = timed_call(fwd, (k,))
        out["compile_" + solver] = compile_s
        timed_call(grad, (k,))
        out["t"]["sd_" + solver] = _timed(lambda: jax.block_until_ready(fwd(k)), repeats)
        out["t"]["sd_" + solver + "_grad"] = _timed(lambda: jax.block_until_ready(grad(k)),
                                                    repeats)
        out["counts"]["sd_" + solver] = (int(res.nfev), int(res.njev), int(res.nlu))
        out["y"]["sd_" + solver] = np.asarray(res.ys[-1])
    for solver in ("bdf", "radau"):
        out["t"][f"sd_{solver}_cont"] = _continuous_gradient(
            lambda k, s=solver: sd.ode.odeint(field, y0, ts, k, solver=s,
                                              adjoint="interpolated", **TOL)[-1, 0], k, repeats)
    for method in ("BDF", "Radau"):
        call = HostCall(lambda m=method: si.solve_ivp(f_np, (0.0, t1), y0, method=m,
                                                      jac=jac_np, **TOL))
        out["t"]["scipy_" + method] = _timed(call, max(3, repeats // 2))
        ref = call().out
        out["counts"]["scipy_" + method] = (ref.nfev, ref.njev, ref.nlu)
        out["y"]["scipy_" + method] = ref.y[:, -1]
    exact = si.solve_ivp(f_np, (0.0, t1), y0, method="Radau", jac=jac_np, rtol=1e-12,
                         atol=1e-16).y[:, -1]
    out["err"] = {k_: float(np.abs(v - exact).max()) for k_, v in out["y"].items()}
    try:
        import pydiffsol as ds
    except ImportError:
        out["diffsol"] = None
        return out
    ode = ds.Ode(DIFFSL_ROBERTSON, matrix_type=ds.nalgebra_dense)
    ode.rtol, ode.atol = TOL["rtol"], TOL["atol"]
    sol = ode.solve(k, t1)
    out["t"]["diffsol"] = _timed(lambda: ode.solve(k, t1), repeats * 5)
    out["err"]["diffsol"] = float(np.abs(np.asarray(sol.ys)[:, -1] - exact).max())
    out["diffsol"] = ds.version() if callable(getattr(ds, "version", None)) else "?"
    return out


def brusselator(n: int, repeats: int) -> dict:
    import jax
    import numpy as np
    import scipy.integrate as si
    import scipy.sparse as sp

    import sciad as sd
    import sciad.numpy as snp

    ex = load_example(os.path.join(ROOT, "examples", "ode_fit.py"))
    p = ex.BRUSS_TRUE
    ts = np.linspace(0.0, 10.0, 11)
    y0 = ex.brusselator_start(n)
    tol = dict(rtol=1e-6, atol=1e-6)
    pattern = sd.sparse.jacobian_sparsity(lambda y: ex.brusselator(0.0, y, p), y0)
    pat = sp.csr_matrix((np.ones(pattern.nnz), pattern.indices, pattern.indptr),
                        shape=pattern.shape)
    f_np = brusselator_field(n, p, np)

    ref = si.solve_ivp(f_np, (0.0, 10.0), y0, "Radau", ts, rtol=1e-11, atol=1e-11,
                       jac_sparsity=pat).y.T
    out = {"n": n, "t": {}, "err": {}, "counts": {}}
    for solver in ("bdf", "radau"):
        fwd = sd.function(lambda p, s=solver: sd.ode.odeint(
            ex.brusselator, y0, ts, p, solver=s, jac="sparse", throw=False, **tol))
        grad = sd.function(sd.grad(lambda p, s=solver: snp.sum((sd.ode.odeint(
            ex.brusselator, y0, ts, p, solver=s, jac="sparse", **tol)[1:] - 1.0) ** 2)))
        _, res = timed_call(fwd, (p,))
        timed_call(grad, (p,))
        out["t"]["sd_" + solver] = _timed(lambda: jax.block_until_ready(fwd(p)), repeats)
        out["t"]["sd_" + solver + "_grad"] = _timed(lambda: jax.block_until_ready(grad(p)),
                                                    repeats)
        out["err"]["sd_" + solver] = float(np.abs(np.asarray(res.ys) - ref).max())
        out["counts"]["sd_" + solver] = (int(res.nfev), int(res.njev), int(res.nlu))
    for solver in ("bdf", "radau"):
        out["t"][f"sd_{solver}_cont"] = _continuous_gradient(
            lambda p, s=solver: snp.sum((sd.ode.odeint(
                ex.brusselator, y0, ts, p, solver=s, jac="sparse", adjoint="interpolated",
                **tol)[1:] - 1.0) ** 2), p, repeats)
    for method in ("BDF", "Radau"):
        call = HostCall(lambda m=method: si.solve_ivp(f_np, (0.0, 10.0), y0, m, ts,
                                                      jac_sparsity=pat, **tol))
        out["t"]["scipy_" + method] = _timed(call, max(3, repeats // 2))
        r = call().out
        out["err"]["scipy_" + method] = float(np.abs(r.y.T - ref).max())
        out["counts"]["scipy_" + method] = (r.nfev, r.njev, r.nlu)
    return out


def _cont(t: dict, solver: str) -> str:
    """The gradient by the continuous adjoint (ms), beside the default's."""
    key = f"sd_{solver}_cont"
    return f"{t[key] * 1e3:.1f}" if key in t else ""


HEAT_M = 100  # grid points per side (HEAT_M ** 2 unknowns)
HEAT_TOL = dict(rtol=1e-5, atol=1e-8)


def heat2d(m: int, repeats: int) -> dict:
    import jax
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.linalg import expm_multiply

    import sciad as sd
    import sciad.numpy as snp

    x = np.linspace(0.0, 1.0, m)
    h2 = (x[1] - x[0]) ** 2
    X, Y = np.meshgrid(x, x, indexing="ij")
    u0 = (16 * X * (1 - X) * Y * (1 - Y)).ravel()
    boundary = np.ones((m, m), bool)
    boundary[1:-1, 1:-1] = False
    mass = sp.diags((~boundary).ravel().astype(float)).tocsr()
    ts = np.array([0.0] + [0.01 * 2 ** i for i in range(8)])

    def laplacian(U, xp):
        return (U[:-2, 1:-1] + U[2:, 1:-1] + U[1:-1, :-2] + U[1:-1, 2:]
                - 4 * U[1:-1, 1:-1]) / h2

    def heat(t, u, a):  # interior: a (Laplacian of u); boundary: 0 = u
        U = snp.reshape(u, (m, m))
        return snp.reshape(snp.pad(a * laplacian(U, snp), 1) + snp.where(boundary, U, 0.0),
                           (m * m,))

    def solve(a, **kw):
        return sd.ode.odeint(heat, u0, ts, a, solver="bdf", jac="sparse", mass=mass,
                             **HEAT_TOL, **kw)

    fwd = sd.function(lambda a: solve(a, throw=False))
    grad = sd.function(sd.grad(lambda a: snp.sum(solve(a) ** 2)))
    out = {"m": m, "t": {}, "err": {}, "counts": {}}
    out["compile"], res = timed_call(fwd, (1.0,))
    out["compile_grad"], _ = timed_call(grad, (1.0,))
    out["t"]["sd"] = _timed(lambda: jax.block_until_ready(fwd(1.0).ys), repeats)
    out["t"]["sd_grad"] = _timed(lambda: jax.block_until_ready(grad(1.0)), repeats)
    out["counts"]["sd"] = (int(res.nfev), int(res.njev), int(res.nlu))
    n = m - 2  # the exact semi-discrete solution, on the interior
    T = sp.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]) / h2
    L = sp.kronsum(T, T).tocsr()
    exact = np.stack([expm_multiply(L * t, u0.reshape(m, m)[1:-1, 1:-1].ravel())
                      for t in ts])

    def error(ys):
        return float(np.abs(np.asarray(ys).reshape(len(ts), m, m)[:, 1:-1, 1:-1]
                            .reshape(len(ts), -1) - exact).max())

    out["err"]["sd"] = error(res.ys)
    try:
        import sksundae.ida as ida
    except ImportError:
        return out

    def residual(t, y, yp, res):  # IDA's form: 0 = yp - Laplacian(u), 0 = u
        U = y.reshape(m, m)
        r = yp.reshape(m, m).copy()
        r[1:-1, 1:-1] -= laplacian(U, np)
        r[boundary] = U[boundary]
        res[:] = r.ravel()

    index = np.arange(m * m).reshape(m, m)
    rows = np.concatenate([index[1:-1, 1:-1].ravel()] * 4)
    cols = np.concatenate([index[1 + di:m - 1 + di, 1 + dj:m - 1 + dj].ravel()
                           for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1))])
    pattern = (sp.identity(m * m) + sp.csr_matrix((np.ones(rows.size), (rows, cols)),
                                                  shape=(m * m, m * m))).tocsr()
    yp0 = np.zeros((m, m))
    yp0[1:-1, 1:-1] = laplacian(u0.reshape(m, m), np)
    solver = ida.IDA(residual, algebraic_idx=np.flatnonzero(boundary.ravel()),
                     linsolver="sparse", sparsity=pattern, max_num_steps=5000, **HEAT_TOL)
    call = HostCall(lambda: solver.solve(ts, u0, yp0.ravel()))
    out["t"]["ida"] = _timed(call, max(3, repeats // 2))
    sol = call().out
    out["err"]["ida"] = error(sol.y)
    out["counts"]["ida"] = (int(sol.nfev), int(sol.njev))
    return out


def render(robs, bruss, heats, machine, argv) -> str:
    lines = report_head("Stiff methods: BDF and Radau against SciPy and diffsol", argv,
                        machine)
    lines += ["", "## Robertson's kinetics (3 states, rtol 1e-6, atol 1e-10)", "",
              "Times: compiled solves, medians (ms). Counts: `nfev / njev / nlu` as SciPy "
              "counts them. Error: max |y(t1) - reference| (Radau at rtol 1e-12).", "",
              "| t1 | method | sciad ms | SciPy ms | sciad/SciPy | diffsol BDF ms "
              "| sciad/diffsol | counts sciad | counts SciPy | counts within 2x "
              "| gradient ms | grad/fwd | continuous adjoint ms | error sciad / SciPy |",
              "|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---|"]
    for r in robs:
        t, c, e = r["t"], r["counts"], r["err"]
        for solver, method in (("bdf", "BDF"), ("radau", "Radau")):
            mine, theirs = c["sd_" + solver], c["scipy_" + method]
            within = all(b / COUNT_RATIO <= a <= COUNT_RATIO * b for a, b in zip(mine, theirs))
            ds_ms = f"{t['diffsol'] * 1e3:.2f}" if "diffsol" in t else "n/a"
            ds_ratio = (f"{t['sd_' + solver] / t['diffsol']:.0f}"
                        + (f" ({yes_no(t['sd_' + solver] <= PEER_TARGET * t['diffsol'])})"
                           if solver == "bdf" else "")) if "diffsol" in t else "n/a"
            lines.append(
                f"| {r['t1']:.0e} | {method} | {t['sd_' + solver] * 1e3:.2f} "
                f"| {t['scipy_' + method] * 1e3:.1f} "
                f"| {t['sd_' + solver] / t['scipy_' + method]:.3f} | "
                f"{ds_ms if solver == 'bdf' else ''} | {ds_ratio if solver == 'bdf' else ''} "
                f"| {' / '.join(map(str, mine))} | {' / '.join(map(str, theirs))} "
                f"| {yes_no(within)} | {t['sd_' + solver + '_grad'] * 1e3:.2f} "
                f"| {t['sd_' + solver + '_grad'] / t['sd_' + solver]:.1f} "
                f"| {_cont(t, solver)} "
                f"| {e['sd_' + solver]:.1e} / {e['scipy_' + method]:.1e} |")
    if robs and robs[0].get("diffsol"):
        lines += ["", f"diffsol's error: {robs[0]['err']['diffsol']:.1e} (t1 = "
                  f"{robs[0]['t1']:.0e}). sciad's first call (trace and compile): BDF "
                  f"{robs[0]['compile_bdf']:.1f} s, Radau {robs[0]['compile_radau']:.1f} s."]
    lines += ["", "## Brusselator, method of lines (rtol = atol = 1e-6, sparse iteration "
              "matrices)", "",
              "| states | method | sciad fwd ms | SciPy ms (`jac_sparsity`) | sciad/SciPy "
              "| target | sciad grad ms | grad/fwd | continuous adjoint ms | counts sciad "
              "| counts SciPy | error sciad / SciPy |",
              "|---:|---|---:|---:|---:|---|---:|---:|---:|---|---|---|"]
    for r in bruss:
        t, e, c = r["t"], r["err"], r["counts"]
        for solver, method in (("bdf", "BDF"), ("radau", "Radau")):
            ratio = t["sd_" + solver] / t["scipy_" + method]
            gf = t["sd_" + solver + "_grad"] / t["sd_" + solver]
            target = (f"fwd {yes_no(ratio <= BDF_TARGET)}, grad {yes_no(gf <= GRAD_TARGET)}"
                      if solver == "bdf" else f"grad {yes_no(gf <= GRAD_TARGET)}")
            lines.append(
                f"| {2 * r['n']:,} | {method} | {t['sd_' + solver] * 1e3:.0f} "
                f"| {t['scipy_' + method] * 1e3:.0f} | {ratio:.2f} | {target} "
                f"| {t['sd_' + solver + '_grad'] * 1e3:.0f} | {gf:.1f} | {_cont(t, solver)} "
                f"| {' / '.join(map(str, c['sd_' + solver]))} "
                f"| {' / '.join(map(str, c['scipy_' + method]))} "
                f"| {e['sd_' + solver]:.1e} / {e['scipy_' + method]:.1e} |")
    for r in heats:
        t, e, c = r["t"], r["err"], r["counts"]
        m = r["m"]
        lines += ["", f"## idaHeat2D: the heat equation as a DAE, {m} x {m} = {m * m:,} "
                  "unknowns (rtol 1e-5, atol 1e-8)", "",
                  "| solver | forward ms | gradient ms | grad/fwd | counts | max error |",
                  "|---|---:|---:|---:|---|---:|",
                  f"| sciad BDF (sparse) | {t['sd'] * 1e3:.0f} | {t['sd_grad'] * 1e3:.0f} "
                  f"| {t['sd_grad'] / t['sd']:.1f} | {' / '.join(map(str, c['sd']))} "
                  f"| {e['sd']:.1e} |"]
        if "ida" in t:
            lines.append(f"| IDA (scikit-sundae, sparse) | {t['ida'] * 1e3:.0f} |  |  "
                         f"| {' / '.join(map(str, c['ida']))} | {e['ida']:.1e} |")
        lines += ["", "sciad / IDA forward: "
                  + (f"{t['sd'] / t['ida']:.2f}" if "ida" in t else "n/a (not installed)")
                  + f". Counts: `nfev / njev / nlu` (IDA: `nfev / njev`). sciad's first "
                  f"call (trace and compile): forward {r['compile']:.1f} s, gradient "
                  f"{r['compile_grad']:.1f} s."]
    lines += ["", "Gradients: each method's default adjoint, the discrete one (BDF: its "
              "steps' transposed iteration matrices, from the states and orders its loop "
              "records; Radau: one loop down its recorded steps, each step's transposed "
              "stage system solved by the iteration the forward's kept real and complex "
              "factorizations precondition); the continuous adjoint "
              "(`adjoint=\"interpolated\"`, the default of both before) beside it.",
              ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 repeats, the smaller problems")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/stiff.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    load = load_average()
    t0 = time.perf_counter()
    robs = [robertson(t1, repeats) for t1 in ((1e5,) if args.quick else (1e5, 4e5))]
    print(f"  Robertson done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    bruss = [brusselator(n, repeats) for n in ((64,) if args.quick else (512,))]
    print(f"  Brusselator done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
          flush=True)
    heats = [heat2d(m, max(3, repeats // 2)) for m in ((30,) if args.quick else (HEAT_M,))]
    print(f"  idaHeat2D done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    text = render(robs, bruss, heats, machine_info(load),
                  command_line("bench/stiff.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
