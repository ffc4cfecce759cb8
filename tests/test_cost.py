"""`sd.cost`: FLOPs, bytes and memory per node against XLA's own analysis of
the compiled programs, the gradient's memory under checkpoint schedules,
sparse factorizations' fill, and the printed table."""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

import sciad as sd
import sciad.numpy as snp


def _heat(k, u0, steps, checkpoints=None):
    def step(u, _):
        lap = snp.roll(u, 1) + snp.roll(u, -1) - 2 * u
        return u + 0.1 * k * snp.tanh(lap), None
    u, _ = sd.scan(step, u0, length=steps, checkpoints=checkpoints)
    return snp.sum(u ** 2)


def test_contraction_flops_match_xla(rng):
    a, b = rng.normal(size=(30, 40)), rng.normal(size=(40, 50))
    rep = sd.cost(lambda a, b: snp.sum(snp.tanh(a @ b)), a, b, compare_xla=True)
    (mm,) = [r for r in rep.rows if r.node.primitive.name == "matmul"]
    assert mm.flops == 2 * 30 * 40 * 50
    xla = rep.xla["program"]["flops"]
    assert 0.9 * xla <= rep.flops <= 1.1 * xla, (rep.flops, xla)


def test_gradient_memory_store_all_and_checkpointed_against_xla(rng):
    n, steps = 128, 400
    k, u0 = rng.uniform(0.5, 1.0, n), rng.normal(size=n)
    carry = n * 8
    all_ = sd.cost(lambda k, u0: _heat(k, u0, steps), k, u0, compare_xla=True)
    ck = sd.cost(lambda k, u0: _heat(k, u0, steps, checkpoints=8), k, u0, compare_xla=True)
    # store all: a few arrays per step are kept for the backward pass
    assert steps * carry <= all_.saved <= 4 * steps * carry
    for rep in (all_, ck):
        x = rep.xla["gradient"]
        xla_peak = x["temp"] + x["output"]
        assert 0.5 * xla_peak <= rep.grad_peak <= 2.0 * xla_peak, (rep.grad_peak, x)
    # binomial(8): at most 8 stored carries, whatever the step count
    assert ck.grad_peak < 30 * carry < all_.grad_peak / 10
    # ... for a few more FLOPs: the schedule's recomputed forward steps
    assert all_.grad_flops < ck.grad_flops < 4 * all_.grad_flops


def test_table_names_ops_lines_and_schedules(rng):
    k, u0 = rng.uniform(0.5, 1.0, 16), rng.normal(size=16)
    text = str(sd.cost(lambda k, u0: _heat(k, u0, 50, checkpoints=4), k, u0))
    assert "scan" in text and "test_cost.py:" in text and "50 steps" in text
    assert "reverse mode:" in text and "peak memory" in text
    grad_text = str(sd.cost(sd.grad(lambda k, u0: _heat(k, u0, 50, checkpoints=4)), k, u0))
    assert "binomial(4)" in grad_text and "forward steps recomputed" in grad_text

    def loop(x):
        return sd.while_loop(lambda s: snp.sum(s) < 10.0, lambda s: s * 2.0, x)

    assert "trip count unknown" in str(sd.cost(loop, np.ones(3)))


def _laplacian(n):
    t = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
    return (sp.kron(sp.eye(n), t) + sp.kron(t, sp.eye(n))).tocsr()


def test_sparse_factorization_fill_from_its_pattern(rng):
    a = _laplacian(20)
    b = rng.normal(size=a.shape[0])

    def f(d, b):
        A = sd.sparse.csr_matrix((d, a.indices, a.indptr), shape=a.shape)
        return snp.sum(sd.linalg.solve(A, b) ** 2)

    rep = sd.cost(f, a.data, b)
    (fac,) = [r for r in rep.rows if r.node.primitive.name == "linalg.factor"]
    lu = spl.splu(a.tocsc(), permc_spec="MMD_AT_PLUS_A")
    fill = lu.L.nnz + lu.U.nnz
    assert fill > 2 * a.nnz  # a 2-D Laplacian fills in
    assert fill * 8 <= fac.temp + fac.bytes <= 4 * fill * 12
    assert fac.flops >= fill  # at least a FLOP per entry of the factors
    solves = [r for r in rep.rows if r.node.primitive.name == "linalg.backsolve"]
    assert solves and all(r.flops >= 2 * fill for r in solves)


def test_peak_memory_counts_updates_in_place(rng):
    # each op reads the last value of its type: XLA writes its result there
    x = rng.normal(size=1000)
    rep = sd.cost(lambda x: snp.sin(snp.exp(x * 2.0) + 1.0) * 3.0, x, compare_xla=True)
    assert rep.peak == x.nbytes, rep.peak
    xla = rep.xla["program"]
    assert rep.peak <= xla["temp"] + xla["output"], (rep.peak, xla)
    # a value still read later is not overwritten
    two = sd.cost(lambda x: snp.sin(x * 2.0) + x * 2.0, x)
    assert two.peak == 2 * x.nbytes, two.peak


def test_a_loop_updates_its_carried_buffer_in_place():
    def fill(buf):
        return sd.fori_loop(0, 10, lambda i, b: b.at[i].set(b[i] + 1.0), buf)

    buf = np.zeros(1000)
    rep = sd.cost(fill, buf, compare_xla=True)
    (loop,) = [r for r in rep.rows if r.node.primitive.name == "scan"]
    assert loop.flops < 10 * 50, loop.flops  # a few FLOPs per step, not one per element
    assert loop.temp < buf.nbytes, loop.temp  # the carried buffer is not copied
    xla = rep.xla["program"]
    assert rep.peak <= 2 * (xla["temp"] + xla["output"]), (rep.peak, xla)


def test_arguments_on_one_device_add_no_devices_line(rng):
    import jax

    x = rng.normal(size=(8, 5))
    for arg in (x, jax.device_put(x)):
        rep = sd.cost(lambda x: snp.sum(snp.tanh(x)), arg)
        assert rep.devices == 1 and rep.args_bytes == rep.args_bytes_per_device == 320
        assert "devices:" not in str(rep)


_PER_DEVICE_CHILD = r'''
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import sciad as sd, sciad.numpy as snp

N = 10
i = np.arange(N)
r, c = np.concatenate([i, i[1:], i[:-1]]), np.concatenate([i, i[:-1], i[1:]])

def loss(k, b):
    vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
    return snp.sum(sd.linalg.solve(sd.sparse.coo_matrix((vals, (r, c)), shape=(N, N)), b) ** 2)

f = lambda K, B, w: w * sd.vmap(loss, spmd_axis_name="batch")(K, B)
rng = np.random.default_rng(0)
K, B, w = rng.uniform(0.5, 1.5, (8, N)), rng.standard_normal((8, N)), np.ones(8)
mesh = jax.make_mesh((4,), ("batch",))
by_row, whole = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
one = sd.cost(f, K, B, w, compare_xla=True)
four = sd.cost(f, jax.device_put(K, by_row), jax.device_put(B, by_row),
               jax.device_put(w, whole), compare_xla=True)
print("RESULT " + json.dumps({
    "one": [one.devices, one.args_bytes, one.args_bytes_per_device, one.xla, str(one)],
    "four": [four.devices, four.args_bytes, four.args_bytes_per_device, four.xla, str(four)],
    "same_table": one.flops == four.flops and one.peak == four.peak}))
'''


@pytest.mark.slow  # ~7 s: a process of its own with 4 devices, 4 compilations
def test_arguments_over_four_devices_give_per_device_figures():
    """Sharded arguments (4 simulated CPU devices): the `devices:` line with
    what the most loaded device holds, and XLA's analysis of the
    partitioned program, per device."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _PER_DEVICE_CHILD], capture_output=True,
                          text=True, timeout=300, cwd=root)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    devices, total, most, xla, text = r["four"]
    # K and B split by rows (2 of 8 rows each per device: 2 x 160 B), w copied
    # to every device (64 B)
    assert devices == 4 and total == 2 * 640 + 64 and most == 2 * 160 + 64
    assert ("devices: the arguments are laid out over 4, at most 384 B of their 1.3 KiB on "
            "one (the figures above: all devices together)") in text
    assert "XLA (program, per device):" in text and "XLA (gradient, per device):" in text
    one = r["one"]
    assert one[:3] == [1, total, total] and "devices:" not in one[4]
    assert "XLA (program):" in one[4]
    # the estimates are the whole program's either way; XLA's are per device
    assert r["same_table"]
    for name in ("program", "gradient"):
        assert xla[name]["flops"] < 0.5 * one[3][name]["flops"], (name, xla, one[3])


def test_the_cost_table_names_each_solves_solver():
    """`sd.cost` shows what "auto" chose for each solve of the program (a
    factorization's solver, an iterative solve's method)."""
    A = sd.sparse.from_dense(2 * np.eye(4) - np.eye(4, k=1) - np.eye(4, k=-1), tags={"spd"})
    report = sd.cost(lambda b: snp.sum(sd.linalg.solve(A, b) ** 2), np.ones(4))
    assert "linalg.factor" in str(report) and "solver 'klu'" in str(report)
    amg = sd.cost(lambda b: sd.linalg.solve(A, b, solver="amg"), np.ones(4))
    assert amg.rows[0].note.startswith("solver 'cg', per iteration")
