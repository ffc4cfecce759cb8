"""sciad's overhead over plain JAX: steady-state calls and graph build time.

Run from the repository root:

    .venv/bin/python bench/overhead.py             # full run (~1-2 min on 2 cores)
    .venv/bin/python bench/overhead.py --quick     # smoke check
    .venv/bin/python bench/overhead.py --repeats 41

What it measures, in two float64 configurations:

- `global`: `jax.config.update("jax_enable_x64", True)` at start-up (sciad's default; typical for
  scientific users); sciad skips its x64 scope.
- `scoped`: x64 off globally (`SCIAD_ENABLE_X64=0`). Each `sd.function` call enters sciad's scoped
  `jax.enable_x64(True)`; the JAX baseline runs its timing loop inside one
  `with jax.enable_x64(True):` block, so both compute in float64. Global x64
  cannot be switched off once on, so this configuration runs in a subprocess
  of this script (`--x64=scoped --json`).

1. Steady-state call time of `sd.function(f)` vs `jax.jit(f_jnp)`:
   (a) a 5-op function on shape-(8,) arrays (dispatch overhead), and
   (b) a 10-op elementwise chain on a 1e6-element float64 vector;
   (c) one sparse solve of 50 unknowns and a sum (`solver="auto"`: KLU
   compiled into the program, its factor freed, the backward error
   checked) against KLU's kernel alone through `jax.ffi.ffi_call` (what
   `klujax.solve` calls): information, no target (sciad's program also
   checks the matrix and the solution). Before sciad's programs declared
   no effects to JAX (see `sciad/_function.py`), this case took 230 us a
   call: every call took JAX's Python dispatch path.
   Both get the same JAX device arrays; every output is block_until_ready'd.
   Batches of N calls alternate sciad / JAX (the order flips every repeat); the
   table shows the median per-call time over the repeats and the ratio of the
   medians (target <= 1.10).
2. For a ~1,000-node graph: `sd.trace`, `sciad.graph.verify`, the passes
   `sd.function` runs (`optimize`), and lowering to
   StableHLO (`jax.jit(sciad.graph.lower(g)).lower(*args)` in the x64 scope),
   median of a few repeats, and their total (target < 0.5 s); XLA's compile
   time of the lowered module is shown for information.

The Markdown table goes to stdout and to bench/results/overhead.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import (  # noqa: E402  (bench/ must be on sys.path first)
    command_line, interleaved, load_average, machine_info, median_time, publish, report_head,
    summary, yes_no,
)

RESULTS = os.path.join(HERE, "results", "overhead.md")

RATIO_TARGET = 1.10
BUILD_TARGET_S = 0.5
CHAIN_NODES = 1000

# (calls per batch, repeats) for the full run; --quick divides both.
TINY_N, TINY_R = 1000, 41
BIG_N, BIG_R = 4, 15


# ---------------------------------------------------------------------------
# the functions under test (sciad and jax.numpy versions of the same code)

def tiny_sd(x, y):  # 5 ops
    import sciad.numpy as snp

    a = snp.sin(x)
    b = a * y
    c = b + x
    d = snp.exp(c)
    return d - y


def tiny_jnp(x, y):
    import jax.numpy as jnp

    a = jnp.sin(x)
    b = a * y
    c = b + x
    d = jnp.exp(c)
    return d - y


def _chain(np_):
    def f(x, y):  # 10 elementwise ops
        a = np_.sin(x)
        b = a * y
        c = np_.exp(b)
        d = c + x
        e = np_.tanh(d)
        g = e * 0.5
        h = np_.cos(g)
        i = h - y
        j = i * i
        return np_.sqrt(j + 1.0)
    return f


def big_sd(x, y):
    import sciad.numpy as snp

    return _chain(snp)(x, y)


def big_jnp(x, y):
    import jax.numpy as jnp

    return _chain(jnp)(x, y)


SOLVE_N = 50


def _solve_problem():
    """A 1-D Laplacian of SOLVE_N unknowns (CSR, sorted): its pattern's rows
    and columns, and its values."""
    import numpy as np
    import scipy.sparse as sp

    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (SOLVE_N, SOLVE_N)))
    M.sort_indices()
    return np.repeat(np.arange(SOLVE_N), np.diff(M.indptr)), M.indices, M.data


def solve_sd(d, b):
    """One sparse solve and a reduction: "auto" (KLU compiled into the
    program), its factor freed at the end, the backward error checked."""
    import sciad as sd
    import sciad.numpy as snp

    rows, cols, _ = _solve_problem()
    A = sd.sparse.coo_matrix((d, (rows, cols)), shape=(SOLVE_N, SOLVE_N))
    return snp.sum(sd.linalg.solve(A, b) ** 2)


def solve_jnp(d, b):
    """The same with KLU's kernel alone (klujax's, through XLA's FFI: what
    `klujax.solve` calls; klujax's Python module is not imported, as it
    switches x64 on globally), no checks."""
    import jax
    import jax.numpy as jnp

    import sciad as sd
    from sciad.solvers.direct import _klu_ffi

    rows, cols, data = _solve_problem()
    pattern = sd.sparse.coo_matrix((data, (rows, cols)), shape=(SOLVE_N, SOLVE_N)).pattern
    raw, r, c = _klu_ffi.symbolic(pattern)
    x = jax.ffi.ffi_call("sciad_klu_solve_with_symbol_f64",
                         jax.ShapeDtypeStruct((1, SOLVE_N, 1), jnp.float64))(
        r, c, d[None], b[None, :, None], jnp.uint64(raw))
    return jnp.sum(x ** 2)


def long_chain(x, y):
    """CHAIN_NODES elementwise nodes on (64,) vectors (one node per step)."""
    import sciad.numpy as snp

    steps = (
        snp.sin,
        lambda v: v * y,
        snp.tanh,
        lambda v: v + 0.25,
        snp.cos,
        lambda v: v - y,
        lambda v: v * 0.5,
        snp.exp,
    )
    for i in range(CHAIN_NODES):
        x = steps[i % len(steps)](x)
    return x


# ---------------------------------------------------------------------------
# measurement (runs in the configured process)

def _check_same(sd_fn, jax_fn, args, scoped: bool) -> None:
    import jax
    import numpy as np

    a = sd_fn(*args)
    if scoped:
        with jax.enable_x64(True):
            b = jax_fn(*args)
    else:
        b = jax_fn(*args)
    assert a.dtype == np.float64 and b.dtype == np.float64, (a.dtype, b.dtype)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


def _build_times(x, y, repeats: int, compile_repeats: int) -> dict:
    import jax

    import sciad as sd
    import sciad.graph as sg
    from sciad import config

    t_trace, graph = median_time(lambda: sd.trace(long_chain, x, y), repeats)
    t_verify, _ = median_time(lambda: sg.verify(graph), repeats)
    # sd.function runs the optimization passes before lowering
    t_opt, _ = median_time(lambda: sg.passes.optimize(graph), repeats)

    def lower_once():
        with config.x64_scope():
            return jax.jit(sg.lower(graph)).lower(x, y)

    t_lower, lowered = median_time(lower_once, repeats)
    assert "f64" in lowered.as_text()[:20000], "the lowered module is not float64"
    # A `Lowered` caches its executable: compile a freshly lowered one each time.
    compiles = []
    for _ in range(compile_repeats):
        fresh = lower_once()
        gc.collect()
        t0 = time.perf_counter()
        fresh.compile()
        compiles.append(time.perf_counter() - t0)
    t_compile = statistics.median(compiles)
    return {
        "nodes": len(graph.nodes), "trace_s": t_trace, "verify_s": t_verify,
        "optimize_s": t_opt, "lower_s": t_lower,
        "total_s": t_trace + t_verify + t_opt + t_lower,
        "compile_s": t_compile, "repeats": repeats, "compile_repeats": compile_repeats,
    }


def measure(mode: str, repeats: int | None, quick: bool) -> dict:
    """All measurements for one x64 configuration ('global' or 'scoped')."""
    import jax

    if mode == "global":
        jax.config.update("jax_enable_x64", True)
    else:  # importing sciad turns x64 on unless told not to
        os.environ["SCIAD_ENABLE_X64"] = "0"
    import jax.numpy as jnp  # noqa: F401  (imported after the x64 switch)
    import numpy as np

    import sciad as sd

    scoped = mode == "scoped"
    assert bool(jax.config.jax_enable_x64) == (not scoped)
    div = 5 if quick else 1
    tiny_r = repeats or max(3, TINY_R // div)
    big_r = repeats or max(3, BIG_R // div)

    rng = np.random.default_rng(0)

    def put(a):
        # float64 device arrays, made once and shared by both sides
        with jax.enable_x64(True):
            arr = jax.device_put(a)
        assert arr.dtype == np.float64
        return arr

    out = {"mode": mode}
    cases = (
        ("tiny", tiny_sd, tiny_jnp, 8, TINY_N // div, tiny_r),
        ("big", big_sd, big_jnp, 1_000_000, max(2, BIG_N // (2 if quick else 1)), big_r),
    )
    _, _, data = _solve_problem()
    cases += (("solve", solve_sd, solve_jnp, None, TINY_N // div, tiny_r),)
    for key, f_sd, f_jnp, size, n, r in cases:
        args = ((put(data), put(rng.standard_normal(SOLVE_N))) if size is None else
                (put(rng.standard_normal(size)), put(rng.standard_normal(size))))
        sd_fn, jax_fn = sd.function(f_sd), jax.jit(f_jnp)
        _check_same(sd_fn, jax_fn, args, scoped)
        variants = {"sciad": (sd_fn, False), "jax": (jax_fn, scoped)}
        inner = sd_fn._dispatch.current
        if key == "tiny" and inner is not None:
            # Diagnostic: sd.function's own jax.jit object called directly,
            # i.e. without sciad's scoped-x64 wrapper (in the global mode there is none;
            # in `scoped` mode it runs in the same x64 block as the baseline).
            variants["inner"] = (inner, scoped)
        times = interleaved(variants, args, n, r)
        out[key] = summary(times, "sciad", "jax", n)
        if "inner" in times:
            out[key + "_inner"] = summary(times, "inner", "jax", n)
        assert sd_fn.trace_count == 1, "sd.function re-traced in steady state"

    x, y = put(rng.standard_normal(64)), put(rng.standard_normal(64))
    out["build"] = _build_times(x, y, repeats=3 if quick else 5,
                                compile_repeats=1 if quick else 3)
    return out


# ---------------------------------------------------------------------------
# report

def render(results: list[dict], machine: dict, argv: str) -> str:
    lines = [
        *report_head("sciad overhead benchmark", argv, machine),
        "",
        "x64 `global`: `jax_enable_x64` on at start-up. x64 `scoped`: off globally; "
        "sciad enters its scoped x64 per call, the JAX loop runs in one "
        "`with jax.enable_x64(True):` block.",
        "",
        f"## Steady-state call time (target: sciad/JAX <= {RATIO_TARGET:.2f})",
        "",
        "| case | x64 | sciad µs/call | JAX µs/call | sciad/JAX | pairwise ratio IQR "
        "| calls × repeats | target met |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    names = {"tiny": "(a) 5 ops, shape (8,)", "big": "(b) 10 ops, shape (1e6,)",
             "solve": f"(c) one sparse solve, {SOLVE_N} unknowns"}
    for key in ("tiny", "big", "solve"):
        for res in results:
            m = res[key]
            lines.append(
                f"| {names[key]} | {res['mode']} | {m['sd_us']:.2f} | {m['jax_us']:.2f} "
                f"| {m['ratio']:.3f} | {m['pair_q1']:.3f}–{m['pair_q3']:.3f} "
                f"| {m['n']} × {m['repeats']} | "
                f"{'— (information)' if key == 'solve' else yes_no(m['ratio'] <= RATIO_TARGET)} |")
    inner = [r for r in results if "tiny_inner" in r]
    if inner:
        lines += [
            "",
            "Diagnostic for (a): `sd.function`'s inner `jax.jit` object called directly "
            "(no scoped-x64 wrapper; in `scoped` mode inside the same "
            "`jax.enable_x64(True)` block as the baseline), timed in the same interleaved "
            "loop:",
            "",
            "| case | x64 | inner jit µs/call | JAX µs/call | inner/JAX | pairwise ratio IQR |",
            "|---|---|---:|---:|---:|---|",
        ]
        for res in inner:
            m = res["tiny_inner"]
            lines.append(
                f"| (a) inner jit | {res['mode']} | {m['sd_us']:.2f} | {m['jax_us']:.2f} "
                f"| {m['ratio']:.3f} | {m['pair_q1']:.3f}–{m['pair_q3']:.3f} |")
    b0 = results[0]["build"]
    lines += [
        "",
        f"## Building a {b0['nodes']}-node graph (target: trace + verify + optimize + lower "
        f"< {BUILD_TARGET_S} s)",
        "",
        "| stage | " + " | ".join(f"x64 {r['mode']} (ms)" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    stages = (("`sd.trace`", "trace_s"), ("`sciad.graph.verify`", "verify_s"),
              ("`sciad.graph.passes.optimize`", "optimize_s"),
              ("lower to StableHLO (`jax.jit(lower(g)).lower`)", "lower_s"),
              ("**total**", "total_s"),
              ("XLA compile (information)", "compile_s"))
    for label, k in stages:
        lines.append(f"| {label} | " + " | ".join(
            f"{r['build'][k] * 1e3:.1f}" for r in results) + " |")
    lines.append("| total < 0.5 s | " + " | ".join(
        yes_no(r["build"]["total_s"] < BUILD_TARGET_S) for r in results) + " |")
    lines += [
        "",
        f"Medians of {b0['repeats']} repeats (compile: {b0['compile_repeats']}).",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=None,
                   help="interleaved repeats per case (default: 41 tiny, 15 big)")
    p.add_argument("--quick", action="store_true", help="fewer repeats: a smoke check")
    p.add_argument("--x64", choices=("both", "global", "scoped"), default="both",
                   help="which float64 configuration(s) to measure (default: both)")
    p.add_argument("--json", action="store_true",
                   help="print this process's measurements as JSON (used by the parent)")
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/overhead.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)

    if args.json:
        if args.x64 == "both":
            p.error("--json measures one configuration: pass --x64=global or --x64=scoped")
        print(json.dumps(measure(args.x64, args.repeats, args.quick)))
        return 0

    load = load_average()
    modes = ("global", "scoped") if args.x64 == "both" else (args.x64,)
    results = []
    for mode in modes:
        # Each configuration in its own fresh process: global x64 cannot be
        # turned off once on, and this keeps the two runs symmetric.
        cmd = [sys.executable, os.path.abspath(__file__), f"--x64={mode}", "--json"]
        if args.repeats:
            cmd += ["--repeats", str(args.repeats)]
        if args.quick:
            cmd.append("--quick")
        print(f"measuring x64={mode} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(f"x64={mode} measurement failed (exit {proc.returncode})",
                  file=sys.stderr)
            return proc.returncode
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    text = render(results, machine_info(load), command_line("bench/overhead.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
