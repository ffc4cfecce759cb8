"""Time loops: sciad's `scan` against JAX's `lax.scan` on two simulations.

- heat: 1-D explicit heat equation on 200 points; the gradient of a
  final-state misfit with respect to the conductivity field.
- wave: 2-D acoustic wave equation (second-order leapfrog, 64 x 64 grid, a
  point source); the gradient of a receiver-line misfit with respect to the
  squared-velocity field.

For each problem and step count (200, 2000, 20000; `--quick`: 200 and 2000)
it measures, for the value-and-gradient function:

- `first call`: trace + compile + one run (for sciad: trace to a graph,
  differentiate, optimize, lower, XLA compile);
- `steady`: the median time of a call, batches of calls interleaved between
  the variants and repeated;
- `temp MB`: XLA's own `memory_analysis()` of the compiled program (the
  temporary buffers: the stored states or residuals and the work arrays), the
  same measure for every variant;

for these variants: sciad storing every step (`sd.scan`), JAX's `lax.scan`
(which stores every step's residuals), sciad with `checkpoints=s` (binomial,
s = 2 log2(steps)) and, as the checkpointed JAX peer, equinox's
`eqxi.scan(kind="checkpointed", checkpoints=s)` (online binomial
checkpointing). Ratios are sciad / JAX at equal memory policy.

Then checkpointing at equal memory against the JAX one writes by hand: a
nested scan, an outer `lax.scan` over segments of `k` steps whose body, an
inner `lax.scan`, is wrapped in `jax.checkpoint` (it holds a carry per
segment and one segment's residuals). Beside it sciad with `sd.EveryK(k)`, `k`
the divisor of the step count nearest its square root, and with
`sd.Binomial(s)`, `s` such that it holds as many carries as `EveryK(k)`;
the nested scan's segment length is the divisor of the step count that
makes its memory (XLA's) nearest to theirs. Ratios are sciad / nested scan;
the target is at most 1.2 for every schedule.

    .venv/bin/python bench/loops.py            # about 10-15 minutes on 2 cores
    .venv/bin/python bench/loops.py --quick    # about 3 minutes
    .venv/bin/python bench/loops.py --cpu-time # steady times in process CPU time

The Markdown table goes to stdout and to bench/results/loops.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

# (sciad before JAX: it turns on JAX's hoisting of large constants)
import sciad  # noqa: E402, F401, I001
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import equinox.internal as eqxi  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _harness  # noqa: E402
import sciad as sd  # noqa: E402
import sciad.numpy as snp  # noqa: E402
from sciad.primitives._schedules import checkpoint_runs  # noqa: E402  (the schedule's cells)


# ---------------------------------------------------------------------------
# problems, written once against a NumPy-like module `xp`


def heat_problem(steps: int):
    n = 200
    x = np.linspace(0, 1, n)
    u0 = np.exp(-100 * (x - 0.5) ** 2)
    k_true = 1.0 + 0.5 * np.sin(2 * np.pi * x)
    dt = 0.2

    def make(xp, scan):
        def f(k, u0, d):
            def step(u, _):
                lap = xp.roll(u, 1) + xp.roll(u, -1) - 2.0 * u
                return u + dt * k * lap / (1 + steps / 200.0), None
            u, _ = scan(step, u0, steps)
            r = u - d
            return 0.5 * xp.sum(r * r)
        return f

    d = np.asarray(jax.jit(make(jnp, _jax_scan))(k_true, u0, np.zeros(n)) * 0.0) + u0
    k = np.ones(n)
    return make, (k, u0, d)


def wave_problem(steps: int):
    n = 64
    h, dt = 1.0 / n, 0.5 / n
    xx, yy = np.meshgrid(np.linspace(0, 1, n), np.linspace(0, 1, n), indexing="ij")
    c2 = 1.0 + 0.3 * np.exp(-((xx - 0.5) ** 2 + (yy - 0.6) ** 2) / 0.02)
    src = np.exp(-((xx - 0.5) ** 2 + (yy - 0.2) ** 2) / 0.002)
    rec = np.zeros((n, n))
    rec[:, int(0.8 * n)] = 1.0

    def make(xp, scan):
        def f(c2, u0, d):
            def step(carry, _):
                u, um = carry
                lap = (xp.roll(u, 1, 0) + xp.roll(u, -1, 0) + xp.roll(u, 1, 1)
                       + xp.roll(u, -1, 1) - 4.0 * u) / (h * h)
                up = 2.0 * u - um + dt * dt * c2 * lap
                return (up, u), xp.sum(up * rec)
            _, traces = scan(step, (u0, u0), steps)
            r = traces - d
            return 0.5 * xp.sum(r * r)
        return f

    d = np.asarray(jax.jit(lambda c2: _ys(make, c2, src, steps))(c2))
    return make, (np.ones((n, n)), src, d)


def _ys(make, c2, src, steps):
    # the recorded traces for the true model (the data)
    out = {}

    def scan(step, init, length):
        c, ys = jax.lax.scan(step, init, length=length)
        out["ys"] = ys
        return c, ys
    make(jnp, scan)(c2, src, jnp.zeros(steps))
    return out["ys"]


def _jax_scan(step, init, length):
    return jax.lax.scan(step, init, length=length)


def _eqx_scan(s):
    def scan(step, init, length):
        return eqxi.scan(step, init, None, length=length, kind="checkpointed",
                         checkpoints=s)
    return scan


def _sd_scan(s):
    def scan(step, init, length):
        return sd.scan(step, init, length=length, checkpoints=s)
    return scan


def _nested_scan(k):
    """Checkpointing as one writes it with JAX: segments of `k` steps, each an
    inner scan under `jax.checkpoint`, stepped by an outer scan."""
    def scan(step, init, length):
        def segment(c, _):
            return jax.lax.scan(step, c, None, length=k)
        c, ys = jax.lax.scan(jax.checkpoint(segment), init, None, length=length // k)
        return c, jax.tree_util.tree_map(lambda y: y.reshape((length,) + y.shape[2:]), ys)
    return scan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------
# measurement


class _VG:
    """value-and-grad in argument 0; `.fn(*args)` returns the gradient array
    (so the harness can block on it)."""

    def __init__(self, kind, make, s):
        if kind == "sciad":
            f = make(snp, _sd_scan(s))
            self.vg = sd.function(sd.value_and_grad(f))
            self.lower = self.vg.lower
        else:
            scan = (_jax_scan if s is None else _nested_scan(s) if kind == "nested"
                    else _eqx_scan(s))
            self.vg = jax.jit(jax.value_and_grad(make(jnp, scan)))
            self.lower = self.vg.lower

    def fn(self, *args):
        return self.vg(*args)[1]


def _temp_mb(variant, args) -> float:
    with sd.config.x64_scope():
        ma = variant.lower(*args).compile().memory_analysis()
    return (ma.temp_size_in_bytes) / 1e6


def _equal_memory(make, args, steps: int):
    """The schedules compared at equal memory: `EveryK(k)`, `Binomial(s)` with
    the cells of `EveryK(k)`, and the nested scan's segment length whose
    memory is nearest theirs (from the divisors near the best one)."""
    divisors = _divisors(steps)
    k = min(divisors, key=lambda d: abs(d - math.sqrt(steps)))
    cells = checkpoint_runs(sd.EveryK(k), steps).cells
    s = cells  # (a binomial schedule's cells are its snapshots and one more)
    while s > 1 and checkpoint_runs(sd.Binomial(s), steps).cells > cells:
        s -= 1
    target = _temp_mb(_VG("sciad", make, sd.EveryK(k)), args)
    near = [d for d in divisors if k / 4 <= d <= 4 * k and d < steps]
    kn = min(near, key=lambda d: abs(_temp_mb(_VG("nested", make, d), args) - target))
    return k, s, kn


def run_case(problem: str, steps: int, repeats: int, clock=time.perf_counter) -> dict:
    make, args = {"heat": heat_problem, "wave": wave_problem}[problem](steps)
    s = max(2, int(round(2 * math.log2(steps))))
    k, sb, kn = _equal_memory(make, args, steps)
    variants = {"sciad": _VG("sciad", make, None), "jax": _VG("jax", make, None),
                "sciad-ckpt": _VG("sciad", make, s), "eqx-ckpt": _VG("eqx", make, s),
                "nested": _VG("nested", make, kn), "sciad-everyk": _VG("sciad", make,
                                                                      sd.EveryK(k)),
                "sciad-binomial": _VG("sciad", make, sd.Binomial(sb))}
    first, temp = {}, {}
    for name, v in variants.items():
        t0 = time.perf_counter()
        v.fn(*args).block_until_ready()
        first[name] = time.perf_counter() - t0
        temp[name] = _temp_mb(v, args)
    g = {k: np.asarray(v.fn(*args)) for k, v in variants.items()}
    scale = np.max(np.abs(g["jax"]))
    err = {k: float(np.max(np.abs(g[k] - g["jax"])) / scale) for k in g}
    one = statistics.median(_harness.batch(variants["jax"].fn, args, 1) for _ in range(3))
    n = max(1, int(0.2 / max(one, 1e-6)))
    times = _harness.interleaved({k: (v.fn, False) for k, v in variants.items()}, args, n,
                                 repeats, clock)
    med = {k: statistics.median(t) for k, t in times.items()}
    return dict(problem=problem, steps=steps, s=s, k=k, sb=sb, kn=kn, first=first, temp=temp,
                med=med, err=err)


def table(rows) -> str:
    head = ("| problem | steps | variant | first call (s) | steady (ms) | ratio | temp MB |"
            " max rel. grad diff |\n|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        for name, base in (("sciad", "jax"), ("jax", None), ("sciad-ckpt", "eqx-ckpt"),
                           ("eqx-ckpt", None)):
            label = name if "ckpt" not in name else f"{name} (s={r['s']})"
            ratio = f"{r['med'][name] / r['med'][base]:.2f}" if base else ""
            out.append(f"| {r['problem']} | {r['steps']} | {label} | {r['first'][name]:.2f} | "
                       f"{r['med'][name] * 1e3:.2f} | {ratio} | {r['temp'][name]:.1f} | "
                       f"{r['err'][name]:.1e} |")
    return head + "\n".join(out) + "\n"


def equal_memory_table(rows) -> str:
    head = ("| problem | steps | variant | first call (s) | steady (ms) | ratio | temp MB |"
            " max rel. grad diff | target met |\n|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        for name, label in (("nested", f"nested scan + jax.checkpoint (k={r['kn']})"),
                            ("sciad-everyk", f"sciad EveryK({r['k']})"),
                            ("sciad-binomial", f"sciad Binomial({r['sb']})")):
            ratio = r["med"][name] / r["med"]["nested"]
            met = "" if name == "nested" else _harness.yes_no(ratio <= 1.2)
            out.append(f"| {r['problem']} | {r['steps']} | {label} | {r['first'][name]:.2f} | "
                       f"{r['med'][name] * 1e3:.2f} | {ratio:.2f} | {r['temp'][name]:.2f} | "
                       f"{r['err'][name]:.1e} | {met} |")
    return head + "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time calls by the process's CPU time (on a shared machine)")
    a = ap.parse_args()
    clock = time.process_time if a.cpu_time else time.perf_counter
    cases = [("heat", 200), ("heat", 2000), ("wave", 200), ("wave", 2000)]
    if not a.quick:
        cases += [("heat", 20000), ("wave", 20000)]
    rows = []
    for problem, steps in cases:
        r = run_case(problem, steps, a.repeats if not a.quick else 3, clock)
        rows.append(r)
        print(f"{problem} {steps}: done", file=sys.stderr)
    head = _harness.report_head("Loops: sciad.scan against jax.lax.scan",
                                "python bench/loops.py " + " ".join(sys.argv[1:]),
                                _harness.machine_info())
    if a.cpu_time:
        head.append("Steady times are the process's CPU time per call (`--cpu-time`: the "
                    "machine was shared).")
    text = ("\n".join(head) + "\n\n" + table(rows) + "\nCheckpointing at equal memory: "
            "sciad's schedules against a nested `lax.scan` whose segments are under "
            "`jax.checkpoint` (target: ratio <= 1.2).\n\n" + equal_memory_table(rows))
    print(text)
    if not a.quick:
        _harness.write_text(os.path.join(os.path.dirname(__file__), "results", "loops.md"),
                            text)


if __name__ == "__main__":
    main()
