"""sciad's globalized root methods (`method="hybr"`, `"lm"`: dense
Jacobian) against SciPy's MINPACK ones on one large problem.

Run from the repository root:

    .venv/bin/python bench/root_dense.py            # n = 200, 1000, 2000 (~2 min on 2 cores)
    .venv/bin/python bench/root_dense.py --quick    # n = 200, 1000
    .venv/bin/python bench/root_dense.py --no-write

The problem: Broyden's tridiagonal function (More, Garbow and Hillstrom),
`(3 - 2 x_i) x_i - x_{i-1} - 2 x_{i+1} + 1 = 0`, from `x = -1`. sciad forms
the dense Jacobian from the graph (`jax.jacfwd`) at each accepted iterate
and steps with LU (its Gauss-Newton step; a singular Jacobian falls back to
a least-squares SVD); SciPy's `root(method="hybr" | "lm")` (MINPACK's
`hybrd` with Broyden updates of a QR factorization, and `lmdif`) forms it
by finite differences, `n` evaluations of `F` each. Both converge to the same
root (checked to 1e-8). Medians of interleaved batches (bench/_harness.py),
float64; the ratio is sciad to SciPy (below 1: faster). The table goes to
stdout and bench/results/root_dense.md.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _harness  # noqa: E402

OUT = os.path.join(HERE, "results", "root_dense.md")


def broyden_tridiagonal(x, xp):
    padded = xp.pad(x, 1)
    return (3.0 - 2.0 * x) * x - padded[:-2] - 2.0 * padded[2:] + 1.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import scipy.optimize as so

    import sciad as sd
    import sciad.numpy as snp

    load = _harness.load_average()
    sizes = (200, 1000) if args.quick else (200, 1000, 2000)
    rows = []

    def fun(x):  # (one function: sciad compiles its program once per function)
        return broyden_tridiagonal(x, snp)

    for n in sizes:
        x0 = -np.ones(n)
        for method in ("hybr", "lm"):
            print(f"  n = {n}, {method} ...", file=sys.stderr)

            def ours(x0, method=method):
                return sd.optimize.root(fun, x0, method=method)

            def theirs(x0, method=method):
                return so.root(lambda x: broyden_tridiagonal(x, np), x0, method=method)

            a, b = ours(x0), theirs(x0)  # (compiles sciad's program once)
            assert a.success and b.success
            assert np.max(np.abs(np.asarray(a.x) - b.x)) <= 1e-8 * np.max(np.abs(b.x))
            t = _harness.medians({"sciad": _harness.HostCall(ours),
                                  "scipy": _harness.HostCall(theirs)}, (x0,), repeats=3,
                                 seconds=0.5)
            rows.append((n, method, int(a.nit), int(b.nfev), 1e3 * t["sciad"],
                         1e3 * t["scipy"], t["sciad"] / t["scipy"]))
    lines = _harness.report_head("sciad's hybr and lm against SciPy's MINPACK",
                                 _harness.command_line("bench/root_dense.py", argv),
                                 _harness.machine_info(load))
    lines += ["", "Broyden's tridiagonal function from x = -1, float64. sciad: dense Jacobian "
              "from the graph, LU; SciPy: MINPACK with finite differences.", "",
              "| n | method | sciad iterations | SciPy nfev | sciad ms | SciPy ms | "
              "sciad / SciPy |", "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {n:,} | {m} | {it} | {nfev} | {ts:.1f} | {tr:.1f} | {r:.2f} |"
              for n, m, it, nfev, ts, tr, r in rows]
    _harness.publish(OUT, "\n".join(lines) + "\n", not args.no_write)


if __name__ == "__main__":
    main()
