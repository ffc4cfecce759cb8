"""Memory budgets on the bar's case: the gradient of a 1-D explicit heat
equation on 100,000 points over 2,000 steps (a carry of 0.8 MB; 1.6 GB for
all of them), with respect to the conductivity field.

Variants, each the value and gradient compiled once:

- sciad storing every step (`checkpoints=None`);
- `sd.MemoryBudget(ram="40MiB")` (RAM only: a binomial schedule);
- `sd.MemoryBudget(ram="8MiB", disk=<a temporary directory>)` (two levels:
  a carry on disk every few steps, written while the loop runs and read back
  ahead of the backward pass);
- as the JAX peer, a nested `lax.scan` whose segments are under
  `jax.checkpoint` (segments of 40 steps: the least memory a nested scan
  takes on 2,000 steps, 50 + 40 carries).

For each: the schedule and the forward steps it recomputes (`sd.cost`), the
median time of a call (`--repeats`, default 3), the peak of the process's
resident memory during a call above where it started (VmHWM), XLA's
temporary buffers (`memory_analysis`), and the gradient's largest
difference from the unbudgeted one relative to its largest entry. Targets
(issue 52): the disk budget's time at most 2x the RAM-only budget's; both
gradients equal to the unbudgeted one.

    .venv/bin/python bench/budget.py          # about 2 minutes on 2 cores

The Markdown table goes to stdout and to bench/results/budget.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

# (sciad before JAX: it turns on JAX's hoisting of large constants)
import sciad  # noqa: E402, F401, I001
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _harness  # noqa: E402
import sciad as sd  # noqa: E402
import sciad.numpy as snp  # noqa: E402

N, STEPS, DT = 100_000, 2000, 0.2


def _loss(xp, scan):
    def f(k, u0, d):
        def step(u, _):
            lap = xp.roll(u, 1) + xp.roll(u, -1) - 2.0 * u
            return u + DT * k * lap, None

        u, _ = scan(step, u0)
        r = u - d
        return 0.5 * xp.sum(r * r)
    return f


def _sciad(checkpoints):
    def scan(step, u0):
        return sd.scan(step, u0, length=STEPS, checkpoints=checkpoints)
    return sd.function(sd.value_and_grad(_loss(snp, scan))), scan


def _nested(k: int):
    def scan(step, u0):
        def segment(c, _):
            return jax.lax.scan(step, c, None, length=k)
        c, _ = jax.lax.scan(jax.checkpoint(segment), u0, None, length=STEPS // k)
        return c, None
    return jax.jit(jax.value_and_grad(_loss(jnp, scan)))


def _schedule_note(scan, args) -> str:
    report = sd.cost(sd.grad(_loss(snp, scan)), *args)
    notes = [r.note for r in report.rows if "recomputed" in r.note]
    return notes[0].split(", ", 1)[1] if notes else "every step stored"


def _problem():
    x = np.linspace(0, 1, N)
    u0 = np.exp(-100 * (x - 0.5) ** 2)
    return 1.0 + 0.5 * np.sin(2 * np.pi * x), u0, u0 * 0.9


def _make(name: str, disk: str):
    if name == "nested":
        return _nested(40)
    budget = {"every": None, "ram": sd.MemoryBudget(ram="40MiB"),
              "disk": sd.MemoryBudget(ram="8MiB", disk=disk)}[name]
    return _sciad(budget)[0]


def _peak_child(name: str, disk: str) -> None:
    """(In a process of its own:) the peak of the resident memory during the
    first run of the compiled program, above where it started."""
    fn, args = _make(name, disk), _problem()
    with sd.config.x64_scope():
        compiled = fn.lower(*args).compile()
    before = _harness.status_mb("VmRSS")
    _harness.reset_peak()
    with sd.config.x64_scope():
        jax.block_until_ready(compiled(*args))
    print(f"PEAK {_harness.status_mb('VmHWM') - before:.1f}")


def _peak_mb(name: str, disk: str) -> float:
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--peak", name, "--disk", disk],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split("PEAK ")[1].split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--peak", help=argparse.SUPPRESS)
    ap.add_argument("--disk", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peak:
        return _peak_child(a.peak, a.disk)
    args = _problem()
    with tempfile.TemporaryDirectory() as disk:
        variants = {"sciad, every step stored": _sciad(None),
                    'sciad, MemoryBudget(ram="40MiB")': _sciad(sd.MemoryBudget(ram="40MiB")),
                    'sciad, MemoryBudget(ram="8MiB", disk=tmp)':
                        _sciad(sd.MemoryBudget(ram="8MiB", disk=disk))}
        rows = {}
        for name, (fn, scan) in variants.items():
            first, out = _harness.timed_call(fn, args)
            lowered = fn.lower(*args) if hasattr(fn, "lower") else None
            temp = (lowered.compile().memory_analysis().temp_size_in_bytes / 1e6
                    if lowered is not None else float("nan"))
            rows[name] = dict(first=first, grad=np.asarray(out[1]),
                              note=_schedule_note(scan, args), temp=temp)
            print(f"{name}: first call {first:.1f} s", file=sys.stderr)
        nested = _nested(40)
        first, out = _harness.timed_call(nested, args)
        with sd.config.x64_scope():
            temp = nested.lower(*args).compile().memory_analysis().temp_size_in_bytes / 1e6
        rows["nested lax.scan + jax.checkpoint (k=40)"] = dict(
            first=first, grad=np.asarray(out[1]), note="50 carries + 40 steps' residuals",
            temp=temp)
        fns = {n: f for n, (f, _) in variants.items()}
        fns["nested lax.scan + jax.checkpoint (k=40)"] = nested
        for name, key in zip(fns, ("every", "ram", "disk", "nested")):
            rows[name]["peak"] = _peak_mb(key, disk)
        times = {}
        for _ in range(a.repeats):  # interleaved
            for name, fn in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.setdefault(name, []).append(time.perf_counter() - t0)
        assert os.listdir(disk) == [], os.listdir(disk)
    base = rows["sciad, every step stored"]["grad"]
    scale = float(np.max(np.abs(base)))
    ram_time = statistics.median(times['sciad, MemoryBudget(ram="40MiB")'])
    lines = ["| variant | schedule | first call (s) | median (s) | / every step | peak RSS (MB) "
             "| XLA temp (MB) | max rel. grad diff |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    every = statistics.median(times["sciad, every step stored"])
    for name, r in rows.items():
        med = statistics.median(times[name])
        diff = float(np.max(np.abs(r["grad"] - base))) / scale
        lines.append(f"| {name} | {r['note']} | {r['first']:.1f} | {med:.2f} | "
                     f"{med / every:.2f} | {r['peak']:.0f} | {r['temp']:.0f} | {diff:.1e} |")
    disk_time = statistics.median(times['sciad, MemoryBudget(ram="8MiB", disk=tmp)'])
    head = _harness.report_head("Memory budgets: the bar's case", "python bench/budget.py "
                                + " ".join(sys.argv[1:]), _harness.machine_info())
    text = "\n".join(head) + (
        f"\n\nThe gradient of a 1-D explicit heat equation, {N:,} points, {STEPS:,} steps (a "
        f"carry of {N * 8 / 1e6:.1f} MB, {N * 8 * STEPS / 1e9:.1f} GB for all of them), "
        f"medians of {a.repeats} interleaved calls. Peak RSS: the resident memory of a process "
        "of its own at its highest during the compiled program's first run, above where the "
        "run started (the disk level's file is in the page cache, not counted).\n\n"
        + "\n".join(lines) + "\n\n"
        f"Disk budget / RAM-only budget: {disk_time / ram_time:.2f} (target <= 2: "
        f"{_harness.yes_no(disk_time / ram_time <= 2)}).\n")
    _harness.publish(os.path.join(os.path.dirname(__file__), "results", "budget.md"), text,
                     not a.no_write)


if __name__ == "__main__":
    main()
