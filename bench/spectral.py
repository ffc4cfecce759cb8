"""sciad's FFT gradients against JAX's: the spectral inverse heat objective.

Run from the repository root:

    .venv/bin/python bench/spectral.py              # N = 256, 512, 1024: 2-4 min on 2 cores
    .venv/bin/python bench/spectral.py --quick      # smoke check (N = 64, 128), ~20 s
    .venv/bin/python bench/spectral.py --sizes 128,256 --repeats 31 --no-write

The objective is `examples/spectral_inverse_heat.py`'s, written once and run
with `xp = sciad.numpy` and with `xp = jax.numpy`: 10 spectral heat steps
`u <- irfft2(E * rfft2(u))` on an N x N periodic grid, a Gaussian blur (one
more rfft2/irfft2 pair), the misfit against data in units of the noise and a
Tikhonov penalty with periodic differences (`roll`). Float64 throughout
(`jax_enable_x64` on at start-up, as in bench/autodiff.py); `u0` and the
data are arguments, the spectral symbols constants of the program.

For each N:

- The gradient `sd.function(sd.grad(f))` against `jax.jit(jax.grad(f_jnp))`,
  and each library's forward `f`. Before timing, the two forward values must
  agree to rtol 1e-12 and the two gradients to 1e-10 (relative to the
  largest entry).
- The four calls are timed in interleaved batches (bench/_harness.py: the order
  flips every repeat, gc off); the table shows the median per-call time over
  the repeats, the ratio sciad/JAX of the gradients' medians (target <= 1.05)
  with the interquartile range of the per-repeat ratios, and each library's
  gradient/forward ratio.
- The compiled programs' sizes, from XLA's optimized HLO: FFT ops and all
  kernels (ops of the entry computation other than parameters, constants and
  tuples) of each gradient.

The Markdown table goes to stdout and to bench/results/spectral.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
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

RESULTS = os.path.join(HERE, "results", "spectral.md")
RATIO_TARGET = 1.05
SIZES, QUICK_SIZES = (256, 512, 1024), (64, 128)
REPEATS, QUICK_REPEATS = 21, 5
BATCH_SECONDS = 0.25  # aim for batches of about this long (at least one call)


def _example():
    path = os.path.join(ROOT, "examples", "spectral_inverse_heat.py")
    spec = importlib.util.spec_from_file_location("spectral_inverse_heat", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hlo_counts(compiled) -> tuple[int, int]:
    """(FFT ops, kernels) in the entry computation of a compiled program."""
    text = compiled.as_text()
    entry = text[text.index("\nENTRY"):]
    entry = entry[: entry.index("\n}")]
    ops = re.findall(r"=\s*[^=]*?\s([a-z][a-z0-9\-]*)\(", entry)
    skip = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
    kernels = [op for op in ops if op not in skip]
    return sum(op == "fft" for op in kernels), len(kernels)


def measure(sizes, repeats: int) -> list[dict]:
    # (sciad before JAX: it turns on JAX's hoisting of large constants)
    import sciad  # noqa: E402, F401, I001
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import sciad as sd

    ex = _example()
    results = []
    for n in sizes:
        print(f"  N = {n} ...", file=sys.stderr, flush=True)
        problem = ex.Problem(n)
        data, sigma = ex.make_data(problem)
        rng = np.random.default_rng(n)
        args = (jax.device_put(0.1 * rng.standard_normal((n, n))), jax.device_put(data))

        def f_sd(u, d):
            return ex.objective(u, d, sigma, problem)

        def f_jnp(u, d):
            return ex.objective(u, d, sigma, problem, jnp)

        fns = {"sciad grad": sd.function(sd.grad(f_sd)),
               "jax grad": jax.jit(jax.grad(f_jnp)),
               "sciad fwd": sd.function(f_sd),
               "jax fwd": jax.jit(f_jnp)}
        first, outs = {}, {}
        for name, fn in fns.items():
            first[name], outs[name] = timed_call(fn, args)
        for a, b, tol in (("sciad fwd", "jax fwd", 1e-12), ("sciad grad", "jax grad", 1e-10)):
            x, y = np.asarray(outs[a]), np.asarray(outs[b])
            assert x.dtype == y.dtype == np.float64, (x.dtype, y.dtype)
            err = float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300))
            assert err <= tol, f"N={n}: {a} and {b} differ by {err:.2e} (> {tol:g})"
        t_grad = min(timed_call(fns["jax grad"], args)[0], timed_call(fns["sciad grad"], args)[0])
        calls = max(1, round(BATCH_SECONDS / t_grad))
        times = interleaved({k: (fn, False) for k, fn in fns.items()}, args, calls, repeats)
        grad = summary(times, "sciad grad", "jax grad", calls)
        fwd = summary(times, "sciad fwd", "jax fwd", calls)
        sd_fft, sd_kernels = _hlo_counts(fns["sciad grad"].lower(*args).compile())
        jx_fft, jx_kernels = _hlo_counts(fns["jax grad"].lower(*args).compile())
        results.append({
            "n": n, "calls": calls, "repeats": repeats,
            "sd_grad_ms": grad["sd_us"] / 1e3, "jax_grad_ms": grad["jax_us"] / 1e3,
            "ratio": grad["ratio"], "q1": grad["pair_q1"], "q3": grad["pair_q3"],
            "sd_fwd_ms": fwd["sd_us"] / 1e3, "jax_fwd_ms": fwd["jax_us"] / 1e3,
            "sd_gf": grad["sd_us"] / fwd["sd_us"], "jax_gf": grad["jax_us"] / fwd["jax_us"],
            "sd_fft": sd_fft, "jax_fft": jx_fft, "sd_kernels": sd_kernels,
            "jax_kernels": jx_kernels, "sd_first_s": first["sciad grad"],
            "jax_first_s": first["jax grad"],
        })
        assert fns["sciad grad"].trace_count == 1, "sd.function re-traced in steady state"
    return results


def render(results: list[dict], machine: dict, argv: str) -> str:
    lines = [
        *report_head("sciad spectral benchmark", argv, machine),
        "",
        "The gradient of `examples/spectral_inverse_heat.py`'s objective (10 spectral "
        "heat steps, a blur, misfit + Tikhonov; 22 FFTs forward) on an N x N grid, "
        "float64: `sd.function(sd.grad(f))` against `jax.jit(jax.grad(f_jnp))` of the "
        "same code with `xp = jax.numpy`. Forward values agree to 1e-12 and gradients "
        "to 1e-10 (checked before timing).",
        "",
        f"## Gradient time (target: sciad/JAX <= {RATIO_TARGET:.2f})",
        "",
        "| N | sciad grad ms | JAX grad ms | sciad/JAX | pairwise ratio IQR "
        "| sciad grad/fwd | JAX grad/fwd | calls × repeats | target met |",
        "|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for m in results:
        lines.append(
            f"| {m['n']}² | {m['sd_grad_ms']:.2f} | {m['jax_grad_ms']:.2f} | {m['ratio']:.3f} "
            f"| {m['q1']:.3f}–{m['q3']:.3f} | {m['sd_gf']:.2f} | {m['jax_gf']:.2f} "
            f"| {m['calls']} × {m['repeats']} | {yes_no(m['ratio'] <= RATIO_TARGET)} |")
    lines += [
        "",
        "## Compiled gradient programs and first calls",
        "",
        "Ops of XLA's optimized HLO (entry computation; kernels: every op but "
        "parameters, constants and tuples). First call: trace, lower, compile, run.",
        "",
        "| N | sciad FFTs | JAX FFTs | sciad kernels | JAX kernels | sciad fwd ms "
        "| JAX fwd ms | sciad first call s | JAX first call s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in results:
        lines.append(
            f"| {m['n']}² | {m['sd_fft']} | {m['jax_fft']} | {m['sd_kernels']} "
            f"| {m['jax_kernels']} | {m['sd_fwd_ms']:.2f} | {m['jax_fwd_ms']:.2f} "
            f"| {m['sd_first_s']:.2f} | {m['jax_first_s']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None,
                   help=f"comma-separated grid sizes (default {','.join(map(str, SIZES))})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"interleaved repeats per size (default {REPEATS})")
    p.add_argument("--quick", action="store_true",
                   help=f"N = {', '.join(map(str, QUICK_SIZES))}, {QUICK_REPEATS} repeats")
    p.add_argument("--no-write", action="store_true",
                   help="do not write bench/results/spectral.md")
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else \
        (QUICK_SIZES if args.quick else SIZES)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)

    load = load_average()
    t0 = time.perf_counter()
    print("measuring (x64 global) ...", file=sys.stderr, flush=True)
    results = measure(sizes, repeats)
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    text = render(results, machine_info(load), command_line("bench/spectral.py", argv))
    publish(RESULTS, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
