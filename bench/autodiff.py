"""sciad's reverse-mode derivatives against JAX's: steady-state calls and graph sizes.

Run from the repository root:

    .venv/bin/python bench/autodiff.py             # full run (~1 min on 2 cores)
    .venv/bin/python bench/autodiff.py --quick     # smoke check (20-step chain)
    .venv/bin/python bench/autodiff.py --repeats 41

Everything runs in one process with `jax.config.update("jax_enable_x64", True)`
at start-up (the x64 `global` configuration of bench/overhead.py, in which an
`sd.function` call goes straight into JAX's C++ dispatch).

Cases, each written once with `sciad.numpy` and once with `jax.numpy`:

1. `elementwise`: `sum(sqrt(...))` of a 10-op elementwise chain of two
   float64 vectors of 1e6 elements (the chain of overhead.py's case (b));
   gradient with respect to the first.
2. `tanh chain`: 200 steps `x = tanh(W @ x + b)` with x of shape (64,), a
   fixed W of shape (64, 64) and b of shape (64,) passed as arguments, then
   `sum(x * x)`. Gradient (a) with respect to W, the parameter gradient one
   trains with (its backward pass has a matrix-vector product and an outer
   product per step), and (b) with respect to x (a matrix-vector product per
   step).

For each case:

- Both gradients are computed once and must be float64 and agree to
  `rtol=1e-10` (`atol=0`). The time of that first call (trace, lower and XLA
  compile) is shown for information.
- Steady-state call time of `sd.function(sd.grad(f))` vs
  `jax.jit(jax.grad(f_jnp))`: batches of N calls alternate sciad / JAX (the
  order flips every repeat, gc off); the table shows the median per-call time
  over the repeats, the ratio of the medians (target <= 1.10) and the
  interquartile range of the per-repeat ratios.
- Sizes: sciad's derivative graph `sd.trace(sd.grad(f), ...)` as traced and
  after `sciad.graph.passes.optimize` (what `sd.function` lowers), and the
  number of equations of `jax.make_jaxpr(jax.grad(f_jnp))(...)`, counting the
  equations inside sub-jaxprs (a `jit`/`pjit`, `custom_jvp_call` ...
  equation counts as its body's equations) and, separately, the live ones
  (those an output depends on: JAX's jaxpr keeps the primal `reduce_sum`
  that `grad` does not return; XLA removes it).

The Markdown table goes to stdout and to bench/results/autodiff.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _harness import (  # noqa: E402  (bench/ must be on sys.path first)
    command_line, interleaved, load_average, machine_info, publish, report_head, summary,
    timed_call, yes_no,
)

RESULTS = os.path.join(HERE, "results", "autodiff.md")

RATIO_TARGET = 1.10
RTOL = 1e-10
SIZE = 1_000_000
DIM, STEPS, QUICK_STEPS = 64, 200, 20

# (calls per batch, repeats) for the full run; --quick divides both.
ELEM_N, ELEM_R = 4, 21
CHAIN_N, CHAIN_R = 100, 31


# ---------------------------------------------------------------------------
# the functions under test (sciad and jax.numpy versions of the same code)

def elementwise(np_):
    def f(x, y):  # 10 elementwise ops, then a sum
        a = np_.sin(x)
        b = a * y
        c = np_.exp(b)
        d = c + x
        e = np_.tanh(d)
        g = e * 0.5
        h = np_.cos(g)
        i = h - y
        j = i * i
        return np_.sum(np_.sqrt(j + 1.0))
    return f


def tanh_chain(np_, steps: int):
    def f(x, W, b):  # `steps` times a matrix-vector product, an add and a tanh
        for _ in range(steps):
            x = np_.tanh(W @ x + b)
        return np_.sum(x * x)
    return f


# ---------------------------------------------------------------------------
# graph sizes

def _jaxpr_counts(closed) -> tuple[int, int, int]:
    """(top-level equations, all equations, live equations) of a ClosedJaxpr.

    "All" and "live" replace an equation that has sub-jaxprs (jit, custom_jvp,
    cond ...) by the equations of its bodies, recursively; "live" keeps only the
    equations an output depends on (or that have effects) and counts a live
    call's bodies in full.
    """
    from jax.extend.core import Literal, jaxprs_in_params

    def total(jaxpr) -> int:
        n = 0
        for eqn in jaxpr.eqns:
            subs = list(jaxprs_in_params(eqn.params))
            n += sum(total(s) for s in subs) if subs else 1
        return n

    def live(jaxpr) -> int:
        needed = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
        n = 0
        for eqn in reversed(jaxpr.eqns):
            if eqn.effects or any(v in needed for v in eqn.outvars):
                subs = list(jaxprs_in_params(eqn.params))
                n += sum(total(s) for s in subs) if subs else 1
                needed.update(v for v in eqn.invars if not isinstance(v, Literal))
        return n

    jaxpr = closed.jaxpr
    return len(jaxpr.eqns), total(jaxpr), live(jaxpr)


def _sizes(f_sd, f_jnp, argnum: int, args) -> dict:
    import jax

    import sciad as sd

    graph = sd.trace(sd.grad(f_sd, argnums=argnum), *args)
    optimized = sd.graph.passes.optimize(graph)
    top, total, live = _jaxpr_counts(jax.make_jaxpr(jax.grad(f_jnp, argnums=argnum))(*args))
    return {"sd_nodes": len(graph.nodes), "sd_opt_nodes": len(optimized.nodes),
            "jaxpr_top": top, "jaxpr_eqns": total, "jaxpr_live": live}


# ---------------------------------------------------------------------------
# measurement

def _check_same(a, b) -> None:
    import numpy as np

    assert a.dtype == np.float64 and b.dtype == np.float64, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=0)


def measure(repeats: int | None, quick: bool) -> list[dict]:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import sciad as sd
    import sciad.numpy as snp

    assert jax.config.jax_enable_x64
    div = 5 if quick else 1
    steps = QUICK_STEPS if quick else STEPS
    rng = np.random.default_rng(0)

    def put(a):
        arr = jax.device_put(np.asarray(a, dtype=np.float64))
        assert arr.dtype == np.float64
        return arr

    big = (put(rng.standard_normal(SIZE)), put(rng.standard_normal(SIZE)))
    # W / sqrt(DIM) keeps the chain away from both saturation and vanishing gradients.
    small = (put(rng.standard_normal(DIM)),
             put(rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)),
             put(0.1 * rng.standard_normal(DIM)))
    cases = (
        ("(1) elementwise, 10 ops + sum, shape (1e6,), d/dx",
         elementwise(snp), elementwise(jnp), 0, big,
         max(2, ELEM_N // (2 if quick else 1)), repeats or max(3, ELEM_R // div)),
        (f"(2a) tanh chain, {steps} steps, (64,64) W, d/dW",
         tanh_chain(snp, steps), tanh_chain(jnp, steps), 1, small,
         CHAIN_N // div, repeats or max(3, CHAIN_R // div)),
        (f"(2b) tanh chain, {steps} steps, (64,64) W, d/dx",
         tanh_chain(snp, steps), tanh_chain(jnp, steps), 0, small,
         CHAIN_N // div, repeats or max(3, CHAIN_R // div)),
    )
    results = []
    for name, f_sd, f_jnp, argnum, args, n, r in cases:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        sd_fn = sd.function(sd.grad(f_sd, argnums=argnum))
        jax_fn = jax.jit(jax.grad(f_jnp, argnums=argnum))
        sd_first, a = timed_call(sd_fn, args)
        jax_first, b = timed_call(jax_fn, args)
        _check_same(a, b)
        times = interleaved({"sciad": (sd_fn, False), "jax": (jax_fn, False)}, args, n, r)
        res = summary(times, "sciad", "jax", n)
        assert sd_fn.trace_count == 1, "sd.function re-traced in steady state"
        res.update(_sizes(f_sd, f_jnp, argnum, args))
        res.update(name=name, sd_first_s=sd_first, jax_first_s=jax_first,
                   out_shape=tuple(a.shape))
        results.append(res)
    return results


# ---------------------------------------------------------------------------
# report

def render(results: list[dict], machine: dict, argv: str) -> str:
    lines = [
        *report_head("sciad autodiff benchmark", argv, machine),
        "",
        "x64 `global` only: `jax_enable_x64` on at start-up. Both gradients are float64 "
        f"and agree to rtol {RTOL:g} (checked before timing).",
        "",
        "## Steady-state call time: `sd.function(sd.grad(f))` vs "
        f"`jax.jit(jax.grad(f_jnp))` (target: sciad/JAX <= {RATIO_TARGET:.2f})",
        "",
        "| case | sciad µs/call | JAX µs/call | sciad/JAX | pairwise ratio IQR "
        "| calls × repeats | target met |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for m in results:
        lines.append(
            f"| {m['name']} | {m['sd_us']:.2f} | {m['jax_us']:.2f} | {m['ratio']:.3f} "
            f"| {m['pair_q1']:.3f}–{m['pair_q3']:.3f} | {m['n']} × {m['repeats']} "
            f"| {yes_no(m['ratio'] <= RATIO_TARGET)} |")

    def eqns(m):
        if m["jaxpr_top"] == m["jaxpr_eqns"]:
            return f"{m['jaxpr_eqns']}"
        return f"{m['jaxpr_eqns']} ({m['jaxpr_top']} top-level)"

    lines += [
        "",
        "## Derivative graph size",
        "",
        "sciad: nodes of `sd.trace(sd.grad(f), ...)` as traced, and after "
        "`sciad.graph.passes.optimize` (the graph `sd.function` lowers). JAX: equations "
        "of `jax.make_jaxpr(jax.grad(f_jnp))(...)`, sub-jaxprs' equations counted in "
        "place of their call equation; live: those an output depends on.",
        "",
        "| case | sciad nodes (traced) | sciad nodes (optimized) | jaxpr eqns "
        "| jaxpr eqns (live) | optimized / live |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in results:
        lines.append(
            f"| {m['name']} | {m['sd_nodes']} | {m['sd_opt_nodes']} | {eqns(m)} "
            f"| {m['jaxpr_live']} | {m['sd_opt_nodes'] / m['jaxpr_live']:.2f} |")
    lines += [
        "",
        "## First call (information)",
        "",
        "Trace, lower and XLA-compile, then run once: for sciad also tracing the "
        "derivative graph, verifying and optimizing it.",
        "",
        "| case | sciad first call (s) | JAX first call (s) |",
        "|---|---:|---:|",
    ]
    for m in results:
        lines.append(f"| {m['name']} | {m['sd_first_s']:.2f} | {m['jax_first_s']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=None,
                   help=f"interleaved repeats per case (default: {ELEM_R} elementwise, "
                        f"{CHAIN_R} tanh chain)")
    p.add_argument("--quick", action="store_true",
                   help=f"fewer repeats and a {QUICK_STEPS}-step chain: a smoke check")
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/autodiff.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)

    load = load_average()
    t0 = time.perf_counter()
    print("measuring (x64 global) ...", file=sys.stderr, flush=True)
    results = measure(args.repeats, args.quick)
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    text = render(results, machine_info(load), command_line("bench/autodiff.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
