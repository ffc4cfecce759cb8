"""The host level of a memory budget (`sd.MemoryBudget(ram=..., host=...)`):
on a GPU, a scan's carries at its segments' starts in pinned host memory.
On the CPU the level's program runs with both memory spaces in the
process's memory: there it must give the RAM gradient bit for bit through
every transform, and a budget must choose it only where an accelerator
runs the program. The GPU tests (marked `gpu`) check that XLA places the
carries in host memory and that the device's memory holds only the RAM
level."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError
from sciad.primitives import _schedules
from sciad.primitives._schedules import TwoLevel
from helpers import BUDGET_N, BUDGET_STEPS, budget_heat_loss, scan_adjoint_schedule

N, STEPS = BUDGET_N, BUDGET_STEPS  # a carry of 512 bytes
_loss, _schedule = budget_heat_loss, scan_adjoint_schedule


def _fori(k, u0, checkpoints):
    u = sd.fori_loop(0, STEPS, lambda i, u: u + 0.05 * k * (snp.roll(u, 1) - u), u0,
                     checkpoints=checkpoints)
    return snp.sum(snp.sin(u) * u)


@pytest.fixture
def heat(rng):
    return rng.uniform(0.5, 1.5, N), np.sin(np.linspace(0, 3, N))


@pytest.mark.parametrize("reverse", [False, True])
def test_carries_in_host_memory_give_the_ram_gradient_bit_for_bit(heat, reverse):
    k, u0 = heat
    host = sd.TwoLevel(3, 2, host=True)
    g = sd.trace(sd.grad(lambda k: _loss(k, u0, host, reverse)), k)
    (adj,) = [n for n in g.nodes if n.primitive.name == "scan_adjoint"]
    assert adj.params["schedule"] == host
    again = sd.graph.Graph.from_json(g.to_json())  # (the schedule round-trips)
    assert [n.params.get("schedule") for n in again.nodes] == [n.params.get("schedule")
                                                              for n in g.nodes]
    want = np.asarray(sd.function(sd.grad(lambda k: _loss(k, u0, sd.Binomial(4), reverse)))(k))
    got = np.asarray(sd.function(sd.grad(lambda k: _loss(k, u0, host, reverse)))(k))
    assert np.array_equal(got, want)
    np.testing.assert_allclose(got, sd.grad(lambda k: _loss(k, u0, None, reverse))(k),
                               rtol=1e-12)
    text = str(sd.cost(sd.grad(lambda k: _loss(k, u0, host, reverse)), k))
    assert "a carry in host memory every 3 steps" in text
    assert "34 carries (17.0 KiB) in host memory" in text


@pytest.mark.slow  # ~10 s on the CPU; the disk level's twin runs by default
def test_host_carries_through_fori_loop_forward_mode_vmap_and_to_jax(heat, rng):
    """(Compiled in other loops, the steps may round in their last bit
    otherwise than the RAM schedule's: equal to 1e-14.)"""
    k, u0 = heat
    ram, host = sd.Binomial(4), sd.TwoLevel(3, 2, host=True)
    v = rng.normal(size=N)
    ks = np.stack([k, 2 * k, 0.5 * k])
    for f in (_fori, _loss):
        assert _schedule(sd.grad(lambda k: f(k, u0, host)), k) == host
        for make, x in ((lambda b: sd.grad(lambda k: f(k, u0, b)), k),
                        (lambda b: lambda k: sd.hvp(lambda k: f(k, u0, b), k, v), k),
                        (lambda b: sd.vmap(sd.grad(lambda k: f(k, u0, b))), ks)):
            want, got = (np.asarray(sd.function(make(b))(x)) for b in (ram, host))
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
        g_ram = sd.to_jax(sd.grad(lambda k: f(k, u0, ram)))
        g_host = sd.to_jax(sd.grad(lambda k: f(k, u0, host)))
        for t, x in ((jax.jit, k), (lambda g: jax.jit(jax.vmap(g)), ks)):
            np.testing.assert_allclose(t(g_host)(jnp.asarray(x)), t(g_ram)(jnp.asarray(x)),
                                       rtol=1e-14, atol=1e-15)


def test_the_host_level_lowers_for_a_gpu_with_its_placements(heat):
    """The exported CUDA program puts the kept carries in pinned host
    memory and takes each back to the device (one annotation each way; the
    copies themselves are XLA's host offloading, run by the GPU tests)."""
    k, u0 = heat
    f = sd.to_jax(sd.grad(lambda k: _loss(k, u0, sd.TwoLevel(3, 2, host=True))))
    for fn, shape in ((f, (N,)), (jax.vmap(f), (3, N))):
        text = jax.export.export(jax.jit(fn), platforms=["cuda"])(
            jax.ShapeDtypeStruct(shape, np.float64)).mlir_module()
        assert text.count('_xla_buffer_placement = "pinned_host"') == 1
        assert text.count('_xla_buffer_placement = "device"') == 1


def test_a_budget_uses_host_memory_only_on_an_accelerator(monkeypatch, tmp_path):
    """The choice, traced: on the CPU `host=` is not a level (RAM or disk
    as before); on an accelerator the bar's 100,000-point carries go to
    host memory under 8 MiB, before the disk; where `host` holds fewer of
    them than the segments need, the segments are longer (and at most
    `host` bytes are kept)."""
    def heat(n, steps, budget):
        u0, k = np.ones(n), np.ones(n)

        def loss(k0):
            u, _ = sd.scan(lambda u, _: (u + 0.1 * k * (snp.roll(u, 1) - 2.0 * u
                                                        + snp.roll(u, -1)) * k0, None),
                           u0, length=steps, checkpoints=budget)
            return snp.sum(u ** 2)

        return _schedule(sd.grad(loss), 1.0)

    mib = 2 ** 20
    budget = sd.MemoryBudget(ram="8MiB", disk=tmp_path, host="4GiB")
    monkeypatch.setattr(_schedules, "accelerator", lambda: False)
    assert heat(100_000, 2000, budget) == TwoLevel(7, 6, str(tmp_path), budget=8 * mib)
    assert heat(100_000, 2000, sd.MemoryBudget(ram="8MiB", host="4GiB")) == sd.Binomial(
        8, budget=8 * mib)
    monkeypatch.setattr(_schedules, "accelerator", lambda: True)
    # (another budget: a loop's trace is cached with its budget)
    budget = sd.MemoryBudget(ram="8MiB", disk=tmp_path, host="3GiB")
    assert heat(100_000, 2000, budget) == TwoLevel(7, 6, host=True, budget=8 * mib)
    small = heat(100_000, 2000, sd.MemoryBudget(ram="8MiB", host="80MB"))  # 100 carries
    m, _ = small.segments(2000)
    assert small == TwoLevel(20, 6, host=True, budget=8 * mib) and m - 1 <= 100
    # (a GPU loop's step costs about a copy of a small carry out and back:
    # small carries go too; a large carry's copies can outweigh its steps)
    assert heat(200, 10_000, sd.MemoryBudget(ram="16KiB", host="1GiB")) == TwoLevel(
        7, 6, host=True, budget=16 * 2 ** 10)
    assert _schedules.host_pays(100, 10, 2 ** 20, 0.0)
    assert not _schedules.host_pays(10, 10, 2 ** 30, 0.0)


def test_bad_host_budgets_and_two_level_schedules_are_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match="`host` must be a number of bytes"):
        sd.MemoryBudget(ram="1MiB", host="lots")
    with pytest.raises(InvalidOptionError, match="`host` must be at least 1 byte"):
        sd.MemoryBudget(ram="1MiB", host=0)
    with pytest.raises(InvalidOptionError, match="one second level.*got both"):
        sd.TwoLevel(3, 2, str(tmp_path), host=True)
    with pytest.raises(InvalidOptionError, match="one second level.*got neither"):
        sd.TwoLevel(3, 2)
    with pytest.raises(InvalidOptionError, match="`host` is True or False"):
        sd.TwoLevel(3, 2, host=1)
    b = sd.MemoryBudget(ram="1MiB", host="2GiB")
    assert b.host == 2 * 2 ** 30 and b == sd.MemoryBudget(ram=2 ** 20, host=2 * 2 ** 30)
    assert b != sd.MemoryBudget(ram="1MiB") and "host='2.0 GiB'" in repr(b)


def _bar_case(steps, budget):
    """The bar's heat equation, smaller: 100,000 points (0.8 MB a carry)."""
    n = 100_000

    def loss(k):
        def step(u, _):
            return u + 0.2 * k * (snp.roll(u, 1) + snp.roll(u, -1) - 2.0 * u), None

        u, _ = sd.scan(step, snp.sin(snp.linspace(0.0, 3.0, n)), length=steps,
                       checkpoints=budget)
        return 0.5 * snp.sum(u * u)

    return sd.to_jax(sd.grad(loss)), np.full(n, 0.5)


@pytest.mark.gpu
def test_on_a_gpu_the_carries_are_in_host_memory_and_the_gradient_is_the_rams():
    """XLA's compiled program keeps the level's carries in host memory (its
    host temporaries hold them) and the device's temporaries within the
    RAM budget's order; the gradient equals the unbudgeted one."""
    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")
    steps, carry = 400, 800_000
    budget = sd.MemoryBudget(ram="8MiB", host="1GiB")
    f, k = _bar_case(steps, budget)
    compiled = jax.jit(f).lower(k).compile()
    mem = compiled.memory_analysis()
    kept = (-(-steps // 7) - 1) * carry  # a carry every 7 steps (6 snapshots in 8 MiB)
    assert mem.host_temp_size_in_bytes >= kept, mem
    assert mem.temp_size_in_bytes < kept / 4, mem
    want = jax.jit(_bar_case(steps, None)[0])(k)
    got = compiled(k)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=0)
