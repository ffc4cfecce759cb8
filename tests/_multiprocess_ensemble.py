"""The workload of tests/test_multiprocess.py's ensemble test: the
ensemble example (examples/ensemble_inversion.py) on every process of a
`jax.distributed` job (tests/_multiprocess.py starts it), small sizes, its
`check` on: process 0 solves the same problems on one device and the run
fails unless the results are the same."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 8 problems in 2 batches of 4 over the job's 4 devices: one problem per
# device per batch
SIZES = {"n": 8, "sources": 2, "problems": 8, "batch": 4, "iters": 6}


def load():
    """examples/ensemble_inversion.py, loaded by path."""
    path = os.path.join(ROOT, "examples", "ensemble_inversion.py")
    spec = importlib.util.spec_from_file_location("_ensemble_inversion_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run() -> dict:
    """One process's part of the job: the example's `main`, and what it printed."""
    import jax

    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import sciad as sd

    ex = load()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        out = ex.main(**SIZES, check=True)
    out["printed"] = printed.getvalue()
    out["process"] = jax.process_index()
    # what sd.cost says about the data synthesis of one batch laid out over
    # the job's devices (global arrays)
    problem = ex._ms.Problem(SIZES["n"], SIZES["sources"])
    sh = NamedSharding(jax.make_mesh((jax.device_count(),), ("batch",)), P("batch"))
    index = np.arange(SIZES["batch"])
    Mt = ex.true_media(problem, index)
    Eps = ex.noise(problem, index)
    glob = [jax.make_array_from_callback(a.shape, sh, lambda idx, a=a: a[idx]) for a in (Mt, Eps)]
    synth, _ = ex.batched(problem, "batch")
    rep = sd.cost(synth, *glob)  # nothing compiled: the layout comes from the shardings
    out["cost"] = {"devices": rep.devices, "args_bytes": rep.args_bytes,
                   "per_device": rep.args_bytes_per_device, "text": str(rep).splitlines()[-3:]}
    return out
