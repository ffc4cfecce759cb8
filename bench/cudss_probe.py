"""What cuDSS's factor exposes and what its mixed-precision factors cost (issues 49, 53).

Builds bench/cudss_probe.cc with the system compiler against the cuDSS and CUDA
runtime wheels (the paths sciad's own cuDSS extension builds with), runs it on the
GPU and reads its JSON lines:

- Part A, small matrices factored as SPD, symmetric and general: whether cuDSS's
  `CUDSS_DATA_DIAG` gives log|det| (sum of log|d_i|), half of it (a Cholesky
  factor's diagonal) or neither, and the determinant's sign from it, against
  NumPy's `slogdet`: what a log-determinant from cuDSS's factor needs.
- Part B, 3-D matrices (the 7-point Laplacian plus the identity, SPD; a
  convection-diffusion matrix, general): analysis, factorization and solve times,
  the device memory the factorization took, and the backward error, with float64
  factors, with float32 factors (`CUDSS_CONFIG_DOWNCAST_FACTORS`: the strict or
  the block diagonal kept in float64) and with the strict mode plus two steps of
  cuDSS's iterative refinement.

    python bench/cudss_probe.py 64 100     # m^3 grids: 262,144 and 10^6 unknowns
    python bench/cudss_probe.py --build    # only compile (the CPU: a check that it builds)

Writes bench/results/cudss_probe_<device>.md (and the raw lines beside it, .jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

MODES = {0: "float64 factors", 1: "float32, block diagonal kept", 2: "float32, diagonal kept"}


def build(out_dir: str) -> str:
    from sciad.solvers.direct import _cudss_build

    p = _cudss_build.paths()
    exe = os.path.join(out_dir, "cudss_probe")
    cmd = [_cudss_build.compiler(), "-O2", "-std=c++17", os.path.join(HERE, "cudss_probe.cc"),
           "-o", exe, *_cudss_build.flags(p)]
    subprocess.run(cmd, check=True)
    return exe


def read_small(rec: dict) -> dict:
    n = rec["n"]
    A = np.array(rec["matrix"]).reshape(n, n)
    sign, logdet = np.linalg.slogdet(A)
    status, _, diag = rec["diag"]
    d = np.array(diag)
    got = float(np.sum(np.log(np.abs(d)))) if status == 0 and np.all(d != 0) else float("nan")
    x_err = float(np.max(np.abs(A @ np.array(rec["x"]) - 1.0)))
    return dict(name=rec["name"], info=rec["info"][1], sign=sign, logdet=logdet,
                sum_log_diag=got, ratio=got / logdet if logdet else float("nan"),
                diag_sign=float(np.prod(np.sign(d))) if status == 0 else float("nan"),
                diag=d.tolist(), perm_row=rec["perm_reorder_row"], inertia=rec["inertia"],
                npivots=rec["npivots"], residual=x_err, diag_status=status)


def table(rows, header) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[64])
    ap.add_argument("--build", action="store_true", help="only compile")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cudss_probe")
    exe = build(work)
    if args.build:
        print("built", exe)
        return 0
    proc = subprocess.run([exe, *map(str, args.sizes)], capture_output=True, text=True,
                          timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    recs = [json.loads(ln) for ln in lines]
    try:
        import jax
        device = jax.devices()[0].device_kind
    except Exception:  # (the report still names what it can)
        device = "GPU"
    slug = "".join(c if c.isalnum() else "_" for c in device)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"cudss_probe_{slug}.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    md = [f"# cuDSS probe on {device}", "",
          "Written by `bench/cudss_probe.py` (bench/cudss_probe.cc); exit status "
          f"{proc.returncode}.", "", "## A. What the factor's diagonal gives", ""]
    small = [read_small(r) for r in recs if r.get("part") == "A"]
    md += table([(s["name"], s["info"], f"{s['sign']:+.0f}", f"{s['logdet']:.12f}",
                  f"{s['sum_log_diag']:.12f}", f"{s['ratio']:.6f}", f"{s['diag_sign']:+.0f}",
                  s["inertia"], s["npivots"], f"{s['residual']:.1e}") for s in small],
                 ["matrix, factored as", "info", "sign (NumPy)", "log abs det (NumPy)",
                  "sum log abs diag", "ratio", "sign of prod(diag)", "inertia [status, v]",
                  "npivots [status, v]", "solve residual"])
    md += ["", "Diagonals and reordering permutations:", ""]
    md += [f"- {s['name']}: diag {np.round(s['diag'], 6).tolist()}, perm_reorder_row "
           f"{s['perm_row']}" for s in small]
    md += ["", "## B. Float64 against float32 (downcast) factors", ""]
    rows = []
    for r in recs:
        if r.get("part") != "B":
            continue
        mode = MODES.get(r["downcast"][0], r["downcast"][0])
        if r["ir_steps"][0]:
            mode += f" + {r['ir_steps'][0]} refinement steps"
        rows.append((r["name"], f"{r['n']:,}", mode, f"{r['analysis_s']:.3f}",
                     f"{r['factor_s']:.3f}", f"{r['refactor_s']:.3f}",
                     f"{1e3 * r['resolve_s']:.1f}", f"{r['backward_error']:.1e}",
                     f"{r['factor_device_bytes'] / 2**20:,.0f}", r["info"],
                     r["downcast"][1], r["ir_steps"][3]))
        if "error" in r:
            rows.append((r["error"],))
    md += table(rows, ["matrix", "n", "factors", "analysis s", "factor s", "refactor s",
                       "solve ms", "backward error", "factor MiB (device)", "info",
                       "config status", "IR steps done"])
    errors = [r for r in recs if "error" in r]
    if errors:
        md += ["", "Errors: " + "; ".join(json.dumps(e) for e in errors)]
    path = os.path.join(args.out, f"cudss_probe_{slug}.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print("written", path)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
