"""What `import sciad` costs on top of `import jax`, in fresh processes.

Run from the repository root:

    .venv/bin/python bench/import_time.py              # 5 processes, about 10 s
    .venv/bin/python bench/import_time.py --runs 11
    .venv/bin/python bench/import_time.py --as-is      # the environment's bytecode setting

Each child process runs `t0; import jax; t1; import sciad; t2` (wall time,
`time.perf_counter`) and reports `t1 - t0`, `t2 - t1` and the ratio
`(t2 - t0) / (t1 - t0)`, and which of pyamg, scikit-fem (`skfem`), lineax,
equinox and `scipy.optimize` were loaded (none should be: they load on first
use). The script prints the medians over the processes. Target: the ratio
<= 1.5.

Bytecode: an installed package imports from cached bytecode (`.pyc`), and so
do JAX and SciPy here; an editable checkout run with
`PYTHONDONTWRITEBYTECODE=1` compiles every sciad module from source on each
import, which adds about 0.25 s to `import sciad` alone. By default the
children share a private bytecode cache (`PYTHONPYCACHEPREFIX`, a temporary
directory, filled by one untimed process first), so that both imports load
cached bytecode; `--as-is` keeps the environment's setting.

Prints only (no result file): the figures depend on the disk cache and the
load of the machine. Timings are wall-clock, so compare runs taken on the
same machine under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET = 1.5

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import jax
t1 = time.perf_counter()
import sciad
t2 = time.perf_counter()
print(json.dumps({"jax": t1 - t0, "sciad": t2 - t1, "ratio": (t2 - t0) / (t1 - t0),
                  "loaded": sorted(m for m in ("pyamg", "skfem", "lineax", "equinox",
                                               "scipy.optimize") if m in sys.modules)}))
"""


def run_child(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise SystemExit(f"a child process failed:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes (default 5)")
    ap.add_argument("--as-is", action="store_true",
                    help="keep the environment's bytecode setting (no private cache)")
    args = ap.parse_args(argv)

    env = dict(os.environ)
    cache = None
    if not args.as_is:
        cache = tempfile.mkdtemp(prefix="sciad-import-pyc-")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    try:
        if cache is not None:
            run_child(env)  # untimed: fills the bytecode cache
        rows = [run_child(env) for _ in range(args.runs)]
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)

    jax_s = statistics.median(r["jax"] for r in rows)
    sciad_s = statistics.median(r["sciad"] for r in rows)
    ratio = statistics.median(r["ratio"] for r in rows)
    loaded = sorted({m for r in rows for m in r["loaded"]})
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        load = "n/a"
    mode = "environment's bytecode setting" if args.as_is else "cached bytecode"
    print(f"import time, median of {args.runs} fresh processes ({mode}; "
          f"load average before: {load})")
    print(f"  import jax:                      {jax_s * 1e3:7.0f} ms")
    print(f"  import sciad (after jax):        {sciad_s * 1e3:7.0f} ms")
    print(f"  ratio (jax + sciad) / jax:       {ratio:7.2f}   (target <= {TARGET}: "
          f"{'met' if ratio <= TARGET else 'NOT met'})")
    print("  per process: " + ", ".join(f"{r['ratio']:.2f}" for r in rows))
    print(f"  loaded by `import sciad`: {', '.join(loaded) if loaded else 'none'} "
          f"(of pyamg, skfem, lineax, equinox, scipy.optimize)")


if __name__ == "__main__":
    main()
