"""`sd.sparse.sharded_matmul`: a sparse matrix's rows split over the devices
of a mesh axis, products with halo exchange only, differentiable in the
values and the vector, the transpose sharded too.

XLA's device count is fixed when JAX starts, so the runs on 4 simulated
devices happen in one child process (`_CHILD`) that prints its findings as
JSON (as in tests/test_sharding.py); the tests read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd

n = 24
# a 1-D operator with two far couplings (rows 0 and 20 read columns 23 and 3)
A = (sp.diags([np.full(n - 1, -1.0), np.full(n, 4.0), np.full(n - 1, -1.2)], [-1, 0, 1])
     + sp.coo_matrix(([0.3, 0.2], ([0, 20], [23, 3])), shape=(n, n))).tocsr()
A.sort_indices()
pat = sd.sparse.from_scipy(A).type.pattern
rows = np.repeat(np.arange(n), np.diff(A.indptr))
rng = np.random.default_rng(0)
x, u = rng.standard_normal(n), rng.standard_normal(n)


def f(d, x, t, part):
    B = sd.sparse.csr_matrix((d, pat.indices, pat.indptr), shape=(n, n))
    return sd.sparse.sharded_matmul(B, x, part, transpose=t)


_CHILD = textwrap.dedent(r'''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import numpy as np
    import sciad as sd, sciad.numpy as snp
    sys.path.insert(0, os.environ["SCIAD_TESTS_DIR"])
    from test_sparse_sharded import A, f, n, pat, rng, rows, u, x
    auto = sd.sparse.row_partition(pat, 4, "rows")
    out = {"halo": list(auto.halo_counts), "send": auto.send_size, "auto": auto.exchange,
           "received": {}}
    COLLECTIVES = ("all-gather(", "all-reduce(", "collective-permute(", "all-to-all(",
                   "reduce-scatter(")
    for kind, exchange in (("auto", "all_gather"), ("explicit", "all_gather"),
                           ("auto", "ppermute"), ("explicit", "ppermute")):
        part = sd.sparse.row_partition(pat, 4, "rows", exchange)
        out["received"][exchange] = [part.received(), part.received(True)]
        mesh = jax.make_mesh((4,), ("rows",), axis_types=(
            AxisType.Auto if kind == "auto" else AxisType.Explicit,))
        sh = NamedSharding(mesh, P("rows"))
        for t in (False, True):
            r = out[f"{kind}_{exchange}_{t}"] = {}
            fn = sd.function(lambda d, x: f(d, x, t, part), in_shardings=(None, sh),
                             out_shardings=sh)
            xs = jax.device_put(x, sh)
            y = fn(A.data, xs)
            r["err"] = float(np.abs(np.asarray(y) - (A.T if t else A) @ x).max())
            r["spec"] = str(y.sharding.spec)
            hlo = fn.lower(A.data, xs).compile().as_text()
            r["collectives"] = sorted(ln.split("=")[1].split()[0] + " " + c
                                      for ln in hlo.splitlines() for c in COLLECTIVES
                                      if c in ln)
            g = sd.function(sd.grad(lambda d, x: snp.sum(f(d, x, t, part) * u),
                                    argnums=(0, 1)), in_shardings=(None, sh))
            gd, gx = g(A.data, xs)
            want_gd = x[A.indices] * u[rows] if not t else x[rows] * u[A.indices]
            r["grad_err"] = [float(np.abs(np.asarray(gd) - want_gd).max()),
                             float(np.abs(np.asarray(gx) - ((A if t else A.T) @ u)).max())]
            if kind == "auto":
                with jax.set_mesh(mesh):
                    rep = sd.testing.check_rules(lambda d, x: f(d, x, t, part), A.data, x,
                                                 batch=False, seed=0)
                r["rules"] = [rep.jvp_error, rep.vjp_error, rep.second_order_error]
    part = auto
    # a partition for another device count than the mesh's
    with jax.set_mesh(jax.make_mesh((4,), ("rows",), axis_types=(AxisType.Auto,))):
        try:
            sd.function(lambda d, x: f(d, x, False, sd.sparse.row_partition(pat, 2, "rows")))(
                A.data, x)
        except Exception as e:
            out["wrong_devices"] = [type(e).__name__, str(e)]
    with jax.set_mesh(jax.make_mesh((4,), ("batch",), axis_types=(AxisType.Auto,))):
        try:
            sd.function(lambda d, x: f(d, x, False, part))(A.data, x)
        except Exception as e:
            out["wrong_axis"] = [type(e).__name__, str(e)]
    # a batch of vectors under the mesh: a map of sharded products
    with jax.set_mesh(jax.make_mesh((4,), ("rows",), axis_types=(AxisType.Auto,))):
        X = rng.standard_normal((3, n))
        Y = sd.function(sd.vmap(lambda x: f(A.data, x, True, part)))(X)
        out["batch_err"] = float(np.abs(np.asarray(Y) - X @ A.toarray()).max())
    print("RESULT " + json.dumps(out))
''')

@pytest.fixture(scope="module")
def child():
    env = dict(os.environ, SCIAD_TESTS_DIR=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


EXCHANGES = [("auto", "all_gather"), ("explicit", "all_gather"), ("auto", "ppermute"),
             ("explicit", "ppermute")]


@pytest.mark.parametrize("kind,exchange", EXCHANGES)
@pytest.mark.parametrize("t", [False, True])
def test_sharded_products_and_gradients_equal_one_device(child, kind, exchange, t):
    r = child[f"{kind}_{exchange}_{t}"]
    assert r["err"] < 1e-14 and r["spec"] == "P('rows',)"
    assert r["grad_err"][0] < 1e-14 and r["grad_err"][1] < 1e-14


@pytest.mark.parametrize("kind,exchange", EXCHANGES)
@pytest.mark.parametrize("t", [False, True])
def test_only_the_halo_travels(child, kind, exchange, t):
    # each device reads 2 values of others and sends 2 (its edge rows'
    # entries; rows 0 and 20 read 23 and 3 from afar, at distances 1 and 3
    # as the neighbours): one all_gather of 4 x 2 values, or two ppermutes
    # (to the next device, and to the previous one) of 1 value each
    assert child["halo"] == [2, 2, 2, 2] and child["send"] == 2
    assert child["received"] == {"all_gather": [8, 8], "ppermute": [2, 2]}
    assert child["auto"] == "ppermute"
    want = (["f64[8]{0} all-gather("] if exchange == "all_gather"
            else ["f64[1]{0} collective-permute("] * 2)
    if kind == "explicit":
        # over explicit axes sd.function hands back whole results (one
        # gather of the (24,) result, sciad/_function.py), then lays them out
        want = sorted(want + ["f64[24]{0} all-gather("])
    assert child[f"{kind}_{exchange}_{t}"]["collectives"] == want


@pytest.mark.parametrize("exchange", ["all_gather", "ppermute"])
@pytest.mark.parametrize("t", [False, True])
def test_sharded_rules_check(child, exchange, t):
    jvp, vjp, second = child[f"auto_{exchange}_{t}"]["rules"]
    assert jvp < 1e-6 and vjp < 1e-10 and second < 1e-6


def test_ppermute_moves_the_halo_of_a_2d_grid_not_all_sends():
    # the 5-point Laplacian on a 32 x 32 grid, 4 devices of 8 grid rows:
    # each device reads one grid row (32 values) from each neighbour
    import scipy.sparse as sps

    N = 32
    T = sps.diags([-np.ones(N - 1), 2 * np.ones(N), -np.ones(N - 1)], [-1, 0, 1])
    L = sd.sparse.from_scipy((sps.kron(sps.eye(N), T) + sps.kron(T, sps.eye(N))).tocsr())
    part = sd.sparse.row_partition(L.type.pattern, 4, "rows")
    assert part.halo_counts == (32, 64, 64, 32) and part.exchange == "ppermute"
    assert part.shifts == (1, 3) and part.received() == part.received(True) == 64
    gather = sd.sparse.row_partition(L.type.pattern, 4, "rows", "all_gather")
    assert gather.received() == 4 * 64 and gather.received(True) == 4 * 64
    with pytest.raises(sd.errors.InvalidOptionError, match="`exchange` must be one of"):
        sd.sparse.row_partition(L.type.pattern, 4, "rows", "psum")


def test_a_partition_for_another_device_count_is_refused(child):
    name, msg = child["wrong_devices"]
    assert name == "ShapeError" and "over 2 devices, but mesh axis 'rows' has 4" in msg


def test_a_partition_over_an_axis_the_mesh_lacks_is_refused(child):
    name, msg = child["wrong_axis"]
    assert name == "ShapeError" and "over mesh axis 'rows', but the mesh here has axes " \
        "['batch']" in msg


def test_a_batch_of_vectors_maps_the_sharded_product(child):
    assert child["batch_err"] < 1e-14


def test_without_a_mesh_it_is_the_plain_product():
    part = sd.sparse.row_partition(pat, 4, "rows")
    for t in (False, True):
        y = sd.function(lambda d, x: f(d, x, t, part))(A.data, x)
        np.testing.assert_allclose(y, (A.T if t else A) @ x, rtol=1e-14, atol=1e-15)
    sd.testing.check_rules(lambda d, x: f(d, x, False, part), A.data, x, batch=False)


def test_the_partition_is_computed_once_per_pattern():
    assert sd.sparse.row_partition(pat, 4, "rows") is sd.sparse.row_partition(pat, 4, "rows")
    p = sd.sparse.row_partition(pat, 4, "rows")
    # device 0 reads column 4 (from device 1) and 23 (device 3, afar)
    assert p.halo_counts == (2, 2, 2, 2)
    assert str(p) == "rows/4@'rows'<halo=2, ppermute=2>"


def test_rows_that_do_not_split_evenly_are_refused():
    with pytest.raises(sd.errors.ShapeError, match="24 rows split evenly over 5 devices"):
        sd.sparse.row_partition(pat, 5, "rows")
    M = sd.sparse.from_scipy(sp.random(4, 6, density=0.5, random_state=0, format="csr"))
    with pytest.raises(sd.errors.ShapeError, match="needs a square matrix"):
        sd.sparse.row_partition(M.type.pattern, 2, "rows")


def test_sharded_product_round_trips_through_json():
    part = sd.sparse.row_partition(pat, 4, "rows")
    g = sd.trace(lambda d, x: f(d, x, True, part), A.data, x)
    g2 = sd.graph.Graph.from_json(g.to_json())
    assert "sparse.sharded_matmul" in str(g2)
    np.testing.assert_allclose(sd.function(lambda d, x: f(d, x, True, part))(A.data, x),
                               A.T @ x, rtol=1e-14)
