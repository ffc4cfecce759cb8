"""The workload of tests/test_multiprocess.py: small sparse inverse problems
(a 1-D diffusion operator with a coefficient `k` per node, solved by
SuperLU), run by `run()` on every process of a `jax.distributed` job over
a global mesh of all processes' devices, and by `reference()` unsharded in
one process. The functions are shared, so both sides compute the same
thing.

- `ensemble`: 8 examples `loss(k_i, b_i)` under `sd.vmap(...,
  spmd_axis_name="batch")`, values and gradients in k, through
  `sd.function` with global shardings;
- `optimize`: a few L-BFGS-B steps of `sd.optimize.minimize` on one shared
  coefficient vector fitted to 8 sources, its objective sharded over the
  sources (the sources and data are global arrays);
- `spmv`: the value and gradients of a loss of `A @ x` and `A.T @ x` with
  `A`'s 16 rows split over the 4 devices (`sd.sparse.sharded_matmul`);
- `cg`: the value and gradients (in the coefficients and the right-hand
  side) of a loss of a CG solve with the same matrix's rows split over the
  4 devices (`sd.linalg.solve(..., partition=)`): halo exchanges and the
  inner products' all-reduces cross the processes.
"""

from __future__ import annotations

import numpy as np

import sciad as sd
import sciad.numpy as snp
import sciad.optimize

N, BATCH, STEPS = 10, 8, 4
_i = np.arange(N)
ROWS = np.concatenate([_i, _i[1:], _i[:-1]])
COLS = np.concatenate([_i, _i[:-1], _i[1:]])


def data():
    rng = np.random.default_rng(0)
    return (rng.uniform(0.5, 1.5, (BATCH, N)), rng.standard_normal((BATCH, N)),
            rng.standard_normal((BATCH, N)))


def state(k, b):
    vals = snp.where(ROWS == COLS, 4.0 + k[ROWS], -0.5 - 0.1 * (k[ROWS] + k[COLS]))
    A = sd.sparse.coo_matrix((vals, (ROWS, COLS)), shape=(N, N))
    return sd.linalg.solve(A, b, solver="splu")


def loss(k, b):
    return snp.sum(state(k, b) ** 2)


def total(axis):
    return lambda K, B: snp.sum(sd.vmap(loss, spmd_axis_name=axis)(K, B))


def objective(axis):
    def f(k, B, D):
        misfit = sd.vmap(lambda k, b, d: snp.sum((state(k, b) - d) ** 2), in_axes=(None, 0, 0),
                         spmd_axis_name=axis)
        return snp.sum(misfit(k, B, D)) + 1e-3 * snp.sum(k ** 2)
    return f


# one objective function per axis, so that minimize's cache (keyed on f)
# holds one compiled program for each
_OBJECTIVES = {None: objective(None), "batch": objective("batch")}


def minimize(B, D, axis):
    iterates = []
    res = sd.optimize.minimize(_OBJECTIVES[axis], np.ones(N), args=(B, D), method="L-BFGS-B",
                               callback=lambda x: iterates.append(np.asarray(x).tolist()),
                               options={"maxiter": STEPS})
    return {"x": np.asarray(res.x).tolist(), "fun": float(res.fun), "nit": int(res.nit),
            "iterates": iterates}


# a sparse matrix of 16 rows split over the 4 devices: 4 rows per device,
# 2 per process boundary crossing between the processes' blocks
SPMV_N = 16


def spmv_operator():
    n = SPMV_N
    i = np.arange(n)
    r = np.concatenate([i, i[1:], i[:-1], [0, n - 1]])
    c = np.concatenate([i, i[:-1], i[1:], [n - 1, 0]])
    return r, c


def spmv_loss(vals, x, partition):
    """`sum((A x) ** 2 + A.T x)` with `A`'s rows split over the devices."""
    r, c = spmv_operator()
    A = sd.sparse.coo_matrix((vals, (r, c)), shape=(SPMV_N, SPMV_N))
    return snp.sum(sd.sparse.sharded_matmul(A, x, partition) ** 2
                   + sd.sparse.sharded_matmul(A, x, partition, transpose=True))


def spmv_data():
    rng = np.random.default_rng(1)
    return rng.uniform(0.5, 1.5, spmv_operator()[0].size), rng.standard_normal(SPMV_N)


def spmv_partition(exchange="auto"):
    r, c = spmv_operator()
    A = sd.sparse.coo_matrix((np.ones(r.size), (r, c)), shape=(SPMV_N, SPMV_N))
    return sd.sparse.row_partition(A.type.pattern, 4, "batch", exchange)


def cg_loss(k, b, partition):
    """`sum(w * x)` for the spd `A(k) x = b`, solved by CG with `A`'s rows
    split over the devices."""
    r, c = spmv_operator()
    vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
    A = sd.sparse.coo_matrix((vals, (r, c)), shape=(SPMV_N, SPMV_N))
    x = sd.linalg.solve(A, b, solver="cg", assume="spd", tol=1e-12, partition=partition)
    return snp.sum(np.linspace(-1.0, 1.0, SPMV_N) * x)


def cg_data():
    rng = np.random.default_rng(2)
    return rng.uniform(0.5, 1.5, SPMV_N), rng.standard_normal(SPMV_N)


def _cg_value_and_grad(partition):
    return sd.function(sd.value_and_grad(lambda k, b: cg_loss(k, b, partition),
                                         argnums=(0, 1)))


def reference() -> dict:
    """The same quantities, unsharded, in this process."""
    K, B, D = data()
    vals, x = spmv_data()
    part = spmv_partition()
    v, (gv, gx) = sd.function(sd.value_and_grad(lambda a, b: spmv_loss(a, b, part),
                                                argnums=(0, 1)))(vals, x)
    k, bc = cg_data()
    cv, (ck, cb) = _cg_value_and_grad(None)(k, bc)
    return {"values": np.asarray(sd.function(sd.vmap(loss))(K, B)).tolist(),
            "cg": [float(cv), np.asarray(ck).tolist(), np.asarray(cb).tolist()],
            "grads": np.asarray(sd.function(sd.grad(total(None)))(K, B)).tolist(),
            "optimize": minimize(B, D, None),
            "spmv": [float(v), np.asarray(gv).tolist(), np.asarray(gx).tolist()]}


def run() -> dict:
    """One process's part of the job (see tests/_multiprocess.py)."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    from sciad.solvers import _host

    # the batch sizes of this process's host calls (SuperLU factor/solve)
    calls = []
    call = _host._HostFn.__call__

    def recording(self, *args):
        calls.append(int(np.shape(args[0])[0]) if args and np.ndim(args[0]) else 0)
        return call(self, *args)

    _host._HostFn.__call__ = recording

    K, B, D = data()
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    sh = NamedSharding(mesh, P("batch"))

    def glob(x):  # a global array; this process fills only its own rows
        return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

    Kg, Bg, Dg = glob(K), glob(B), glob(D)
    out = {"process": jax.process_index(), "processes": jax.process_count(),
           "devices": jax.device_count(), "local_devices": jax.local_device_count(),
           "rows": sorted(int(s.index[0].start) for s in Kg.addressable_shards)}

    with sd.config.checks(True):
        f = sd.function(sd.vmap(loss, spmd_axis_name="batch"), in_shardings=(sh, sh),
                        out_shardings=sh)
        g = sd.function(sd.grad(total("batch")), in_shardings=(sh, sh), out_shardings=sh)
        calls.clear()
        y = f(Kg, Bg)
        dK = g(Kg, Bg)
        out["host_call_batches"] = sorted(set(calls))
        out["values"] = np.asarray(multihost_utils.process_allgather(y, tiled=True)).tolist()
        out["grads"] = np.asarray(multihost_utils.process_allgather(dK, tiled=True)).tolist()
        # no shardings given: the mesh comes from the global arguments
        y2 = sd.function(sd.vmap(loss, spmd_axis_name="batch"))(Kg, Bg)
        out["values_mesh_from_args"] = np.asarray(
            multihost_utils.process_allgather(y2, tiled=True)).tolist()
        out["value_spec"], out["grad_spec"] = str(y.sharding.spec), str(dK.sharding.spec)
        out["local_shapes"] = [list(s.data.shape) for s in dK.addressable_shards]
        # whole NumPy arrays with a sharded layout: JAX refuses them across processes
        try:
            f(K, B)
            out["numpy_inputs"] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["numpy_inputs"] = [type(e).__name__, str(e)[:400]]
        out["optimize"] = minimize(Bg, Dg, "batch")
        # a sparse matrix's rows over the 4 devices of both processes: the
        # halo exchange crosses processes (gloo)
        vals, x = spmv_data()
        xg = glob(x)
        for exchange in ("all_gather", "ppermute"):
            part = spmv_partition(exchange)
            v, (gv, gx) = sd.function(sd.value_and_grad(
                lambda a, b: spmv_loss(a, b, part), argnums=(0, 1)))(vals, xg)
            out[f"spmv_{exchange}"] = [
                float(v), np.asarray(multihost_utils.process_allgather(gv, tiled=True)).tolist(),
                np.asarray(multihost_utils.process_allgather(gx, tiled=True)).tolist()]
    # CG with the rows over the 4 devices (halo and all-reduces across processes)
    # (over a mesh with automatic axes: lineax's operators do not yet take
    # the sharded vector types of explicit ones)
    k, bc = cg_data()
    f = _cg_value_and_grad(spmv_partition())
    mesh = jax.make_mesh((jax.device_count(),), ("batch",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    bg = jax.make_array_from_callback(bc.shape, NamedSharding(mesh, P("batch")),
                                      lambda idx: bc[idx])
    with jax.set_mesh(mesh):
        cv, (ck, cb) = f(k, bg)
        out["cg"] = [float(cv),
                     np.asarray(multihost_utils.process_allgather(ck, tiled=True)).tolist(),
                     np.asarray(multihost_utils.process_allgather(cb, tiled=True)).tolist()]
        out["cg_spec"] = str(cb.sharding.spec)
    return out
