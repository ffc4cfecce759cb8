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
   Targets: counts within 2x of SciPy's same-named method.
2. The 1-D Brusselator by the method of lines (examples/ode_fit.py: `2n`
   states, rtol = atol = 1e-6, 11 output times on [0, 10]): sciad's BDF and
   Radau with sparse iteration matrices (the pattern from the graph, SuperLU)
   against SciPy's BDF and Radau with `jac_sparsity`. Max error against a
   Radau solve at 1e-11. Target: BDF forward <= 1.0x SciPy's BDF; gradient
   (the default adjoint) <= 3x the forward.
   Against diffsol (both problems, where pydiffsol is installed): its BDF
   (Robertson: nalgebra dense LU; the Brusselator: the same model in DiffSL,
   faer's sparse LU) and its gradients, forward sensitivities and the
   discrete adjoint. Targets: forward <= 1.5x diffsol's; gradient <= 2x
   diffsol's fastest.
3. SUNDIALS' `idaHeat2D` at 100 x 100 = 10,000 unknowns: the heat equation
   on the unit square, its boundary values algebraic (`0 = u` there, a
   singular mass matrix), `u0 = 16 x (1 - x) y (1 - y)`, output at 0.01 ...
   1.28 (doubling), rtol 1e-5, atol 1e-8: sciad's BDF with sparse iteration
   matrices and Kvaerno5 (ESDIRK, the same mass matrix), value and gradient
   (the sum of the squared outputs, in the diffusivity), against
   scikit-sundae's IDA (SUNDIALS' DAE solver, its `sparse` linear solver,
   SuperLU_MT, on the 5-point pattern; where it is installed). Error:
   max |u - exact| over the outputs, the semi-discrete system's exact
   solution by `scipy.sparse.linalg.expm_multiply`.

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
COUNT_RATIO, PEER_TARGET, BDF_TARGET, GRAD_TARGET, DS_GRAD_TARGET = 2.0, 1.5, 1.0, 3.0, 2.0

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
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
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
    grads = _diffsol_gradients(ode, k, np.array([0.0, t1]), repeats * 5)
    out["t"].update(grads["t"])
    out["failed"] = grads["failed"]
    return out


def _diffsol_gradients(ode, params, t_eval, repeats: int) -> dict:
    """diffsol's gradients of its solution at `t_eval` in `params`: forward
    sensitivities (every output's, in every parameter) and its discrete
    adjoint (of the sum of the outputs); `t` holds the times of those that
    run, `failed` the message of those that do not (its adjoint stops on
    Robertson: "step size is too small")."""
    import numpy as np

    out = {"t": {}, "failed": {}}

    def adjoint():
        sol, checkpoint = ode.solve_adjoint_fwd(params, t_eval)
        return ode.solve_adjoint_bkwd(sol, checkpoint,
                                      np.ones((ode.nout, len(np.asarray(sol.ts)))))

    for name, call in (("diffsol_sens", lambda: ode.solve_fwd_sens(params, t_eval)),
                       ("diffsol_adjoint", adjoint)):
        try:
            call()
        except RuntimeError as e:
            out["failed"][name] = str(e).split(":")[-1].strip()
            continue
        out["t"][name] = _timed(call, repeats)
    return out


def diffsl_brusselator(n: int, p) -> str:
    """The Brusselator of `examples/ode_fit.py` on `n` cells in DiffSL
    (diffsol's model language), its state ordered `[u, v]` (sciad's
    interleaves them), its parameters `in = [log alpha, B]` at `p`."""
    import numpy as np

    x = np.arange(1, n + 1) / (n + 1)
    u0 = 1.0 + np.sin(2 * np.pi * x)
    c = float((n + 1) ** 2)  # 1 / dx^2
    entries = []
    for i in range(n):
        entries += [f"({i}, {j}): {v!r}" for j, v in ((i - 1, c), (i, -2 * c), (i + 1, c))
                    if 0 <= j < n]
    values = ", ".join([repr(float(v)) for v in u0] + ["3.0"] * n)
    return f"""
in_i {{ la = {float(p[0])!r}, B = {float(p[1])!r} }}
L_ij {{ {", ".join(entries)} }}
e_i {{ (0:1): {c!r}, (1:{n - 1}): 0, ({n - 1}:{n}): {c!r} }}
u_i {{ {values} }}
a_i {{ u_i[0:{n}] }}
b_i {{ u_i[{n}:{2 * n}] }}
alpha {{ exp(la) }}
La_i {{ L_ij * a_j }}
Lb_i {{ L_ij * b_j }}
F_i {{ (0:{n}): 1 + a_i * a_i * b_i - (B + 1) * a_i + alpha * (La_i + e_i),
      ({n}:{2 * n}): B * a_i - a_i * a_i * b_i + alpha * (Lb_i + 3 * e_i) }}
"""


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
    try:
        import pydiffsol as ds
    except ImportError:
        return out
    # (its sparse LU: faer's; pydiffsol 0.6.2's KLU crashes on this problem)
    ode = ds.Ode(diffsl_brusselator(n, p), matrix_type=ds.faer_sparse)
    ode.rtol, ode.atol = tol["rtol"], tol["atol"]
    sol = ode.solve_dense(p, ts)
    out["t"]["diffsol"] = _timed(lambda: ode.solve_dense(p, ts), repeats)
    blocks = ref.reshape(len(ts), n, 2).transpose(0, 2, 1).reshape(len(ts), 2 * n)
    out["err"]["diffsol"] = float(np.abs(np.asarray(sol.ys).T - blocks).max())
    grads = _diffsol_gradients(ode, p, ts, repeats)
    out["t"].update(grads["t"])
    out["failed"] = grads["failed"]
    return out


def _cont(t: dict, solver: str) -> str:
    """The gradient by the continuous adjoint (ms), beside the default's."""
    key = f"sd_{solver}_cont"
    return f"{t[key] * 1e3:.1f}" if key in t else ""


HEAT_M = 100  # grid points per side (HEAT_M ** 2 unknowns)
HEAT_TOL = dict(rtol=1e-5, atol=1e-8)
#: the sciad solvers run on it, and their names in the table
HEAT_SOLVERS = {"bdf": "BDF", "kvaerno5": "Kvaerno5"}


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

    def solve(a, solver, **kw):
        return sd.ode.odeint(heat, u0, ts, a, solver=solver, jac="sparse", mass=mass,
                             **HEAT_TOL, **kw)

    out = {"m": m, "t": {}, "err": {}, "counts": {}, "compile": {}, "compile_grad": {},
           "ys": {}}
    for solver in HEAT_SOLVERS:
        fwd = sd.function(lambda a: solve(a, solver, throw=False))
        grad = sd.function(sd.grad(lambda a: snp.sum(solve(a, solver) ** 2)))
        out["compile"][solver], res = timed_call(fwd, (1.0,))
        out["compile_grad"][solver], _ = timed_call(grad, (1.0,))
        out["t"][solver] = _timed(lambda: jax.block_until_ready(fwd(1.0).ys), repeats)
        out["t"][solver + "_grad"] = _timed(lambda: jax.block_until_ready(grad(1.0)), repeats)
        out["counts"][solver] = (int(res.nfev), int(res.njev), int(res.nlu))
        out["ys"][solver] = res.ys
    n = m - 2  # the exact semi-discrete solution, on the interior
    T = sp.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]) / h2
    L = sp.kronsum(T, T).tocsr()
    exact = np.stack([expm_multiply(L * t, u0.reshape(m, m)[1:-1, 1:-1].ravel())
                      for t in ts])

    def error(ys):
        return float(np.abs(np.asarray(ys).reshape(len(ts), m, m)[:, 1:-1, 1:-1]
                            .reshape(len(ts), -1) - exact).max())

    for solver in HEAT_SOLVERS:
        out["err"][solver] = error(out["ys"].pop(solver))
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
              "| t1 | method | sciad ms | SciPy ms | sciad/SciPy "
              "| counts sciad | counts SciPy | counts within 2x "
              "| gradient ms | grad/fwd | continuous adjoint ms | error sciad / SciPy |",
              "|---:|---|---:|---:|---:|---|---|---|---:|---:|---:|---|"]
    for r in robs:
        t, c, e = r["t"], r["counts"], r["err"]
        for solver, method in (("bdf", "BDF"), ("radau", "Radau")):
            mine, theirs = c["sd_" + solver], c["scipy_" + method]
            within = all(b / COUNT_RATIO <= a <= COUNT_RATIO * b for a, b in zip(mine, theirs))
            lines.append(
                f"| {r['t1']:.0e} | {method} | {t['sd_' + solver] * 1e3:.2f} "
                f"| {t['scipy_' + method] * 1e3:.1f} "
                f"| {t['sd_' + solver] / t['scipy_' + method]:.3f} "
                f"| {' / '.join(map(str, mine))} | {' / '.join(map(str, theirs))} "
                f"| {yes_no(within)} | {t['sd_' + solver + '_grad'] * 1e3:.2f} "
                f"| {t['sd_' + solver + '_grad'] / t['sd_' + solver]:.1f} "
                f"| {_cont(t, solver)} "
                f"| {e['sd_' + solver]:.1e} / {e['scipy_' + method]:.1e} |")
    if robs:
        lines += ["", f"sciad's first call (trace and compile): BDF "
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
    lines += _against_diffsol(robs, bruss)
    for r in heats:
        t, e, c = r["t"], r["err"], r["counts"]
        m = r["m"]
        lines += ["", f"## idaHeat2D: the heat equation as a DAE, {m} x {m} = {m * m:,} "
                  "unknowns (rtol 1e-5, atol 1e-8)", "",
                  "| solver | forward ms | gradient ms | grad/fwd | sciad/IDA forward "
                  "| counts | max error | first call (fwd / grad) s |",
                  "|---|---:|---:|---:|---:|---|---:|---|"]
        for solver in HEAT_SOLVERS:
            ratio = f"{t[solver] / t['ida']:.2f}" if "ida" in t else "n/a"
            lines.append(f"| sciad {HEAT_SOLVERS[solver]} (sparse) | {t[solver] * 1e3:.0f} "
                         f"| {t[solver + '_grad'] * 1e3:.0f} "
                         f"| {t[solver + '_grad'] / t[solver]:.1f} | {ratio} "
                         f"| {' / '.join(map(str, c[solver]))} | {e[solver]:.1e} "
                         f"| {r['compile'][solver]:.1f} / {r['compile_grad'][solver]:.1f} |")
        if "ida" in t:
            lines.append(f"| IDA (scikit-sundae, sparse) | {t['ida'] * 1e3:.0f} |  |  |  "
                         f"| {' / '.join(map(str, c['ida']))} | {e['ida']:.1e} |  |")
        else:
            lines.append("| IDA (scikit-sundae) | not installed |  |  |  |  |  |  |")
        lines += ["", "Counts: `nfev / njev / nlu` (IDA: `nfev / njev`). First call: "
                  "trace and compile. Kvaerno5 with a mass matrix runs sciad's own ESDIRK "
                  "loop (diffrax's stage relation has no mass), its gradient the steps "
                  "replayed with it."]
    lines += ["", "Gradients: each method's default adjoint, the discrete one (BDF: its "
              "steps' transposed iteration matrices, from the states and orders its loop "
              "records; Radau: one loop down its recorded steps, each step's transposed "
              "stage system solved by the iteration the forward's kept real and complex "
              "factorizations precondition); the continuous adjoint "
              "(`adjoint=\"interpolated\"`, the default of both before) beside it.",
              ""]
    return "\n".join(lines)


def _against_diffsol(robs, bruss) -> list[str]:
    """The section that sets sciad beside diffsol (pydiffsol): forward
    solves (sciad's BDF and Radau against diffsol's BDF; target <=
    `PEER_TARGET`x) and gradients (sciad's gradient of one scalar of the
    solution against diffsol's fastest gradient, forward sensitivities or
    its adjoint; target <= `DS_GRAD_TARGET`x)."""
    rows = [(f"Robertson to {r['t1']:.0e}", r) for r in robs if "diffsol" in r["t"]] + \
        [(f"Brusselator, {2 * r['n']:,} states", r) for r in bruss if "diffsol" in r["t"]]
    if not rows:
        return ["", "## Against diffsol", "", "pydiffsol is not installed here."]
    lines = ["", "## Against diffsol (pydiffsol, Rust: BDF, dense LU on Robertson, faer's "
             "sparse LU on the Brusselator)", "",
             "Forward: compiled solves, medians (ms). Gradient: sciad's of one scalar of the "
             "solution (its default, discrete adjoint); diffsol's forward sensitivities (every "
             "output in every parameter) and its discrete adjoint, the faster of the two "
             f"the target's measure. Targets: forward <= {PEER_TARGET}x diffsol's, gradient "
             f"<= {DS_GRAD_TARGET}x diffsol's fastest.", "",
             "| problem | sciad BDF fwd | sciad Radau fwd | diffsol fwd | fwd ratio (best) "
             "| sciad BDF grad | sciad Radau grad | diffsol sens | diffsol adjoint "
             "| grad ratio (best) | error sciad BDF / diffsol |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for name, r in rows:
        t, e, failed = r["t"], r["err"], r.get("failed", {})
        fwd = min(t["sd_bdf"], t["sd_radau"]) / t["diffsol"]
        theirs = [t[k] for k in ("diffsol_sens", "diffsol_adjoint") if k in t]
        grad = min(t["sd_bdf_grad"], t["sd_radau_grad"]) / min(theirs) if theirs else None

        def ms(key):
            return f"{t[key] * 1e3:.2f}" if key in t else f"fails ({failed.get(key, 'n/a')})"

        lines.append(
            f"| {name} | {ms('sd_bdf')} | {ms('sd_radau')} | {ms('diffsol')} "
            f"| {fwd:.1f} ({yes_no(fwd <= PEER_TARGET)}) | {ms('sd_bdf_grad')} "
            f"| {ms('sd_radau_grad')} | {ms('diffsol_sens')} | {ms('diffsol_adjoint')} "
            f"| {'n/a' if grad is None else f'{grad:.1f} ({yes_no(grad <= DS_GRAD_TARGET)})'} "
            f"| {e['sd_bdf']:.1e} / {e['diffsol']:.1e} |")
    return lines


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
