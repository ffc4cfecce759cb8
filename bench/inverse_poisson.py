"""The inverse-Poisson misfit and its gradient: sciad against SciPy and JAX peers.

Run from the repository root:

    .venv/bin/python bench/inverse_poisson.py              # full run (~5-7 min on 2 cores)
    .venv/bin/python bench/inverse_poisson.py --quick      # smoke check (N = 32, ~40 s)
    .venv/bin/python bench/inverse_poisson.py --sizes 64,128,256,512
    .venv/bin/python bench/inverse_poisson.py --methods scipy,sciad-direct --no-write
    .venv/bin/python bench/inverse_poisson.py --direct-solver splu   # sciad's SuperLU path

The problem is examples/inverse_poisson.py's: `Problem(N)` gives the 5-point
variable-coefficient Poisson matrix on an N x N grid (N^2 unknowns, about
5 N^2 stored entries, a static COO pattern) whose stored values `entries(m)`
come from the nodal log-conductivity `m`. The objective is a plain misfit with
one right-hand side (the example's first source `f`):

    J(m) = 0.5 * ||u(m) - d||^2,    A(m) u = f,

`d` the solution for the example's true field plus 1% noise, evaluated at
`m = 0.5 * m_true`. Methods (each a forward `J(m)` and a value-and-gradient
`(J, dJ/dm)`, float64):

- `sciad-direct`: `sd.linalg.solve(A, f, solver=S)` with the `spd`-tagged
  matrix, `S` from `--direct-solver` (default `"auto"`: on the CPU KLU through
  XLA's FFI up to 12,000 unknowns, SuperLU through host callbacks above;
  `"klu"` or `"splu"` to force one), the factor
  reused by the adjoint; `sd.function(J)` and `sd.function(sd.value_and_grad(J))`.
- `sciad-cg`: the same with `solver="cg", tol=1e-10, preconditioner="jacobi"`.
- `scipy`: `splu(A.tocsc(), permc_spec="MMD_AT_PLUS_A")` and a hand-written
  adjoint: `lam = lu.solve(u - d, trans="T")` with the same LU, the entries'
  cotangent `-lam[rows] * u[cols]`, and the transpose of the (linear in
  exp(m)) map m -> entries written out by hand in NumPy. The reference
  gradient for every other method (itself checked against a central
  difference).
- `jax-cg`: `jax.scipy.sparse.linalg.cg` (Jacobi-preconditioned, tol 1e-10) on a
  matrix-free `segment_sum` matvec from the COO entries, `jax.grad`, jitted.
- `lineax-cg`: `lineax.linear_solve` with `lineax.CG(rtol=1e-10)`, the same
  operator and preconditioner, `jax.grad`, jitted. lineax tests the residual
  elementwise against `atol + rtol |f_i|`, which with `atol = 0` this localized
  source never meets (it runs to 10 N steps and fails), so `atol = 1e-10
  ||f|| / sqrt(N^2)`, which makes its test imply `||r|| <= 1e-10 ||f||` (sciad's
  CG, on lineax too, takes half of each tolerance for the same guarantee);
  its preconditioner is held constant (`stop_gradient`: lineax cannot
  differentiate its `options`).
- `cholmod`: SciPy's hand adjoint with CHOLMOD's Cholesky (cvxopt's) for
  splu: the symbolic analysis once, outside the timed calls; the numeric
  factorization and the solves each call (the adjoint solve is the forward
  one: the matrix is symmetric). What sciad's `"cholmod"` (auto's choice
  here, with cvxopt installed) runs, written by hand.
- `klujax`: `klujax.solve(rows, cols, vals, f)`, `jax.grad`, jitted; the index
  arrays are jit arguments (not constants baked into the program).
- `jax-dense`: `jnp.linalg.solve` on the densified matrix, `jax.grad`, jitted;
  only for N <= 64.
- `unrolled-cg`: K steps of Jacobi-preconditioned CG written with `jax.numpy` in a
  `lax.fori_loop`, differentiated by `jax.grad` through its iterations; K is
  the number of steps that reaches a relative residual of 1e-10 at this m
  and N. Only for N <= 256 (reverse mode keeps every iterate: ~5 GB at 256).
- klujax is optional (`pip install klujax`): without it its row shows the
  import error. The CG-based methods skip N > 256 (seconds per call).

Every JAX-based method takes `m`, `f`, `d` (and the peers the index arrays) as
jit arguments placed on the device once.

Measurement: each (method, N) runs in its own subprocess, so one library's
thread pools never share the machine with another's and the peak RSS is that
block's alone. In that process: build, call the forward and gradient once
(the first-call time: trace, compile, run), check the value and gradient
against SciPy's hand adjoint (rel. 2-norm error; direct solvers must agree to
1e-8, the CG-based ones to 1e-6), then alternate one forward and one gradient
call for R rounds (R from a time budget, the order flipping every round, gc
off; each call on the next of `FIELDS` = 4 fields `(1 + 1e-3 j) m`, as an
optimizer's calls change the values: CHOLMOD's compiled path skips a
factorization of the values it factored last) and report the medians. The
relative residual `||A u - f|| / ||f||` of
each method's solution is checked in NumPy. Memory, from the process's RSS:
"peak" is its peak RSS (`VmHWM`: imports, compilation and the timed calls)
minus its RSS after the imports and inputs, a cheap upper bound of what the
block needed, with XLA's compilation included; "held" the RSS after the first
calls above the same base (compiled programs, caches); "call peak" the peak
RSS during the timed calls (the peak counter reset before them through
`/proc/self/clear_refs`) above the RSS just before them: what one call needs,
the figure the memory target compares. Wall time is the measure; the process's CPU
time per call (all threads) is shown too, being less sensitive to other load
on the machine (but it counts spinning XLA and OpenBLAS threads).

`scipy` and `sciad-direct`, which the targets compare, run paired: both
processes are started, and they take turns running batches of rounds (the
order flipping every batch), so that both see the same load; the per-batch
ratios of their gradient times are reported with the pooled medians.

`sciad-parts` (also its own subprocess per N) times the pieces of sciad's
direct solve: the host factorization and the checked host solves (timed by
wrapping the functions sciad's host calls run, from this script; nothing in
sciad/ is changed), SuperLU and a plain triangular solve on the same arrays
on the main thread, the entries + assembly alone, and a program with one
pass-through host call; and the memory the process holds between calls.

Many small solves (`--no-steps` skips it): 50 backward-Euler steps of a 1-D
heat equation with one 512 x 512 matrix from a log-conductivity `m`, the
value and gradient of a misfit of the last state: sciad (`sd.linalg.solve`
in a Python loop; the graph shares one factorization) against SciPy's splu
with the adjoint steps written by hand, paired like the direct solvers.
Target: sciad's gradient at most 1.2x SciPy's.

The Markdown tables go to stdout and to bench/results/inverse_poisson.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import load_example as _harness_load_example  # noqa: E402
from _harness import (  # noqa: E402
    block, command_line, load_average, machine_info, publish, report_head, reset_peak, status_mb,
    timed_call, yes_no,
)

RESULTS = os.path.join(HERE, "results", "inverse_poisson.md")
EXAMPLE = os.path.join(ROOT, "examples", "inverse_poisson.py")

SIZES, QUICK_SIZES = (64, 128, 256), (32,)
CG_TOL = 1e-10
DIRECT_RTOL, CG_RTOL = 1e-8, 1e-6
# targets from the issue
RATIO_TARGET, RATIO_AT = 1.15, (256,)
VS_SCIPY_TARGET, VS_SCIPY_GOAL, VS_SCIPY_AT = 1.2, 0.8, (128, 256)
# the sparse direct solver of sciad's rows (`--direct-solver`; the children
# read it from the environment)
DIRECT_SOLVER = os.environ.get("SCIAD_BENCH_DIRECT_SOLVER", "auto")
MEMORY_TARGET, MEMORY_AT = 1.5, (256,)

# key: (label, kind, largest N it runs at)
METHODS = {
    "scipy": ("SciPy splu + hand adjoint", "direct", None),
    "sciad-direct": (f"sciad direct ({DIRECT_SOLVER})", "direct", None),
    "sciad-cg": ("sciad CG (jacobi)", "cg", 256),
    "jax-cg": ("jax.scipy cg + jax.grad", "cg", 256),
    "lineax-cg": ("lineax CG + jax.grad", "cg", 256),
    "klujax": ("klujax.solve + jax.grad", "direct", None),
    "cholmod": ("CHOLMOD (cvxopt) + hand adjoint", "direct", None),
    "jax-dense": ("jnp.linalg.solve (dense) + jax.grad", "direct", 64),
    "unrolled-cg": ("unrolled CG + jax.grad", "unrolled", 256),
}
ORDER = tuple(METHODS)
CHILD_TIMEOUT = 420

# the many-small-solves case: STEPS backward-Euler steps of a 1-D heat
# equation with one STEP_N x STEP_N matrix (value and gradient)
STEPS, STEP_N, STEP_DT = 50, 512, 1e-3
STEPS_TARGET = 1.2
STEP_METHODS = {
    "scipy-steps": "SciPy splu + hand adjoint",
    "sciad-steps": f"sciad ({DIRECT_SOLVER}, one shared factorization)",
}


# ---------------------------------------------------------------------------
# the problem, in NumPy (shared by the children)

def load_example():
    """examples/inverse_poisson.py as a module (see `_harness.load_example`)."""
    return _harness_load_example(EXAMPLE)


def entries_np(n: int, h: float, m):
    """The example's `entries(problem, m)` in NumPy; also returns exp(m) as (n, n)."""
    import numpy as np

    h2 = h * h
    k = np.exp(m).reshape(n, n)
    kx = 0.5 * (k[:, :-1] + k[:, 1:])
    ky = 0.5 * (k[:-1, :] + k[1:, :])
    diag = np.empty((n, n))
    diag[:, :-1] = kx          # right faces
    diag[:, -1] = k[:, -1]
    diag[:, 1:] += kx          # left faces
    diag[:, 0] += k[:, 0]
    diag[:-1, :] += ky         # down faces
    diag[-1, :] += k[-1, :]
    diag[1:, :] += ky          # up faces
    diag[0, :] += k[0, :]
    offx, offy = -kx.ravel() / h2, -ky.ravel() / h2
    return np.concatenate([diag.ravel() / h2, offx, offx, offy, offy]), k


def entries_np_vjp(n: int, h: float, k, g):
    """dJ/dm from dJ/d(entries) `g`: the transpose of `entries_np`, by hand."""
    import numpy as np

    h2, n2, nf = h * h, n * n, n * (n - 1)
    gd = g[:n2].reshape(n, n) / h2
    gkx = (-(g[n2:n2 + nf] + g[n2 + nf:n2 + 2 * nf]) / h2).reshape(n, n - 1)
    gky = (-(g[n2 + 2 * nf:n2 + 3 * nf] + g[n2 + 3 * nf:]) / h2).reshape(n - 1, n)
    gkx += gd[:, :-1] + gd[:, 1:]
    gky += gd[:-1, :] + gd[1:, :]
    gk = np.zeros((n, n))
    gk[:, -1] += gd[:, -1]
    gk[:, 0] += gd[:, 0]
    gk[-1, :] += gd[-1, :]
    gk[0, :] += gd[0, :]
    gkx *= 0.5
    gky *= 0.5
    gk[:, :-1] += gkx
    gk[:, 1:] += gkx
    gk[:-1, :] += gky
    gk[1:, :] += gky
    return (gk * k).ravel()


def make_inputs(n: int, path: str) -> None:
    """The pattern, source, data and evaluation point for size `n`, saved to `path`;
    also checks `entries_np` against the example's sciad `entries`."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    ex = load_example()
    P = ex.Problem(n)
    rows, cols = P.rows.astype(np.int64), P.cols.astype(np.int64)
    f = np.ascontiguousarray(P.sources[:, 0])
    m_true = P.true_field()
    N = n * n
    vals_true, _ = entries_np(n, P.h, m_true)
    u_true = spl.splu(sp.coo_matrix((vals_true, (rows, cols)), shape=(N, N)).tocsc(),
                      permc_spec="MMD_AT_PLUS_A").solve(f)
    sigma = 0.01 * float(np.max(np.abs(u_true)))
    d = u_true + sigma * np.random.default_rng(0).standard_normal(N)
    m = 0.5 * m_true
    import sciad as sd

    sd_vals = np.asarray(sd.function(lambda mm: ex.entries(P, mm))(m))
    vals, _ = entries_np(n, P.h, m)
    err = np.max(np.abs(sd_vals - vals)) / np.max(np.abs(vals))
    assert err < 1e-14, f"entries_np differs from the example's entries: {err:.2e}"
    np.savez(path, n=n, h=P.h, rows=rows, cols=cols, f=f, d=d, m=m)


def step_entries_np(n: int, h: float, m):
    """The stored values of `I + dt L(m)` (1-D, `-(k u')'` with Dirichlet ends,
    face conductivities the average of the two nodes', the end node's own at
    the boundary faces): `[diagonal, lower, upper]`; also returns exp(m)."""
    import numpy as np

    k = np.exp(m)
    kf = 0.5 * (k[:-1] + k[1:])
    c = STEP_DT / (h * h)
    diag = 1.0 + c * (np.concatenate([k[:1], kf]) + np.concatenate([kf, k[-1:]]))
    return np.concatenate([diag, -c * kf, -c * kf]), k


def step_entries_vjp(n: int, h: float, k, g):
    """dJ/dm from dJ/d(entries) `g`: the transpose of `step_entries_np`."""
    import numpy as np

    c = STEP_DT / (h * h)
    gd, gl, gu = g[:n] * c, g[n:2 * n - 1] * c, g[2 * n - 1:] * c
    gkf = gd[1:] + gd[:-1] - gl - gu  # each face enters two diagonals and both off-diagonals
    gk = np.zeros(n)
    gk[0] += gd[0]
    gk[-1] += gd[-1]
    gk[:-1] += 0.5 * gkf
    gk[1:] += 0.5 * gkf
    return gk * k


def step_pattern(n: int):
    import numpy as np

    i = np.arange(n)
    return (np.concatenate([i, i[1:], i[:-1]]), np.concatenate([i, i[:-1], i[1:]]))


def make_step_inputs(path: str) -> None:
    """The steps case's pattern, initial state, data and evaluation point."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    n = STEP_N
    h = 1.0 / (n + 1)
    x = np.linspace(h, 1 - h, n)
    rows, cols = step_pattern(n)
    u0 = np.exp(-((x - 0.3) / 0.05) ** 2)
    m_true = 0.8 * np.sin(3 * np.pi * x)
    vals, _ = step_entries_np(n, h, m_true)
    lu = spl.splu(sp.csc_matrix(sp.coo_matrix((vals, (rows, cols)), shape=(n, n))))
    u = u0
    for _ in range(STEPS):
        u = lu.solve(u)
    d = u + 0.01 * np.max(np.abs(u)) * np.random.default_rng(0).standard_normal(n)
    np.savez(path, n=n, h=h, rows=rows, cols=cols, u0=u0, d=d, m=0.5 * m_true)


def build_scipy_steps(inp):
    """SciPy's SuperLU once, the steps, and the adjoint steps by hand."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    n, h, rows, cols, u0, d = (inp[k] for k in ("n", "h", "rows", "cols", "u0", "d"))

    def factor(m):
        vals, k = step_entries_np(n, h, m)
        A = sp.csc_matrix(sp.coo_matrix((vals, (rows, cols)), shape=(n, n)))
        return spl.splu(A), k

    def fwd(m):
        lu, _ = factor(m)
        u = u0
        for _ in range(STEPS):
            u = lu.solve(u)
        r = u - d
        return 0.5 * float(np.sum(r * r))

    def grad(m):
        lu, k = factor(m)
        us = [u0]
        for _ in range(STEPS):
            us.append(lu.solve(us[-1]))
        r = us[-1] - d
        lam, g_vals = r, np.zeros(len(rows))
        for j in range(STEPS, 0, -1):        # A u_j = u_{j-1}
            lam = lu.solve(lam, trans="T")
            g_vals -= lam[rows] * us[j][cols]
        return 0.5 * float(np.sum(r * r)), step_entries_vjp(n, h, k, g_vals)

    m = inp["m"]
    v = np.random.default_rng(1).standard_normal(m.shape)
    eps = 1e-6
    fd = (fwd(m + eps * v) - fwd(m - eps * v)) / (2 * eps)
    gv = float(grad(m)[1] @ v)
    return fwd, grad, (m,), {"fd_rel_err": abs(fd - gv) / abs(gv)}


def build_sciad_steps(inp):
    """The same steps with `sd.linalg.solve` (the graph shares one factorization
    among the 50 solves and their 50 adjoint solves)."""
    import jax

    import sciad as sd
    import sciad.numpy as snp

    n, h = int(inp["n"]), float(inp["h"])
    rows, cols = inp["rows"], inp["cols"]
    c = STEP_DT / (h * h)

    def J(m, u0, d):
        k = snp.exp(m)
        kf = 0.5 * (k[:-1] + k[1:])
        diag = 1.0 + c * (snp.concatenate([k[:1], kf]) + snp.concatenate([kf, k[-1:]]))
        A = sd.sparse.coo_matrix((snp.concatenate([diag, -c * kf, -c * kf]), (rows, cols)),
                                 shape=(n, n), tags={"spd"})
        u = u0
        for _ in range(STEPS):
            u = sd.linalg.solve(A, u, solver=DIRECT_SOLVER)
        r = u - d
        return 0.5 * snp.sum(r * r)

    args = tuple(jax.device_put(inp[k]) for k in ("m", "u0", "d"))
    return sd.function(J), sd.function(sd.value_and_grad(J)), args, {}


# ---------------------------------------------------------------------------
# the methods (each builder returns fwd, grad, args, solution, extra)

def hand_adjoint(inp, factor):
    """`(fwd, grad, solution)` of the misfit with a hand-written adjoint, from
    `factor(m) -> (solve, solve_transposed, exp(m))` of a direct solver."""
    import numpy as np

    n, h, rows, cols, f, d = (inp[k] for k in ("n", "h", "rows", "cols", "f", "d"))

    def fwd(m):
        solve, _, _ = factor(m)
        r = solve(f) - d
        return 0.5 * float(np.sum(r * r))  # not `r @ r`: see below

    def grad(m):
        solve, solve_t, k = factor(m)
        u = solve(f)
        r = u - d
        lam = solve_t(r)                         # adjoint solve, same factor
        g_vals = -lam[rows] * u[cols]            # dJ/d(entries), on the pattern
        # `r @ r` (OpenBLAS ddot) goes multi-threaded above 10^4 entries and its
        # threads then spin on the other core through the next factorization:
        # no faster, but twice the CPU time
        return 0.5 * float(np.sum(r * r)), entries_np_vjp(n, h, k, g_vals)

    def solution(m):
        return factor(m)[0](f)

    return fwd, grad, solution


def build_scipy(inp):
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    n, h, rows, cols, f, d = (inp[k] for k in ("n", "h", "rows", "cols", "f", "d"))
    N = n * n

    def factor(m):
        vals, k = entries_np(n, h, m)
        A = sp.coo_matrix((vals, (rows, cols)), shape=(N, N)).tocsc()
        lu = spl.splu(A, permc_spec="MMD_AT_PLUS_A")
        return lu.solve, lambda r: lu.solve(r, trans="T"), k  # (adjoint: same LU)

    fwd, grad, solution = hand_adjoint(inp, factor)

    # central-difference check of the hand adjoint along a random direction
    m = inp["m"]
    v = np.random.default_rng(1).standard_normal(m.shape)
    eps = 1e-6
    fd = (fwd(m + eps * v) - fwd(m - eps * v)) / (2 * eps)
    gv = float(grad(m)[1] @ v)
    extra = {"fd_rel_err": abs(fd - gv) / abs(gv)}

    # the pieces, for the breakdown
    def med(fn, r=7):
        fn()
        ts = []
        for _ in range(r):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    vals, k = entries_np(n, h, m)
    A = sp.coo_matrix((vals, (rows, cols)), shape=(N, N)).tocsc()
    lu = spl.splu(A, permc_spec="MMD_AT_PLUS_A")
    u = lu.solve(f)
    lam = lu.solve(u - d, trans="T")
    g_vals = -lam[rows] * u[cols]
    extra["parts_ms"] = {
        "entries": med(lambda: entries_np(n, h, m)),
        "tocsc": med(lambda: sp.coo_matrix((vals, (rows, cols)), shape=(N, N)).tocsc()),
        "splu": med(lambda: spl.splu(A, permc_spec="MMD_AT_PLUS_A"), 5),
        "solve": med(lambda: lu.solve(f)),
        "solve_T": med(lambda: lu.solve(u - d, trans="T")),
        "sddmm": med(lambda: -lam[rows] * u[cols]),
        "entries_vjp": med(lambda: entries_np_vjp(n, h, k, g_vals)),
    }
    extra["lu_nnz"] = int(lu.L.nnz + lu.U.nnz)
    return fwd, grad, (m,), solution, extra


def build_cholmod(inp):
    """SciPy's hand adjoint with CHOLMOD's Cholesky (cvxopt's) in place of
    splu: the symbolic analysis once (outside the timed calls, as a user
    keeps it), the numeric factorization each call; the adjoint solve is the
    forward one (the matrix is symmetric)."""
    import cvxopt
    import cvxopt.cholmod as chm
    import numpy as np

    n, h, rows, cols, f, d = (inp[k] for k in ("n", "h", "rows", "cols", "f", "d"))
    N = n * n
    low = np.flatnonzero(cols <= rows)
    low = low[np.lexsort((rows[low], cols[low]))]
    A = cvxopt.spmatrix(cvxopt.matrix(np.ones(low.size)), cvxopt.matrix(rows[low].astype(np.int64)),
                        cvxopt.matrix(cols[low].astype(np.int64)), (N, N))
    F = chm.symbolic(A, uplo="L")

    def solve(b):
        x = cvxopt.matrix(b)
        chm.solve(F, x)
        return np.asarray(x).ravel()

    def factor(m):
        vals, k = entries_np(n, h, m)
        A.V = cvxopt.matrix(vals[low])
        chm.numeric(A, F)
        return solve, solve, k  # (symmetric: the adjoint solve is the forward one)

    fwd, grad, solution = hand_adjoint(inp, factor)
    return fwd, grad, (inp["m"],), solution, {}


def build_sciad(inp, solver: str):
    import jax
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    ex = load_example()
    P = ex.Problem(int(inp["n"]))
    assert np.array_equal(P.rows, inp["rows"]) and np.array_equal(P.cols, inp["cols"])
    kw = {"solver": DIRECT_SOLVER} if solver == "direct" else {
        "solver": "cg", "tol": CG_TOL, "preconditioner": "jacobi"}

    def J(m, f, d):
        u = sd.linalg.solve(ex.stiffness(P, m), f, **kw)
        r = u - d
        return 0.5 * snp.sum(r * r)

    fwd = sd.function(J)
    grad = sd.function(sd.value_and_grad(J))
    sol = sd.function(lambda m, f: sd.linalg.solve(ex.stiffness(P, m), f, **kw))
    args = tuple(jax.device_put(inp[k]) for k in ("m", "f", "d"))
    return fwd, grad, args, lambda m: sol(args[0], args[1]), {}


def _jax_entries(n: int):
    """The example's `entries(problem, m)`, in jax.numpy."""
    import jax.numpy as jnp

    problem = load_example().Problem(n)
    return lambda m: load_example().entries(problem, m, xp=jnp)


def _cg_iterations(matvec, inv_diag, b, tol: float, maxiter: int):
    """Jacobi-PCG steps (jax.numpy) until ||r|| <= tol ||b||: the count."""
    import jax
    import jax.numpy as jnp

    bnorm = jnp.linalg.norm(b)

    def cond(s):
        return (jnp.linalg.norm(s[2]) > tol * bnorm) & (s[0] < maxiter)

    def body(s):
        k, x, r, p, rz = s
        Ap = matvec(p)
        alpha = rz / jnp.dot(p, Ap)
        x, r = x + alpha * p, r - alpha * Ap
        z = inv_diag * r
        rz_new = jnp.dot(r, z)
        return k + 1, x, r, z + (rz_new / rz) * p, rz_new

    z = inv_diag * b
    s = (0, jnp.zeros_like(b), b, z, jnp.dot(b, z))
    return jax.lax.while_loop(cond, body, s)[0]


def build_jax(inp, method: str):
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = int(inp["n"])
    N = n * n
    entries = _jax_entries(n)
    extra = {}

    def parts(vals, rows, cols):
        def matvec(x):
            return jax.ops.segment_sum(vals * x[cols], rows, num_segments=N)
        diag = jax.ops.segment_sum(jnp.where(rows == cols, vals, 0.0), rows, num_segments=N)
        return matvec, 1.0 / diag

    if method == "jax-cg":
        from jax.scipy.sparse.linalg import cg

        def solve(vals, rows, cols, f):
            matvec, inv_diag = parts(vals, rows, cols)
            return cg(matvec, f, tol=CG_TOL, atol=0.0, M=lambda x: inv_diag * x)[0]
    elif method == "lineax-cg":
        import lineax as lx

        def solve(vals, rows, cols, f):
            matvec, inv_diag = parts(vals, rows, cols)
            op = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct(f.shape, f.dtype),
                                           tags=(lx.symmetric_tag,
                                                 lx.positive_semidefinite_tag))
            # lineax cannot differentiate its `options`: the preconditioner (which
            # does not change the solution) is held constant
            pre = lx.TaggedLinearOperator(
                lx.DiagonalLinearOperator(jax.lax.stop_gradient(inv_diag)),
                lx.positive_semidefinite_tag)
            # lineax tests |r_i| <= atol + rtol |f_i| elementwise: with atol = 0 the
            # near-zero entries of this localized source are never met (it runs to
            # its 10 N step limit and reports failure); this atol makes the test
            # imply ||r|| <= rtol ||f|| (what sciad's CG does too)
            atol = CG_TOL * jnp.linalg.norm(f) / np.sqrt(N)
            return lx.linear_solve(op, f, lx.CG(rtol=CG_TOL, atol=atol),
                                   options={"preconditioner": pre}).value
    elif method == "klujax":
        import klujax

        def solve(vals, rows, cols, f):
            return klujax.solve(rows, cols, vals, f)
    elif method == "jax-dense":
        def solve(vals, rows, cols, f):
            A = jnp.zeros((N, N), vals.dtype).at[rows, cols].add(vals)
            return jnp.linalg.solve(A, f)
    elif method == "unrolled-cg":
        m0, f0 = jnp.asarray(inp["m"]), jnp.asarray(inp["f"])
        rows0, cols0 = jnp.asarray(inp["rows"], jnp.int32), jnp.asarray(inp["cols"], jnp.int32)

        @jax.jit
        def count(m, rows, cols, f):
            matvec, inv_diag = parts(entries(m), rows, cols)
            return _cg_iterations(matvec, inv_diag, f, CG_TOL, 20 * N)

        steps = int(count(m0, rows0, cols0, f0))
        extra["cg_steps"] = steps

        def solve(vals, rows, cols, f):
            matvec, inv_diag = parts(vals, rows, cols)

            def body(_, s):
                x, r, p, rz = s
                Ap = matvec(p)
                alpha = rz / jnp.dot(p, Ap)
                x, r = x + alpha * p, r - alpha * Ap
                z = inv_diag * r
                rz_new = jnp.dot(r, z)
                return x, r, z + (rz_new / rz) * p, rz_new

            z = inv_diag * f
            s = (jnp.zeros_like(f), f, z, jnp.dot(f, z))
            return jax.lax.fori_loop(0, steps, body, s)[0]
    else:
        raise ValueError(method)

    def J(m, rows, cols, f, d):
        r = solve(entries(m), rows, cols, f) - d
        return 0.5 * jnp.dot(r, r)

    fwd = jax.jit(J)
    grad = jax.jit(jax.value_and_grad(J))
    sol = jax.jit(lambda m, rows, cols, f: solve(entries(m), rows, cols, f))
    args = tuple(jax.device_put(a) for a in (
        inp["m"], np.asarray(inp["rows"], np.int32), np.asarray(inp["cols"], np.int32),
        inp["f"], inp["d"]))
    return fwd, grad, args, lambda m: sol(*args[:4]), extra


# ---------------------------------------------------------------------------
# the child process: one (method, N) block

def _rss_mb() -> float:
    return status_mb("VmRSS")


def _hwm_mb() -> float:
    """This process's peak RSS (`ru_maxrss` where VmHWM cannot be read)."""
    return status_mb("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


#: the fields `m` each method's timed calls cycle through: `(1 + 1e-3 j) m`
FIELDS = 4


def _alternate(fns: dict, args, budget: float, rmin: int, rmax: int, fixed: int | None,
               warmup: bool = True, flip: bool = False):
    """Alternates one call of each of `fns` for R rounds (order flipped every
    round, starting reversed if `flip`; gc off), after one untimed round unless
    not `warmup` (R = `fixed`, or from `budget` and the untimed round's time);
    returns {name: [wall seconds, ...], name + "_cpu":
    [CPU seconds of the whole process (all threads), ...]}."""
    if warmup or not fixed:  # warm up (compiled already); its time is the estimate
        t0 = time.perf_counter()
        for fn in fns.values():
            block(fn(*args))
        est = time.perf_counter() - t0
    if fixed:
        rounds = fixed
    else:
        if est * rmin > 4 * budget:  # very slow calls (CG at N=256, dense): 3 rounds
            rmin = 3
        rounds = max(rmin, min(rmax, int(budget / max(est, 1e-9))))
    order = list(fns)[::-1] if flip else list(fns)
    times = {k: [] for k in order} | {k + "_cpu": [] for k in order}
    # (each call on the next of FIELDS fields: an optimizer's calls, whose
    # values change; a library that skips a factorization of the values it
    # factored last, as CHOLMOD's compiled path does, is not timed solving alone)
    variants = [(args[0] * (1 + 1e-3 * j),) + tuple(args[1:]) for j in range(FIELDS)]
    calls = 0
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for k in (order if r % 2 == 0 else order[::-1]):
                a = variants[calls % FIELDS]
                calls += 1
                c0, t0 = time.process_time(), time.perf_counter()
                block(fns[k](*a))
                t1, c1 = time.perf_counter(), time.process_time()
                times[k].append(t1 - t0)
                times[k + "_cpu"].append(c1 - c0)
    finally:
        gc.enable()
    return times


def _stats_ms(ts) -> dict:
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {"ms": statistics.median(ts) * 1e3, "q1": q[0] * 1e3, "q3": q[2] * 1e3,
            "repeats": len(ts), "samples": list(ts)}


def prepare_child(method: str, n: int, workdir: str):
    """Builds `method` for size `n`, calls it once and checks it against the
    reference: (result dict, fwd, grad, args)."""
    import numpy as np

    import jax  # (every child: the harness uses it to wait for results)

    if not method.startswith("scipy"):
        jax.config.update("jax_enable_x64", True)
        import sciad  # noqa: F401  (imported before the baseline RSS, like jax)
    import scipy.sparse as sp
    import scipy.sparse.linalg  # noqa: F401

    steps = method in STEP_METHODS
    inp = dict(np.load(os.path.join(workdir, "steps.npz" if steps else f"inputs_{n}.npz")))
    inp["n"], inp["h"] = int(inp["n"]), float(inp["h"])
    rss0 = _rss_mb()
    if method == "scipy-steps":
        fwd, grad, args, extra = build_scipy_steps(inp)
    elif method == "sciad-steps":
        fwd, grad, args, extra = build_sciad_steps(inp)
    elif method == "scipy":
        fwd, grad, args, solution, extra = build_scipy(inp)
    elif method == "cholmod":
        fwd, grad, args, solution, extra = build_cholmod(inp)
    elif method.startswith("sciad-"):
        fwd, grad, args, solution, extra = build_sciad(inp, method.split("-", 1)[1])
    else:
        fwd, grad, args, solution, extra = build_jax(inp, method)
    res = {"method": method, "n": n, **extra}
    res["fwd_first_s"], val_f = timed_call(fwd, args)
    res["grad_first_s"], (val, g) = timed_call(grad, args)
    val_f, val, g = float(val_f), float(val), np.asarray(g, dtype=np.float64)
    assert g.dtype == np.float64 and g.shape == inp["m"].shape

    # correctness, before timing
    if not steps:
        N = n * n
        vals, _ = entries_np(n, inp["h"], inp["m"])
        A = sp.csr_matrix(sp.coo_matrix((vals, (inp["rows"], inp["cols"])), shape=(N, N)))
        u = np.asarray(solution(inp["m"]), dtype=np.float64)
        res["residual"] = float(np.linalg.norm(A @ u - inp["f"]) / np.linalg.norm(inp["f"]))
    ref_path = os.path.join(workdir, "ref_steps.npz" if steps else f"ref_{n}.npz")
    if method in ("scipy", "scipy-steps"):
        np.savez(ref_path, value=val, grad=g)
    ref = np.load(ref_path)
    res["value"] = val
    res["value_rel_err"] = abs(val - float(ref["value"])) / abs(float(ref["value"]))
    res["fwd_value_rel_err"] = abs(val_f - float(ref["value"])) / abs(float(ref["value"]))
    res["grad_rel_err"] = float(np.linalg.norm(g - ref["grad"]) / np.linalg.norm(ref["grad"]))
    res["rss_base_mb"] = rss0
    # the peak so far (imports of the method, build, compile, first calls); then
    # the peak counter restarts, for the timed calls alone
    res["rss_first_peak_mb"] = _hwm_mb()
    gc.collect()
    res["rss_ready_mb"] = _rss_mb()
    reset_peak()
    return res, fwd, grad, args


def run_child(method: str, n: int, workdir: str, budget: float, rmin: int, rmax: int,
              fixed: int | None) -> dict:
    """One block: build, check, time."""
    res, fwd, grad, args = prepare_child(method, n, workdir)
    times = _alternate({"fwd": fwd, "grad": grad}, args, budget, rmin, rmax, fixed)
    for k in ("fwd", "grad", "fwd_cpu", "grad_cpu"):
        res[k] = _stats_ms(times[k])
    res["rss_calls_peak_mb"] = _hwm_mb()
    res["rss_peak_mb"] = max(res["rss_first_peak_mb"], res["rss_calls_peak_mb"])
    return res


def serve_child(method: str, n: int, workdir: str) -> None:
    """Like `run_child`, but timing on request: prints the check's result as a
    JSON line, then for each `run R W F` line on stdin, the times of R rounds
    (after one untimed round if W is 1; the gradient first if F is 1); on
    `quit`, the final JSON line (peak RSS)."""
    res, fwd, grad, args = prepare_child(method, n, workdir)
    print(json.dumps(res), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] != "run":
            break
        times = _alternate({"fwd": fwd, "grad": grad}, args, 0.0, 1, 1, int(cmd[1]),
                           warmup=len(cmd) < 3 or cmd[2] == "1",
                           flip=len(cmd) > 3 and cmd[3] == "1")
        print(json.dumps(times), flush=True)
    print(json.dumps({"rss_calls_peak_mb": _hwm_mb()}), flush=True)


def run_parts(n: int, workdir: str, budget: float, rmin: int, rmax: int,
              fixed: int | None) -> dict:
    """Where sciad's direct-solve time (and memory) goes (see the module docstring)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    import sciad as sd
    import sciad.numpy as snp
    from sciad.solvers.direct import _cholmod, _sparse_direct
    from sciad.solvers import _host

    inp = dict(np.load(os.path.join(workdir, f"inputs_{n}.npz")))
    ex = load_example()
    P = ex.Problem(n)
    args = tuple(jax.device_put(inp[k]) for k in ("m", "f", "d"))
    rss0 = _rss_mb()

    def J(m, f, d):
        r = sd.linalg.solve(ex.stiffness(P, m), f) - d
        return 0.5 * snp.sum(r * r)

    # host time inside the callbacks, by wrapping the module functions the
    # callbacks look up when they run: SuperLU (on sciad's SuperLU thread) and
    # one checked solve (triangular solves, residual, backward error)
    host = {"factor": [], "solve": []}
    orig_factor, orig_solve = _sparse_direct._factor_one, _sparse_direct._solve_checked
    orig_cholmod = _cholmod.factorize

    def timed(key, fn):
        def wrapped(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            host[key].append(time.perf_counter() - t0)
            return out
        return wrapped

    _sparse_direct._factor_one = timed("factor", orig_factor)
    _cholmod.factorize = timed("factor", orig_cholmod)
    _sparse_direct._solve_checked = timed("solve", orig_solve)
    try:
        fwd, grad = sd.function(J), sd.function(sd.value_and_grad(J))
        block(fwd(*args)), block(grad(*args))
        out = {"n": n, "rss_compiled_mb": _rss_mb() - rss0}
        t = _alternate({"fwd": fwd, "grad": grad}, args, budget, rmin, rmax, fixed)
    finally:
        _sparse_direct._factor_one, _sparse_direct._solve_checked = orig_factor, orig_solve
        _cholmod.factorize = orig_cholmod
    out.update(fwd=_stats_ms(t["fwd"]), grad=_stats_ms(t["grad"]))
    out["factorizations"] = len(host["factor"])  # timed and warm-up calls
    out["host_factor_ms"] = statistics.median(host["factor"]) * 1e3
    out["host_solve_ms"] = statistics.median(host["solve"]) * 1e3
    # memory: what the process holds between calls (no factorization: each is
    # released after its last solve)
    gc.collect()
    out["rss_after_mb"], out["hwm_mb"] = _rss_mb() - rss0, _hwm_mb() - rss0
    out["held_factors"] = _sparse_direct.held()
    out["growth_per_factor_mb"] = (out["rss_after_mb"] - out["rss_compiled_mb"]) / max(
        out["factorizations"], 1)

    # SuperLU on the main thread, same CSC arrays as sciad's callback builds
    # (the CSR arrays of A read as CSC: the factor of A^T), and its plain solve
    pattern = sd.sparse.coo_matrix((np.ones(len(P.rows)), (P.rows, P.cols)),
                                   shape=(n * n, n * n)).type.pattern
    data = np.asarray(sd.function(lambda m: sd.sparse.data(ex.stiffness(P, m)))(args[0]))

    def splu_main():
        at = sp.csc_matrix((data, pattern.indices, pattern.indptr), shape=(n * n, n * n))
        return spl.splu(at, permc_spec="MMD_AT_PLUS_A")

    lu = splu_main()
    out["lu_nnz"] = int(lu.L.nnz + lu.U.nnz)
    f_np = np.asarray(args[1])
    for key, fn in (("splu_main_ms", splu_main),
                    ("plain_solve_ms", lambda: lu.solve(f_np, trans="T"))):
        fn()
        ts = []
        for _ in range(max(5, min(len(t["fwd"]), 21))):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[key] = statistics.median(ts) * 1e3
    del lu

    m = args[0]
    entries_fn = sd.function(lambda m: ex.entries(P, m))
    assembled = sd.function(lambda m: sd.sparse.data(ex.stiffness(P, m)))
    block(entries_fn(m)), block(assembled(m))
    t = _alternate({"entries": entries_fn, "assembled": assembled}, (m,), budget / 4,
                   rmin, rmax, fixed)
    out["entries"], out["assembled"] = _stats_ms(t["entries"]), _stats_ms(t["assembled"])

    # one sciad host call passing the vector through, against none
    N = n * n
    struct = (jax.ShapeDtypeStruct((N,), jnp.float64),)
    one_cb = jax.jit(lambda x: _host.host_call(lambda v: (v,), struct, x + 1.0)[0])
    plain = jax.jit(lambda x: x + 1.0)
    for fn in (one_cb, plain):
        block(fn(args[1]))
    t = _alternate({"cb": one_cb, "plain": plain}, (args[1],), budget / 4,
                   max(rmin, 21), max(rmax, 51), fixed)
    out["callback"] = _stats_ms(t["cb"])
    out["plain"] = _stats_ms(t["plain"])
    out["graph_nodes"] = len(sd.graph.passes.optimize(
        sd.trace(sd.value_and_grad(J), *(np.asarray(a) for a in args))).nodes)
    return out


# ---------------------------------------------------------------------------
# the parent: inputs, children, report

def _spawn(argv: list[str], timeout: int) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__)] + argv
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": " / ".join(tail)[-300:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


class _Server:
    """A `--serve` child: one method's process, timed on request."""

    def __init__(self, key: str, n: int, work: str):
        self.key = key
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", key, str(n), work],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
            cwd=ROOT)

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=60)
                self.err.seek(0)
                tail = self.err.read().strip().splitlines()[-3:]
                raise RuntimeError(" / ".join(tail)[-300:] or "the child exited")
            if line.startswith("{"):
                return json.loads(line)

    def run(self, rounds: int, warmup: bool = True, flip: bool = False) -> dict:
        self.proc.stdin.write(f"run {rounds} {int(warmup)} {int(flip)}\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> dict:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            out = self.read()
            self.proc.wait(timeout=60)
        except (OSError, RuntimeError, subprocess.SubprocessError):
            self.proc.kill()
            self.proc.wait()
            out = {}
        self.err.close()
        return out


def paired(n: int, work: str, batch_s: float, batches: int,
           keys=("scipy", "sciad-direct")) -> dict:
    """SciPy and sciad (`keys`: the reference first, it writes the reference
    gradient), each in its own process, timed in alternating batches (the
    order flipping every batch): both see the same load. Returns their
    results (samples pooled) and the per-batch ratios."""
    servers, results = {}, {}
    try:
        for key in keys:
            print(f"  N={n} {key} (paired) ...", file=sys.stderr, flush=True)
            servers[key] = _Server(key, n, work)
            results[key] = dict(servers[key].read(), method=key, n=n, blocks="paired")
        est = {}
        for key in keys:
            t = servers[key].run(1)
            est[key] = t["fwd"][0] + t["grad"][0]
        rounds = max(1, int(batch_s / max(est.values())))
        warm = max(est.values()) < 0.25  # an untimed round per batch only for short calls
        pooled = {k: {c: [] for c in ("fwd", "grad", "fwd_cpu", "grad_cpu")} for k in keys}
        ratios = {"grad": [], "fwd": [], "grad_cpu": []}
        for b in range(batches):
            med = {}
            for key in (keys if b % 2 == 0 else keys[::-1]):
                # fwd first in even batches, the gradient first in odd ones
                t = servers[key].run(rounds, warm, flip=b % 2 == 1)
                for c in pooled[key]:
                    pooled[key][c] += t[c]
                med[key] = {c: statistics.median(t[c]) for c in ratios}
            for c in ratios:
                ratios[c].append(med[keys[1]][c] / med[keys[0]][c])
        for key in keys:
            results[key].update({c: _stats_ms(v) for c, v in pooled[key].items()})
        pair = {}
        for c, v in ratios.items():
            q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
            pair[c] = {"median": statistics.median(v), "q1": q[0], "q3": q[2]}
        results[keys[1]]["paired"] = dict(pair, batches=batches, rounds=rounds)
    except RuntimeError as e:
        for key in keys:
            if "fwd" not in results.get(key, {}):
                results[key] = {"method": key, "n": n, "error": str(e)}
    finally:
        for key, srv in servers.items():
            final = srv.close()
            r = results.get(key, {})
            if "rss_calls_peak_mb" in final and "error" not in r:
                r["rss_calls_peak_mb"] = final["rss_calls_peak_mb"]
                r["rss_peak_mb"] = max(r["rss_first_peak_mb"], final["rss_calls_peak_mb"])
    return results


def measure(sizes, methods, quick: bool, repeats: int | None, parts: bool,
            steps: bool = True) -> dict:
    budget, rmin, rmax = (0.5, 3, 9) if quick else (2.5, 5, 41)
    batch_s, batches = (0.3, 3) if quick else (1.0, 8)
    timing = ["--budget", str(budget), "--rmin", str(rmin), "--rmax", str(rmax)]
    if repeats:
        timing += ["--repeats", str(repeats)]
    results, breakdown = [], []
    with tempfile.TemporaryDirectory(prefix="sciad_bench_ip_") as work:
        for n in sizes:
            t0 = time.perf_counter()
            make_inputs(n, os.path.join(work, f"inputs_{n}.npz"))
            todo = [k for k in ORDER if k in methods
                    and (METHODS[k][2] is None or n <= METHODS[k][2])]
            if "scipy" not in todo:
                todo.insert(0, "scipy")  # the reference gradient
            # the two methods the targets compare: paired (alternating batches of
            # their two processes), so a drift in the machine's load biases neither
            if "sciad-direct" in todo:
                t1 = time.perf_counter()
                blocks = paired(n, work, batch_s, batches)
                print(f"    {time.perf_counter() - t1:.1f} s", file=sys.stderr, flush=True)
            else:
                blocks = {}
            for key in todo:
                if key in blocks:
                    continue
                print(f"  N={n} {key} ...", file=sys.stderr, flush=True)
                t1 = time.perf_counter()
                res = _spawn(["--child", key, str(n), work] + timing, CHILD_TIMEOUT)
                print(f"    {time.perf_counter() - t1:.1f} s", file=sys.stderr, flush=True)
                blocks[key] = dict(res, method=key, n=n)
            for key in todo:
                if "error" in blocks[key]:
                    print(f"    {key} failed: {blocks[key]['error']}", file=sys.stderr,
                          flush=True)
            results += [blocks[k] for k in todo]
            if parts and "sciad-direct" in methods:
                print(f"  N={n} sciad-parts ...", file=sys.stderr, flush=True)
                t1 = time.perf_counter()
                res = _spawn(["--child", "sciad-parts", str(n), work] + timing, CHILD_TIMEOUT)
                print(f"    {time.perf_counter() - t1:.1f} s", file=sys.stderr, flush=True)
                res["n"] = n
                breakdown.append(res)
            print(f"  N={n} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
        step_results = {}
        if steps:
            t0 = time.perf_counter()
            make_step_inputs(os.path.join(work, "steps.npz"))
            step_results = paired(STEP_N, work, batch_s, batches, keys=tuple(STEP_METHODS))
            print(f"  steps done in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                  flush=True)
    return {"results": results, "breakdown": breakdown, "steps": step_results}


def _peak(r: dict) -> str:
    if "rss_peak_mb" not in r or "rss_base_mb" not in r:
        return "–"
    return f"{r['rss_peak_mb'] - r['rss_base_mb']:.0f}"


def _call_peak(r: dict) -> float | None:
    """The timed calls' peak RSS above the RSS just before them (MB)."""
    if "rss_calls_peak_mb" not in r or "rss_ready_mb" not in r:
        return None
    return max(r["rss_calls_peak_mb"] - r["rss_ready_mb"], 0.0)


def _held(r: dict) -> float | None:
    """RSS after the first calls above the RSS after imports and inputs (MB):
    compiled programs and whatever a call leaves behind."""
    if "rss_ready_mb" not in r or "rss_base_mb" not in r:
        return None
    return r["rss_ready_mb"] - r["rss_base_mb"]


def _mb(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f}"


def _fmt_ms(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def git_state() -> str:
    """The commit, and the files under sciad/ that differ from it (others may be
    editing the library while this runs)."""
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout
    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = [line[3:] for line in git("status", "--porcelain", "--", "sciad").splitlines()]
    except (OSError, subprocess.SubprocessError):
        return "sciad: git state unknown."
    text = f"sciad at commit {head or '?'}"
    if dirty:
        text += " with uncommitted changes to " + ", ".join(f"`{d}`" for d in dirty)
    return text + "."


def render_steps(st: dict) -> list[str]:
    """The many-small-solves section."""
    if not st:
        return []
    lines = [
        "", "## Many small solves", "",
        f"{STEPS} backward-Euler steps of a 1-D heat equation, `(I + dt L(m)) u_k+1 = u_k` "
        f"with one {STEP_N} x {STEP_N} tridiagonal matrix whose values come from the "
        "log-conductivity `m`, J(m) = 0.5 ||u_50 - d||^2; value and gradient. SciPy "
        "factors once and runs the steps and the adjoint steps by hand (50 solves and 50 "
        "transposed solves with one LU); sciad traces the Python loop, and its graph "
        "shares one factorization among all 100 solves. Run paired like the direct "
        "solvers above (medians over all rounds).",
        "",
        "| method | forward ms | gradient ms | gradient IQR | vs SciPy | grad err "
        "| peak MB | held MB | call peak MB | R |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    sc = st.get("scipy-steps", {})
    for key, label in STEP_METHODS.items():
        r = st.get(key)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error']} |||||||||")
            continue
        gr = r["grad"]["ms"]
        vs = f"{gr / sc['grad']['ms']:.2f}" if "grad" in sc else "–"
        lines.append(
            f"| {label} | {_fmt_ms(r['fwd']['ms'])} | {_fmt_ms(gr)} "
            f"| {_fmt_ms(r['grad']['q1'])}–{_fmt_ms(r['grad']['q3'])} | {vs} "
            f"| {r['grad_rel_err']:.1e} | {_peak(r)} | {_mb(_held(r))} "
            f"| {_mb(_call_peak(r))} | {r['grad']['repeats']} |")
    r = st.get("sciad-steps", {})
    if "grad" in r and "grad" in sc:
        vs = r["grad"]["ms"] / sc["grad"]["ms"]
        pr = r.get("paired", {}).get("grad")
        spread = (f" (per-batch ratios: median {pr['median']:.2f}, IQR "
                  f"{pr['q1']:.2f}–{pr['q3']:.2f} over {r['paired']['batches']} batches)"
                  if pr else "")
        ok = r["grad_rel_err"] <= DIRECT_RTOL
        lines += ["", f"- sciad gradient / SciPy hand adjoint = {vs:.2f}{spread} "
                  f"(target <= {STEPS_TARGET}): target met: {yes_no(vs <= STEPS_TARGET)}; "
                  f"gradient agrees to {DIRECT_RTOL:g}: {yes_no(ok)}"]
    if "fd_rel_err" in sc:
        lines.append(f"- SciPy's hand adjoint against a central difference: relative "
                     f"error {sc['fd_rel_err']:.1e}.")
    return lines


def render(data: dict, machine: dict, argv: str) -> str:
    res = data["results"]
    by = {(r["n"], r["method"]): r for r in res}
    sizes = sorted({r["n"] for r in res})
    lines = [
        *report_head("Inverse Poisson: misfit gradient, sciad vs SciPy and JAX peers", argv,
                     machine),
        data.get("git", ""),
        "",
        "J(m) = 0.5 ||u(m) - d||^2 with A(m) u = f: examples/inverse_poisson.py's 5-point "
        "variable-coefficient Poisson matrix on an N x N grid (N² unknowns), its first "
        "source, m = 0.5 m_true; float64, x64 on globally. Each (method, N) runs in its own "
        "process; times are medians over R rounds of one forward and one "
        "value-and-gradient call (alternating, after the first call and a warm-up). "
        "SciPy and sciad direct, which the targets compare, run paired: their two "
        "processes take turns in batches of rounds, so both see the same load. "
        "\"vs SciPy\" is the gradient time over SciPy's hand-written adjoint's. "
        "\"grad err\" is ||g - g_SciPy|| / ||g_SciPy|| (checked before timing: "
        f"<= {DIRECT_RTOL:g} for direct solvers, <= {CG_RTOL:g} for CG-based ones); "
        "\"residual\" is ||A u - f|| / ||f|| of the method's own solution. \"peak MB\" is the "
        "process's maximum RSS above its RSS after imports and inputs (compilation and "
        "first calls included); \"held MB\" its RSS after the first calls above the same "
        "base (compiled programs, caches); \"call peak MB\" the maximum RSS during the "
        "timed calls above the RSS just before them: the memory a call needs.",
        "",
        "| N | method | forward ms | gradient ms | gradient IQR | grad/fwd | vs SciPy "
        "| grad err | check | residual | peak MB | held MB | call peak MB | R |",
        "|---:|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        sc = by.get((n, "scipy"), {})
        for key in ORDER:
            r = by.get((n, key))
            if r is None:
                continue
            label = METHODS[key][0]
            if key == "unrolled-cg" and "cg_steps" in r:
                label += f", K={r['cg_steps']}"
            if "error" in r:
                lines.append(f"| {n} | {label} | failed: {r['error']} ||||||||||||")
                continue
            fw, gr = r["fwd"]["ms"], r["grad"]["ms"]
            vs = f"{gr / sc['grad']['ms']:.2f}" if "grad" in sc else "–"
            tol = DIRECT_RTOL if METHODS[key][1] == "direct" else CG_RTOL
            passed = r["grad_rel_err"] <= tol and r["value_rel_err"] <= tol
            check = "ref." if key == "scipy" else yes_no(passed)
            if METHODS[key][1] == "unrolled":
                check = f"{yes_no(passed)} (info)"
            lines.append(
                f"| {n} | {label} | {_fmt_ms(fw)} | {_fmt_ms(gr)} "
                f"| {_fmt_ms(r['grad']['q1'])}–{_fmt_ms(r['grad']['q3'])} | {gr / fw:.2f} | {vs} "
                f"| {r['grad_rel_err']:.1e} | {check} | {r['residual']:.1e} "
                f"| {_peak(r)} | {_mb(_held(r))} | {_mb(_call_peak(r))} "
                f"| {r['grad']['repeats']} |")
    skipped = [f"`{k}` (N <= {v[2]})" for k, v in METHODS.items() if v[2] is not None
               and any(n > v[2] for n in sizes)]
    if skipped:
        lines += ["", "Size limits: " + ", ".join(skipped) + "."]
    fds = [f"N={n}: {by[(n, 'scipy')]['fd_rel_err']:.1e}" for n in sizes
           if "fd_rel_err" in by.get((n, "scipy"), {})]
    if fds:
        lines += ["", "SciPy's hand adjoint against a central difference along a random "
                  "direction (eps 1e-6), relative error: " + ", ".join(fds) + "."]

    lines += [
        "", "## CPU time per call", "",
        "CPU time of the whole process (all threads: `time.process_time`) per call, "
        "medians over the same rounds: less sensitive than wall time to other load on the "
        "machine, but it counts XLA worker threads that spin while waiting.", "",
        "| N | method | forward CPU ms | gradient CPU ms | grad/fwd | vs SciPy |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for n in sizes:
        sc = by.get((n, "scipy"), {})
        for key in ORDER:
            r = by.get((n, key))
            if r is None or "error" in r:
                continue
            fw, gr = r["fwd_cpu"]["ms"], r["grad_cpu"]["ms"]
            vs = f"{gr / sc['grad_cpu']['ms']:.2f}" if "grad_cpu" in sc else "–"
            lines.append(f"| {n} | {METHODS[key][0]} | {_fmt_ms(fw)} | {_fmt_ms(gr)} "
                         f"| {gr / fw:.2f} | {vs} |")

    # targets
    lines += ["", "## Targets", "",
              "Wall time (CPU time in parentheses, for information)."]
    for n in sizes:
        r = by.get((n, "sciad-direct"))
        sc = by.get((n, "scipy"))
        if not r or "error" in r:
            continue
        ratio = r["grad"]["ms"] / r["fwd"]["ms"]
        ratio_cpu = r["grad_cpu"]["ms"] / r["fwd_cpu"]["ms"]
        if n in RATIO_AT:
            lines.append(f"- N={n}: sciad direct gradient/forward = {ratio:.2f} "
                         f"({ratio_cpu:.2f}) "
                         f"(target <= {RATIO_TARGET}): target met: {yes_no(ratio <= RATIO_TARGET)}")
        if sc and "error" not in sc and n in VS_SCIPY_AT:
            vs = r["grad"]["ms"] / sc["grad"]["ms"]
            vs_cpu = r["grad_cpu"]["ms"] / sc["grad_cpu"]["ms"]
            pr = r.get("paired", {}).get("grad")
            spread = (f"; per-batch ratios: median {pr['median']:.2f}, IQR "
                      f"{pr['q1']:.2f}–{pr['q3']:.2f} over {r['paired']['batches']} batches"
                      if pr else "")
            lines.append(f"- N={n}: sciad direct gradient / SciPy hand adjoint = {vs:.2f} "
                         f"({vs_cpu:.2f}{spread}) "
                         f"(target <= {VS_SCIPY_TARGET}, goal <= {VS_SCIPY_GOAL}): "
                         f"target met: {yes_no(vs <= VS_SCIPY_TARGET)}, goal met: "
                         f"{yes_no(vs <= VS_SCIPY_GOAL)}")
        if sc and "error" not in sc and n in MEMORY_AT:
            mine, ref = _call_peak(r), _call_peak(sc)
            if mine is not None and ref:
                lines.append(
                    f"- N={n}: peak memory of sciad direct's calls / SciPy's = "
                    f"{mine:.0f} / {ref:.0f} MB = {mine / ref:.2f} (target <= "
                    f"{MEMORY_TARGET}): target met: {yes_no(mine <= MEMORY_TARGET * ref)}; "
                    f"whole process (compilation and first calls included): "
                    f"{_peak(r)} / {_peak(sc)} MB")
        if r["grad_rel_err"] > DIRECT_RTOL:
            lines.append(f"- N={n}: sciad direct gradient error {r['grad_rel_err']:.1e} "
                         f"> {DIRECT_RTOL:g}: **NO**")
    if not any(n in RATIO_AT + VS_SCIPY_AT + MEMORY_AT for n in sizes):
        lines.append(f"(no target size among {sizes}: targets are at N = "
                     f"{sorted(set(RATIO_AT + VS_SCIPY_AT))})")

    # breakdown
    bd = [b for b in data["breakdown"] if "error" not in b]
    if bd or any("parts_ms" in r for r in res if r["method"] == "scipy"):
        lines += [
            "", "## Where the time goes", "",
            "sciad direct, from `sciad-parts` (its own process per N; medians, ms): the "
            "forward and gradient calls; inside them, the time spent in sciad's host "
            "factorization (CHOLMOD's Cholesky for this spd matrix where cvxopt is installed, "
            "else SuperLU of the CSC view of the static pattern; on sciad's host factorization "
            "thread) and in one host solve with its checks (triangular solves, "
            "residual, backward error); SuperLU and one plain triangular solve on the same "
            "arrays, called on the main thread; the rest of a call (the XLA program, the host "
            "call transfers) = call - host time (forward: one factorization and one solve; "
            "gradient: one factorization and two solves); the entries + `sparse.assemble` "
            "part alone; the extra cost of one sciad host call passing an N²-vector "
            "through, over a jitted `x + 1`; the nodes of the optimized value-and-gradient "
            "graph.",
            "",
            "| N | fwd | grad | grad/fwd | host factor | SuperLU, main thread "
            "| host solve, checked | plain solve | fwd rest | grad rest | entries+assemble "
            "| 1 host call | nodes |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in bd:
            hf, hs = b["host_factor_ms"], b["host_solve_ms"]
            fw, gr = b["fwd"]["ms"], b["grad"]["ms"]
            lines.append(
                f"| {b['n']} | {_fmt_ms(fw)} | {_fmt_ms(gr)} | {gr / fw:.2f} | {_fmt_ms(hf)} "
                f"| {_fmt_ms(b['splu_main_ms'])} | {hs:.3f} | {b['plain_solve_ms']:.3f} "
                f"| {fw - hf - hs:.2f} | {gr - hf - 2 * hs:.2f} "
                f"| {b['assembled']['ms']:.3f} "
                f"| {b['callback']['ms'] - b['plain']['ms']:.3f} | {b['graph_nodes']} |")
        if bd:
            lines += [
                "",
                "sciad direct, memory in that process (MB above its RSS after imports and "
                "inputs): after compiling both programs; held between calls after the timed "
                "rounds; the peak; the growth from the first to the last of these, per "
                "factorization (timed and warm-up calls); and the factorizations sciad's "
                "host store still holds between calls (each is released after the last "
                "solve that reads it).",
                "",
                "| N | after compile | between calls | peak | growth per factorization "
                "| factors held | nnz(L)+nnz(U) | one LU (values + indices) |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for b in bd:
                lu_mb = b["lu_nnz"] * 12 / 2**20
                lines.append(
                    f"| {b['n']} | {b['rss_compiled_mb']:.0f} | {b['rss_after_mb']:.0f} "
                    f"| {b['hwm_mb']:.0f} | {b['growth_per_factor_mb']:.1f} ({b['factorizations']} "
                    f"calls) | {b['held_factors']} | {b['lu_nnz']} | {lu_mb:.1f} |")
        lines += [
            "",
            "SciPy, the pieces of the hand adjoint (medians, ms; `lu nnz` = nnz(L) + nnz(U)):",
            "",
            "| N | entries | COO->CSC | splu | solve | solve (trans) | -lam[rows]*u[cols] "
            "| entries VJP | lu nnz |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for n in sizes:
            r = by.get((n, "scipy"), {})
            if "parts_ms" not in r:
                continue
            p = r["parts_ms"]
            lines.append(
                f"| {n} | {p['entries']:.3f} | {p['tocsc']:.3f} | {_fmt_ms(p['splu'])} "
                f"| {p['solve']:.3f} | {p['solve_T']:.3f} | {p['sddmm']:.3f} "
                f"| {p['entries_vjp']:.3f} | {r['lu_nnz']} |")

    lines += render_steps(data.get("steps") or {})
    lines += [
        "", "## First call (information)", "",
        "Seconds: build, trace, compile and run once (SciPy: just the run).", "",
        "| N | method | forward first call s | gradient first call s |",
        "|---:|---|---:|---:|",
    ]
    for n in sizes:
        for key in ORDER:
            r = by.get((n, key))
            if r and "error" not in r:
                lines.append(f"| {n} | {METHODS[key][0]} | {r['fwd_first_s']:.2f} "
                             f"| {r['grad_first_s']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None,
                   help="comma-separated grid sizes N (default: 64,128,256; --quick: 32)")
    p.add_argument("--methods", default=",".join(ORDER),
                   help=f"comma-separated subset of {','.join(ORDER)} (scipy always runs)")
    p.add_argument("--repeats", type=int, default=None,
                   help="fixed rounds per block (default: from a time budget)")
    p.add_argument("--quick", action="store_true", help="small sizes, short budgets")
    p.add_argument("--no-parts", action="store_true", help="skip sciad's time breakdown")
    p.add_argument("--no-steps", action="store_true", help="skip the many-small-solves case")
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/inverse_poisson.md")
    p.add_argument("--direct-solver", default=None,
                   help="sciad's sparse direct solver (default: auto; klu or splu)")
    p.add_argument("--child", nargs=3, metavar=("METHOD", "N", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--serve", nargs=3, metavar=("METHOD", "N", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=2.5, help=argparse.SUPPRESS)
    p.add_argument("--rmin", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("--rmax", type=int, default=41, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    if args.direct_solver:  # (before the children start: they inherit it)
        global DIRECT_SOLVER
        os.environ["SCIAD_BENCH_DIRECT_SOLVER"] = DIRECT_SOLVER = args.direct_solver
        METHODS["sciad-direct"] = (f"sciad direct ({DIRECT_SOLVER})",
                                   *METHODS["sciad-direct"][1:])
        STEP_METHODS["sciad-steps"] = f"sciad ({DIRECT_SOLVER}, one shared factorization)"

    if args.serve:
        serve_child(args.serve[0], int(args.serve[1]), args.serve[2])
        return 0
    if args.child:
        method, n, work = args.child[0], int(args.child[1]), args.child[2]
        if method == "sciad-parts":
            out = run_parts(n, work, args.budget, args.rmin, args.rmax, args.repeats)
        else:
            out = run_child(method, n, work, args.budget, args.rmin, args.rmax, args.repeats)
        print(json.dumps(out))
        return 0

    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else (
        QUICK_SIZES if args.quick else SIZES)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(ORDER)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {ORDER}")
    load = load_average()
    t0 = time.perf_counter()
    print(f"measuring N = {sizes} ...", file=sys.stderr, flush=True)
    data = measure(sizes, methods, args.quick, args.repeats, not args.no_parts,
                   not args.no_steps)
    data["git"] = git_state()
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    text = render(data, machine_info(load), command_line("bench/inverse_poisson.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
