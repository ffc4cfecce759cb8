"""`sd.linalg.slogdet` of a sparse SPD matrix on the GPU against the same machine's CPU.

The 5-point Laplacian plus a unit diagonal on an n x n grid, its stored values the
input; value and gradient of `log det A` with `solver="auto"` (an exact
factorization: what "auto" picks where the program runs) and `solver="slq"` (the
matrix-free estimate: Lanczos quadrature with 64 probes, only products with A),
first call (tracing and compilation) and the median of the next calls, on JAX's
default backend and in a child process with `JAX_PLATFORMS=cpu`.

    python bench/gpu_logdet.py            # n = 256 and 512 (the CPU child: 256)
    python bench/gpu_logdet.py --n 128 --cpu-n 128    # one size

Prints a table; with --write, bench/results/gpu_logdet_<device>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _matrix(n: int):
    import numpy as np
    import scipy.sparse as sp

    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (n, n))
    A = sp.csr_array(sp.kronsum(T, T) + sp.eye(n * n))
    A.sort_indices()
    return A, np.asarray(A.data)


def run(sizes, repeats: int = 5) -> list[dict]:
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import sciad as sd

    rows = []
    for n in sizes:
        A, data = _matrix(n)
        exact = float(np.sum(np.log(np.linalg.eigvalsh(A.toarray())))) if n <= 64 else None
        for solver in ("auto", "slq"):
            def logdet(d, solver=solver):
                M = sd.sparse.csr_matrix((d, A.indices, A.indptr), shape=A.shape, tags=("spd",))
                return sd.linalg.slogdet(M, solver=solver)[1]

            f = sd.function(sd.value_and_grad(logdet))
            t0 = time.perf_counter()
            v, g = jax.block_until_ready(f(data))
            first = time.perf_counter() - t0
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(f(data))
                times.append(time.perf_counter() - t0)
            rows.append(dict(backend=jax.default_backend(), n=n * n, solver=solver,
                             first_s=first, median_s=statistics.median(times),
                             logdet=float(v), exact=exact,
                             grad_norm=float(np.linalg.norm(np.asarray(g)))))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="*", default=[256, 512])
    ap.add_argument("--cpu-n", type=int, nargs="*", default=[256],
                    help="sizes for the CPU child (its exact gradient at 512^2 took over "
                         "two minutes on the H200 machine's CPU)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if args.child:
        run(args.n)
        return 0
    rows = run(args.n)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, __file__, "--child", "--n", *map(str, args.cpu_n)],
                           capture_output=True, text=True, env=env, timeout=600)
    rows += [json.loads(ln) for ln in child.stdout.splitlines() if ln.startswith("{")]
    if child.returncode:
        print(child.stderr[-3000:])
    import jax
    device = jax.devices()[0].device_kind
    out = [f"# slogdet on {device} and its host CPU", "",
           "| backend | n | solver | first call s | median | log det "
           "| rel. to the first auto row |",
           "|---|---|---|---|---|---|---|"]
    ref = {}
    for r in rows:  # (the default backend's rows come first)
        if r["solver"] == "auto":
            ref.setdefault(r["n"], r["logdet"])
    for r in rows:
        out.append(f"| {r['backend']} | {r['n']:,} | {r['solver']} | {r['first_s']:.2f} | "
                   f"{r['median_s'] * 1e3:.1f} ms | {r['logdet']:.6f} | "
                   f"{r['logdet'] / ref[r['n']] - 1:+.1e} |")
    print("\n".join(out))
    if args.write:
        slug = "".join(c if c.isalnum() else "_" for c in device)
        with open(os.path.join(HERE, "results", f"gpu_logdet_{slug}.md"), "w") as f:
            f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
