"""Scalable solves: Poisson gradients at 10^4..10^6 unknowns in 2-D and 3-D,
sciad's direct and AMG-CG solves against SciPy, pyamg, klujax and lineax.

Run from the repository root:

    .venv/bin/python bench/scalable.py                  # every case (long: see below)
    .venv/bin/python bench/scalable.py --quick          # 3-D 22^3 (10^4 unknowns), < 1 min
    .venv/bin/python bench/scalable.py --cases 3d:100 --merge   # one case, kept with the rest
    .venv/bin/python bench/scalable.py --methods pyamg,sciad-amg --no-write

The problem: -div(exp(m) grad u) = f with u = 0 on the boundary, the
variable-coefficient finite-volume stencil of examples/inverse_poisson.py
(2-D, 5 points, N x N grid) and examples/inverse_conductivity_3d.py (3-D,
7 points, N x N x N grid), face conductivities the arithmetic means of the
nodes' exp(m); one source (the example's first), and

    J(m) = 0.5 ||u(m) - d||^2,    A(m) u = f,

`d` the solution for the example's true field plus 1% noise, evaluated at
m = 0.5 m_true. Cases (unknowns): 2-D 100^2, 316^2, 1000^2 (10^4, ~10^5,
10^6) and 3-D 22^3, 46^3, 100^3 (10^4, ~10^5, 10^6). Methods, each a
forward `J(m)` and a value-and-gradient `(J, dJ/dm)`, float64:

- `scipy`: `splu(A.tocsc(), permc_spec="MMD_AT_PLUS_A")` and a hand-written
  adjoint: `lam = lu.solve(u - d, trans="T")` with the same LU, the entries'
  cotangent `-lam[rows] * u[cols]`, and the transpose of the (linear in
  exp(m)) map m -> entries written out in NumPy (`entries_vjp`, checked
  against `jax.vjp` of the example's `entries` by `--check-vjp`).
- `sciad-direct`: `sd.linalg.solve(A, f, solver="klu")` where sciad has the
  compiled KLU record, else `solver="splu"`; `sd.function(J)` and
  `sd.function(sd.value_and_grad(J))`.
- `sciad-cholmod`: the same with `solver="cholmod"` (CHOLMOD's sparse
  Cholesky on the host, the `[cholmod]` extra; "auto"'s choice for these
  spd matrices from 2,500 unknowns where it is installed); run up to 10^6
  unknowns in 2-D and ~10^5 in 3-D (10 s for the numeric factorization at
  46^3).
- `klujax`: `klujax.solve(rows, cols, vals, f)`, `jax.grad`, jitted (klujax
  changes JAX's global config at import: it is imported only in its own
  process).
- `pyamg`: `pyamg.smoothed_aggregation_solver(A)` (its defaults: symmetric
  strength, standard aggregation, symmetric Gauss-Seidel smoothing), built
  once per evaluation, then `ml.solve(f, tol=1e-10, accel="cg")` forward and
  `ml.solve(u - d, ...)` for the adjoint (A is symmetric: one hierarchy), the
  same hand-written entries VJP. pyamg's CG stops at ||r|| <= tol ||b||.
- `sciad-amg`: `sd.linalg.solve(A, f, solver="cg", preconditioner="amg",
  rtol=1e-10)`: sciad's AMG-preconditioned CG, forward and adjoint (where
  sciad has no "amg" preconditioner yet the row runs Jacobi and says so).
- `lineax-cg`: `lineax.linear_solve` with `lineax.CG(rtol=1e-10, atol)` and a
  Jacobi preconditioner on a matrix-free `segment_sum` matvec, `jax.grad`,
  jitted; atol = 1e-10 ||f|| / sqrt(N) (lineax tests the residual
  elementwise: see bench/inverse_poisson.py).

Direct methods are skipped where a factorization would take more than about
a minute or exhaust memory (measured on this machine: SuperLU of the 3-D
46^3 matrix took 201 s and 87 * 10^6 factor entries), Jacobi-CG where its
thousands of iterations would; the table says so in the row.

Measurement: each (method, case) runs in its own process (its thread pools
and peak RSS are its own). There: build, call the forward and the
value-and-gradient once (first-call time: trace, compile, run), check the
gradient against the reference (below), then alternate one forward and one
value-and-gradient call for R rounds (R from a time budget and a warm
round where the first calls were quick, 2 at least; the order flipping
every round, gc off) and report medians. Every timed call
gets a different m (m + 1e-9 k v for call k), so no method gains from a
cache keyed on the values (an AMG hierarchy, a factorization): every call
builds its hierarchy or factorization, as an optimizer's would. Memory from
the process's RSS, as bench/inverse_poisson.py: "peak MB" the maximum RSS
above the RSS after imports and inputs (compilation included), "call peak
MB" the maximum during the timed calls above the RSS just before them (the
target compares this one). Iterations: the Krylov steps of the forward
solve (pyamg's residual history, lineax's `num_steps`; sciad's where its
SolveInfo reports them).

Reference gradient (per case, in the parent process): SciPy's splu with the
hand adjoint where the direct methods run, else pyamg's CG to rtol 1e-12
(forward and adjoint); "grad err" is ||g - g_ref|| / ||g_ref||.

Targets, at 10^6 unknowns in 3-D: sciad AMG value+gradient <= 1.3x pyamg's
(forward + hand adjoint, one hierarchy); its call peak memory <= 1.5x
pyamg's; its gradient/forward <= 2.1.

The Markdown table goes to stdout and to bench/results/scalable.md; the
measured rows to bench/results/scalable.json (`--merge` keeps the rows of
cases not measured in this run, so a long case can be run on its own).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import (block, command_line, load_average, load_example, machine_info,  # noqa: E402
                      publish, report_head, reset_peak, status_mb, write_text, yes_no)

RESULTS = os.path.join(HERE, "results", "scalable.md")
DATA = os.path.join(HERE, "results", "scalable.json")
EXAMPLES = {2: os.path.join(ROOT, "examples", "inverse_poisson.py"),
            3: os.path.join(ROOT, "examples", "inverse_conductivity_3d.py")}
AXES = {2: (1, 0), 3: (0, 1, 2)}  # the order of the faces' axes in each example's `entries`

CASES = ("2d:100", "2d:316", "2d:1000", "3d:22", "3d:46", "3d:100")
QUICK_CASES = ("3d:22",)
ORDER = ("scipy", "sciad-direct", "sciad-cholmod", "klujax", "pyamg", "sciad-amg", "lineax-cg")
LABELS = {"scipy": "SciPy splu + hand adjoint", "sciad-direct": "sciad direct",
          "sciad-cholmod": "sciad direct (cholmod)",
          "klujax": "klujax.solve + jax.grad", "pyamg": "pyamg SA + CG + hand adjoint",
          "sciad-amg": "sciad AMG-CG", "lineax-cg": "lineax CG (Jacobi) + jax.grad"}
DIRECT = ("scipy", "sciad-direct", "sciad-cholmod", "klujax")
RTOL = 1e-10
REF_RTOL = 1e-12
DIRECT_TOL, CG_TOL = 1e-8, 1e-6  # the gradient checks before timing
TARGET_CASE = "3d:100"
TIME_TARGET, MEMORY_TARGET, RATIO_TARGET = 1.3, 1.5, 2.1
NOISE = 0.01
# level-1 BLAS on one thread in every block: on a loaded 2-core machine OpenBLAS's
# threads spin (pyamg's setup at 22^3: 4.4 s with them, 0.09 s without); XLA's
# thread pool is not affected. `OPENBLAS_NUM_THREADS=2 bench/scalable.py` overrides it.
CHILD_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}


def skip_reason(method: str, dim: int, n: int) -> str | None:
    """Why `method` does not run on the case (None: it runs)."""
    N = n ** dim
    if method == "sciad-cholmod":  # (Cholesky: half SuperLU's fill, supernodes)
        if dim == 3 and N > 200_000:
            return "3-D fill-in: CHOLMOD's numeric factorization took 10 s at 46^3"
        return None
    if method in DIRECT and dim == 3 and N > 20_000:
        return "3-D fill-in: SuperLU took 201 s at 46^3 (87e6 factor entries)"
    if method in DIRECT and dim == 2 and N > 200_000:
        return "a SuperLU factorization > 30 s: value+gradient over a minute"
    if method == "lineax-cg" and dim == 2 and N > 200_000:
        return "Jacobi-CG: thousands of iterations, minutes per solve"
    if method == "lineax-cg" and N > 200_000:
        return "Jacobi-CG: ~60 s per solve at 100^3 (sciad's Jacobi-CG, measured)"
    return None


def parse_case(case: str) -> tuple[int, int]:
    dim, n = case.lower().split(":")
    return int(dim.rstrip("d")), int(n)


# ---------------------------------------------------------------------------
# the problem, in NumPy

def problem(dim: int, n: int):
    ex = load_example(EXAMPLES[dim])
    return ex, ex.Problem(n)


def entries_np(dim: int, P, m):
    """The example's stored values (NumPy) and k = exp(m)."""
    import numpy as np

    ex = load_example(EXAMPLES[dim])
    return ex.entries(P, m, xp=np), np.exp(m)


def entries_vjp(dim: int, P, k, g_vals):
    """The transpose of m -> entries(m) at k = exp(m), by hand: the values are
    the diagonal (N), then for each axis its interior faces twice (the upper
    and the lower off-diagonal), each face -0.5 (k_p + k_q) / h^2, the
    diagonal the sum of a node's faces over h^2 (a boundary face: the node's
    own k)."""
    import numpy as np

    n, h2 = P.n, P.h ** 2
    shape = (n,) * dim
    N = n ** dim
    G = g_vals[:N].reshape(shape) / h2  # d/d(face value) through the diagonal
    gk = np.zeros(shape)
    pos = N
    for axis in AXES[dim]:
        lo = [slice(None)] * dim
        hi = [slice(None)] * dim
        lo[axis], hi[axis] = slice(None, -1), slice(1, None)
        lo, hi = tuple(lo), tuple(hi)
        F = n ** (dim - 1) * (n - 1)
        g_off = g_vals[pos:pos + F] + g_vals[pos + F:pos + 2 * F]
        pos += 2 * F
        gkf = -g_off.reshape([n - 1 if a == axis else n for a in range(dim)]) / h2
        gkf = gkf + G[hi] + G[lo]  # each face in the diagonal of both of its nodes
        gk[lo] += 0.5 * gkf
        gk[hi] += 0.5 * gkf
        first = [slice(None)] * dim
        last = [slice(None)] * dim
        first[axis], last[axis] = 0, -1
        gk[tuple(first)] += G[tuple(first)]  # the boundary faces
        gk[tuple(last)] += G[tuple(last)]
    return gk.ravel() * k


def matrix(dim: int, P, m, fmt: str = "csr"):
    import scipy.sparse as sp

    vals, k = entries_np(dim, P, m)
    N = P.n ** dim
    return sp.coo_matrix((vals, (P.rows, P.cols)), shape=(N, N)).asformat(fmt), k


def pyamg_adjoint(dim: int, P, f, d, rtol: float):
    """pyamg forward + adjoint at `rtol`: (J(m), dJ/dm, iterations of the
    forward solve), as functions of m."""
    import numpy as np
    import pyamg

    def run(m, grad: bool):
        A, k = matrix(dim, P, m)
        ml = pyamg.smoothed_aggregation_solver(A)
        res = []
        u = ml.solve(f, tol=rtol, maxiter=2000, accel="cg", residuals=res)
        r = u - d
        val = 0.5 * float(np.sum(r * r))
        if not grad:
            return val, len(res) - 1
        lam = ml.solve(r, tol=rtol, maxiter=2000, accel="cg")
        return val, entries_vjp(dim, P, k, -lam[P.rows] * u[P.cols]), len(res) - 1

    return run


def splu_adjoint(dim: int, P, f, d):
    import numpy as np
    import scipy.sparse.linalg as spl

    def run(m, grad: bool):
        A, k = matrix(dim, P, m, "csc")
        lu = spl.splu(A, permc_spec="MMD_AT_PLUS_A")
        u = lu.solve(f)
        r = u - d
        val = 0.5 * float(np.sum(r * r))
        if not grad:
            return val, None
        lam = lu.solve(r, trans="T")
        return val, entries_vjp(dim, P, k, -lam[P.rows] * u[P.cols]), None

    return run


def make_inputs(dim: int, n: int, workdir: str, use_direct: bool) -> str:
    """Writes the case's inputs and reference gradient; returns the file."""
    import numpy as np

    _, P = problem(dim, n)
    f = np.ascontiguousarray(P.sources[:, 0])
    m_true = P.true_field()
    # the data: the true field's solution (computed as the reference computes) + noise
    if use_direct:
        import scipy.sparse.linalg as spl

        u = spl.splu(matrix(dim, P, m_true, "csc")[0], permc_spec="MMD_AT_PLUS_A").solve(f)
    else:
        import pyamg

        A = matrix(dim, P, m_true)[0]
        u = pyamg.smoothed_aggregation_solver(A).solve(f, tol=REF_RTOL, maxiter=2000,
                                                       accel="cg")
    rng = np.random.default_rng(0)
    d = u + NOISE * float(np.max(np.abs(u))) * rng.standard_normal(u.shape)
    m = 0.5 * m_true
    run = splu_adjoint(dim, P, f, d) if use_direct else pyamg_adjoint(dim, P, f, d, REF_RTOL)
    t0 = time.perf_counter()
    val, g, _ = run(m, True)
    ref_s = time.perf_counter() - t0
    path = os.path.join(workdir, f"inputs_{dim}d_{n}.npz")
    np.savez(path, m=m, f=f, d=d, g_ref=g, val_ref=val, dim=dim, n=n,
             ref=("splu" if use_direct else f"pyamg rtol {REF_RTOL:g}"), ref_s=ref_s)
    return path


# ---------------------------------------------------------------------------
# the methods: each builder returns fwd(m), grad(m) -> (value, gradient),
# prepare(m) (the method's argument for that m), and iterations(m)

def build_sciad(dim: int, n: int, inp: dict, kind: str):
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    __import__("sciad")
    import jax
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    ex, P = problem(dim, n)
    extra = {}
    if kind == "direct":
        kw = {"solver": "klu"}
        extra["label"] = "sciad direct (klu)"
    elif kind == "cholmod":
        kw = {"solver": "cholmod"}
        extra["label"] = "sciad direct (cholmod)"
    else:
        kw = {"solver": "cg", "preconditioner": "amg", "tol": RTOL}
        extra["label"] = "sciad AMG-CG"
    f, d = jax.device_put(inp["f"]), jax.device_put(inp["d"])

    def J(m, f, d):
        r = sd.linalg.solve(ex.stiffness(P, m), f, **kw) - d
        return 0.5 * snp.sum(r * r)

    fwd_c = sd.function(J)
    grad_c = sd.function(sd.value_and_grad(J))
    info_c = sd.function(lambda m, f: sd.linalg.solve(ex.stiffness(P, m), f, throw=False,
                                                      **kw)[1])

    def iterations(m):
        info = info_c(m, f)
        it = getattr(info, "iterations", None)
        return None if it is None else int(np.asarray(it))

    return (lambda m: fwd_c(m, f, d)), (lambda m: grad_c(m, f, d)), jax.device_put, \
        iterations, extra


def build_host(dim: int, n: int, inp: dict, kind: str):
    _, P = problem(dim, n)
    run = splu_adjoint(dim, P, inp["f"], inp["d"]) if kind == "scipy" else \
        pyamg_adjoint(dim, P, inp["f"], inp["d"], RTOL)
    return (lambda m: run(m, False)[0]), (lambda m: run(m, True)[:2]), (lambda m: m), \
        (lambda m: run(m, False)[1]), {}


def build_jax(dim: int, n: int, inp: dict, kind: str):
    import jax
    import jax.numpy as jnp
    import numpy as np

    ex, P = problem(dim, n)
    N = n ** dim
    rows, cols = (jax.device_put(np.asarray(a, np.int32)) for a in (P.rows, P.cols))
    f, d = jax.device_put(inp["f"]), jax.device_put(inp["d"])

    def entries(m):
        return ex.entries(P, m, xp=jnp)

    if kind == "klujax":
        import klujax  # only in this process: it changes JAX's global config

        def solve(vals, rows, cols, f):
            return klujax.solve(rows, cols, vals, f), None
    else:
        import lineax as lx

        def solve(vals, rows, cols, f):
            def matvec(x):
                return jax.ops.segment_sum(vals * x[cols], rows, num_segments=N)

            diag = jax.ops.segment_sum(jnp.where(rows == cols, vals, 0.0), rows,
                                       num_segments=N)
            op = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct(f.shape, f.dtype),
                                           tags=(lx.symmetric_tag,
                                                 lx.positive_semidefinite_tag))
            pre = lx.TaggedLinearOperator(
                lx.DiagonalLinearOperator(jax.lax.stop_gradient(1.0 / diag)),
                lx.positive_semidefinite_tag)
            atol = RTOL * jnp.linalg.norm(f) / np.sqrt(N)
            sol = lx.linear_solve(op, f, lx.CG(rtol=RTOL, atol=atol, max_steps=100_000),
                                  options={"preconditioner": pre})
            return sol.value, sol.stats["num_steps"]

    def J(m, rows, cols, f, d):
        r = solve(entries(m), rows, cols, f)[0] - d
        return 0.5 * jnp.sum(r * r)

    fwd_c = jax.jit(J)
    grad_c = jax.jit(jax.value_and_grad(J))
    steps_c = jax.jit(lambda m, rows, cols, f: solve(entries(m), rows, cols, f)[1])

    def iterations(m):
        s = steps_c(m, rows, cols, f)
        return None if s is None else int(s)

    return (lambda m: fwd_c(m, rows, cols, f, d)), (lambda m: grad_c(m, rows, cols, f, d)), \
        jax.device_put, iterations, {}


# ---------------------------------------------------------------------------
# the child process: one (method, case) block

def run_child(method: str, path: str, budget: float, rmax: int) -> dict:
    import numpy as np

    if method != "scipy" and method != "pyamg":
        import jax

        jax.config.update("jax_enable_x64", True)
        import sciad  # noqa: F401  (imported before the baseline RSS)
    if method == "pyamg":
        import pyamg  # noqa: F401
    import scipy.sparse.linalg  # noqa: F401

    inp = dict(np.load(path))
    dim, n = int(inp["dim"]), int(inp["n"])
    problem(dim, n)  # the example module and its Problem (index arrays), before the base
    builder = {"scipy": build_host, "pyamg": build_host, "sciad-direct": build_sciad,
               "sciad-cholmod": build_sciad, "sciad-amg": build_sciad, "klujax": build_jax,
               "lineax-cg": build_jax}[method]
    kind = method.split("-", 1)[1] if method.startswith("sciad-") else method
    rng = np.random.default_rng(2)
    v = rng.standard_normal(inp["m"].shape)
    rss0 = status_mb("VmRSS")
    fwd, grad, prepare, iterations, extra = builder(dim, n, inp, kind)

    def m_at(k):  # a different m for every call: no method gains from a cache of values
        return prepare(inp["m"] + 1e-9 * k * v)

    res = {"method": method, "dim": dim, "n": n, **extra}
    x = m_at(0)
    t0 = time.perf_counter()
    val_f = float(block(fwd(x)))
    res["fwd_first_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    val, g = block(grad(x))
    res["grad_first_s"] = time.perf_counter() - t0
    g = np.asarray(g, dtype=np.float64)
    g_ref, val_ref = inp["g_ref"], float(inp["val_ref"])
    res["grad_rel_err"] = float(np.linalg.norm(g - g_ref) / np.linalg.norm(g_ref))
    res["value_rel_err"] = abs(float(val) - val_ref) / abs(val_ref)
    tol = DIRECT_TOL if method in DIRECT else CG_TOL
    if not (res["grad_rel_err"] <= tol and res["value_rel_err"] <= tol
            and abs(val_f - float(val)) <= tol * abs(float(val))):
        res["error"] = (f"gradient error {res['grad_rel_err']:.1e}, value error "
                        f"{res['value_rel_err']:.1e} (forward {val_f!r}) > {tol:g}")
        return res
    res["iterations"] = iterations(x)

    # timed rounds: one forward and one value-and-gradient call each, order flipping
    est = res["fwd_first_s"] + res["grad_first_s"]
    k = 1
    if est < 5.0:  # (compilation dominates the first calls): one warm round to estimate R
        t0 = time.perf_counter()
        block(fwd(m_at(k)))
        block(grad(m_at(k + 1)))
        est, k = time.perf_counter() - t0, k + 2
    rounds = max(2, min(rmax, int(budget / max(est, 1e-9))))
    fns = {"fwd": fwd, "grad": grad}
    times = {"fwd": [], "grad": []}
    del x, g
    gc.collect()
    hwm_first = status_mb("VmHWM")  # imports excluded: compilation and first calls
    rss_before = status_mb("VmRSS")
    reset_peak()
    gc.disable()
    try:
        for r in range(rounds):
            for name in (("fwd", "grad") if r % 2 == 0 else ("grad", "fwd")):
                x = m_at(k)
                k += 1
                t0 = time.perf_counter()
                block(fns[name](x))
                times[name].append(time.perf_counter() - t0)
    finally:
        gc.enable()
    hwm = status_mb("VmHWM")
    res["call_peak_mb"] = hwm - rss_before
    res["peak_mb"] = max(hwm, hwm_first) - rss0
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        res[name] = {"ms": statistics.median(ts) * 1e3, "q1": q[0] * 1e3, "q3": q[2] * 1e3,
                     "repeats": len(ts)}
    return res


# ---------------------------------------------------------------------------
# the parent

def measure(cases, methods, budget: float, rmax: int, timeout: float) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalable_") as work:
        for case in cases:
            dim, n = parse_case(case)
            use_direct = skip_reason("scipy", dim, n) is None
            t0 = time.perf_counter()
            print(f"{case} ({n ** dim} unknowns): inputs and reference gradient ...",
                  file=sys.stderr, flush=True)
            from threadpoolctl import threadpool_limits

            with threadpool_limits(int(CHILD_ENV["OPENBLAS_NUM_THREADS"]), "blas"):
                path = make_inputs(dim, n, work, use_direct)
            print(f"  {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            import numpy as np

            ref = str(np.load(path)["ref"])
            for method in methods:
                why = skip_reason(method, dim, n)
                row = {"method": method, "dim": dim, "n": n, "case": case, "ref": ref}
                if why:
                    rows.append(row | {"skipped": why})
                    continue
                print(f"  {method} ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                cmd = [sys.executable, os.path.abspath(__file__), "--child", method, path,
                       "--budget", str(budget), "--rmax", str(rmax)]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                       cwd=ROOT, env=CHILD_ENV)
                except subprocess.TimeoutExpired:
                    rows.append(row | {"error": f"timed out after {timeout:.0f} s"})
                    continue
                if p.returncode != 0:
                    tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                    rows.append(row | {"error": f"exit {p.returncode}: {tail[:200]}"})
                    print(p.stderr[-2000:], file=sys.stderr)
                    continue
                rows.append(row | json.loads(p.stdout.strip().splitlines()[-1]))
                print(f"    {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return rows


def _ms(x: float) -> str:
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def _case_label(dim: int, n: int) -> str:
    return f"{dim}-D {n}^{dim} ({n ** dim:,})"


def render(rows: list[dict], machine: dict, argv: str, git: str) -> str:
    by = {(r["case"], r["method"]): r for r in rows}
    cases = [c for c in CASES if any(r["case"] == c for r in rows)] + \
        sorted({r["case"] for r in rows} - set(CASES))
    lines = [
        *report_head("Scalable solves: Poisson gradients at 10^4 to 10^6 unknowns", argv,
                     machine), git, "",
        "J(m) = 0.5 ||u(m) - d||^2 with A(m) u = f: the variable-coefficient Poisson "
        "matrix of examples/inverse_poisson.py (2-D, 5-point) and "
        "examples/inverse_conductivity_3d.py (3-D, 7-point), one source, m = 0.5 m_true; "
        "float64. Each (method, case) runs in its own process; times are medians over R "
        "rounds of one forward and one value-and-gradient call, each call with a "
        "different m (every call builds its factorization or AMG hierarchy). Iterative "
        f"methods solve to ||r|| <= {RTOL:g} ||b||, forward and adjoint. \"value+grad\" "
        "is one value-and-gradient call, \"vs pyamg\" its time over pyamg's (SA "
        "hierarchy built once, CG forward and adjoint, hand-written adjoint); \"iters\" "
        "the forward solve's Krylov steps; \"grad err\" ||g - g_ref|| / ||g_ref||, the "
        "reference named per case. \"call peak MB\" the maximum RSS during the timed "
        "calls above the RSS before them; \"peak MB\" the process's maximum RSS above its "
        "RSS after imports and inputs (compilation included).",
        "",
        "| case | method | value+grad ms | forward ms | grad/fwd | vs pyamg | iters "
        "| grad err | call peak MB | peak MB | first call s | R |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        dim, n = parse_case(case)
        pa = by.get((case, "pyamg"), {})
        for method in ORDER:
            r = by.get((case, method))
            if r is None:
                continue
            label = r.get("label", LABELS[method])
            head = f"| {_case_label(dim, n)} | {label} "
            if "skipped" in r:
                lines.append(head + f"| skipped: {r['skipped']} ||||||||||")
                continue
            if "error" in r:
                lines.append(head + f"| failed: {r['error']} ||||||||||")
                continue
            gr, fw = r["grad"]["ms"], r["fwd"]["ms"]
            vs = f"{gr / pa['grad']['ms']:.2f}" if "grad" in pa else "–"
            it = "–" if r.get("iterations") is None else str(r["iterations"])
            lines.append(
                head + f"| {_ms(gr)} | {_ms(fw)} | {gr / fw:.2f} | {vs} | {it} "
                f"| {r['grad_rel_err']:.1e} | {r['call_peak_mb']:.0f} | {r['peak_mb']:.0f} "
                f"| {r['fwd_first_s'] + r['grad_first_s']:.1f} | {r['grad']['repeats']} |")
    refs = [f"{_case_label(*parse_case(c))}: {next(r['ref'] for r in rows if r['case'] == c)}"
            for c in cases]
    lines += ["", "Reference gradients: " + "; ".join(refs) + "."]

    lines += ["", "## Targets", ""]
    am, pa = by.get((TARGET_CASE, "sciad-amg")), by.get((TARGET_CASE, "pyamg"))
    if not am or not pa or "grad" not in am or "grad" not in pa:
        lines.append(f"Not measured in this run: the targets are at {TARGET_CASE} "
                     f"(sciad AMG-CG and pyamg).")
    else:
        if am.get("label", "").find("jacobi") >= 0:
            lines.append("- sciad ran Jacobi-CG (no AMG in this sciad): targets not applicable.")
        vs = am["grad"]["ms"] / pa["grad"]["ms"]
        mem = am["call_peak_mb"] / pa["call_peak_mb"] if pa["call_peak_mb"] > 0 else float("nan")
        ratio = am["grad"]["ms"] / am["fwd"]["ms"]
        lines += [
            f"- 3-D 10^6: sciad AMG value+gradient / pyamg's forward + hand adjoint = "
            f"{vs:.2f} (target <= {TIME_TARGET}): target met: {yes_no(vs <= TIME_TARGET)}",
            f"- 3-D 10^6: call peak memory sciad AMG / pyamg = {am['call_peak_mb']:.0f} / "
            f"{pa['call_peak_mb']:.0f} MB = {mem:.2f} (target <= {MEMORY_TARGET}): target met: "
            f"{yes_no(mem <= MEMORY_TARGET)}; whole process: {am['peak_mb']:.0f} / "
            f"{pa['peak_mb']:.0f} MB",
            f"- 3-D 10^6: sciad AMG gradient / forward = {ratio:.2f} (target <= "
            f"{RATIO_TARGET}): target met: {yes_no(ratio <= RATIO_TARGET)}",
        ]
    lines.append("")
    return "\n".join(lines)


def git_state() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sciad", "bench"],
                               capture_output=True, text=True, cwd=ROOT).stdout.strip()
        return f"sciad at commit {rev}{' (with uncommitted changes)' if dirty else ''}."
    except OSError:
        return ""


def check_vjp() -> None:
    """`entries_vjp` against `jax.vjp` of the examples' `entries` (small grids)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    for dim, n in ((2, 7), (3, 5)):
        ex, P = problem(dim, n)
        rng = np.random.default_rng(0)
        m = 0.3 * rng.standard_normal(n ** dim)
        g_vals = rng.standard_normal(P.rows.size)
        _, vjp = jax.vjp(lambda m: ex.entries(P, m, xp=jnp), m)
        want = np.asarray(vjp(g_vals)[0])
        got = entries_vjp(dim, P, np.exp(m), g_vals)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{dim}-D n={n}: entries_vjp vs jax.vjp relative error {err:.1e}")
        assert err < 1e-13, err


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=None,
                   help=f"comma-separated DIMd:N (default: {','.join(CASES)})")
    p.add_argument("--methods", default=",".join(ORDER),
                   help=f"comma-separated subset of {','.join(ORDER)}")
    p.add_argument("--quick", action="store_true", help=f"only {','.join(QUICK_CASES)}")
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of bench/results/scalable.json not measured now")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timed rounds per block (default 8; --quick 2)")
    p.add_argument("--rmax", type=int, default=15, help="most rounds per block")
    p.add_argument("--timeout", type=float, default=900, help="seconds per block")
    p.add_argument("--check-vjp", action="store_true", help="check entries_vjp and exit")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "INPUTS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    budget = args.budget if args.budget is not None else (2.0 if args.quick else 8.0)

    if args.check_vjp:
        check_vjp()
        return 0
    if args.child:
        print(json.dumps(run_child(args.child[0], args.child[1], budget, args.rmax)))
        return 0

    cases = args.cases.split(",") if args.cases else (QUICK_CASES if args.quick else CASES)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(ORDER)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {ORDER}")
    load = load_average()
    t0 = time.perf_counter()
    rows = measure(cases, [m for m in ORDER if m in methods], budget, args.rmax, args.timeout)
    print(f"done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    git = git_state()
    if args.merge and os.path.exists(DATA):
        with open(DATA) as fh:
            old = json.load(fh)
        new = {(r["case"], r["method"]) for r in rows}
        kept = [r for r in old["rows"] if (r["case"], r["method"]) not in new]
        rows = kept + rows
        if kept:
            git += " Rows of other runs kept (--merge): " + ", ".join(
                sorted({r["case"] for r in kept})) + f" from {old.get('when', '?')}."
    text = render(rows, machine_info(load), command_line("bench/scalable.py", argv), git)
    publish(RESULTS, text, write=not args.no_write)
    if not args.no_write:
        write_text(DATA, json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows},
                                    indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
