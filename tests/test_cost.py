"""`sd.cost`: FLOPs, bytes and memory per node against XLA's own analysis of
the compiled programs, the gradient's memory under checkpoint schedules,
sparse factorizations' fill, and the printed table."""

import numpy as np
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
