"""Sparse direct solves on the GPU: sciad's "cudss" against the host and device peers.

Run from the repository root on a machine with an NVIDIA GPU (JAX's CUDA build and
`pip install '.[cuda]'`; `bench/gpu_check.sh` does both and runs this):

    python bench/gpu_sparse.py              # full run (~4 minutes on an H100)
    python bench/gpu_sparse.py --quick      # 256^2 flagship, B = 16, 24^3
    python bench/gpu_sparse.py --dry        # the plumbing on the CPU: tiny sizes, "cudss"
                                            # through the host stand-in (_cudss.StandIn)

Cases (float64; each variant's values and gradients are compared with the first
direct variant's, relative 2-norm error <= 1e-8, CG <= 1e-6):

1. The flagship gradient: examples/inverse_poisson.py's matrix on n x n grids
   (n = 256, 512: 65,536 and 262,144 unknowns), `J(m) = 0.5 ||u(m) - d||^2`,
   `A(m) u = f` (the first source), value and gradient `sd.value_and_grad(J)` at
   `m = 0.5 m_true`. Variants: `cudss` (`assume="spd"`: Cholesky), `cudss LU`,
   `splu` (SuperLU on the host), `spsolve` (jax.experimental.sparse.linalg.spsolve:
   cuSOLVER's QR; n = 256 only), `cg+jacobi` and `cg+amg` on the device
   (tol 1e-10), and in a child process with `JAX_PLATFORMS=cpu` (the same machine's
   CPU): sciad's `auto` (KLU up to 12,000 unknowns, SuperLU above) and `klu`, and
   SciPy (`splu` with `MMD_AT_PLUS_A`, a solve and a transposed solve with one LU:
   the solves of a hand-written adjoint, without the chain rule through `entries`).
2. The batch of bench/batch.py: B = 256 examples of its n = 32 problem (N = 1024),
   `sd.vmap(loss)` value and gradient with `cudss`, `splu` (host) and `cg+jacobi`.
3. A 3-D case: the 7-point Laplacian on an m^3 grid (m = 40: 64,000 unknowns)
   plus a unit diagonal, its stored values the inputs; the gradient of
   `sum(u^2)` with respect to them, `cudss` (Cholesky), `splu`, `cg+jacobi`.

Targets (issue 34, on an H100): the 512^2 gradient >= 5x faster than the best CPU
path and >= 2x faster than device CG; the 256-example batch >= 10x faster than the
host SuperLU path. The result goes to bench/results/gpu_sparse_<device>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import _harness  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "inverse_poisson.py")
DIRECT_TOL, CG_TOL = 1e-8, 1e-6


def _x64():
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    __import__("sciad")
    import jax

    jax.config.update("jax_enable_x64", True)


# ---------------------------------------------------------------------------
# timing


def _time(fn, args, repeats: int, budget_s: float):
    """(first call s, median s per call, output): the first call traces and
    compiles; then `repeats` calls (fewer where they take over `budget_s`)."""
    return _harness.first_and_median(fn, args, repeats, budget_s)


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.concatenate([np.ravel(x) for x in a]), np.concatenate([np.ravel(x) for x in b])
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _run(variants: dict, args, repeats: int, budget_s: float) -> list[dict]:
    """Times each variant (`{name: (fn, is_cg)}`), compares its output with the first's."""
    rows, ref = [], None
    for name, (fn, cg) in variants.items():
        try:
            first, med, out = _time(fn, args, repeats, budget_s)
        except Exception as e:  # (a variant that fails is reported, not fatal)
            rows.append(dict(variant=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        out = out if isinstance(out, tuple) else (out,)
        err = 0.0 if ref is None else _rel(out, ref)
        ref = out if ref is None else ref
        rows.append(dict(variant=name, first_s=first, ms=1e3 * med, err=err,
                         ok=err <= (CG_TOL if cg else DIRECT_TOL)))
    return rows


# ---------------------------------------------------------------------------
# the problems


def flagship(n: int, solver: str, **kw):
    """`(value_and_grad(J), (m,))` for examples/inverse_poisson.py at n x n."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    import sciad as sd

    ex = _harness.load_example(EXAMPLE)
    P = ex.Problem(n)
    m_true = P.true_field()
    f = P.sources[:, 0]
    vals = np.asarray(ex.entries(P, m_true, xp=np))
    A = sp.csc_matrix((vals, (P.rows, P.cols)), shape=(n * n, n * n))
    u = spla.splu(A, permc_spec="MMD_AT_PLUS_A").solve(f)
    d = u + 0.01 * np.abs(u).max() * np.random.default_rng(0).standard_normal(u.shape)

    def J(m):
        A = ex.stiffness(P, m)
        r = sd.linalg.solve(A, f, solver=solver, **kw) - d
        return 0.5 * sd.numpy.sum(r * r)

    return sd.function(sd.value_and_grad(J)), (0.5 * m_true,)


def scipy_flagship(n: int):
    """SciPy's factor + solve + transposed solve (the adjoint's solves) at n x n."""
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    ex = _harness.load_example(EXAMPLE)
    P = ex.Problem(n)
    vals = np.asarray(ex.entries(P, 0.5 * P.true_field(), xp=np))
    f = P.sources[:, 0]

    def run(vals):
        A = sp.csc_matrix((vals, (P.rows, P.cols)), shape=(n * n, n * n))
        lu = spla.splu(A, permc_spec="MMD_AT_PLUS_A")
        u = lu.solve(f)
        return u, lu.solve(u, trans="T")

    return run, (vals,)


def batch_case(B: int, n: int, solver: str, **kw):
    """bench/batch.py's case 1: `(value_and_grad of sum(vmap(loss)), (K, R))`."""
    import sciad as sd
    import sciad.numpy as snp

    import batch

    P = batch.load_example().Problem(n)
    loss = batch.sciad_loss(P, solver=solver, **kw)
    K, R = batch.make_batch(n, B)
    fn = sd.function(sd.value_and_grad(lambda K, R: snp.sum(sd.vmap(loss)(K, R))))
    return fn, (K, R)


def laplacian_3d(m: int):
    import numpy as np
    import scipy.sparse as sp

    one = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (m, m))
    eye = sp.eye(m)
    L = (sp.kron(sp.kron(one, eye), eye) + sp.kron(sp.kron(eye, one), eye)
         + sp.kron(sp.kron(eye, eye), one) + sp.eye(m ** 3))
    L = sp.csr_array(L)
    L.sum_duplicates()
    L.sort_indices()
    return L, np.random.default_rng(1).standard_normal(m ** 3)


def case_3d(m: int, solver: str, **kw):
    import sciad as sd
    import sciad.numpy as snp

    L, b = laplacian_3d(m)

    def loss(d):
        A = sd.sparse.csr_matrix((d, L.indices, L.indptr), shape=L.shape, tags=("spd",))
        return snp.sum(sd.linalg.solve(A, b, solver=solver, **kw) ** 2)

    return sd.function(sd.value_and_grad(loss)), (L.data,)


GPU_FLAGSHIP = {
    "cudss": ("cudss", dict(assume="spd"), False),
    "cudss LU": ("cudss", {}, False),
    "splu (host)": ("splu", {}, False),
    "spsolve (jax)": ("spsolve", {}, False),
    "cg+jacobi": ("cg", dict(tol=1e-10, preconditioner="jacobi"), True),
    "cg+amg": ("cg", dict(tol=1e-10, preconditioner="amg"), True),
}
CPU_FLAGSHIP = {
    "cpu auto": ("auto", dict(assume="spd"), False),
    "cpu klu": ("klu", dict(assume="spd"), False),
}


PEERS = {"cudss": ("cudss", {}, False), "splu (host)": ("splu", {}, False),
         "cg+jacobi": ("cg", dict(tol=1e-10, preconditioner="jacobi"), True)}


def _peers(make) -> dict:
    """`{name: (fn, is_cg)}` for cases 2 and 3: `make(solver, **kw)` gives
    `(fn, args)`; each variant is called with one dummy argument."""
    out = {}
    for name, (s, kw, cg) in PEERS.items():
        fn, args = make(s, **kw)
        out[name] = ((lambda f, a: (lambda _: f(*a)))(fn, args), cg)
    return out


def cpu_child(sizes: list[int], repeats: int, budget_s: float) -> dict:
    """Case 1's CPU rows, in this process (run with JAX_PLATFORMS=cpu)."""
    _x64()
    out = {}
    for n in sizes:
        variants = {name: _flagship_fn(n, s, kw, cg) for name, (s, kw, cg) in
                    CPU_FLAGSHIP.items() if not (s == "klu" and n > 256)}
        rows = _run(variants, (None,), repeats, budget_s)
        fn, args = scipy_flagship(n)
        first, med, _ = _time(fn, args, repeats, budget_s)
        rows.append(dict(variant="cpu scipy splu (solves only)", first_s=first, ms=1e3 * med,
                         err=float("nan"), ok=True))
        out[str(n)] = rows
    return out


def _flagship_fn(n, solver, kw, cg):
    fn, args = flagship(n, solver, **kw)
    return (lambda _: fn(*args)), cg


def run_cpu_child(sizes, repeats, budget_s, dry) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.abspath(__file__), "--cpu-child", ",".join(map(str, sizes)),
           "--repeats", str(repeats), "--budget", str(budget_s)] + (["--dry"] if dry else [])
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if run.returncode != 0:
        return {"error": run.stderr[-2000:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# the report


def _table(rows: list[dict], base: str | None = None) -> list[str]:
    base_ms = next((r["ms"] for r in rows if r.get("variant") == base and "ms" in r), None)
    lines = ["| variant | ms per call | first call s | rel. error | ok | " +
             (f"time / {base}'s" if base else "") + " |",
             "|---|---:|---:|---:|---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | **NO** | |")
            continue
        ratio = f"{r['ms'] / base_ms:.2f}x" if base_ms else ""
        lines.append(f"| {r['variant']} | {r['ms']:.2f} | {r['first_s']:.2f} | "
                     f"{r['err']:.1e} | {_harness.yes_no(r['ok'])} | {ratio} |")
    return lines


def _without_batch(fn):
    """`fn` with cuDSS's uniform-batch mode off for its factorizations."""
    import jax

    from sciad.solvers.direct import _cudss_ffi

    def run(*a):
        _cudss_ffi.KERNELS.set_batch(False)
        try:
            return jax.block_until_ready(fn(*a))
        finally:
            _cudss_ffi.KERNELS.set_batch(True)

    return run


def _partial(what: str, rows) -> None:
    """A finished case's rows on stderr, as JSON (kept where a later case runs
    past a time limit and the report is never written)."""
    print(f"{what}: done: {json.dumps(rows, default=str)}", file=sys.stderr, flush=True)


def _ms(rows, name):
    return next((r["ms"] for r in rows if r.get("variant") == name and "ms" in r), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="tiny sizes on the CPU, the stand-in")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=10.0, help="seconds of repeats a variant")
    ap.add_argument("--cpu-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cpu_child is not None:
        sizes = [int(s) for s in args.cpu_child.split(",")]
        print(json.dumps(cpu_child(sizes, args.repeats, args.budget)))
        return 0
    _x64()
    import contextlib

    import jax

    from sciad.solvers.direct import _cudss, _cudss_ffi

    load = _harness.load_average()
    if args.dry:
        sizes, B, bn, m3 = [16], 4, 8, 5
        standin = _cudss.StandIn()
        kernels = _cudss.use_kernels(standin)
        args.repeats, args.budget = 2, 1.0
    else:
        if not _cudss_ffi.gpu_backend():
            print("bench/gpu_sparse.py needs an NVIDIA GPU as JAX's default backend "
                  "(--dry checks the plumbing on the CPU)", file=sys.stderr)
            return 2
        sizes, B, bn, m3 = ([256], 16, 32, 24) if args.quick else ([256, 512], 256, 32, 40)
        kernels = contextlib.nullcontext()
    device = "dry" if args.dry else jax.devices()[0].device_kind.replace(" ", "_")
    out: dict = {"flagship": {}, "cpu": {}}
    with kernels:
        for n in sizes:
            variants = {name: _flagship_fn(n, s, kw, cg) for name, (s, kw, cg) in
                        GPU_FLAGSHIP.items() if not (s == "spsolve" and n > 256)}
            out["flagship"][n] = _run(variants, (None,), args.repeats, args.budget)
            _partial(f"flagship {n}", out["flagship"][n])
        out["cpu"] = run_cpu_child(sizes, args.repeats, args.budget, args.dry)
        _partial("cpu child", out["cpu"])
        peers = _peers(lambda s, **kw: batch_case(B, bn, s, **kw))
        if not args.dry:  # (the same call with one cuDSS data object per example)
            peers = {"cudss": peers["cudss"],
                     "cudss, no uniform batch": (_without_batch(peers["cudss"][0]), False),
                     **{k: v for k, v in peers.items() if k != "cudss"}}
        out["batch"] = _run(peers, (None,), args.repeats, args.budget)
        _partial("batch", out["batch"])
        out["3d"] = _run(_peers(lambda s, **kw: case_3d(m3, s, **kw)), (None,), args.repeats,
                         args.budget)
        _partial("3d", out["3d"])
        out["live_factors_after"] = (standin.live() if args.dry
                                     else _cudss_ffi.KERNELS.live_factors())
        if not args.dry:
            out["batch_mode"] = _cudss_ffi.KERNELS.batch_status()
            out["batch_fallbacks"] = _cudss_ffi.KERNELS.batch_fallbacks()

    lines = _harness.report_head("Sparse direct solves on the GPU: cudss and its peers",
                                 _harness.command_line("bench/gpu_sparse.py", argv),
                                 _harness.machine_info(load))
    lines += ["", "Medians of up to {} calls (ms per call, value and gradient).".format(
        args.repeats) + (" DRY RUN: the CPU, tiny sizes, cudss through the host stand-in "
                         "(KLU): plumbing only, no figures." if args.dry else "")]
    targets = []
    for n, rows in out["flagship"].items():
        cpu_rows = out["cpu"].get(str(n), []) if isinstance(out["cpu"], dict) else []
        lines += ["", f"## 1. Flagship gradient, {n}^2 = {n * n} unknowns", ""]
        lines += _table(rows + cpu_rows, base="cudss")
        if n == max(sizes):
            c = _ms(rows, "cudss")
            cpu = [r["ms"] for r in cpu_rows if "ms" in r and "solves only" not in r["variant"]]
            cg = [x for x in (_ms(rows, "cg+jacobi"), _ms(rows, "cg+amg")) if x]
            if c and cpu:
                targets.append((f"{n}^2 gradient >= 5x faster than the best CPU path",
                                min(cpu) / c, 5.0))
            if c and cg:
                targets.append((f"{n}^2 gradient >= 2x faster than device CG", min(cg) / c, 2.0))
    if "error" in out["cpu"]:
        lines += ["", f"CPU child failed: {out['cpu']['error']}"]
    lines += ["", f"## 2. Batch: B = {B} examples of bench/batch.py's {bn}^2 problem", ""]
    lines += _table(out["batch"], base="cudss")
    c, s = _ms(out["batch"], "cudss"), _ms(out["batch"], "splu (host)")
    if c and s:
        targets.append((f"B = {B} batch >= 10x faster than host SuperLU", s / c, 10.0))
    lines += ["", f"## 3. 3-D: 7-point Laplacian + I on {m3}^3 = {m3 ** 3} unknowns", ""]
    lines += _table(out["3d"], base="cudss")
    lines += ["", "## Targets", "", "| target | measured speed-up | met |", "|---|---:|---|"]
    for what, got, want in targets:
        lines.append(f"| {what} | {got:.2f}x | {_harness.yes_no(got >= want)} |")
    lines += ["", f"cuDSS factors live after the run: {out['live_factors_after']}."]
    if "batch_mode" in out:
        on, why = out["batch_mode"]
        lines += [f"cuDSS uniform-batch mode at the end: {why}; batch solves run one example "
                  f"at a time: {out['batch_fallbacks']}."]
    text = "\n".join(lines) + "\n"
    path = (os.path.join(os.environ.get("TMPDIR", "/tmp"), "gpu_sparse_dry.md") if args.dry
            else os.path.join(HERE, "results", f"gpu_sparse_{device}.md"))
    _harness.publish(path, text, write=not args.no_write)
    bad = [r for rows in [*out["flagship"].values(), out["batch"], out["3d"]] for r in rows
           if not r.get("ok")]
    return 1 if bad or out["live_factors_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
