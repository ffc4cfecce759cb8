"""sciad's nonlinear root solves and their gradients against SciPy, optimistix
and unrolled Newton in JAX.

Run from the repository root:

    .venv/bin/python bench/nonlinear.py            # the full set: about 5 min on 2 cores
    .venv/bin/python bench/nonlinear.py --quick    # smoke check, ~30 s
    .venv/bin/python bench/nonlinear.py --no-write

Float64 throughout (`jax_enable_x64` on at start-up).

The problem: 2-D nonlinear diffusion `-div((1 + u^2) grad u) = f` on an
N x N grid (5-point stencil, zero Dirichlet boundary), solved from `u = 0`,
and the loss `L(f) = |u(f) - d|^2 / 2`. The peers stop at `||F||_inf <=
1e-10 ||F(0)||_inf`, sciad at its own tests (the error in `u` estimated from
the last Newton step at most 1e-10 relative: the same iteration here; SciPy's
finite-difference Jacobian may take an iteration more; the table shows both
counts).

1. sciad: `sd.optimize.root(F, 0, (f,))` (sparse Jacobian detected from the
   graph, colored JVPs, SuperLU), forward alone and `sd.value_and_grad(L)`.
2. SciPy: Newton with `approx_derivative(F, u, sparsity=pattern)` (the user
   supplies the pattern; finite differences, one F per color) and `splu`,
   forward alone, and with a hand-written adjoint (the Jacobian at the root
   once more, `splu`, one transposed solve: `fbar = J^-T ubar`).
   Targets: sciad value and gradient <= 1.0x SciPy's forward alone; sciad
   gradient/forward <= 1.2.
3. optimistix: `optx.root_find` with `optx.Newton` (dense `jax.jacfwd`
   Jacobian, LU), value and gradient by `jax.value_and_grad` (optimistix's
   implicit adjoint), and 4. Newton unrolled in JAX (dense Jacobian, the
   same iteration count, differentiated through every iteration), where the
   dense Jacobian fits: N = 32 and 64.
5. The colored sparse Jacobian alone: `sd.sparse.jacobian(F)` against one
   compiled `F`, both `sd.function`. Target: <= (colors + 1) F evaluations.

Each line's calls are timed in interleaved batches (bench/_harness.py);
medians over the repeats. The Markdown table goes to stdout and to
bench/results/nonlinear.md.
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
    HostCall, command_line, load_average, machine_info, medians, publish, report_head,
    yes_no,
)

RESULTS = os.path.join(HERE, "results", "nonlinear.md")
SIZES, QUICK_SIZES = (64, 128, 256), (32,)
DENSE_SIZES, QUICK_DENSE_SIZES = (32, 64), (16,)
REPEATS, QUICK_REPEATS = 5, 3
TOL = 1e-10
VG_TARGET, GRAD_TARGET = 1.0, 1.2


def residual(xp, N: int):
    """`F(u, f)` of the nonlinear diffusion on an N x N grid, in `xp`
    (NumPy, sciad.numpy or jax.numpy)."""
    h2 = 1.0 / (N + 1) ** 2

    def F(u, f):
        U = xp.pad(xp.reshape(u, (N, N)), 1)
        K = 1.0 + U ** 2
        kx = 0.5 * (K[1:, 1:-1] + K[:-1, 1:-1])
        ky = 0.5 * (K[1:-1, 1:] + K[1:-1, :-1])
        fx = kx * (U[1:, 1:-1] - U[:-1, 1:-1])
        fy = ky * (U[1:-1, 1:] - U[1:-1, :-1])
        div = (fx[1:] - fx[:-1] + fy[:, 1:] - fy[:, :-1]) / h2
        return xp.reshape(-div, (N * N,)) - f

    return F


def problem(N: int):
    import numpy as np

    x = np.linspace(0, 1, N + 2)[1:-1]
    X, Y = np.meshgrid(x, x, indexing="ij")
    f = 40.0 * np.exp(-20 * ((X - 0.4) ** 2 + (Y - 0.6) ** 2)).ravel() + 5.0
    d = 0.1 * np.sin(np.pi * X).ravel() * np.sin(np.pi * Y).ravel()
    return f, d


def sciad_solve_and_loss(N: int):
    """`solve(f)` (the root's result) and `loss(f, d)` with sciad."""
    import sciad as sd
    import sciad.numpy as snp

    F = residual(snp, N)

    def solve(f):
        return sd.optimize.root(F, snp.zeros(N * N), (f,))

    def loss(f, d):
        return 0.5 * snp.sum((solve(f).x - d) ** 2)

    return solve, loss


def scipy_newton(N: int):
    """Newton with SciPy: `approx_derivative` on the given pattern, `splu`."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla
    from scipy.optimize._numdiff import approx_derivative

    F = residual(np, N)
    t = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(N, N))
    eye = sp.eye(N)
    pattern = ((sp.kron(t, eye) + sp.kron(eye, t)) != 0).tocsr()

    def forward(f):
        u = np.zeros(N * N)
        r = F(u, f)
        goal = TOL * np.abs(r).max()
        k = 0
        while np.abs(r).max() > goal and k < 50:
            J = approx_derivative(lambda v: F(v, f), u, f0=r, sparsity=pattern)
            u = u + spla.splu(sp.csc_matrix(J)).solve(-r)
            r = F(u, f)
            k += 1
        return u, k

    def value_and_grad(f, d):
        u, _ = forward(f)
        ubar = u - d
        J = approx_derivative(lambda v: F(v, f), u, sparsity=pattern)
        lam = spla.splu(sp.csc_matrix(J.T)).solve(ubar)
        return 0.5 * ubar @ ubar, lam          # dF/df = -I: fbar = J^-T ubar

    return forward, value_and_grad


def measure_sparse(sizes, repeats: int) -> list[dict]:
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    out = []
    for N in sizes:
        print(f"  N = {N} ({N * N} unknowns) ...", file=sys.stderr, flush=True)
        F = residual(snp, N)
        f, d = problem(N)
        solve, loss = sciad_solve_and_loss(N)
        fwd = sd.function(lambda f: solve(f).x)
        vg = sd.function(sd.value_and_grad(loss))
        res = solve(f)
        sc_fwd, sc_vg = scipy_newton(N)
        u_sc, k_sc = sc_fwd(f)
        err = float(np.abs(np.asarray(res.x) - u_sc).max() / np.abs(u_sc).max())
        assert res.success and err <= 1e-8, (err, res.nit, k_sc)
        value, grad = vg(f, d)
        v_sc, g_sc = sc_vg(f, d)
        gerr = float(np.abs(np.asarray(grad) - g_sc).max() / np.abs(g_sc).max())
        assert gerr <= 1e-6, gerr
        t = medians({"fwd": lambda f, d: fwd(f), "vg": lambda f, d: vg(f, d)[1],
                   "scipy": HostCall(lambda f, d: sc_fwd(f)),
                   "scipy_adj": HostCall(sc_vg)}, (f, d), repeats)
        # the colored Jacobian against F alone
        Fc = sd.function(lambda u: F(u, f))
        Jc = sd.function(lambda u: sd.sparse.data(sd.sparse.jacobian(lambda u: F(u, f))(u)))
        u = np.asarray(res.x)
        graph = sd.trace(lambda f: solve(f).x, f)
        colors = [n for n in graph.nodes if n.primitive.name == "optimize.root"][0] \
            .params["colors"]
        tj = medians({"F": Fc, "J": Jc}, (u,), repeats)
        out.append({"N": N, "n": N * N, "nit": res.nit, "nit_sc": k_sc, "colors": colors,
                    "fwd_ms": 1e3 * t["fwd"], "vg_ms": 1e3 * t["vg"],
                    "scipy_ms": 1e3 * t["scipy"], "scipy_adj_ms": 1e3 * t["scipy_adj"],
                    "err": err, "gerr": gerr,
                    "F_us": 1e6 * tj["F"], "J_us": 1e6 * tj["J"]})
    return out


def measure_dense(sizes, repeats: int) -> list[dict]:
    """optimistix's Newton and unrolled Newton, dense Jacobians, in JAX."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optimistix as optx

    import sciad as sd

    out = []
    for N in sizes:
        print(f"  dense peers, N = {N} ...", file=sys.stderr, flush=True)
        F = residual(jnp, N)
        f, d = problem(N)
        nit = sciad_solve_and_loss(N)[0](f).nit

        atol = TOL * float(np.abs(f).max())  # the same rule: |F| <= 1e-10 |F(0)|

        def optx_loss(f, d):
            sol = optx.root_find(lambda u, f: F(u, f), optx.Newton(rtol=TOL, atol=atol),
                                 jnp.zeros(N * N), args=f, max_steps=50)
            return 0.5 * jnp.sum((sol.value - d) ** 2)

        def unrolled_loss(f, d):
            u = jnp.zeros(N * N)
            for _ in range(nit):
                J = jax.jacfwd(lambda v: F(v, f))(u)
                u = u - jnp.linalg.solve(J, F(u, f))
            return 0.5 * jnp.sum((u - d) ** 2)

        fns = {"optx": jax.jit(jax.value_and_grad(optx_loss)),
               "unrolled": jax.jit(jax.value_and_grad(unrolled_loss))}
        sd_vg = sd.function(sd.value_and_grad(sciad_solve_and_loss(N)[1]))
        gs = np.asarray(sd_vg(f, d)[1])
        for k, fn in fns.items():
            g = np.asarray(fn(f, d)[1])
            assert np.abs(g - gs).max() <= 1e-6 * np.abs(gs).max(), k
        t = medians({"optx": lambda f, d: fns["optx"](f, d)[1],
                   "unrolled": lambda f, d: fns["unrolled"](f, d)[1],
                   "sciad": lambda f, d: sd_vg(f, d)[1]}, (f, d), max(1, repeats // 2))
        out.append({"N": N, "n": N * N, "optx_ms": 1e3 * t["optx"],
                    "unrolled_ms": 1e3 * t["unrolled"], "sd_ms": 1e3 * t["sciad"]})
    return out


def render(sparse, dense, machine: dict, argv: str) -> str:
    lines = [
        *report_head("sciad nonlinear benchmark", argv, machine),
        "",
        "## Root solve and gradient against SciPy (targets: value+grad <= 1.0x SciPy's "
        "forward; gradient/forward <= 1.2)",
        "",
        "`-div((1 + u^2) grad u) = f` on N x N, Newton from 0 (sciad: to its step test, "
        "tol 1e-10; the peers: to `||F|| <= 1e-10 ||F(0)||`); "
        "the loss `|u - d|^2 / 2`. sciad: `sd.optimize.root` (pattern detected from the "
        "graph, colored JVPs, SuperLU), forward and `value_and_grad`. SciPy: Newton with "
        "`approx_derivative(sparsity=pattern)` and `splu`, forward, and with a hand-written "
        "adjoint. The roots agree to 1e-8 and the gradients to 1e-6 (relative) first.",
        "",
        "| unknowns | Newton its (sciad/SciPy) | sciad fwd ms | sciad value+grad ms | SciPy fwd ms "
        "| SciPy fwd+adjoint ms | vg / SciPy fwd | grad/fwd | targets met |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sparse:
        a, b = r["vg_ms"] / r["scipy_ms"], r["vg_ms"] / r["fwd_ms"]
        lines.append(f"| {r['n']:,} | {r['nit']}/{r['nit_sc']} | {r['fwd_ms']:.1f} | {r['vg_ms']:.1f} "
                     f"| {r['scipy_ms']:.1f} | {r['scipy_adj_ms']:.1f} | {a:.2f} | {b:.2f} "
                     f"| {yes_no(a <= VG_TARGET)} / {yes_no(b <= GRAD_TARGET)} |")
    lines += [
        "",
        "## The colored sparse Jacobian (target: <= colors + 1 evaluations of F)",
        "",
        "`sd.sparse.jacobian(F)` (one batched JVP over the colors' seeds) against one "
        "compiled `F`, at the root.",
        "",
        "| unknowns | colors | F µs | Jacobian µs | Jacobian / F | target met |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in sparse:
        ratio = r["J_us"] / r["F_us"]
        lines.append(f"| {r['n']:,} | {r['colors']} | {r['F_us']:.0f} | {r['J_us']:.0f} "
                     f"| {ratio:.1f} | {yes_no(ratio <= r['colors'] + 1)} |")
    lines += [
        "",
        "## Dense peers in JAX, value and gradient",
        "",
        "optimistix `root_find` with `Newton` (dense `jax.jacfwd` Jacobian, LU; implicit "
        "adjoint) and Newton unrolled in JAX (the same iterations, dense LU, differentiated "
        "through every one), where the dense Jacobian fits.",
        "",
        "| unknowns | sciad ms | optimistix ms | unrolled JAX ms | optimistix/sciad "
        "| unrolled/sciad |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in dense:
        lines.append(f"| {r['n']:,} | {r['sd_ms']:.1f} | {r['optx_ms']:.1f} "
                     f"| {r['unrolled_ms']:.1f} | {r['optx_ms'] / r['sd_ms']:.0f} "
                     f"| {r['unrolled_ms'] / r['sd_ms']:.0f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/nonlinear.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    load = load_average()
    t0 = time.perf_counter()
    sparse = measure_sparse(QUICK_SIZES if args.quick else SIZES, repeats)
    dense = measure_dense(QUICK_DENSE_SIZES if args.quick else DENSE_SIZES, repeats)
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    text = render(sparse, dense, machine_info(load),
                  command_line("bench/nonlinear.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
