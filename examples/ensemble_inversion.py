"""An ensemble of independent inverse problems over every device of every process.

Each problem is the multi-source inverse Poisson problem of
`examples/multi_source_inversion.py` for a medium of its own: recover the
log-conductivity `m_i` of `-div(exp(m_i) grad u) = f_s` on an n x n grid
from S sources' states at the receivers plus 1% noise. The true media are
random (two Gaussian bumps each, seeded by the problem's index), so the
ensemble is P different problems on one sparsity pattern.

The problems are split over one mesh axis `"batch"` of ALL devices
(`jax.devices()`: every process's), `sd.vmap(..., spmd_axis_name="batch")`
inside `sd.function` with global shardings. In batches of `--batch`
problems:

- each process makes only the rows it holds (`jax.make_array_from_callback`:
  its problems' true media and noise, from seeds), and the data are
  synthesized on the devices that hold them;
- every process checks the gradient of the first problem it holds with a
  Taylor test (a local computation on its addressable shard);
- `--iters` steps of a batched gradient descent with Barzilai-Borwein step
  lengths (one per problem; a step never changes `m` by more than 0.5) run
  as one sharded program per step: each device factors its own problems'
  matrices and solves their forward and adjoint systems;
- the results are gathered (`multihost_utils.process_allgather`) and
  process 0 prints a line per batch (misfit reduction, error of `m`, wall
  time), then a summary (and `--summary` writes it as JSON, `--plot` a
  figure).

With `--check`, process 0 then solves the same problems on one device,
unsharded, and the run fails unless the ensemble's results equal them (to
1e-8 relative: rounding, grown by the descent steps).

Run it as one process with simulated CPU devices:

    python examples/ensemble_inversion.py --devices 4 --check

or as one of several processes (one command per host, or per GPU; the same
program everywhere):

    python examples/ensemble_inversion.py --coordinator HOST:PORT --num-processes 2 --process-id 0
    python examples/ensemble_inversion.py --coordinator HOST:PORT --num-processes 2 --process-id 1

or under a cluster launcher with `--auto` (`jax.distributed.initialize()`
with no arguments: JAX reads SLURM's, Open MPI's, ... environment). See
docs/guide/cluster.md. Defaults: 16 x 16 grid, 4 sources, 16 problems in
batches of 8, 25 steps: about 15 s on two cores, mostly compilation (the
second batch takes under a second), 25 s with `--check`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's flags (see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16, help="grid size per side (default 16)")
    p.add_argument("--sources", type=int, default=4, help="sources per problem (default 4)")
    p.add_argument("--problems", type=int, default=16, help="problems in all (default 16)")
    p.add_argument("--batch", type=int, default=8,
                   help="problems per batch, a multiple of the device count (default 8)")
    p.add_argument("--iters", type=int, default=25, help="descent steps per batch (default 25)")
    p.add_argument("--check", action="store_true",
                   help="process 0 solves the same problems on one device and compares")
    p.add_argument("--summary", default=None, help="write the summary as JSON to this path")
    p.add_argument("--plot", default=None, help="write a figure (matplotlib) to this path")
    p.add_argument("--devices", type=int, default=None,
                   help="simulate this many CPU devices per process (sets XLA_FLAGS)")
    p.add_argument("--cpu", action="store_true", help="run on CPU devices (JAX_PLATFORMS=cpu)")
    g = p.add_argument_group("multi-process (jax.distributed)")
    g.add_argument("--coordinator", default=None,
                   help="HOST:PORT of the coordinator (process 0 serves it)")
    g.add_argument("--num-processes", type=int, default=None)
    g.add_argument("--process-id", type=int, default=None)
    g.add_argument("--auto", action="store_true",
                   help="jax.distributed.initialize() with no arguments (SLURM, Open MPI, ...)")
    a = p.parse_args(argv)
    given = [a.coordinator is not None, a.num_processes is not None, a.process_id is not None]
    if any(given) and not all(given):
        p.error("--coordinator, --num-processes and --process-id go together")
    if a.auto and any(given):
        p.error("--auto takes the coordinator and process ids from the launcher: give neither")
    return a


def set_environment(a: argparse.Namespace) -> None:
    """What must be set before JAX starts: simulated CPU devices."""
    if a.devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={a.devices}").strip()
    if a.cpu or a.devices:
        os.environ["JAX_PLATFORMS"] = "cpu"


if __name__ == "__main__":
    ARGS = parse_args()
    set_environment(ARGS)  # before JAX is imported, below

# (sciad before JAX: it turns on JAX's hoisting of large constants)
import sciad  # noqa: E402, F401, I001
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import sciad as sd  # noqa: E402
import sciad.numpy as snp  # noqa: E402


def _load_multi_source():
    # examples/multi_source_inversion.py, loaded by path (examples/ is no package)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_source_inversion.py")
    spec = importlib.util.spec_from_file_location("_multi_source_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ms = _load_multi_source()

NOISE = _ms.NOISE
MAX_CHANGE = 0.5  # the largest change of m in one step
FIRST_STEP = 0.1  # the first step's largest change of m
RTOL_CHECK = 1e-8  # rounding, grown by the descent steps (a few 1e-10 seen)


def true_media(problem, index: np.ndarray, seed: int = 0) -> np.ndarray:
    """The true log-conductivity of problems `index` (one row each): two
    Gaussian bumps of amplitude +-(0.5..1) at random places, seeded by the
    problem's index, so that any process makes any problem's medium alone."""
    X, Y = problem.X.ravel(), problem.Y.ravel()
    out = np.zeros((len(index), X.size))
    for row, i in enumerate(index):
        rng = np.random.default_rng([seed, int(i)])
        for _ in range(2):
            cx, cy = rng.uniform(0.25, 0.75, 2)
            amp = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.0)
            out[row] += amp * np.exp(-((X - cx) ** 2 + (Y - cy) ** 2) / (2 * 0.12 ** 2))
    return out


def noise(problem, index: np.ndarray, seed: int = 0) -> np.ndarray:
    """Standard normal draws for problems `index`, (len(index), S, R)."""
    shape = (problem.S, problem.receivers.size)
    return np.stack([np.random.default_rng([seed, int(i), 1]).standard_normal(shape)
                     for i in index]).reshape(len(index), *shape)


# ---------------------------------------------------------------------------
# one problem, written once; batched (and sharded) with sd.vmap


def synthesize(problem, m_true, eps):
    """One problem's data: its states at the receivers plus `NOISE` times
    their largest value times `eps`; and that noise level."""
    u = sd.vmap(lambda f: _ms.observe(problem, m_true, f))(problem.F)
    sigma = NOISE * snp.max(snp.abs(u))
    return u + sigma * eps, sigma


def objective(problem, m, d, sigma):
    """One problem's objective (examples/multi_source_inversion.py's)."""
    return _ms.objective(m, problem.F, d, sigma, problem)


def batched(problem, axis: str | None):
    """`(synth, step)` for a batch of problems (leading axis), split
    over mesh axis `axis` (None: unsharded)."""
    kw = {} if axis is None else {"spmd_axis_name": axis}

    def synth(Mt, Eps):
        return sd.vmap(lambda m, e: synthesize(problem, m, e), **kw)(Mt, Eps)

    def total(M, D, sig):
        v = sd.vmap(lambda m, d, s: objective(problem, m, d, s), **kw)(M, D, sig)
        return snp.sum(v), v

    def step(M, M_prev, G_prev, D, sig):
        """One Barzilai-Borwein step for every problem: `(M_next, M, G, f(M))`."""
        (_, v), G = sd.value_and_grad(total, has_aux=True)(M, D, sig)
        s, y = M - M_prev, G - G_prev
        ss, sy = snp.sum(s * s, axis=1), snp.sum(s * y, axis=1)
        gmax = snp.maximum(snp.max(snp.abs(G), axis=1), 1e-300)  # a zero gradient: no step
        # BB1 where the curvature is positive, else the first step's length;
        # never more than MAX_CHANGE in m
        bb = snp.where(sy > 0, ss / snp.where(sy > 0, sy, 1.0), FIRST_STEP / gmax)
        alpha = snp.minimum(bb, MAX_CHANGE / gmax)
        return M - alpha[:, None] * G, M, G, v

    return synth, step


def run_batch(problem, fns, index: np.ndarray, iters: int, glob, seed: int = 0):
    """The batch of problems `index`: returns `(m_true, m, objective before,
    objective after, sigma, data)`, global arrays (NumPy arrays when `glob`
    makes them: unsharded)."""
    synth, step = fns
    N, S, R = problem.n ** 2, problem.S, problem.receivers.size
    Mt = glob((len(index), N), lambda rows: true_media(problem, index[rows], seed))
    Eps = glob((len(index), S, R), lambda rows: noise(problem, index[rows], seed))
    D, sig = synth(Mt, Eps)
    M = glob((len(index), N), lambda rows: np.zeros((len(rows), N)))
    M_prev, G_prev = M, M
    for k in range(iters + 1):  # the last call only evaluates the objective at the last M
        M_next, M_prev, G_prev, v = step(M, M_prev, G_prev, D, sig)
        if k == 0:
            v0 = v
        if k < iters:
            M = M_next
    return Mt, M, v0, v, sig, D


# ---------------------------------------------------------------------------


def main(n: int = 16, sources: int = 4, problems: int = 16, batch: int = 8, iters: int = 25,
         check: bool = False, summary: str | None = None, plot: str | None = None,
         verbose: bool = True, seed: int = 0) -> dict:
    """Solves `problems` inverse problems in batches of `batch` over every
    device of every process (whatever `jax.distributed` joined: call it
    first). Returns the summary (on every process: the results are gathered
    everywhere; only process 0 prints and writes)."""
    t_start = time.perf_counter()
    pid, nproc = jax.process_index(), jax.process_count()
    say = print if (verbose and pid == 0) else (lambda *a, **k: None)
    ndev = jax.device_count()
    if batch < 1 or batch % ndev:
        raise sd.errors.InvalidOptionError(
            f"the batch ({batch} problems) must be a multiple of the device count ({ndev}), "
            f"each device taking the same number; give --batch {ndev * max(1, batch // ndev)}",
            op="ensemble_inversion")
    problem = _ms.Problem(n, sources)
    mesh = jax.make_mesh((ndev,), ("batch",), devices=jax.devices())
    sh = NamedSharding(mesh, P("batch"))

    def glob(shape, rows_of):
        # a global array over all devices: this process makes only the rows
        # of its own devices (rows_of gets a slice of the batch)
        return jax.make_array_from_callback(
            shape, sh, lambda idx: rows_of(np.arange(shape[0])[idx[0]]))

    synth, step = batched(problem, "batch")  # (step: sd.cost's example below)
    fns = (sd.function(synth, in_shardings=(sh, sh), out_shardings=(sh, sh)),
           sd.function(step, in_shardings=(sh,) * 5, out_shardings=(sh,) * 4))
    if problems < 1 or problems % batch:
        raise sd.errors.InvalidOptionError(
            f"{problems} problems do not make whole batches of {batch}; give a positive "
            f"multiple of --batch as --problems", op="ensemble_inversion")
    batches = [np.arange(s, s + batch) for s in range(0, problems, batch)]
    say(f"ensemble inversion: {problems} problems ({n} x {n} grid, {sources} sources, "
        f"{problem.receivers.size} receivers each) in {len(batches)} batches of {batch}; "
        f"{nproc} process(es), {ndev} devices ({jax.local_device_count()} on this process, "
        f"{jax.devices()[0].platform}), per batch {batch // ndev} problem(s) per device")

    gather = lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True))  # noqa: E731
    out = {"problems": problems, "batch": batch, "processes": nproc, "devices": ndev,
           "n": n, "sources": sources, "iters": iters, "batches": [],
           "m_true": [], "m": [], "f0": [], "f": [], "err": []}
    for b, index in enumerate(batches):
        t = time.perf_counter()
        Mt, M, v0, v, sig, D = run_batch(problem, fns, index, iters, glob, seed)
        if b == 0:  # each process: the first problem it holds, on its own device
            first, d, s = first_held(D), first_held(D, row=True), first_held(sig, row=True)
            rates = taylor_check(problem, d, s)
            every = np.asarray(multihost_utils.process_allgather(np.append(rates, first)))
            every = every.reshape(nproc, -1)
            out["taylor"] = [{"process": p, "problem": int(r[-1]), "rates": r[:-1].tolist()}
                             for p, r in enumerate(every)]
            say("Taylor test of each process's first problem (remainder rates, want ~2): "
                + ", ".join(f"problem {int(r[-1])} (process {p}) "
                            f"{np.array2string(r[:-1], precision=3)}"
                            for p, r in enumerate(every)))
            out["layout"] = layout(D, lambda: sd.cost(step, M, M, M, D, sig))
            for line in out["layout"]:
                say(line)
        Mt, M, v0, v = gather(Mt), gather(M), gather(v0), gather(v)
        err = np.linalg.norm(M - Mt, axis=1) / np.linalg.norm(Mt, axis=1)
        wall = time.perf_counter() - t
        say(f"batch {b + 1}/{len(batches)}: problems {index[0]}-{index[-1]}, objective "
            f"{np.median(v0):.3e} -> {np.median(v):.3e} (median; reduced {np.min(v0 / v):.1f}x "
            f"to {np.max(v0 / v):.1f}x), relative error of m {np.median(err):.3f} (median), "
            f"{wall:.2f} s")
        out["batches"].append({"problems": [int(index[0]), int(index[-1])], "wall_s": wall})
        for key, val in (("m_true", Mt), ("m", M), ("f0", v0), ("f", v), ("err", err)):
            out[key] += np.asarray(val).tolist()
    out["wall_s"] = time.perf_counter() - t_start
    f0, f = np.array(out["f0"]), np.array(out["f"])
    say(f"done: {problems} problems, {iters} steps each, {out['wall_s']:.1f} s; objective "
        f"reduced {np.median(f0 / f):.1f}x (median), relative error of m "
        f"{np.median(out['err']):.3f} (median, from 1)")
    if check and pid == 0:
        t = time.perf_counter()
        out["check"] = check_one_device(problem, batches, iters, out, seed)
        say(f"check: one device, unsharded, gives the same m to {out['check']['m']:.1e} and "
            f"the same objective to {out['check']['f']:.1e} (relative; "
            f"{time.perf_counter() - t:.1f} s)")
    if pid == 0 and summary:
        with open(summary, "w") as fh:
            json.dump({k: v for k, v in out.items() if k not in ("m_true", "m")}, fh, indent=1)
        say(f"summary written to {summary}")
    if pid == 0 and plot:
        if _plot(problem, out, plot):
            say(f"figure written to {plot}")
    return out


def first_held(a, row: bool = False):
    """The index of the first row of a global array that this process holds
    (its first problem), or with `row=True` that row (a NumPy array)."""
    first = min(a.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.asarray(first.data)[0] if row else (first.index[0].start or 0)


def layout(a, cost) -> list[str]:
    """Where a global array's rows are (which process holds which, on how
    many devices), and the `devices:` line of `cost()` (an `sd.cost`
    report): lines to print."""
    nproc = jax.process_count()
    starts = sorted(s.index[0].start or 0 for s in a.addressable_shards)
    block = a.sharding.shard_shape(a.shape)[0]
    every = np.asarray(multihost_utils.process_allgather(np.array(starts))).reshape(nproc, -1)
    held = "; ".join(f"process {p} problems {r.min()}-{r.max() + block - 1} ({len(r)} devices)"
                     for p, r in enumerate(every))
    lines = [f"layout: data {tuple(a.shape)} split as {a.sharding.spec} over "
             f"{len(a.sharding.device_set)} devices, {block} problem(s) per device; {held}"]
    lines += [f"sd.cost of a step: {ln[len('devices: '):].split(' (the figures')[0]}"
              for ln in str(cost()).splitlines() if ln.startswith("devices:")]
    return lines


def taylor_check(problem, d, sigma) -> np.ndarray:
    """The Taylor test of one problem's objective at a random `m`; raises
    unless the remainder rates are ~2."""
    rng = np.random.default_rng(1)
    N = problem.n ** 2
    rates = sd.testing.taylor_test(lambda m: objective(problem, m, d, float(sigma)),
                                   0.1 * rng.standard_normal(N), rng.standard_normal(N))
    if not np.all(np.abs(rates - 2.0) < 0.1):  # NaN fails too
        raise AssertionError(f"ensemble_inversion: Taylor test of process "
                             f"{jax.process_index()}'s first problem: rates {rates}, want ~2")
    return rates


def check_one_device(problem, batches, iters: int, out: dict, seed: int) -> dict:
    """The same problems, unsharded, on this process's first device; raises
    unless the ensemble's `m` and objective equal them (RTOL_CHECK)."""
    synth, step = batched(problem, None)
    fns = (sd.function(synth), sd.function(step))

    def local(shape, rows_of):
        return rows_of(np.arange(shape[0]))

    ms, fs = [], []
    for index in batches:
        _, M, _, v, _, _ = run_batch(problem, fns, index, iters, local, seed)
        ms.append(np.asarray(M))
        fs.append(np.asarray(v))
    M, f = np.concatenate(ms), np.concatenate(fs)
    dm = float(np.max(np.abs(np.array(out["m"]) - M)) / np.max(np.abs(M)))
    df = float(np.max(np.abs(np.array(out["f"]) - f) / np.abs(f)))
    if not (dm < RTOL_CHECK and df < RTOL_CHECK):  # NaN fails too
        raise AssertionError(f"ensemble_inversion: the ensemble differs from one device: m by "
                             f"{dm:.2e}, the objective by {df:.2e} (relative; want < "
                             f"{RTOL_CHECK:.0e})")
    return {"m": dm, "f": df}


def _plot(problem, out: dict, path: str, k: int = 4) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n, k = problem.n, min(k, out["problems"])
    fig, axes = plt.subplots(2, k, figsize=(3 * k, 6), squeeze=False)
    for j in range(k):
        mt, m = np.array(out["m_true"][j]), np.array(out["m"][j])
        lim = float(np.max(np.abs(mt)))
        for ax, field, title in ((axes[0, j], mt, f"problem {j}: true"),
                                 (axes[1, j], m, f"recovered (error {out['err'][j]:.2f})")):
            ax.imshow(field.reshape(n, n), origin="lower", extent=(0, 1, 0, 1), vmin=-lim,
                      vmax=lim, cmap="RdBu_r")
            ax.set_title(title, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def initialize(a: argparse.Namespace) -> None:
    """Joins the job: `jax.distributed.initialize` from the flags (or from
    the launcher's environment with `--auto`); nothing for one process."""
    if not (a.auto or a.coordinator):
        return
    if a.cpu or a.devices or os.environ.get("JAX_PLATFORMS") == "cpu":
        # collectives between CPU processes (the default of recent JAX)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if a.auto:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address=a.coordinator,
                                   num_processes=a.num_processes, process_id=a.process_id)


if __name__ == "__main__":
    initialize(ARGS)
    try:
        main(ARGS.n, ARGS.sources, ARGS.problems, ARGS.batch, ARGS.iters, ARGS.check,
             ARGS.summary, ARGS.plot)
    except BaseException:
        if jax.process_count() > 1:
            # end now: JAX's exit handler would wait for the other processes
            # at a shutdown barrier
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
