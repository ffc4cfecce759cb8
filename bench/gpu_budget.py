"""Memory budgets on a GPU: the bar's case (bench/budget.py) with the host
level, pinned host memory (issue 52).

The gradient of a 1-D explicit heat equation on 100,000 points over 2,000
steps (a carry of 0.8 MB; 1.6 GB for all of them) with respect to the
conductivity, value and gradient compiled once, on the default device:

- sciad storing every step (`checkpoints=None`);
- `sd.MemoryBudget(ram="40MiB")` (device memory only: binomial);
- `sd.MemoryBudget(ram="8MiB", host="4GiB")` (two levels: a carry in pinned
  host memory every few steps);
- the JAX peer: a nested `lax.scan` whose segments of 40 steps are under
  `jax.checkpoint`.

For each: the schedule (`sd.cost`), the median time of a call, XLA's
temporary buffers in device memory and in host memory (the compiled
program's `memory_analysis`), and the gradient's largest difference from
the unbudgeted one relative to its largest entry. Targets: the host
budget's device temporaries within about its 8 MiB plus one step's values,
its time at most 2x the 40 MiB budget's, the gradients equal.

    python bench/gpu_budget.py [--repeats 5] [--out DIR]

The Markdown table goes to stdout and to `gpu_budget_<device>.md` in
bench/results (or --out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (sciad before JAX: it turns on JAX's hoisting of large constants, which JAX
# reads when it is first imported; otherwise a mesh's index arrays are copied
# into the program's text and XLA folds them: compilation grows with the mesh)
import sciad as sd  # noqa: E402, I001
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import _harness  # noqa: E402
import budget as bar  # noqa: E402  (the problem and the peer, as on the CPU)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    device = jax.devices()[0]
    args = tuple(jax.device_put(x) for x in bar._problem())
    variants = {"sciad, every step stored": None,
                'sciad, MemoryBudget(ram="40MiB")': sd.MemoryBudget(ram="40MiB"),
                'sciad, MemoryBudget(ram="8MiB", host="4GiB")':
                    sd.MemoryBudget(ram="8MiB", host="4GiB")}
    fns, rows = {}, {}
    for name, budget in variants.items():
        fn, scan = bar._sciad(budget)
        fns[name] = fn
        rows[name] = dict(note=bar._schedule_note(scan, bar._problem()))
    fns["nested lax.scan + jax.checkpoint (k=40)"] = bar._nested(40)
    rows["nested lax.scan + jax.checkpoint (k=40)"] = dict(
        note="50 carries + 40 steps' residuals")
    for name, fn in fns.items():
        t0 = time.perf_counter()
        with sd.config.x64_scope():
            compiled = fn.lower(*args).compile()
        mem = compiled.memory_analysis()
        out = jax.block_until_ready(compiled(*args))
        rows[name].update(first=time.perf_counter() - t0, grad=np.asarray(out[1]),
                          temp=mem.temp_size_in_bytes / 1e6,
                          host=getattr(mem, "host_temp_size_in_bytes", 0) / 1e6)
        fns[name] = compiled
        print(f"{name}: first call {rows[name]['first']:.1f} s, device temp "
              f"{rows[name]['temp']:.1f} MB, host temp {rows[name]['host']:.1f} MB",
              file=sys.stderr)
    times: dict = {}
    for _ in range(a.repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.setdefault(name, []).append(time.perf_counter() - t0)
    base = rows["sciad, every step stored"]["grad"]
    scale = float(np.max(np.abs(base)))
    every = statistics.median(times["sciad, every step stored"])
    lines = ["| variant | schedule | first call (s) | median (ms) | / every step "
             "| device temp (MB) | host temp (MB) | max rel. grad diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        med = statistics.median(times[name])
        diff = float(np.max(np.abs(r["grad"] - base))) / scale
        r["diff"] = diff
        lines.append(f"| {name} | {r['note']} | {r['first']:.1f} | {med * 1e3:.1f} | "
                     f"{med / every:.2f} | {r['temp']:.1f} | {r['host']:.1f} | {diff:.1e} |")
    host_name = 'sciad, MemoryBudget(ram="8MiB", host="4GiB")'
    ram_name = 'sciad, MemoryBudget(ram="40MiB")'
    ratio = statistics.median(times[host_name]) / statistics.median(times[ram_name])
    nested = statistics.median(times[host_name]) / statistics.median(
        times["nested lax.scan + jax.checkpoint (k=40)"])
    host = rows[host_name]
    # (the budget counts the stored carries; one step's own values, a few
    # carries of a 100,000-point stencil, come beside it)
    fits = host["temp"] <= 8 * 2 ** 20 / 1e6 + 8 * bar.N * 8 / 1e6
    n_kept = int(host["note"].split(" carries (")[0].rsplit(" ", 1)[1]) \
        if " carries (" in host["note"] else 0
    kept = n_kept > 0 and host["host"] >= 0.9 * n_kept * bar.N * 8 / 1e6
    head = _harness.report_head(f"Memory budgets on a GPU ({device.device_kind})",
                                "python bench/gpu_budget.py " + " ".join(sys.argv[1:]),
                                _harness.machine_info())
    text = "\n".join(head) + (
        f"\n\nDevice: {device.device_kind}, JAX {jax.__version__}. The gradient of a 1-D "
        f"explicit heat equation, {bar.N:,} points, {bar.STEPS:,} steps (a carry of "
        f"{bar.N * 8 / 1e6:.1f} MB, {bar.N * 8 * bar.STEPS / 1e9:.1f} GB for all of them), "
        f"medians of {a.repeats} interleaved calls of the compiled program. Device and host "
        "temp: XLA's temporary buffers in each memory (`memory_analysis`).\n\n"
        + "\n".join(lines) + "\n\n"
        f"- Host budget / 40 MiB device budget: {ratio:.2f} (target <= 2: "
        f"{_harness.yes_no(ratio <= 2)}); / the nested `lax.scan` + `jax.checkpoint`: "
        f"{nested:.2f}.\n"
        f"- The host budget's device temporaries: {host['temp']:.1f} MB (8 MiB of carries "
        f"and one step's values: {_harness.yes_no(fits)}); its carries in host memory: "
        f"{host['host']:.1f} MB ({_harness.yes_no(kept)}).\n"
        f"- Gradients equal to the unbudgeted one to 1e-12: "
        f"{_harness.yes_no(all(r['diff'] <= 1e-12 for r in rows.values()))}.\n")
    name = "gpu_budget_" + device.device_kind.replace(" ", "_") + ".md"
    _harness.publish(os.path.join(a.out, name), text, not a.no_write)


if __name__ == "__main__":
    main()
