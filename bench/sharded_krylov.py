"""Weak scaling of the distributed CG (`sd.linalg.solve(..., partition=)`) on
simulated CPU devices.

A 2-D variable-coefficient Poisson problem (5-point, Dirichlet) with a fixed
block of 64 x 64 grid points per device, the grid's rows split over 1, 2, 4
and 8 devices (one subprocess per count: XLA's device count is fixed when
JAX starts), solved by CG to rtol 1e-8 with no preconditioner, Jacobi per
device, and block-Jacobi with a local AMG V-cycle per device
(`"block_amg"`). Per count and preconditioner it reports:

- iterations;
- values each device receives per iteration (the halo of one product:
  `RowPartition.received()`), against the `n` of gathering the vector;
- collectives in the compiled loop's body (from the HLO): all-reduces (the
  inner products: scalars) and collective-permutes (the halo);
- wall time per iteration (the median of 3 runs of the compiled solve,
  divided by its iterations).

The devices are simulated: they share this machine's cores (2 here), so
wall times show the cost of the loop's work and collectives on a shared
CPU, not a scaling figure.

The loop timed is the one `linalg.solve` runs for a sharded solve (its
Krylov machinery, the sharded product, the preconditioner), called directly
so that the iteration count comes back; the run-time checks are left out.

Run from the repository root: `.venv/bin/python bench/sharded_krylov.py`
(writes bench/results/sharded_krylov.md; `--devices 1 2` for fewer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

GRID = 64          # grid points per device along each axis
RTOL = 1e-8
PRECONDITIONERS = (None, "jacobi", "block_amg")


def poisson(nx: int, ny: int, seed: int = 0):
    """The 5-point `-div(k grad u)` on an `ny` x `nx` grid (rows of `nx`
    points, numbered row by row), conductivities log-uniform over two
    orders of magnitude on the faces."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    kx = np.exp(rng.uniform(-2.3, 2.3, (ny, nx + 1)))
    ky = np.exp(rng.uniform(-2.3, 2.3, (ny + 1, nx)))
    idx = np.arange(nx * ny).reshape(ny, nx)
    rows, cols, vals = [], [], []
    diag = np.zeros((ny, nx))
    for (di, dj), w in (((0, 1), kx[:, 1:]), ((0, -1), kx[:, :-1]),
                        ((1, 0), ky[1:]), ((-1, 0), ky[:-1])):
        diag += w
        i, j = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        ii, jj = i + di, j + dj
        inside = (ii >= 0) & (ii < ny) & (jj >= 0) & (jj < nx)
        rows.append(idx[inside])
        cols.append(idx[ii[inside], jj[inside]])
        vals.append(-w[inside])
    rows.append(idx.ravel())
    cols.append(idx.ravel())
    vals.append(diag.ravel())
    A = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(nx * ny,) * 2).tocsr()
    A.sort_indices()
    return A


def loop_collectives(hlo: str) -> dict:
    """Counts of all-reduces and collective-permutes in the bodies of the
    compiled program's while loops (and what they call)."""
    comps, name = {}, None
    for line in hlo.splitlines():
        s = line.strip()
        if s.endswith("{") and "=" not in s.split("(")[0]:
            name = (s.split()[1] if s.startswith("ENTRY") else s.split()[0]).lstrip("%")
            comps[name] = []
        elif name is not None and s and s != "}":
            comps[name].append(s)
    seen = set()

    def visit(c):
        if c in seen or c not in comps:
            return
        seen.add(c)
        for ln in comps[c]:
            for key in ("body=", "condition=", "calls=", "true_computation=",
                        "false_computation=", "branch_computations={"):
                if key in ln:
                    for t in ln.split(key, 1)[1].split("}")[0].split(","):
                        visit(t.strip().lstrip("{%").split(" ")[0].rstrip(")"))

    for lines in comps.values():
        for ln in lines:
            if " while(" in ln and "body=" in ln:
                visit(ln.split("body=", 1)[1].split(",")[0].split()[0].lstrip("%"))
    body = [ln for c in seen for ln in comps[c]]
    return {"all_reduce": sum("all-reduce(" in ln or "all-reduce-start(" in ln for ln in body),
            "permute": sum("collective-permute(" in ln or "collective-permute-start(" in ln
                           for ln in body),
            "all_gather": sum("all-gather(" in ln or "all-gather-start(" in ln for ln in body)}


def child(devices: int) -> dict:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax
    import numpy as np
    from jax.sharding import AxisType

    import sciad as sd
    from sciad.primitives._sparse_sharded import block_amg, sharded_product
    from sciad.solvers.iterative import _iterative as iterative
    from sciad.solvers._indices import pattern_matmul

    A = poisson(GRID, GRID * devices)
    n = A.shape[0]
    pat = sd.sparse.from_scipy(A).type.pattern
    part = sd.sparse.row_partition(pat, devices, "rows")
    b = np.random.default_rng(1).standard_normal(n)
    mesh = jax.make_mesh((devices,), ("rows",), axis_types=(AxisType.Auto,))
    out = {"devices": devices, "n": n, "nnz": int(A.nnz), "received": part.received(),
           "exchange": part.exchange, "rows": []}

    def solver(pre):
        def run(d, b):
            sharded = sharded_product(part, d, b, False, op="bench")
            if sharded is None:  # (one device: the one-device loop)
                matvec = lambda x: pattern_matmul(pat, d, x, False)  # noqa: E731
                b_, split = b, (lambda v: v)
            else:
                matvec, b_, split, _ = sharded
            precond = None
            if pre == "jacobi":
                inv = split(1.0 / d[pat.diagonal_positions()])
                precond = lambda v: inv * v  # noqa: E731
            elif pre == "block_amg":
                precond = block_amg(part, d, b, False, op="bench")
            return iterative.solve(matvec, b_, method="cg", rtol=RTOL, atol=0.0, maxiter=None,
                                   precond=precond)
        return jax.jit(run)

    with jax.set_mesh(mesh):
        for pre in PRECONDITIONERS:
            f = solver(pre)
            t0 = time.perf_counter()
            x, ok, rel, steps = jax.block_until_ready(f(A.data, b))
            first = time.perf_counter() - t0
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(f(A.data, b))
                times.append(time.perf_counter() - t0)
            hlo = f.lower(A.data, b).compile().as_text()
            coll = loop_collectives(hlo)
            err = float(np.linalg.norm(A @ np.asarray(x) - b) / np.linalg.norm(b))
            steps = int(steps)
            out["rows"].append({"pre": pre or "none", "steps": steps, "ok": bool(ok),
                                "residual": err, "first_s": first,
                                "ms_per_iter": 1e3 * float(np.median(times)) / max(steps, 1),
                                **coll})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--child", type=int, default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.child)))
        return
    machine = _harness.machine_info(_harness.load_average())
    results = []
    for d in args.devices:
        proc = subprocess.run([sys.executable, __file__, "--child", str(d)], capture_output=True,
                              text=True, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(f"devices={d} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
        print(f"devices={d} done", file=sys.stderr)
    lines = _harness.report_head("Distributed CG: weak scaling on simulated devices",
                                 _harness.command_line("bench/sharded_krylov.py",
                                                       argv or sys.argv[1:]), machine)
    lines += [
        "",
        f"2-D variable-coefficient Poisson (5-point, Dirichlet, conductivities log-uniform "
        f"over two orders of magnitude), {GRID} x {GRID} grid points per device, the grid's "
        f"rows split over the devices; CG to rtol {RTOL:g}; float64. `received`: values each "
        "device receives per iteration (one product's halo, `RowPartition.received()`), "
        "against `vector` (n) for gathering the vector. `all-reduce`, `permute`, `all-gather`: "
        "collectives in the compiled loop's body (static count, a conditional branch "
        "included: lineax's CG recomputes the residual every few steps). ms/iteration: "
        "median of 3 runs / iterations.",
        "",
        "**The devices are simulated and share this machine's 2 cores: wall times are not "
        "scaling figures** (8 devices do 8 blocks' work on 2 cores).",
        "",
        "| devices | n | preconditioner | iterations | received / iteration | vector | all-reduce "
        "| permute | all-gather | ms / iteration | first call s | residual |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for row in r["rows"]:
            lines.append(f"| {r['devices']} | {r['n']} | {row['pre']} | {row['steps']} | "
                         f"{r['received'] if r['devices'] > 1 else 0} | {r['n']} | "
                         f"{row['all_reduce']} | {row['permute']} | {row['all_gather']} | "
                         f"{row['ms_per_iter']:.3f} | {row['first_s']:.1f} | "
                         f"{row['residual']:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        _harness.write_text(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                         "sharded_krylov.md"), text)


if __name__ == "__main__":
    main()
