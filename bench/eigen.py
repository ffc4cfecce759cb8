"""sciad's eigendecompositions and their gradients against JAX's and SciPy's.

Run from the repository root:

    .venv/bin/python bench/eigen.py            # the full set: about 5 min on 2 cores
    .venv/bin/python bench/eigen.py --quick    # smoke check, ~30 s
    .venv/bin/python bench/eigen.py --no-write

Float64 throughout (`jax_enable_x64` on at start-up).

1. Dense: the value and gradient of `L(A) = sum(c * w) + sum(d @ v**2)` (the
   eigenvalues, and the eigenvectors through a sign-free function) of a random
   symmetric `n x n` matrix, `sd.function(sd.value_and_grad(L))` with
   `sd.linalg.eigh` against `jax.jit(jax.value_and_grad(L_jnp))` with
   `jnp.linalg.eigh`, n = 100 and 1000. Target: sciad/JAX <= 1.1. The two
   gradients must agree to 1e-8 (relative) first: the spectrum is simple,
   where JAX's rule is right.
2. Sparse: the 6 smallest eigenvalues of `-div(c grad u)` on an m x m grid
   (5-point stencil, node coefficients `c`), and the gradient of their
   weighted sum with respect to `c`: `sd.linalg.eigsh(A, 6, sigma=0)` under
   `sd.value_and_grad`, against SciPy's `eigsh(A, 6, sigma=0)` forward alone
   (the same shift-invert ARPACK; sciad computes one pair more, to see a
   cluster cut by `k`), at m = 128 (16,384 unknowns; target: value and
   gradient <= 1.5x SciPy's forward) and m = 320 (102,400). The gradient is
   checked against central finite differences along a random direction.
3. Dense JAX on the same sparse problem (`jnp.linalg.eigh` of the dense
   matrix, value and gradient) where it fits: measured at m = 32 and 64
   (1,024 and 4,096 unknowns). At 16,384 unknowns the dense matrix alone is
   2 GiB and the O(n^3) decomposition 64x the 4,096 one; the table gives that
   extrapolation, marked as such (target: dense JAX >= 50x slower).

Each line's calls are timed in interleaved batches (bench/_harness.py);
medians over the repeats. The Markdown table goes to stdout and to
bench/results/eigen.md.
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

RESULTS = os.path.join(HERE, "results", "eigen.md")
DENSE, QUICK_DENSE = (100, 1000), (100,)
SPARSE, QUICK_SPARSE = (128, 320), (32,)
DENSE_JAX, QUICK_DENSE_JAX = (32, 64), (16,)
REPEATS, QUICK_REPEATS = 7, 3
K = 6
DENSE_TARGET, SPARSE_TARGET, JAX_TARGET = 1.1, 1.5, 50.0


# ---------------------------------------------------------------------------
# the problems


def dense_loss(xp, eigh):
    def loss(a, c, d):
        w, v = eigh(a)
        return xp.sum(c * w) + xp.sum(d @ (v * v))
    return loss


def grid(m: int):
    import numpy as np

    idx = np.arange(m * m).reshape(m, m)
    ep = np.concatenate([idx[:, :-1].ravel(), idx[:-1, :].ravel()])
    eq = np.concatenate([idx[:, 1:].ravel(), idx[1:, :].ravel()])
    bnd = 4 - np.bincount(np.concatenate([ep, eq]), minlength=m * m)
    i = np.arange(m * m)
    rows = np.concatenate([ep, eq, ep, eq, i])
    cols = np.concatenate([eq, ep, ep, eq, i])
    return ep, eq, bnd, rows, cols


def stiffness_data(xp, c, g):
    ep, eq, bnd, _, _ = g
    we = (c[ep] + c[eq]) / 2
    return xp.concatenate([-we, -we, we, we, c * bnd])


def measure_dense(sizes, repeats: int) -> list[dict]:
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    out = []
    for n in sizes:
        print(f"  dense n = {n} ...", file=sys.stderr, flush=True)
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n))
        a = (a + a.T) / 2
        c, d = rng.standard_normal(n), rng.standard_normal(n) / n
        fns = {"sciad": sd.function(sd.value_and_grad(dense_loss(snp, sd.linalg.eigh))),
               "jax": jax.jit(jax.value_and_grad(dense_loss(jnp, jnp.linalg.eigh)))}
        args = (a, c, d)
        (vs, gs), (vj, gj) = (fns[k](*args) for k in ("sciad", "jax"))
        err = float(np.max(np.abs(np.asarray(gs) - np.asarray(gj))) / np.max(np.abs(gj)))
        assert abs(float(vs) - float(vj)) <= 1e-10 * abs(float(vj)) and err <= 1e-8, err
        wrapped = {k: (lambda f: lambda *x: f(*x)[1])(f) for k, f in fns.items()}
        t = medians(wrapped, args, repeats)
        out.append({"n": n, "sd_ms": 1e3 * t["sciad"], "jax_ms": 1e3 * t["jax"],
                    "ratio": t["sciad"] / t["jax"], "err": err})
    return out


def measure_sparse(sizes, repeats: int) -> list[dict]:
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    import sciad as sd
    import sciad.numpy as snp

    out = []
    for m in sizes:
        print(f"  sparse m = {m} ({m * m} unknowns) ...", file=sys.stderr, flush=True)
        g = grid(m)
        rng = np.random.default_rng(m)
        c = 1.0 + 0.5 * rng.uniform(size=m * m)
        weights = np.arange(1.0, K + 1)
        rows, cols = g[3], g[4]

        def loss(c):
            a = sd.sparse.coo_matrix((stiffness_data(snp, c, g), (rows, cols)),
                                     shape=(m * m, m * m))
            return snp.sum(weights * sd.linalg.eigsh(a, K, sigma=0.0)[0])

        vg = sd.function(sd.value_and_grad(loss))

        def scipy_forward(c):
            a = sp.csr_matrix((stiffness_data(np, c, g), (rows, cols)), shape=(m * m, m * m))
            return spla.eigsh(a, K, sigma=0.0)[0]

        value, grad = vg(c)
        ref = np.sort(scipy_forward(c))
        assert abs(float(value) - float(weights @ ref)) <= 1e-9 * abs(float(value))
        dc = rng.standard_normal(m * m)
        h = 1e-6
        f = sd.function(loss)
        fd = (float(f(c + h * dc)) - float(f(c - h * dc))) / (2 * h)
        fd_err = abs(float(np.asarray(grad) @ dc) - fd) / abs(fd)
        assert fd_err <= 1e-6, fd_err
        t = medians({"sciad": lambda c: vg(c)[1], "scipy": HostCall(scipy_forward)}, (c,),
                  repeats)
        out.append({"m": m, "n": m * m, "sd_ms": 1e3 * t["sciad"], "scipy_ms": 1e3 * t["scipy"],
                    "ratio": t["sciad"] / t["scipy"], "fd_err": fd_err})
    return out


def measure_dense_jax(sizes, repeats: int) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    out = []
    for m in sizes:
        print(f"  dense JAX on the grid m = {m} ({m * m} unknowns) ...", file=sys.stderr,
              flush=True)
        g = grid(m)
        rows, cols = g[3], g[4]
        n = m * m
        weights = jnp.arange(1.0, K + 1)

        def loss(c):
            a = jnp.zeros((n, n)).at[rows, cols].add(stiffness_data(jnp, c, g))
            return jnp.sum(weights * jnp.linalg.eigh(a)[0][:K])

        fn = jax.jit(jax.value_and_grad(loss))
        c = 1.0 + 0.5 * np.random.default_rng(m).uniform(size=n)
        t = medians({"jax": lambda c: fn(c)[1]}, (c,), max(1, repeats // 2))
        out.append({"m": m, "n": n, "jax_ms": 1e3 * t["jax"]})
    return out


def render(dense, sparse, dense_jax, machine: dict, argv: str) -> str:
    lines = [
        *report_head("sciad eigen benchmark", argv, machine),
        "",
        "## Dense: `eigh` value and gradient (target: sciad/JAX <= 1.1)",
        "",
        "`L(A) = sum(c w) + sum(d (v * v))` of a random symmetric n x n matrix: "
        "`sd.function(sd.value_and_grad(L))` against `jax.jit(jax.value_and_grad(L))` "
        "with `jnp.linalg.eigh`; the gradients agree to the error shown.",
        "",
        "| n | sciad ms | JAX ms | sciad/JAX | gradient difference | target met |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in dense:
        lines.append(f"| {r['n']} | {r['sd_ms']:.2f} | {r['jax_ms']:.2f} | {r['ratio']:.3f} "
                     f"| {r['err']:.1e} | {yes_no(r['ratio'] <= DENSE_TARGET)} |")
    lines += [
        "",
        f"## Sparse: the {K} smallest eigenvalues, value and gradient (target: <= "
        f"{SPARSE_TARGET}x SciPy's forward at 16,384 unknowns)",
        "",
        f"`-div(c grad u)` on an m x m grid; the weighted sum of the {K} smallest "
        "eigenvalues and its gradient with respect to the m² node coefficients, "
        f"`sd.linalg.eigsh(A, {K}, sigma=0)`, against SciPy's `eigsh(A, {K}, sigma=0)` "
        "forward alone (shift-invert ARPACK both). Gradient checked against central "
        "finite differences (relative error shown).",
        "",
        "| unknowns | sciad value+grad ms | SciPy forward ms | ratio | FD check | target met |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in sparse:
        met = yes_no(r["ratio"] <= SPARSE_TARGET) if r["n"] <= 20000 else "—"
        lines.append(f"| {r['n']:,} | {r['sd_ms']:.1f} | {r['scipy_ms']:.1f} "
                     f"| {r['ratio']:.2f} | {r['fd_err']:.1e} | {met} |")
    lines += [
        "",
        f"## Dense JAX on the sparse problem (target: >= {JAX_TARGET:.0f}x slower at 16,384)",
        "",
        "`jnp.linalg.eigh` of the dense matrix, value and gradient (`jax.value_and_grad`). "
        "Rows marked *extrapolated* scale the largest measured time by n³ (the "
        "decomposition's cost); they were not run (the dense matrix alone is n² x 8 "
        "bytes).",
        "",
        "| unknowns | dense JAX ms | sciad sparse ms | JAX/sciad | note |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in dense_jax:
        lines.append(f"| {r['n']:,} | {r['jax_ms']:.1f} | — | — | measured |")
    if dense_jax:
        big = dense_jax[-1]
        for r in sparse:
            est = big["jax_ms"] * (r["n"] / big["n"]) ** 3
            gib = r["n"] ** 2 * 8 / 2 ** 30
            ratio = est / r["sd_ms"]
            met = f"; target {yes_no(ratio >= JAX_TARGET)}" if r["n"] <= 20000 else ""
            lines.append(f"| {r['n']:,} | {est:,.0f} (extrapolated) | {r['sd_ms']:.1f} "
                         f"| {ratio:,.0f} | {gib:.1f} GiB dense{met} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/eigen.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    load = load_average()
    t0 = time.perf_counter()
    dense = measure_dense(QUICK_DENSE if args.quick else DENSE, repeats)
    sparse = measure_sparse(QUICK_SPARSE if args.quick else SPARSE, repeats)
    dense_jax = measure_dense_jax(QUICK_DENSE_JAX if args.quick else DENSE_JAX, repeats)
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    text = render(dense, sparse, dense_jax, machine_info(load),
                  command_line("bench/eigen.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
