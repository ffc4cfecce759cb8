"""sciad's banded LU (the stiff integrators' factorization of a narrow-band
iteration matrix, `sciad.solvers.direct._band`) against KLU in the program
(klujax's kernels, as the integrators keep them), SciPy's SuperLU and LAPACK's
banded LU (`scipy.linalg.lapack.dgbtrf` / `dgbtrs`), on the same matrices.

Run from the repository root:

    .venv/bin/python bench/band.py            # about 1 min on 2 cores
    .venv/bin/python bench/band.py --quick --no-write

The matrices: the iteration matrix `I - c J` of a 1-D method of lines with
`s` interleaved species (the Brusselator's `s = 2`: 2 sub- and 2
superdiagonals; `s = 4`: 4 and 4), `n` unknowns, random values with a
dominant diagonal. Times per call (us), medians: sciad's and KLU's inside a
compiled loop of many calls (their per-call cost in the integrators' loops);
SciPy's and LAPACK's through their Python functions (a few microseconds of
Python each). A factorization, and a solve with one right-hand side.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import (  # noqa: E402  (bench/ must be on sys.path first)
    command_line, load_average, machine_info, publish, report_head)

RESULTS = os.path.join(ROOT, "bench", "results", "band.md")
SIZES = ((2, 1024), (2, 16384), (4, 4096))
QUICK_SIZES = ((2, 1024),)
CALLS = 200  # calls per compiled loop


def _matrix(s: int, n: int, seed: int = 0):
    """`I - c J` on the pattern of an `s`-species 1-D stencil (interleaved):
    every unknown coupled to the `s` species of its cell and to its own
    species in the neighbouring cells; a dominant diagonal."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    offsets = sorted({d for d in range(-s + 1, s)} | {-s, s})
    diags = [rng.uniform(-1.0, 1.0, n - abs(d)) for d in offsets]
    A = sp.diags(diags, offsets, shape=(n, n), format="csr")
    A = (A + sp.eye(n) * (2.0 * s + 1.0)).tocsr()
    A.sort_indices()
    return A


def _per_call(fn, args, repeats: int) -> float:
    """Median seconds per call of `fn` (a compiled loop of `CALLS` calls)."""
    import statistics

    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) / CALLS)
    return statistics.median(times)


def _host_per_call(fn, repeats: int, calls: int = 50) -> float:
    import statistics

    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def measure(s: int, n: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import scipy.linalg as la
    import scipy.sparse.linalg as sla

    from sciad.graph._types import Pattern
    from sciad.solvers.direct import _band
    from sciad.solvers.ode import _kept_klu

    A = _matrix(s, n)
    pattern = Pattern(A.shape, A.indptr.astype(np.int64), A.indices.astype(np.int64))
    band = _band.Band.of(pattern)
    values = jnp.asarray(A.data)
    b = jnp.asarray(np.random.default_rng(1).standard_normal(n))
    out = {"s": s, "n": n, "nnz": A.nnz, "kl": band.kl, "ku": band.ku, "t": {}}

    def factors(factor):  # CALLS factorizations of changing values
        def body(i, c):
            v, acc = c
            return v * 1.000001, acc + factor(v)
        return jax.jit(lambda v: jax.lax.fori_loop(0, CALLS, body, (v, 0.0))[1])

    def solves(solve):  # CALLS solves, each from the last's solution
        return jax.jit(lambda b: jax.lax.fori_loop(0, CALLS, lambda i, x: solve(x), b))

    out["t"]["band_factor"] = _per_call(factors(lambda v: band.factor(v).lu[0, 0]),
                                        (values,), repeats)
    f = jax.jit(band.factor)(values)
    out["t"]["band_solve"] = _per_call(solves(lambda x: band.solve(f, x)), (b,), repeats)
    x = np.asarray(band.solve(f, b))
    out["residual"] = float(np.abs(A @ x - np.asarray(b)).max())
    if _kept_klu.usable(np.float64):
        def klu_factor(v):
            h = _kept_klu.swap(pattern, jnp.asarray(True), _kept_klu.none(), v)
            return _kept_klu.release(h, after=[v]).astype(v.dtype)

        out["t"]["klu_factor"] = _per_call(factors(klu_factor), (values,), repeats)

        @jax.jit
        def klu_solves(b):
            h = _kept_klu.swap(pattern, jnp.asarray(True), _kept_klu.none(), values)
            x = jax.lax.fori_loop(0, CALLS, lambda i, x: _kept_klu.solve(pattern, h, values, x),
                                  b)
            return x + _kept_klu.release(h, after=[x]).astype(x.dtype)

        out["t"]["klu_solve"] = _per_call(klu_solves, (b,), repeats)
    Ac = A.tocsc()
    out["t"]["splu_factor"] = _host_per_call(lambda: sla.splu(Ac), repeats)
    lu = sla.splu(Ac)
    bn = np.asarray(b)
    out["t"]["splu_solve"] = _host_per_call(lambda: lu.solve(bn), repeats)
    kl, ku = band.kl, band.ku
    ab = np.zeros((2 * kl + ku + 1, n))
    D = A.todia()
    for off, row in zip(D.offsets, D.data):
        if -kl <= off <= ku:
            ab[kl + ku - off, max(0, off):n + min(0, off)] = row[max(0, off):n + min(0, off)]
    out["t"]["lapack_factor"] = _host_per_call(lambda: la.lapack.dgbtrf(ab, kl, ku), repeats)
    lub, piv, _ = la.lapack.dgbtrf(ab, kl, ku)
    out["t"]["lapack_solve"] = _host_per_call(lambda: la.lapack.dgbtrs(lub, kl, ku, bn, piv),
                                              repeats)
    return out


def render(rows, machine, argv) -> str:
    lines = report_head("Banded LU in the program", argv, machine)
    lines += ["", "Microseconds per call, medians. sciad's banded LU and KLU (klujax's kernels, "
              "as the stiff integrators keep them) inside compiled loops of "
              f"{CALLS} calls; SciPy's SuperLU and LAPACK's banded LU (`dgbtrf`/`dgbtrs`) "
              "through their Python functions, a few microseconds of Python each. Matrices: "
              "`I - c J` of an `s`-species 1-D stencil, interleaved (`kl = ku = s`).", "",
              "| s | n | nnz | band factor | KLU factor | SuperLU factor | LAPACK factor "
              "| band solve | KLU solve | SuperLU solve | LAPACK solve | KLU / band (factor, "
              "solve) | max residual |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        t = r["t"]

        def us(key):
            return f"{t[key] * 1e6:.1f}" if key in t else "-"

        ratio = (f"{t['klu_factor'] / t['band_factor']:.1f}, "
                 f"{t['klu_solve'] / t['band_solve']:.1f}") if "klu_factor" in t else "-"
        lines.append(f"| {r['s']} | {r['n']:,} | {r['nnz']:,} | {us('band_factor')} "
                     f"| {us('klu_factor')} | {us('splu_factor')} | {us('lapack_factor')} "
                     f"| {us('band_solve')} | {us('klu_solve')} | {us('splu_solve')} "
                     f"| {us('lapack_solve')} | {ratio} | {r['residual']:.1e} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the smallest matrix, 3 repeats")
    p.add_argument("--no-write", action="store_true", help="do not write bench/results/band.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    import jax

    jax.config.update("jax_enable_x64", True)
    load = load_average()
    rows = [measure(s, n, 3 if args.quick else 9) for s, n in
            (QUICK_SIZES if args.quick else SIZES)]
    publish(RESULTS, render(rows, machine_info(load), command_line("bench/band.py", argv)),
            write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
