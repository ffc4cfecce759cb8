"""Sparse log-determinants and selected inverses: sciad against sparsax's
CHOLMOD `logdet` (value and gradient), and what sparsax lacks (forward mode,
Hessian-vector products), on the 2-D 5-point spd matrix of an N x N grid
(a Gaussian Markov random field's precision, `(kappa^2 - Laplacian)`).

Run from the repository root (needs the `[cholmod]` extra, which installs
sparsax on Linux x86-64):

    .venv/bin/python bench/logdet.py               # full run (N = 64, 128, 256)
    .venv/bin/python bench/logdet.py --quick       # smoke check (N = 32)
    .venv/bin/python bench/logdet.py --sizes 64 --no-write

Variants, each a function of the matrix's stored values `v` (its upper
triangle, mirrored: a symmetric parameterization), float64:

- `sciad value+grad`: `sd.function(sd.value_and_grad(logdet))`, "auto":
  sciad's compiled sparse Cholesky factorization (`solver="cholesky"`), the
  gradient `A^-1` on the pattern by the factorization's reverse mode
  (Takahashi's recurrence as one pass).
- `sparsax value+grad`: `jax.jit(jax.value_and_grad(sparsax.logdet))` on the
  same upper triangle (CHOLMOD; its reverse rule is its selected inverse).
- `sciad jvp`: forward mode, one direction (one tangent pass of the factor).
- `sciad hvp`: one Hessian-vector product, forward over reverse: after the
  factorization (F multiply-adds) its reverse pass (2F), the tangent of the
  factor (2F), `symmul` (2F) and a second reverse pass (2F): 9F against the
  gradient's 3F, so 3x the gradient's flops is this product's floor.
- `sciad hvp, each of 8`: `sd.vmap` of the product over 8 directions (a
  randomized eigensolver's block, Lanczos' or Newton-CG's repeated products
  at one point), per direction: the factorization and its reverse pass run
  once for the block, each direction the 6F of its own three passes.
- `sciad selinv`: `selected_inverse(A)` by the sparse Cholesky factor.
- `sciad vg (cholmod)`, `sciad hvp (cholmod)`, `sciad selinv (cholmod)`,
  `sciad selinv (splu)`: `solver="cholmod"` (sparsax's kernels, sharing the
  factor with CHOLMOD solves; its Hessian-vector products are selected
  inverses of a block matrix of twice the order by SuperLU, not run at
  N = 256) and `solver="splu"`.
- `sciad factorization`: `slogdet` alone (one numeric factorization by the
  sparse Cholesky); `CHOLMOD factorization`: `sparsax.logdet` of new values
  (CHOLMOD's analysis kept, one numeric factorization).

Each call gets the next of 4 value sets (both libraries skip a factorization
of the values last factored). Medians of interleaved batches; the table goes
to stdout and `bench/results/logdet.md`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "logdet.md")
CYCLE = 4
BLOCK = 8  # (directions of the batched Hessian-vector product)


def build(n: int):
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import jax.numpy as jnp
    import numpy as np
    import scipy.sparse as sp
    import sparsax

    import sciad as sd

    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (n, n))
    A = (sp.kron(T, sp.eye(n)) + sp.kron(sp.eye(n), T) + 0.1 * sp.eye(n * n)).tocsr()
    A.sort_indices()
    rows = np.repeat(np.arange(n * n), np.diff(A.indptr))
    cols = A.indices
    upper = np.flatnonzero(rows <= cols)
    # each stored entry's upper-triangle twin
    key = np.minimum(rows, cols) * n * n + np.maximum(rows, cols)
    at = np.searchsorted(key[upper], key)
    ai = jnp.asarray(rows[upper], jnp.int32)
    aj = jnp.asarray(cols[upper], jnp.int32)
    shape = A.shape

    def matrix(u):
        return sd.sparse.coo_matrix((u[at], (rows, cols)), shape=shape, tags={"spd"})

    def logdet(u):
        return sd.linalg.slogdet(matrix(u))[1]

    def logdet_sparsax(u):
        return sparsax.logdet(ai, aj, u, n * n)

    u0 = A.data[upper]
    w = np.random.default_rng(1).standard_normal(u0.size)
    W = jnp.asarray(np.random.default_rng(2).standard_normal((BLOCK, u0.size)))
    def chol(u, solver):
        return sd.linalg.slogdet(matrix(u), solver=solver)[1]

    fns = {
        "sciad value+grad": sd.function(sd.value_and_grad(logdet)),
        "sparsax value+grad": jax.jit(jax.value_and_grad(logdet_sparsax)),
        "sciad jvp": sd.function(lambda u: sd.jvp(logdet, (u,), (w,))),
        "sciad hvp": sd.function(lambda u: sd.hvp(logdet, u, w)),
        "sciad hvp, each of 8": sd.function(
            lambda u: sd.vmap(lambda d: sd.hvp(logdet, u, d))(W)),
        "sciad selinv": sd.function(
            lambda u: sd.sparse.data(sd.linalg.selected_inverse(matrix(u)))),
        "sciad vg (cholmod)": sd.function(sd.value_and_grad(lambda u: chol(u, "cholmod"))),
        "sciad hvp (cholmod)": sd.function(lambda u: sd.hvp(lambda u: chol(u, "cholmod"),
                                                            u, w)),
        "sciad selinv (cholmod)": sd.function(
            lambda u: sd.sparse.data(sd.linalg.selected_inverse(matrix(u), solver="cholmod"))),
        "sciad selinv (splu)": sd.function(
            lambda u: sd.sparse.data(sd.linalg.selected_inverse(matrix(u), solver="splu"))),
        "sciad factorization": sd.function(logdet),
        "CHOLMOD factorization": jax.jit(logdet_sparsax),
    }
    if n >= 256:  # (seconds a call: a selected inverse of order 2N^2 by SuperLU)
        del fns["sciad hvp (cholmod)"]
    inputs = [(jnp.asarray(u0 * (1 + 0.01 * i)),) for i in range(CYCLE)]
    # checks: the value and gradient against sparsax's (its gradient is
    # d/du of the upper triangle: the same parameterization), the selected
    # inverses and Hessian-vector products against each other
    v, g = fns["sciad value+grad"](*inputs[0])
    v2, g2 = fns["sparsax value+grad"](*inputs[0])
    assert abs(float(v) - float(v2)) <= 1e-10 * abs(float(v2)), (v, v2)
    err = float(jnp.max(jnp.abs(g - g2)) / jnp.max(jnp.abs(g2)))
    assert err < 1e-10, f"gradient differs from sparsax's by {err:.1e}"
    z = [fns[k](*inputs[0]) for k in ("sciad selinv", "sciad selinv (cholmod)",
                                      "sciad selinv (splu)")]
    for other in z[1:]:
        assert float(jnp.max(jnp.abs(z[0] - other)) / jnp.max(jnp.abs(z[0]))) < 1e-10
    if "sciad hvp (cholmod)" in fns:
        h1, h2 = fns["sciad hvp"](*inputs[0]), fns["sciad hvp (cholmod)"](*inputs[0])
        assert float(jnp.max(jnp.abs(h1 - h2)) / jnp.max(jnp.abs(h2))) < 1e-9
    hb, h0 = fns["sciad hvp, each of 8"](*inputs[0]), sd.hvp(logdet, inputs[0][0], W[3])
    assert float(jnp.max(jnp.abs(hb[3] - h0)) / jnp.max(jnp.abs(h0))) < 1e-12
    return fns, inputs


def run(sizes, repeats: int) -> list[dict]:
    import jax

    jax.config.update("jax_enable_x64", True)
    rows = []
    for n in sizes:
        fns, inputs = build(n)
        med = _harness.medians({k: _harness.Cycling(f, inputs) for k, f in fns.items()},
                               (), repeats)
        med["sciad hvp, each of 8"] /= BLOCK
        rows.append({"n": n, **{k: v * 1e3 for k, v in med.items()}})
        print(rows[-1], file=sys.stderr)
    return rows


COLUMNS = ["sciad value+grad", "sparsax value+grad", "sciad jvp", "sciad hvp",
           "sciad hvp, each of 8", "sciad selinv",
           "sciad vg (cholmod)", "sciad hvp (cholmod)", "sciad selinv (cholmod)",
           "sciad selinv (splu)", "sciad factorization", "CHOLMOD factorization"]


def table(rows, argv: str) -> str:
    lines = _harness.report_head("Sparse log-determinants and selected inverses", argv,
                                 _harness.machine_info(_harness.load_average()))
    lines += ["", "Median ms per call; each call on new values (- : not run). Targets: "
              "value+grad <= 1.0x sparsax's; forward mode and Hessian-vector products <= 2x "
              "the gradient; the selected inverse <= 3x one factorization (CHOLMOD's). "
              "One Hessian-vector product is 9F multiply-adds against the gradient's 3F "
              "(F: the factorization's), a floor of 3x its flops; in a block of 8 "
              "directions each is 6F (2x).", "",
              "| N (unknowns) | " + " | ".join(COLUMNS)
              + " | vg / sparsax | jvp / vg | hvp / vg | hvp each of 8 / vg "
              "| selinv / CHOLMOD factorization |",
              "|---|" + "---:|" * (len(COLUMNS) + 5)]
    for r in rows:
        vg = r["sciad value+grad"]
        ratios = [(vg / r["sparsax value+grad"], 1.0), (r["sciad jvp"] / vg, 2.0),
                  (r["sciad hvp"] / vg, 2.0), (r["sciad hvp, each of 8"] / vg, 2.0),
                  (r["sciad selinv"] / r["CHOLMOD factorization"], 3.0)]
        lines.append(f"| {r['n']} ({r['n'] ** 2:,}) | "
                     + " | ".join(f"{r[c]:.2f}" if c in r else "-" for c in COLUMNS) + " | "
                     + " | ".join(f"{x:.2f} ({_harness.yes_no(x <= t)})" for x, t in ratios)
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,128,256")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    sizes = [32] if a.quick else [int(s) for s in a.sizes.split(",")]
    rows = run(sizes, 3 if a.quick else a.repeats)
    _harness.publish(OUT, table(rows, _harness.command_line("bench/logdet.py", argv)),
                     write=not (a.no_write or a.quick))


if __name__ == "__main__":
    main()
