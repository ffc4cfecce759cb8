"""Batches split over devices: `sd.vmap(..., spmd_axis_name=...)` inside
`sd.function(..., in_shardings=..., out_shardings=...)`, on 4 simulated host
devices.

XLA's device count is fixed when JAX starts, so the sharded runs happen in
one child process (`_CHILD`) that prints its findings as JSON; the tests
read them. The child compares every sharded result with the unsharded one
and records the batch size each host call (SuperLU factorizations and
solves) received, which shows whether each device solved its own share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp

_CHILD = textwrap.dedent(r'''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import sciad as sd, sciad.numpy as snp
    from sciad.solvers import _host

    calls = []
    _call = _host._HostFn.__call__
    def recording(self, *args):
        calls.append([list(np.shape(a)) for a in args])
        return _call(self, *args)
    _host._HostFn.__call__ = recording

    N = 10
    i = np.arange(N)
    r = np.concatenate([i, i[1:], i[:-1]]); c = np.concatenate([i, i[:-1], i[1:]])

    def loss(k, b):
        vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
        A = sd.sparse.coo_matrix((vals, (r, c)), shape=(N, N))
        return snp.sum(sd.linalg.solve(A, b, solver="splu") ** 2)

    def total(axis):
        return lambda K, B: snp.sum(sd.vmap(loss, spmd_axis_name=axis)(K, B))

    rng = np.random.default_rng(0)
    K, B = rng.uniform(0.5, 1.5, (8, N)), rng.standard_normal((8, N))
    want_f = np.asarray(sd.function(sd.vmap(loss))(K, B))
    want_g = np.asarray(sd.function(sd.grad(total(None)))(K, B))
    out = {"devices": len(jax.devices())}
    for kind in ("auto", "explicit"):
        mesh = jax.make_mesh((4,), ("batch",), axis_types=(
            AxisType.Auto if kind == "auto" else AxisType.Explicit,))
        sh = NamedSharding(mesh, P("batch"))
        f = sd.function(sd.vmap(loss, spmd_axis_name="batch"), in_shardings=(sh, sh),
                        out_shardings=sh)
        g = sd.function(sd.grad(total("batch")), in_shardings=(sh, sh), out_shardings=sh)
        calls.clear()
        y = f(K, B)
        fcalls = list(calls)
        calls.clear()
        dK = g(jax.device_put(K, sh), jax.device_put(B, sh))
        out[kind] = {
            "f_err": float(np.max(np.abs(np.asarray(y) - want_f))),
            "g_err": float(np.max(np.abs(np.asarray(dK) - want_g) / np.abs(want_g).max())),
            "f_spec": y.sharding.spec[0], "g_spec": dK.sharding.spec[0],
            "f_devices": len(y.sharding.device_set),
            "f_call_batches": sorted({s[0][0] for s in fcalls if s and s[0]}),
            "g_call_batches": sorted({s[0][0] for s in calls if s and s[0]}),
            "f_calls": len(fcalls),
        }
    # many right-hand sides against one matrix
    mesh = jax.make_mesh((4,), ("batch",), axis_types=(AxisType.Auto,))
    sh, rep = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    shared = lambda k, B: snp.sum(sd.vmap(loss, in_axes=(None, 0), spmd_axis_name="batch")(k, B))
    unshared = lambda k, B: snp.sum(sd.vmap(loss, in_axes=(None, 0))(k, B))
    gs = sd.function(sd.grad(shared), in_shardings=(rep, sh), out_shardings=rep)
    want = np.asarray(sd.function(sd.grad(unshared))(K[0], B))
    gs(K[0], B)
    calls.clear()
    dk = gs(K[0], B)
    out["shared"] = {"g_err": float(np.max(np.abs(np.asarray(dk) - want))),
                     "shapes": sorted({tuple(s) for call in calls for s in call})}
    # a batch that does not divide over the devices, and an axis without a mesh
    mesh = jax.make_mesh((4,), ("batch",), axis_types=(AxisType.Auto,))
    sh = NamedSharding(mesh, P("batch"))
    errors = {}
    # no mesh at all: one device, as on a mesh of one
    errors["no_mesh_err"] = float(np.max(np.abs(
        np.asarray(sd.function(sd.vmap(loss, spmd_axis_name="batch"))(K, B)) - want_f)))
    with jax.set_mesh(mesh):
        try:
            sd.function(sd.vmap(loss, spmd_axis_name="sources"))(K, B)
        except Exception as e:
            errors["wrong_axis"] = [type(e).__name__, str(e)]
    with jax.set_mesh(mesh):
        try:
            sd.function(sd.vmap(loss, spmd_axis_name="batch"))(K[:6], B[:6])
        except Exception as e:
            errors["uneven"] = [type(e).__name__, str(e)]
    out["errors"] = errors
    # inputs put on 4 devices, no mesh axis named (XLA partitions the program):
    # JAX's own transforms of `sd.to_jax`, and `sd.function`, per solver
    from sciad.solvers.direct import _cudss

    def misfit(solver, twice=False):
        def f(k):
            vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
            A = sd.sparse.coo_matrix((vals, (r, c)), shape=(N, N))
            x = sd.linalg.solve(A, B[0], solver=solver)
            if twice:  # (two solves with one factor: the value's program holds it)
                x = sd.linalg.solve(A, x, solver=solver)
            return snp.sum(x ** 2)
        return f

    Ks = jax.device_put(K, NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("batch",)),
                                         P("batch")))
    put = {}
    want = np.asarray(sd.function(sd.vmap(sd.grad(misfit("splu"))))(K))  # (one device)
    want2 = np.asarray(sd.function(sd.vmap(misfit("splu", twice=True)))(K))
    for solver in ("klu", "cudss", "splu"):
        with _cudss.use_kernels(_cudss.StandIn()) if solver == "cudss" else open(os.devnull):
            got = jax.jit(jax.vmap(jax.grad(sd.to_jax(misfit(solver)))))(Ks)
            res = {"to_jax_err": float(np.max(np.abs(np.asarray(got) - want)))}
            got = jax.jit(jax.vmap(sd.to_jax(misfit(solver, twice=True))))(Ks)
            res["to_jax_value_err"] = float(np.max(np.abs(np.asarray(got) - want2)))
            try:
                got = sd.function(sd.vmap(sd.grad(misfit(solver))))(Ks)
                res["function_err"] = float(np.max(np.abs(np.asarray(got) - want)))
            except Exception as e:
                res["function_error"] = [type(e).__name__, str(e)]
        put[solver] = res
    out["input_sharded"] = put
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def child():
    env = dict(os.environ, SCIAD_TRACEBACK_FILTERING="on")
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_sharded_batch_equals_unsharded_and_stays_sharded(child, kind):
    r = child[kind]
    assert child["devices"] == 4
    assert r["f_err"] < 1e-13 and r["g_err"] < 1e-13
    assert r["f_spec"] == r["g_spec"] == "batch" and r["f_devices"] == 4


@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_each_device_solves_its_own_examples(child, kind):
    # 8 examples over 4 devices: every host call (factorization, solve,
    # check) gets 2 examples, never the gathered 8
    r = child[kind]
    assert r["f_calls"] >= 4
    assert r["f_call_batches"] == [2] and r["g_call_batches"] == [2]


def test_shared_matrix_each_device_solves_its_own_columns(child):
    # 8 right-hand sides over 4 devices: solves of 2 columns each, never 8
    r = child["shared"]
    shapes = {tuple(s) for s in r["shapes"]}
    assert r["g_err"] < 1e-12
    assert (2, 10) in shapes and not any(8 in s for s in shapes)


def test_sharding_errors_name_the_fix(child):
    errs = child["errors"]
    assert errs["no_mesh_err"] < 1e-13
    name, msg = errs["wrong_axis"]
    assert name == "ShapeError" and "the mesh here has axes ['batch']" in msg
    name, msg = errs["uneven"]
    assert name == "ShapeError" and "6 examples cannot be split evenly" in msg


def test_spmd_axis_name_is_a_param_of_the_batched_solves(rng):
    N = 6
    K, B = rng.uniform(0.5, 1.5, (4, N, N)), rng.standard_normal((4, N))

    def solve(a, b):
        return sd.linalg.solve(a + 4 * snp.eye(N), b)

    text = str(sd.trace(sd.vmap(solve, spmd_axis_name="batch"), K, B))
    assert "spmd_axis='batch'" in text
    assert "spmd_axis" not in str(sd.trace(sd.vmap(solve), K, B))
    with pytest.raises(sd.errors.ShapeError, match="must be a mesh axis name"):
        sd.vmap(solve, spmd_axis_name=3)
    # without devices to split over, a one-device mesh runs it as it is
    import jax
    from jax.sharding import AxisType

    mesh = jax.make_mesh((1,), ("batch",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(mesh):
        got = sd.function(sd.vmap(solve, spmd_axis_name="batch"))(K, B)
    np.testing.assert_allclose(got, [np.linalg.solve(a + 4 * np.eye(N), b)
                                     for a, b in zip(K, B)], rtol=1e-12)


def _shared_matrix_total(N: int):
    """`total(k, B, axis)`: the summed losses of one tridiagonal N x N matrix
    (values from `k`) solved by SuperLU against the rows of `B`, the batch
    split over mesh axis `axis` (or not, for None)."""
    i = np.arange(N)
    r = np.concatenate([i, i[1:], i[:-1]])
    c = np.concatenate([i, i[:-1], i[1:]])

    def loss(k, b):
        vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
        A = sd.sparse.coo_matrix((vals, (r, c)), shape=(N, N))
        return snp.sum(sd.linalg.solve(A, b, solver="splu") ** 2)

    def total(k, B, axis):
        return snp.sum(sd.vmap(loss, in_axes=(None, 0), spmd_axis_name=axis)(k, B))
    return total


def test_a_shared_matrix_split_over_devices_is_factored_once(rng):
    # many right-hand sides against one matrix, split over a mesh axis: one
    # factorization, read by the maps of the solves and of the adjoint's
    # transposed solves (each device solves its own columns)
    import jax
    from jax.sharding import AxisType

    N = 8
    k, B = rng.uniform(0.5, 1.5, N), rng.standard_normal((4, N))
    total = _shared_matrix_total(N)

    g = sd.graph.passes.optimize(sd.trace(sd.grad(lambda k, B: total(k, B, "batch")), k, B))
    (factor,) = [n for n in g.nodes if n.primitive.name == "linalg.factor"]
    assert "uses" not in factor.params  # read on every device: kept, not counted
    readers = [n for n in g.nodes if factor.outputs[0] in n.inputs]
    assert [n.primitive.name for n in readers] == ["map", "map"]
    assert all(n.params["spmd_axis"] == "batch" for n in readers)
    mesh = jax.make_mesh((1,), ("batch",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(mesh):
        got = sd.function(sd.grad(lambda k, B: total(k, B, "batch")))(k, B)
    want = sd.function(sd.grad(lambda k, B: total(k, B, None)))(k, B)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_index_arrays_first_made_under_a_mesh_serve_a_program_without_one(rng):
    # sciad caches a pattern's index arrays once per process; here they are
    # first made while a map split over a mesh axis is lowered, and must
    # still serve the same computation without a mesh
    import jax
    from jax.sharding import AxisType

    N = 13  # (a pattern no other test makes)
    k, B = rng.uniform(0.5, 1.5, N), rng.standard_normal((2, N))
    total = _shared_matrix_total(N)

    mesh = jax.make_mesh((1,), ("batch",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(mesh):
        got = sd.function(sd.grad(lambda k, B: total(k, B, "batch")))(k, B)
    want = sd.function(sd.grad(lambda k, B: total(k, B, None)))(k, B)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("solver", ["klu", "cudss", "splu"])
def test_inputs_put_on_devices_without_a_mesh_axis(child, solver):
    """`jax.jit(jax.vmap(jax.grad(sd.to_jax(f))))` on a batch put on 4 devices
    (XLA partitions the program) equals one device's gradients, for KLU and
    the cuDSS stand-in too (it once aborted in XLA's partitioner: a factor's
    free, a side-effecting kernel call, without a sharding). `sd.function`
    of the same program equals it too: on a partitioned program it holds no
    compiled factor (`place_releases(hold=False)`: each solve factors in its
    own call, and there is no release to place), and so does JAX's own
    `jax.jit(jax.vmap(sd.to_jax(f)))` of a value whose program holds one
    (two solves with one factor)."""
    r = child["input_sharded"][solver]
    assert r["to_jax_err"] < 1e-12 and r["to_jax_value_err"] < 1e-12
    assert "function_error" not in r, r.get("function_error")
    assert r["function_err"] < 1e-12
