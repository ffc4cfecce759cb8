"""sciad's compiled CHOLMOD (`solver="cholmod"`) against sparsax's, the
fastest compiled direct peer: value and gradient of the 2-D inverse-Poisson
misfit, one matrix and a vmapped batch.

Run from the repository root (needs the `[cholmod]` extra, which installs
sparsax on Linux x86-64):

    .venv/bin/python bench/cholmod_peer.py              # full run (~2-3 min on 2 cores)
    .venv/bin/python bench/cholmod_peer.py --quick      # smoke check (N = 32, 64)
    .venv/bin/python bench/cholmod_peer.py --sizes 64,128 --no-write

The problem is `examples/inverse_poisson.py`'s (see `bench/inverse_poisson.py`):
the 5-point variable-coefficient Poisson matrix on an N x N grid, its stored
values from the nodal log-conductivity `m`, tagged spd, and

    J(m) = 0.5 * ||u(m) - d||^2,    A(m) u = f.

Variants, each `(J, dJ/dm)` in float64, all on one CHOLMOD (SuiteSparse,
sparsax's build of it):

- `sciad`: `sd.function(sd.value_and_grad(J))` with `solver="cholmod"`
  (sparsax's kernels under sciad's names; sciad also checks the matrix and
  the backward error of each solve).
- `sciad (to_jax)`: `jax.jit(jax.value_and_grad(sd.to_jax(J)))`, the same
  program through JAX's own transforms.
- `sparsax`: `sparsax.solve` on the matrix's upper triangle (CHOLMOD reads
  that triangle; the lower one would get no gradient) with the same values
  in `jax.numpy`, `jax.value_and_grad`, jitted.

The batch rows: `jax.vmap` (`sd.vmap` for sciad) of each over 64 fields `m`
at N = 32. Every variant's gradient is checked against sciad's before timing
(relative 1e-9). Each call gets the next of 8 different fields (an
optimizer's calls: both libraries skip a factorization whose values are the
last ones factored, so repeating one input would time the solves alone). Medians of interleaved batches of calls; the ratio is each
to sparsax (below 1: faster). The table goes to stdout and
`bench/results/cholmod_peer.md`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "cholmod_peer.md")
EXAMPLE = os.path.join(HERE, "..", "examples", "inverse_poisson.py")
BATCH, BATCH_N = 64, 32
#: distinct inputs each variant cycles through
CYCLE = 8


def build(n: int, batch: int | None):
    """`{name: fn}` and their arguments for size `n` (a batch of `batch`
    fields where given)."""
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import jax.numpy as jnp
    import numpy as np
    import sparsax

    import sciad as sd
    import sciad.numpy as snp

    ex = _harness.load_example(EXAMPLE)
    P = ex.Problem(n)
    f = np.ascontiguousarray(P.sources[:, 0])
    rng = np.random.default_rng(0)
    m0 = 0.5 * P.true_field()
    d = np.asarray(sd.function(lambda m: sd.linalg.solve(ex.stiffness(P, m), f))(
        P.true_field())) * (1 + 0.01 * rng.standard_normal(n * n))

    def J(m):
        u = sd.linalg.solve(ex.stiffness(P, m), f, solver="cholmod")
        r = u - d
        return 0.5 * snp.sum(r * r)

    up = np.flatnonzero(P.rows <= P.cols)
    ai = jnp.asarray(P.rows[up], jnp.int32)
    aj = jnp.asarray(P.cols[up], jnp.int32)

    def J_sparsax(m):
        vals = ex.entries(P, m, xp=jnp)[up]
        r = sparsax.solve(ai, aj, vals, jnp.asarray(f)) - d
        return 0.5 * jnp.sum(r * r)

    vg = sd.value_and_grad(J)
    if batch is None:
        fns = {"sciad": sd.function(vg),
               "sciad (to_jax)": jax.jit(jax.value_and_grad(sd.to_jax(J))),
               "sparsax": jax.jit(jax.value_and_grad(J_sparsax))}
        fields = [m0 * (1 + 0.01 * i) for i in range(CYCLE)]
    else:
        fns = {"sciad": sd.function(sd.vmap(vg)),
               "sciad (to_jax)": jax.jit(jax.vmap(jax.value_and_grad(sd.to_jax(J)))),
               "sparsax": jax.jit(jax.vmap(jax.value_and_grad(J_sparsax)))}
        fields = [m0[None] * (1 + 0.1 * rng.standard_normal((batch, 1))) for _ in range(CYCLE)]
    return fns, [(jax.device_put(m),) for m in fields]


def check(fns, args) -> None:
    import numpy as np

    ref = np.asarray(fns["sciad"](*args)[1])
    for name, fn in fns.items():
        g = np.asarray(fn(*args)[1])
        err = np.max(np.abs(g - ref)) / np.max(np.abs(ref))
        assert err < 1e-9, f"{name}: gradient differs from sciad's by {err:.1e}"


def run(sizes, repeats: int) -> list[dict]:
    import jax

    jax.config.update("jax_enable_x64", True)
    rows = []
    cases = [(n, None) for n in sizes] + [(BATCH_N, BATCH)]
    for n, batch in cases:
        fns, inputs = build(n, batch)
        check(fns, inputs[0])
        med = _harness.medians({k: _harness.Cycling(f, inputs) for k, f in fns.items()},
                               (), repeats)
        base = med["sparsax"]
        label = f"N = {n} ({n * n:,} unknowns)" if batch is None else \
            f"batch of {batch}, N = {n}"
        rows.append({"case": label, **{k: v * 1e3 for k, v in med.items()},
                     "ratio": med["sciad"] / base, "ratio_jax": med["sciad (to_jax)"] / base,
                     "fn_vs_jit": med["sciad"] / med["sciad (to_jax)"]})
        print(rows[-1], file=sys.stderr)
    return rows


def table(rows, argv: str) -> str:
    lines = _harness.report_head("sciad's compiled CHOLMOD against sparsax's", argv,
                                 _harness.machine_info(_harness.load_average()))
    lines += ["", "Value and gradient of the inverse-Poisson misfit (median ms per call; "
              "ratios to sparsax, target <= 1.00; `sd.function` against "
              "`jax.jit(sd.to_jax)`, target <= 1.10).", "",
              "| case | sciad | sciad (to_jax) | sparsax | sciad / sparsax | to_jax / sparsax "
              "| function / jit | target met |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        met = r["ratio"] <= 1.0 and r["fn_vs_jit"] <= 1.1
        lines.append(f"| {r['case']} | {r['sciad']:.2f} | {r['sciad (to_jax)']:.2f} | "
                     f"{r['sparsax']:.2f} | {r['ratio']:.2f} | {r['ratio_jax']:.2f} | "
                     f"{r['fn_vs_jit']:.2f} | {_harness.yes_no(met)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,128,256")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    sizes = [32, 64] if a.quick else [int(s) for s in a.sizes.split(",")]
    rows = run(sizes, 3 if a.quick else a.repeats)
    _harness.publish(OUT, table(rows, _harness.command_line("bench/cholmod_peer.py", argv)),
                     write=not (a.no_write or a.quick))


if __name__ == "__main__":
    main()
