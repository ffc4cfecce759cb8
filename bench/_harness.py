"""Measurement and reporting helpers shared by the benchmark scripts in bench/.

Not a benchmark itself. The scripts import it as a top-level module
(`import _harness`): run from the repository root as
`.venv/bin/python bench/<script>.py`, Python puts bench/ on `sys.path`, and each
script also inserts its own directory there in case it is loaded another way.

- `interleaved` times batches of calls of several variants, alternating them
  and flipping their order every repeat, with the garbage collector off;
  `summary` turns two variants' per-repeat times into medians, the ratio of
  the medians and the interquartile range of the pairwise (same-repeat) ratios.
- `status_mb`, `reset_peak` read and reset the process's memory figures, and
  `block` waits for a call's arrays.
- `timed_call` times one call (the first: trace and compile), `first_and_median`
  that and the median of the calls after it; `median_time` is
  the median wall time of a one-off step (tracing, lowering); `medians` the
  median time per call of several functions timed in interleaved batches,
  `HostCall` wrapping a NumPy/SciPy function for it.
- `load_average`, `machine_info`, `cpu_model` and `machine_lines` describe the
  machine for the Markdown header, `report_head` is a result file's first lines
  and `yes_no` a "target met" cell; `write_text` writes a result file atomically.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time


# ---------------------------------------------------------------------------
# measurement

def batch(fn, args, n: int, clock=time.perf_counter) -> float:
    """Seconds for `n` calls `fn(*args)`, each output block_until_ready'd, by
    `clock` (wall time; `time.process_time` counts the process's CPU time,
    steadier than wall time on a machine others are using)."""
    t0 = clock()
    for _ in range(n):
        fn(*args).block_until_ready()
    return clock() - t0


def interleaved(variants: dict, args, n: int, repeats: int, clock=time.perf_counter) -> dict:
    """Alternates batches of `n` calls of each variant; the order flips each repeat.

    `variants` maps a name to `(fn, in_x64_block)`; `in_x64_block` runs the
    batch inside one `with jax.enable_x64(True):` (the scoped JAX baseline).
    Every variant is called a few times first (all should be compiled
    already), then the garbage collector is off while timing. `clock`: see
    `batch`. Returns each variant's per-repeat seconds per call: `{name: [s,
    ...]}`.
    """
    import jax

    def run(fn, in_block, k):
        if in_block:
            with jax.enable_x64(True):
                return batch(fn, args, k, clock)
        return batch(fn, args, k, clock)

    for fn, in_block in variants.values():  # warm up (all are compiled already)
        run(fn, in_block, max(3, n // 10))

    order = list(variants)
    times: dict[str, list[float]] = {k: [] for k in order}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for k in (order if r % 2 == 0 else order[::-1]):
                fn, in_block = variants[k]
                times[k].append(run(fn, in_block, n) / n)
    finally:
        gc.enable()
    return times


def summary(times: dict, name: str, base: str, n: int) -> dict:
    """Medians of `times[name]` and `times[base]` (µs per call), the ratio of the
    medians, and the quartiles of the per-repeat ratios name/base."""
    pair = sorted(s / j for s, j in zip(times[name], times[base]))
    q = statistics.quantiles(pair, n=4) if len(pair) >= 2 else [pair[0]] * 3
    sd_med, jx_med = statistics.median(times[name]), statistics.median(times[base])
    return {
        "sd_us": sd_med * 1e6, "jax_us": jx_med * 1e6, "ratio": sd_med / jx_med,
        "pair_q1": q[0], "pair_q3": q[2], "n": n, "repeats": len(pair),
    }


def status_mb(key: str, default: float = float("nan")) -> float:
    """A memory figure of this process from /proc/self/status (`"VmRSS"`, the
    resident set; `"VmHWM"`, its peak, which unlike `ru_maxrss` is not
    inherited from the parent through fork and exec), in MB; `default` where
    it cannot be read."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return default


def reset_peak() -> None:
    """Resets this process's VmHWM to its current RSS (Linux >= 4.0), so that
    the peak of the calls that follow alone can be read."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def block(x):
    """`x`, its arrays (in nested tuples too) block_until_ready'd."""
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif isinstance(x, tuple):
        for y in x:
            block(y)
    return x


def timed_call(fn, args) -> tuple[float, object]:
    """Seconds for one call `fn(*args)` (its outputs block_until_ready'd), and
    the outputs: the first call's trace-and-compile time."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def first_and_median(fn, args, repeats: int, budget_s: float = float("inf")):
    """`(first, median, out)`: seconds of the first call `fn(*args)` (trace
    and compile), the median of `repeats` calls after it (fewer where they
    take over `budget_s` together), and the first call's outputs; each call's
    outputs block_until_ready'd."""
    import jax

    first, out = timed_call(fn, args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return first, statistics.median(times), out


def median_time(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of `repeats` calls `fn()` (gc collected before each), and
    the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def medians(fns: dict, args, repeats: int, seconds: float = 0.3) -> dict:
    """Median seconds per call of each of `fns` (`{name: fn}`), timed in
    interleaved batches of about `seconds` each (see `interleaved`)."""
    t = min(timed_call(f, args)[0] for f in fns.values())
    calls = max(1, round(seconds / max(t, 1e-6)))
    times = interleaved({k: (f, False) for k, f in fns.items()}, args, calls, repeats)
    return {k: statistics.median(v) for k, v in times.items()}


class Cycling:
    """`fn` called on the next of `inputs` each time (their values differ from
    call to call, as an optimizer's do: a CHOLMOD cache skips a factorization
    whose values are the last ones factored), timeable as `medians` times a
    function."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self, *_):
        self.i = (self.i + 1) % len(self.inputs)
        return Blocking(self.fn)(*self.inputs[self.i])


class HostCall:
    """A host (NumPy/SciPy) function made timeable with the JAX ones: its
    call returns this object, whose `block_until_ready` is a no-op."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        self.out = self.fn(*args)
        return self

    def block_until_ready(self):
        return self


class Blocking(HostCall):
    """A function returning a tuple of arrays, timeable as one returning an
    array: `block_until_ready` waits for every array it returned."""

    def block_until_ready(self):
        block(self.out)
        return self


# ---------------------------------------------------------------------------
# reporting

_EXAMPLE_MODULES: dict = {}


def load_example(path: str):
    """The example script at `path` as a module, loaded once per process (by
    path: examples/ is no package, and examples/inverse_poisson.py's name
    clashes with bench/inverse_poisson.py's)."""
    import importlib.util

    mod = _EXAMPLE_MODULES.get(path)
    if mod is None:
        name = "_example_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _EXAMPLE_MODULES[path] = mod
    return mod


def load_average() -> str:
    """The 1-minute load average, formatted, or "n/a" where there is none."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def machine_info(load: str = "n/a") -> dict:
    """The machine and library versions; `load` is shown as the load before the run."""
    import jax
    import jaxlib
    import numpy as np

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpus": os.cpu_count(), "usable_cpus": usable,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(), "jax": jax.__version__,
        "jaxlib": jaxlib.__version__, "numpy": np.__version__,
        "device": str(jax.devices()[0]), "platform": platform.platform(),
        "load": load,
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_lines(m: dict) -> list[str]:
    """The two Markdown lines describing the machine (from `machine_info()`)."""
    return [
        f"Machine: {m['cpus']} CPUs ({m['usable_cpus']} usable), "
        f"{cpu_model()}; {m['platform']}; device {m['device']}.  ",
        f"Python {m['python']}, jax {m['jax']}, jaxlib {m['jaxlib']}, "
        f"numpy {m['numpy']}. Load average (1 min) before the run: "
        f"{m['load']}.",
    ]


def report_head(title: str, argv: str, machine: dict) -> list[str]:
    """A result file's first lines: the title, the command line and the time it
    ran, and the machine (from `machine_info()`)."""
    return [f"# {title}", "", f"`{argv}` — {time.strftime('%Y-%m-%d %H:%M:%S')}", "",
            *machine_lines(machine)]


def yes_no(met: bool) -> str:
    """A "target met" cell: "yes", or a bold "**NO**"."""
    return "yes" if met else "**NO**"


def command_line(script: str, argv) -> str:
    """`bench/NAME.py --flags` as the script was run, for the table's header."""
    import sys

    return " ".join([script] + (list(argv) if argv is not None else sys.argv[1:])).strip()


def publish(path: str, text: str, write: bool) -> None:
    """Prints the table and (unless `write` is False) writes it to `path`."""
    import sys

    print(text)
    if write:
        write_text(path, text)
        print(f"(written to {os.path.relpath(path, os.getcwd())})", file=sys.stderr)


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path` atomically (through a temporary file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
