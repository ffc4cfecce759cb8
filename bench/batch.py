"""Batches of sparse solves: `sd.vmap` against a Python loop, klujax and lineax.

Run from the repository root:

    .venv/bin/python bench/batch.py              # full run (about 7 minutes on 2 cores)
    .venv/bin/python bench/batch.py --quick      # smoke check (B = 1, 16), about a minute
    .venv/bin/python bench/batch.py --batches 1,16 --cases 1,2 --no-write
    .venv/bin/python bench/batch.py --cases 3 --shard-batch 64 --no-write
    taskset -c 0-3 .venv/bin/python bench/batch.py --cases 3 --no-write   # on 4 cores

The problem is examples/inverse_poisson.py's matrix: the 5-point
variable-coefficient Poisson matrix on an n x n grid (N = n^2 unknowns, n = 32
by default: N = 1024, 4992 stored entries on one fixed COO pattern), whose
stored values come from a nodal log-conductivity `k` (N parameters per
example). One example's loss is the sum of squared solutions,

    loss(k, b) = sum(u^2),    A(k) u = b,

float64, x64 on globally. The batch: B log-conductivities `K` (B, N) (random,
`0.3 * standard_normal`) and B right-hand sides (B, N) (standard normal).

1. B independent solves, each with its own matrix (one pattern), B = 1, 16,
   256: the value `vmap(loss)(K, RHS)` (B,) and the gradient of its sum with
   respect to `K` (B, N). Variants:
   - `sciad vmap`: `sd.function(sd.vmap(loss))` and
     `sd.function(sd.grad(lambda K, R: snp.sum(sd.vmap(loss)(K, R))))`
     (`solver="auto"`: KLU through XLA's FFI on the CPU at these sizes);
   - `sciad vmap (1 thread)`: the same, traced with `SCIAD_HOST_THREADS=1`
     (KLU's batched kernel call on one thread, as klujax's; `sciad vmap`
     splits it over the usable cores);
   - `sciad vmap (splu)`: the same with `solver="splu"` (SuperLU on the host);
   - `sciad loop`: a Python loop of B calls of `sd.function(loss)` /
     `sd.function(sd.grad(loss))`, one example each (the inputs already split
     into per-example device arrays; the loop dispatches all B calls, then
     waits for them);
   - `klujax`: `jax.jit(jax.vmap(loss_klu))` and `jax.jit(jax.grad(...))`
     with `klujax.solve(rows, cols, vals, b)` (CPU only: skipped on a GPU);
   - `lineax CG`: `jax.vmap` of `lineax.linear_solve` with a matrix-free
     `segment_sum` operator, `lineax.CG(rtol=1e-10)` with a Jacobi
     preconditioner (held constant: lineax cannot differentiate its
     `options`) and `atol = 1e-10 ||b|| / sqrt(N)` (see
     bench/inverse_poisson.py: lineax's elementwise test), `jax.grad`;
   - `sciad CG`: sciad's `solver="cg", tol=1e-10, preconditioner="jacobi"`,
     vmapped like `sciad vmap` (information: the iterative peer of lineax).
   Targets: `sciad vmap` <= 1.0x `sciad loop` and <= 1.0x `klujax`. Before timing, every variant's
   values and gradients are compared with `sciad vmap`'s (relative 2-norm
   error; direct solvers must agree to 1e-8, CG to 1e-6).
2. B right-hand sides against ONE matrix, B = 16, 256 (the matrix values
   `vals` (nnz,) and the right-hand sides (B, N) are the inputs):
   `sd.vmap(lambda b: sd.linalg.solve(A, b, solver="splu"))(RHS)` with `A`
   assembled from `vals` outside the `vmap` and shared, against SciPy:
   COO -> CSC, `splu(A, permc_spec="MMD_AT_PLUS_A")` (sciad's ordering) and
   one `lu.solve` of the (N, B) block (given Fortran-ordered). Shown too:
   sciad solving the (N, B) block directly (no `vmap`), and SciPy's pieces
   (the factorization alone, the block solve alone, B one-vector solves in a
   Python loop). Target: sciad's vmap <= SciPy's 1 factorization + B
   triangular solves.
3. Sharding: case 1's batch (B = 16 and 64; `--quick`: 16) sharded over 4
   simulated host devices (`XLA_FLAGS=--xla_force_host_platform_device_count=4`,
   set in a child process before jax is imported) with
   `sd.function(sd.vmap(loss, spmd_axis_name="batch"), in_shardings=(sh, sh),
   out_shardings=sh)`, `sh = NamedSharding(jax.make_mesh((4,), ("batch",)),
   P("batch"))`, the inputs `jax.device_put(., sh)`; the value and the
   gradient. In that process, paired (interleaved) with the same program
   sharded over a 1-device mesh (`devices[:1]`) and with the unsharded
   program; and, separately, a child with one host device (no flag) running
   the 1-device mesh, the unsharded program and (a diagnostic) the unsharded
   program with sciad's pool of SuperLU host threads cut to one around each
   call, which shows what parallel factorization gains. The speedup is the 1-device
   time over the 4-device time; the sharded results must equal the unsharded
   ones (max abs difference <= 1e-12 relative). The issue's target, >= 2.5x
   on 4 cores, cannot be reached on a 2-core machine: the table shows what
   the machine's cores give (`taskset -c 0-3` on a larger machine measures 4
   cores). The SuperLU factorizations one call makes are counted (B where each
   example is factored once) in all three cases. The children run on the CPU platform
   (`JAX_PLATFORMS=cpu`) also on a GPU machine. The part needs
   `sd.vmap(..., spmd_axis_name=)` and `sd.function(..., in_shardings=)`;
   without them its rows say so.

OpenBLAS runs single-threaded (`OPENBLAS_NUM_THREADS=1` unless set in the
environment): its default threads made SciPy's (N, B) block solve 30-70x
slower on the loaded 2-core machine. It is the same setting for SciPy and
for sciad's host calls, which use SciPy's SuperLU.

Measurement (cases 1 and 2, one process): every variant is called twice
(compile, warm up); then the variants of one (case, B, quantity) are timed in
interleaved batches (each batch as many calls as fill about `--batch-s`
seconds, at least one; the order flips every repeat; gc off), and the median
per-call time and the quartiles of the per-repeat ratios are reported. The
first call (trace, compile, run) is shown for information. Wall-clock times
on a shared 2-core machine are noisy: compare the paired ratios.

The Markdown table goes to stdout and, for full runs (unless `--no-write`),
to bench/results/batch.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time

# SuperLU's multiple-right-hand-side solves call OpenBLAS, whose threads spin
# against every other thread on a loaded 2-core machine (a (1024, 16) block
# solve: 0.4 ms with one thread, 12-30 ms with its default threads under
# load). One BLAS thread for every library here (SciPy and sciad's host
# calls alike; XLA and klujax do not use it), unless the caller set it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import load_example as _harness_load_example  # noqa: E402
from _harness import (  # noqa: E402
    command_line, load_average, machine_info, publish, report_head, summary, yes_no,
)

RESULTS = os.path.join(HERE, "results", "batch.md")
EXAMPLE = os.path.join(ROOT, "examples", "inverse_poisson.py")

GRID = 32
BATCHES, QUICK_BATCHES = (1, 16, 256), (1, 16)
RHS_BATCHES, QUICK_RHS_BATCHES = (16, 256), (16,)
SHARD_BATCHES, QUICK_SHARD_BATCHES = (16, 64), (16,)
DEVICES = 4
CG_TOL = 1e-10
DIRECT_RTOL, CG_RTOL = 1e-8, 1e-6
SHARD_RTOL = 1e-12
# targets from the issue
LOOP_TARGET = 1.0        # sciad vmap / sciad loop
KLUJAX_TARGET = 1.0      # sciad vmap / klujax vmap
RHS_TARGET = 1.0         # sciad vmap / (SciPy: 1 factorization + B triangular solves)
SHARD_TARGET = 2.5       # speedup of 4 devices over 1 (on 4 cores)
CHILD_TIMEOUT = 900

# key: (label, direct?)
VARIANTS = {
    "vmap": ("sciad vmap", True),
    "vmap-1t": ("sciad vmap (1 thread)", True),
    "vmap-splu": ("sciad vmap (splu)", True),
    "loop": ("sciad loop", True),
    "klujax": ("klujax vmap", True),
    "lineax": ("lineax CG vmap", False),
    "sciad-cg": ("sciad CG vmap", False),
}


# ---------------------------------------------------------------------------
# the problem

def load_example():
    """examples/inverse_poisson.py as a module (see `_harness.load_example`)."""
    return _harness_load_example(EXAMPLE)


def make_batch(n: int, size: int, seed: int = 0):
    """`size` log-conductivities (size, n^2) and right-hand sides (size, n^2);
    the first rows are the same for every `size`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    N = n * n
    K = 0.3 * rng.standard_normal((size, N))
    R = rng.standard_normal((size, N))
    return K, R


def sciad_loss(P, **solver_kw):
    """One example's `loss(k, b) = sum(u^2)`, `A(k) u = b`, in sciad."""
    import sciad as sd
    import sciad.numpy as snp

    ex = load_example()

    def loss(k, b):
        u = sd.linalg.solve(ex.stiffness(P, k), b, **solver_kw)
        return snp.sum(u * u)
    return loss


def jax_loss(P, method: str):
    """The same loss with a JAX peer's solve (`klujax` or `lineax`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    ex = load_example()
    N = P.n * P.n
    rows = jnp.asarray(P.rows, jnp.int32)
    cols = jnp.asarray(P.cols, jnp.int32)

    if method == "klujax":
        import klujax

        def solve(vals, b):
            return klujax.solve(rows, cols, vals, b)
    elif method == "lineax":
        import lineax as lx

        def solve(vals, b):
            def matvec(x):
                return jax.ops.segment_sum(vals * x[cols], rows, num_segments=N)
            diag = jax.ops.segment_sum(jnp.where(rows == cols, vals, 0.0), rows,
                                       num_segments=N)
            op = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct(b.shape, b.dtype),
                                           tags=(lx.symmetric_tag,
                                                 lx.positive_semidefinite_tag))
            pre = lx.TaggedLinearOperator(
                lx.DiagonalLinearOperator(jax.lax.stop_gradient(1.0 / diag)),
                lx.positive_semidefinite_tag)
            atol = CG_TOL * jnp.linalg.norm(b) / np.sqrt(N)
            return lx.linear_solve(op, b, lx.CG(rtol=CG_TOL, atol=atol),
                                   options={"preconditioner": pre}).value
    else:
        raise ValueError(method)

    def loss(k, b):
        u = solve(ex.entries(P, k, xp=jnp), b)
        return jnp.sum(u * u)
    return loss


# ---------------------------------------------------------------------------
# measurement

def _block(x):
    import jax

    return jax.block_until_ready(x)


@contextlib.contextmanager
def host_threads(n):
    """`SCIAD_HOST_THREADS=n` while the block runs (None: as it is): how many
    threads a batch's KLU kernel call is split over, read when a program is
    traced."""
    old = os.environ.get("SCIAD_HOST_THREADS")
    if n is not None:
        os.environ["SCIAD_HOST_THREADS"] = str(n)
    try:
        yield
    finally:
        if n is not None:
            if old is None:
                del os.environ["SCIAD_HOST_THREADS"]
            else:
                os.environ["SCIAD_HOST_THREADS"] = old


def first_call(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = _block(fn())
    return time.perf_counter() - t0, out


def measure(fns: dict, repeats: int, batch_s: float) -> dict:
    """Interleaved batches of calls `fn()` (each variant's batch about `batch_s`
    seconds, at least one call; the order flips every repeat; gc off):
    `{name: [seconds per call, one per repeat]}`. All are compiled already."""
    per = {}
    for k, fn in fns.items():
        _block(fn())
        t0 = time.perf_counter()
        _block(fn())
        per[k] = max(1, min(200, int(batch_s / max(time.perf_counter() - t0, 1e-9))))
    order = list(fns)
    times = {k: [] for k in order}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for k in (order if r % 2 == 0 else order[::-1]):
                fn, n = fns[k], per[k]
                t0 = time.perf_counter()
                for _ in range(n):
                    _block(fn())
                times[k].append((time.perf_counter() - t0) / n)
    finally:
        gc.enable()
    return times


def rel_err(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _stats(times: dict, base: str | None = None) -> dict:
    """Medians (ms) and, against `base`, the ratio of medians and the quartiles of
    the per-repeat ratios."""
    out = {}
    for k, ts in times.items():
        r = {"ms": statistics.median(ts) * 1e3}
        if base is not None and k != base and base in times:
            s = summary(times, k, base, 0)
            r.update(ratio=s["ratio"], q1=s["pair_q1"], q3=s["pair_q3"])
        out[k] = r
    return out


class FactorCounter:
    """Counts SciPy SuperLU factorizations made by sciad's host calls, by
    wrapping the function they run (`_factor_one` in
    sciad/solvers/direct/_sparse_direct.py, looked up by name at each call) from this
    script; nothing in sciad/ is changed. `count(fn)` is the number one call
    `fn()` makes, or None where sciad has no such function."""

    def __init__(self):
        import threading

        self.n, self.lock, self.ok = 0, threading.Lock(), False
        try:
            from sciad.solvers.direct import _sparse_direct as mod
            orig = mod._factor_one
        except (ImportError, AttributeError):
            return

        def counted(*args, **kwargs):
            with self.lock:
                self.n += 1
            return orig(*args, **kwargs)
        mod._factor_one = counted
        self.ok = True

    def count(self, fn) -> int | None:
        n0 = self.n
        _block(fn())
        return self.n - n0 if self.ok else None


def _usable_cpus() -> int:
    from sciad.solvers._threads import usable_cores

    return usable_cores()


def _superlu_threads() -> int:
    """The threads sciad's host calls factor on (a private pool)."""
    from sciad.solvers.direct import _sparse_direct

    return len(_sparse_direct._workers)


SERIAL = "unsharded, 1 SuperLU thread"


def _one_superlu_thread():
    """`run(fn)`: calls `fn()` (and waits for it) with sciad's SuperLU host
    threads cut to the first one, then restores them. A diagnostic from the
    script (nothing in sciad/ changes): every factor made meanwhile is made,
    and released, on that thread."""
    from sciad.solvers.direct import _sparse_direct as mod

    pool = mod._workers

    def run(fn):
        mod._workers = pool[:1]
        try:
            return _block(fn())
        finally:
            mod._workers = pool
    return run


def _max_counted() -> int:
    from sciad.solvers.direct._sparse_direct import MAX_COUNTED

    return MAX_COUNTED


def _count_cell(c) -> str:
    return "n/a" if c is None else str(c)


# ---------------------------------------------------------------------------
# case 1: B solves with B matrices

def case_batch(n: int, size: int, variants: list[str], repeats: int, batch_s: float,
               log, counter: FactorCounter) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    P = load_example().Problem(n)
    K_np, R_np = make_batch(n, size)
    K, R = jax.device_put(K_np), jax.device_put(R_np)
    Ks, Rs = list(K), list(R)  # per-example device arrays, for the loop

    def batched_pair(loss, vmap, grad, fun, sum_):
        return (fun(vmap(loss)),
                fun(grad(lambda K, R: sum_(vmap(loss)(K, R)))))

    fns = {}
    for v in variants:
        if v in ("vmap", "vmap-1t"):
            fv, fg = batched_pair(sciad_loss(P), sd.vmap, sd.grad, sd.function, snp.sum)
        elif v == "vmap-splu":
            fv, fg = batched_pair(sciad_loss(P, solver="splu"), sd.vmap, sd.grad, sd.function,
                                  snp.sum)
        elif v == "sciad-cg":
            loss = sciad_loss(P, solver="cg", tol=CG_TOL, preconditioner="jacobi")
            fv, fg = batched_pair(loss, sd.vmap, sd.grad, sd.function, snp.sum)
        elif v == "loop":
            loss = sciad_loss(P)
            f1, g1 = sd.function(loss), sd.function(sd.grad(loss))
            fns[v] = (lambda: [f1(k, b) for k, b in zip(Ks, Rs)],
                      lambda: [g1(k, b) for k, b in zip(Ks, Rs)])
            continue
        else:
            fv, fg = batched_pair(jax_loss(P, v), jax.vmap, jax.grad, jax.jit, jnp.sum)
        fns[v] = ((lambda fv=fv: fv(K, R)), (lambda fg=fg: fg(K, R)))

    res = {"B": size, "first": {}, "err": {}, "errors": {}, "factorizations": {}}
    outs = {}
    for v, (fv, fg) in fns.items():
        try:
            with host_threads(1 if v == "vmap-1t" else None):  # (read when traced)
                tv, ov = first_call(fv)
                tg, og = first_call(fg)
        except Exception as e:  # noqa: BLE001  (a failing variant is a row, not a crash)
            res["errors"][v] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"    {v}: {res['errors'][v]}")
            continue
        if v == "loop":
            ov, og = np.stack([np.asarray(x) for x in ov]), np.stack([np.asarray(x) for x in og])
        outs[v] = (np.asarray(ov), np.asarray(og))
        res["first"][v] = (tv, tg)
        if v in ("vmap", "loop"):
            res["factorizations"][v] = (counter.count(fv), counter.count(fg))
    fns = {v: f for v, f in fns.items() if v in outs}
    ref = "vmap" if "vmap" in outs else next(iter(outs), None)
    for v, (ov, og) in outs.items():
        ev, eg = rel_err(ov, outs[ref][0]), rel_err(og, outs[ref][1])
        tol = DIRECT_RTOL if VARIANTS[v][1] and VARIANTS[ref][1] else CG_RTOL
        res["err"][v] = (ev, eg, max(ev, eg) <= tol)
    res["value"] = _stats(measure({v: f[0] for v, f in fns.items()}, repeats, batch_s), ref)
    res["grad"] = _stats(measure({v: f[1] for v, f in fns.items()}, repeats, batch_s), ref)
    return res


# ---------------------------------------------------------------------------
# case 2: B right-hand sides, one matrix

def case_rhs(n: int, size: int, repeats: int, batch_s: float, counter: FactorCounter) -> dict:
    import jax
    import numpy as np
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    import sciad as sd

    ex = load_example()
    P = ex.Problem(n)
    N = n * n
    K_np, R_np = make_batch(n, size)
    vals_np = np.asarray(sd.function(lambda k: ex.entries(P, k))(K_np[0]))
    rows, cols = P.rows, P.cols
    RT = np.asfortranarray(R_np.T)  # the (N, B) block SciPy solves

    def matrix(vals):
        return sd.sparse.coo_matrix((vals, (rows, cols)), shape=(N, N), tags={"spd"})

    def sd_vmap(vals, Rb):
        A = matrix(vals)
        return sd.vmap(lambda b: sd.linalg.solve(A, b, solver="splu"))(Rb)

    def sd_block(vals, Rb):
        return sd.linalg.solve(matrix(vals), Rb.T, solver="splu")

    f_vmap, f_block = sd.function(sd_vmap), sd.function(sd_block)
    vals, Rd = jax.device_put(vals_np), jax.device_put(R_np)

    def csc():
        return sp.coo_matrix((vals_np, (rows, cols)), shape=(N, N)).tocsc()

    def factor():
        return spl.splu(csc(), permc_spec="MMD_AT_PLUS_A")

    def scipy_all():
        return factor().solve(RT)

    lu = factor()
    fns = {
        "vmap": lambda: f_vmap(vals, Rd),
        "block": lambda: f_block(vals, Rd),
        "scipy": scipy_all,
        "scipy-factor": factor,
        "scipy-solve": lambda: lu.solve(RT),
        "scipy-loop": lambda: [lu.solve(R_np[i]) for i in range(size)],
    }
    res = {"B": size, "first": {}}
    outs = {}
    for k in ("vmap", "block", "scipy"):
        res["first"][k], outs[k] = first_call(fns[k])
    ref = np.asarray(outs["scipy"])
    res["factorizations"] = {k: counter.count(fns[k]) for k in ("vmap", "block")}
    res["err"] = {"vmap": rel_err(np.asarray(outs["vmap"]).T, ref),
                  "block": rel_err(outs["block"], ref)}
    # graph of the vmapped program, for the node list
    g = f_vmap.trace(vals_np, R_np) if hasattr(f_vmap, "trace") else None
    res["nodes"] = ([nd.primitive.name for nd in g.nodes] if g is not None else [])
    res["times"] = _stats(measure(fns, repeats, batch_s), "scipy")
    return res


# ---------------------------------------------------------------------------
# case 3: sharding over simulated host devices (a child process per device count)

def shard_child(devices: int, n: int, size: int, repeats: int, batch_s: float) -> dict:
    """Runs in a process whose XLA_FLAGS set the host device count: times the
    sharded program over `devices` devices (and, with more than one, over a
    1-device mesh) and the unsharded one, and compares their results."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as Pspec

    import sciad as sd
    import sciad.numpy as snp

    out = {"devices": devices, "B": size, "jax_devices": len(jax.devices()),
           "platform": jax.default_backend(), "usable_cpus": _usable_cpus(),
           "superlu_threads": _superlu_threads()}
    if len(jax.devices()) < devices:
        out["error"] = f"only {len(jax.devices())} devices (wanted {devices})"
        return out
    P = load_example().Problem(n)
    loss = sciad_loss(P)
    K_np, R_np = make_batch(n, size)

    compiled = {}

    def programs(name, mesh):
        sh = NamedSharding(mesh, Pspec("batch"))
        fv = sd.function(sd.vmap(loss, spmd_axis_name="batch"), in_shardings=(sh, sh),
                         out_shardings=sh)
        fg = sd.function(
            sd.grad(lambda K, R: snp.sum(sd.vmap(loss, spmd_axis_name="batch")(K, R))),
            in_shardings=(sh, sh), out_shardings=sh)
        K, R = jax.device_put(K_np, sh), jax.device_put(R_np, sh)
        compiled[name] = (fv, fg, K, R)
        return (lambda: fv(K, R)), (lambda: fg(K, R))

    meshes = {f"sharded-{devices}": jax.make_mesh((devices,), ("batch",),
                                                   devices=jax.devices()[:devices])}
    if devices > 1:
        meshes["sharded-1"] = jax.make_mesh((1,), ("batch",), devices=jax.devices()[:1])
    fns = {}
    errors = {}
    for name, mesh in meshes.items():
        try:
            fns[name] = programs(name, mesh)
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    fv, fg = sd.function(sd.vmap(loss)), sd.function(
        sd.grad(lambda K, R: snp.sum(sd.vmap(loss)(K, R))))
    K0, R0 = jax.device_put(K_np), jax.device_put(R_np)
    fns["unsharded"] = (lambda: fv(K0, R0), lambda: fg(K0, R0))
    compiled["unsharded"] = (fv, fg, K0, R0)
    serial = _one_superlu_thread() if devices == 1 else None
    if serial is not None:  # a diagnostic: the same program, its factorizations serial
        fns[SERIAL] = (lambda: serial(lambda: fv(K0, R0)), lambda: serial(lambda: fg(K0, R0)))
        compiled[SERIAL] = compiled["unsharded"]

    counter = FactorCounter()
    first, results, shards, factorizations = {}, {}, {}, {}
    for name, (f_v, f_g) in list(fns.items()):
        try:
            tv, ov = first_call(f_v)
            tg, og = first_call(f_g)
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            del fns[name]
            continue
        first[name] = (tv, tg)
        factorizations[name] = (counter.count(f_v), counter.count(f_g))
        results[name] = (np.asarray(ov), np.asarray(og))
        shards[name] = [[list(s.data.shape) for s in o.addressable_shards] for o in (ov, og)]
        shards[name].append(sorted({str(s.device) for s in ov.addressable_shards}))
    # (after the first calls, whose times include compiling)
    host_batches = {k: [_host_call_batches(f, *c[2:]) for f in c[:2]]
                    for k, c in compiled.items() if k in fns}
    out.update(first=first, errors=errors, shards=shards, host_batches=host_batches,
               factorizations=factorizations)
    if "unsharded" in results:
        u = results["unsharded"]
        out["diff"] = {k: (rel_err(r[0], u[0]), rel_err(r[1], u[1]))
                       for k, r in results.items() if k != "unsharded"}
    base = "sharded-1" if "sharded-1" in fns else None
    out["value"] = _stats(measure({k: f[0] for k, f in fns.items()}, repeats, batch_s), base)
    out["grad"] = _stats(measure({k: f[1] for k, f in fns.items()}, repeats, batch_s), base)
    return out


def _host_call_batches(fn, *args) -> list[int] | str:
    """The leading (batch) dimensions of the host callbacks' operands in the
    compiled (per-device, after SPMD partitioning) program: with the batch
    sharded over D devices each device's SuperLU calls get B / D examples."""
    import re

    try:
        text = fn.lower(*args).compile().as_text()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}"
    dims = set()
    for line in text.splitlines():
        if "python_cpu_callback" in line:
            m = re.search(r"operand_layout_constraints=\{[a-z0-9]+\[(\d+)", line)
            if m:
                dims.add(int(m.group(1)))
    return sorted(dims)


def run_shard_children(n: int, size: int, repeats: int, batch_s: float, log) -> dict:
    """The 4-device child, then the 1-device child; their JSON results."""
    data = {}
    for devices in (DEVICES, 1):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        if devices > 1:
            flags.append(f"--xla_force_host_platform_device_count={devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        cmd = [sys.executable, os.path.abspath(__file__), "--shard-child", str(devices),
               "--grid", str(n), "--repeats", str(repeats), "--batch-s", str(batch_s),
               "--shard-batch", str(size)]
        log(f"  sharding: {devices} device(s), B = {size} ...")
        try:
            p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            data[devices] = {"error": f"timed out after {CHILD_TIMEOUT} s"}
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            data[devices] = {"error": f"child exited {p.returncode}: {tail[:300]}"}
        else:
            data[devices] = json.loads(lines[-1])
    return data


# ---------------------------------------------------------------------------
# the report

def _ratio_cell(r: dict) -> str:
    if "ratio" not in r:
        return ""
    return f"{r['ratio']:.2f} ({r['q1']:.2f}-{r['q3']:.2f})"


def render(data: dict, machine: dict, argv: str) -> str:
    n = data["n"]
    lines = report_head("Batches of sparse solves: sd.vmap against a loop, klujax, lineax",
                        argv, machine)
    lines += [
        "",
        f"5-point variable-coefficient Poisson matrix on a {n} x {n} grid "
        f"(N = {n * n} unknowns, {data['nnz']} stored entries, one COO pattern), "
        "values from a nodal log-conductivity `k`; loss `sum(u^2)`, `A(k) u = b`; "
        "float64. Platform: "
        f"{data['platform']}. Medians of {data['repeats']} interleaved repeats, ms per "
        "call of the whole batch; ratios are of the medians, with the quartiles of the "
        "per-repeat ratios in parentheses.",
    ]
    # case 1
    c1 = data.get("case1", [])
    if c1:
        present = [v for v in VARIANTS if any(v in r["value"] for r in c1)]
        peers = [v for v in present if v not in ("vmap", "loop")]
        lines += [
            "", "## 1. B solves, B matrices on one pattern: value and gradient", "",
            "The value is `vmap(loss)(K, RHS)` (B,), the gradient that of its sum with "
            "respect to `K` (B, N). `sciad loop`: B calls of the per-example "
            "`sd.function` (all dispatched, then waited for). Ratios: sciad vmap over "
            "each other variant (< 1: sciad vmap "
            f"is faster). Target: sciad vmap <= {LOOP_TARGET:.1f}x the loop.", "",
            _row(["B", "quantity"] + [f"{VARIANTS[v][0]} ms" for v in present]
                 + [f"sciad/{'loop' if v == 'loop' else VARIANTS[v][0]}"
                    for v in ["loop"] + peers] + ["vmap ms/example", "target met"]),
            _row(["---:", "---"] + ["---:"] * (len(present) + 1 + len(peers))
                 + ["---:", "---"]),
        ]
        for r in c1:
            for q in ("value", "grad"):
                st = r[q]
                cells = [f"{st[v]['ms']:.2f}" if v in st else
                         ("error" if v in r["errors"] else "—") for v in present]
                ratios = [summary_from(st, v) if v in st and "vmap" in st else "—"
                          for v in ["loop"] + peers]
                met = ("vmap" in st and "loop" in st
                       and st["vmap"]["ms"] <= LOOP_TARGET * st["loop"]["ms"])
                per_ex = f"{st['vmap']['ms'] / r['B']:.3f}" if "vmap" in st else "—"
                lines.append(_row([r["B"], "value" if q == "value" else "gradient"]
                                  + cells + ratios + [per_ex, yes_no(met)]))
        lines.append("")  # (a list right under a table is read as its rows)
        for r in c1:
            for q in ("value", "grad"):
                st = r[q]
                if "vmap" in st and "klujax" in st:
                    ratio = st["vmap"]["ms"] / st["klujax"]["ms"]
                    one = (f"; on one thread (`vmap-1t`): "
                           f"{st['vmap-1t']['ms'] / st['klujax']['ms']:.2f}"
                           if "vmap-1t" in st else "")
                    lines.append(f"- B={r['B']} {'value' if q == 'value' else 'gradient'}: "
                                 f"sciad vmap / klujax = {ratio:.2f} (target <= "
                                 f"{KLUJAX_TARGET:.1f}): target met: "
                                 f"{yes_no(ratio <= KLUJAX_TARGET)}{one}")
        lines += ["", "Agreement with sciad vmap (relative 2-norm error of the values, of "
                  f"the gradients; direct solvers {DIRECT_RTOL:g}, CG {CG_RTOL:g}) and "
                  "first-call seconds (trace, compile, run: value, gradient):", "",
                  "| B | variant | value err | gradient err | ok | first call value s "
                  "| first call gradient s | SuperLU factorizations per call: value, "
                  "gradient |",
                  "|---:|---|---:|---:|---|---:|---:|---|"]
        for r in c1:
            for v in present:
                if v in r["errors"]:
                    lines.append(f"| {r['B']} | {VARIANTS[v][0]} | error: "
                                 f"{r['errors'][v]} | | | | | |")
                elif v in r["err"]:
                    ev, eg, ok = r["err"][v]
                    tv, tg = r["first"][v]
                    fc = r["factorizations"].get(v)
                    fc = f"{_count_cell(fc[0])}, {_count_cell(fc[1])}" if fc else ""
                    lines.append(f"| {r['B']} | {VARIANTS[v][0]} | {ev:.1e} | {eg:.1e} "
                                 f"| {yes_no(ok)} | {tv:.2f} | {tg:.2f} | {fc} |")
        over = [(r["B"], r["factorizations"]["vmap"]) for r in c1
                if None not in r["factorizations"].get("vmap", (None,))
                and max(r["factorizations"]["vmap"]) > r["B"]]
        if over:
            lines += ["", "**The vmapped program factors some examples more than once:** "
                      + "; ".join(f"B = {b}: {v} factorizations per value call and {g} per "
                                  f"gradient call" for b, (v, g) in over)
                      + f" (B each in the loop). sciad's SuperLU factor store keeps at most "
                      f"{_max_counted()} factors whose uses are counted "
                      "(`MAX_COUNTED` in sciad/solvers/direct/_sparse_direct.py); a batched "
                      "factorization of more examples pushes its own oldest factors out, and "
                      "each solve that finds its factor gone factors again."]
    # case 2
    c2 = data.get("case2", [])
    if c2:
        lines += [
            "", "## 2. B right-hand sides, one matrix", "",
            "`sd.vmap(lambda b: sd.linalg.solve(A, b, solver=\"splu\"))(RHS)`, `A` "
            "assembled once from the values (an input) outside the vmap; `sciad block`: "
            "`sd.linalg.solve(A, RHS.T)` on the (N, B) block, no vmap. SciPy: COO -> "
            "CSC, `splu` (MMD_AT_PLUS_A) and one `lu.solve` of the Fortran-ordered (N, B) "
            "block; its pieces are timed apart. Target: sciad vmap <= "
            f"{RHS_TARGET:.1f}x SciPy's 1 factorization + B triangular solves.", "",
            "| B | sciad vmap ms | sciad block ms | SciPy splu + block solve ms "
            "| SciPy splu ms | SciPy block solve ms | SciPy B one-vector solves ms "
            "| vmap/SciPy | block/SciPy | err vmap, block | sciad factorizations "
            "(vmap, block) | target met |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
        ]
        for r in c2:
            t = r["times"]
            met = t["vmap"]["ms"] <= RHS_TARGET * t["scipy"]["ms"]
            lines.append(
                f"| {r['B']} | {t['vmap']['ms']:.2f} | {t['block']['ms']:.2f} "
                f"| {t['scipy']['ms']:.2f} | {t['scipy-factor']['ms']:.2f} "
                f"| {t['scipy-solve']['ms']:.2f} | {t['scipy-loop']['ms']:.2f} "
                f"| {_ratio_cell(t['vmap'])} | {_ratio_cell(t['block'])} "
                f"| {r['err']['vmap']:.1e}, {r['err']['block']:.1e} "
                f"| {_count_cell(r['factorizations']['vmap'])}, "
                f"{_count_cell(r['factorizations']['block'])} | {yes_no(met)} |")
        nodes = c2[0].get("nodes")
        if nodes:
            lines += ["", f"The vmapped graph's nodes: `{', '.join(nodes)}` (the vmap of "
                      "a solve with a shared matrix becomes one solve of the column block)."]
    # case 3
    if data.get("case3"):
        lines += render_shard(data["case3"])
    lines.append("")
    return "\n".join(lines)


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def summary_from(st: dict, v: str) -> str:
    """'sciad vmap / v' from the stats (ratios are stored as v / vmap)."""
    r = st[v]
    if "ratio" not in r:
        return ""
    return f"{1 / r['ratio']:.2f} ({1 / r['q3']:.2f}-{1 / r['q1']:.2f})"


def render_shard(c3s: list) -> list[str]:
    """Case 3's section: the description once, then a table per batch size."""
    lines = [
        "", f"## 3. Sharding over {DEVICES} simulated host devices", "",
        "Case 1's batch, `sd.function(sd.vmap(loss, spmd_axis_name=\"batch\"), "
        "in_shardings=(sh, sh), out_shardings=sh)` (and the gradient likewise), CPU "
        f"platform. In the {DEVICES}-device process (`--xla_force_host_platform_device_"
        f"count={DEVICES}`) the program sharded over {DEVICES} devices, over a 1-device "
        "mesh and unsharded are timed interleaved; the 1-device process (no flag) runs "
        "the 1-device mesh and the unsharded program. Speedup: the 1-device mesh's time "
        f"over the {DEVICES}-device one's (paired: same process; across: the 1-device "
        f"process's). Target on 4 cores: >= {SHARD_TARGET}x. `host-call batch per "
        "device`: the leading dimension "
        "of the SuperLU host calls' operands in the compiled per-device program (from "
        "its HLO), the examples each device's host calls solve. The factorization "
        "count is the number of SuperLU factorizations one call makes (B where each "
        "example is factored once). sciad factors a batch on a pool of host threads, "
        "so one device already uses several cores; the row `unsharded, 1 SuperLU "
        "thread` (1-device process, a diagnostic: the script cuts sciad's pool to its "
        "first thread around each call) shows what the batch costs with no parallel "
        "factorization, and the column `speedup over 1 SuperLU thread` each row's "
        "speedup over it.",
    ]
    info = next((p for c3 in c3s for p in c3.values() if "usable_cpus" in p), None)
    if info:
        lines += ["", f"The children's usable cores: {info['usable_cpus']}; sciad's SuperLU "
                  f"host threads: {info['superlu_threads']} (a batch's factorizations in one "
                  "host call, and those of devices calling at once, share them)."]
    for c3 in c3s:
        lines += _shard_table(c3)
    return lines


def _shard_table(c3: dict) -> list[str]:
    many, one = c3.get(DEVICES, {}), c3.get(1, {})
    B = many.get("B", one.get("B", "?"))
    lines = ["", f"B = {B}:", ""]
    errs = [f"{d} device(s): {c3[d]['error']}" for d in c3 if "error" in c3[d]]
    if errs:
        return lines + [f"Not measured: {'; '.join(errs)}."]
    key = f"sharded-{DEVICES}"
    lines += [
        "| quantity | process | program | ms | speedup paired | speedup across "
        "| speedup over 1 SuperLU thread | rel. diff vs unsharded | first call s "
        "| output shards (devices x shape) | host-call batch per device "
        "| SuperLU factorizations per call |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for q, qi in (("value", 0), ("grad", 1)):
        for d, proc in ((DEVICES, many), (1, one)):
            for name, r in proc.get(q, {}).items():
                paired = across = ""
                if d == DEVICES and name == key:
                    if "sharded-1" in proc[q]:
                        paired = f"{proc[q]['sharded-1']['ms'] / r['ms']:.2f}"
                    if "sharded-1" in one.get(q, {}):
                        across = f"{one[q]['sharded-1']['ms'] / r['ms']:.2f}"
                ser = one.get(q, {}).get(SERIAL)
                vs_serial = f"{ser['ms'] / r['ms']:.2f}" if ser and name != SERIAL else ""
                diff = proc.get("diff", {}).get(name)
                sh = proc.get("shards", {}).get(name)
                sh_cell = f"{len(sh[2])} x {tuple(sh[qi][0])}" if sh else ""
                fc = proc.get("factorizations", {}).get(name)
                fc_cell = _count_cell(fc[qi]) if fc else ""
                hb = proc.get("host_batches", {}).get(name)
                hb_cell = ", ".join(map(str, hb[qi])) if isinstance(hb, list) and isinstance(
                    hb[qi], list) else (str(hb[qi]) if hb else "")
                lines.append(
                    f"| {'value' if q == 'value' else 'gradient'} | {d} device(s) | {name} "
                    f"| {r['ms']:.2f} | {paired} | {across} | {vs_serial} "
                    f"| {'' if diff is None else f'{diff[qi]:.1e}'} "
                    f"| {proc['first'][name][qi]:.2f} | {sh_cell} | {hb_cell} "
                    f"| {fc_cell} |")
    for d, proc in ((DEVICES, many), (1, one)):
        for name, e in proc.get("errors", {}).items():
            lines.append(f"\n{d} device(s), {name}: error: {e}")
    fc4 = many.get("factorizations", {}).get(key)
    fc1 = many.get("factorizations", {}).get("sharded-1")
    if fc4 and fc1 and None not in fc4 + fc1 and (fc1[0] > B or fc1[1] > B):
        lines += ["", f"At B = {B} the 1-device program makes {fc1[0]} (value) and "
                  f"{fc1[1]} (gradient) factorizations per call, the {DEVICES}-device one "
                  f"{fc4[0]} and {fc4[1]}: the speedup includes the factorizations the "
                  "1-device program repeats (its batch overflows sciad's factor store: see "
                  "case 1), not sharding alone."]
    ok = all(v[0] <= SHARD_RTOL and v[1] <= SHARD_RTOL
             for proc in (many, one) for v in proc.get("diff", {}).values())
    lines += ["", f"Sharded results equal the unsharded ones (<= {SHARD_RTOL:g} relative): "
              f"{yes_no(ok)}."]
    return lines


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="B = 1, 16; short batches")
    p.add_argument("--grid", type=int, default=GRID, help="grid side n (N = n^2)")
    p.add_argument("--batches", default=None, help="case 1 batch sizes (default 1,16,256)")
    p.add_argument("--rhs-batches", default=None, help="case 2 batch sizes (default 16,256)")
    p.add_argument("--shard-batch", default=None,
                   help="case 3 batch sizes (default 16,64; quick 16)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"case 1 variants, a subset of {','.join(VARIANTS)}")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (7; quick 3)")
    p.add_argument("--batch-s", type=float, default=None,
                   help="seconds per timed batch of one variant (0.3; quick 0.1)")
    p.add_argument("--cases", default="1,2,3", help="which cases to run (default 1,2,3)")
    p.add_argument("--no-write", action="store_true", help="do not write bench/results/batch.md")
    p.add_argument("--shard-child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    repeats = args.repeats or (3 if args.quick else 7)
    batch_s = args.batch_s or (0.1 if args.quick else 0.3)
    shard_batches = tuple(int(x) for x in args.shard_batch.split(",")) if args.shard_batch else (
        QUICK_SHARD_BATCHES if args.quick else SHARD_BATCHES)

    if args.shard_child is not None:
        out = shard_child(args.shard_child, args.grid, shard_batches[0], repeats, batch_s)
        print(json.dumps(out))
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    def ints(s, default):
        return tuple(int(x) for x in s.split(",")) if s else default

    batches = ints(args.batches, QUICK_BATCHES if args.quick else BATCHES)
    rhs_batches = ints(args.rhs_batches, QUICK_RHS_BATCHES if args.quick else RHS_BATCHES)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {','.join(VARIANTS)}")

    load = load_average()
    t0 = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    platform = jax.default_backend()
    if platform != "cpu" and "klujax" in variants:
        variants.remove("klujax")  # klujax is CPU-only
        log("  (klujax skipped: CPU only)")
    counter = FactorCounter()
    P = load_example().Problem(args.grid)
    data = {"n": args.grid, "nnz": len(P.rows), "platform": platform, "repeats": repeats}
    cases = set(ints(args.cases, ()))
    if 1 in cases:
        data["case1"] = []
    for size in batches if 1 in cases else ():
        log(f"case 1: B = {size} ...")
        data["case1"].append(case_batch(args.grid, size, variants, repeats, batch_s, log,
                                        counter))
    if 2 in cases:
        data["case2"] = []
        for size in rhs_batches:
            log(f"case 2: B = {size} ...")
            data["case2"].append(case_rhs(args.grid, size, repeats, batch_s, counter))
    if 3 in cases:
        log("case 3 ...")
        data["case3"] = [run_shard_children(args.grid, size, repeats, batch_s, log)
                         for size in shard_batches]
    log(f"  done in {time.perf_counter() - t0:.1f} s")
    text = render(data, machine_info(load), command_line("bench/batch.py", argv))
    publish(RESULTS, text, write=not (args.no_write or args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
