"""The disk level of a memory budget (`sd.MemoryBudget(ram=..., disk=dir)`):
a scan's carries on disk give the RAM gradient bit for bit, through every
transform; each run's file has no name and is closed when the gradient
returns, when a check in the loop fails, when a write fails, and nothing is
left in the directory when the process is killed; a while loop's snapshots
and odeint's replay snapshots on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, NonFiniteError, StorageError
from sciad.primitives import _disk
from sciad.primitives._schedules import TwoLevel
from helpers import BUDGET_N, BUDGET_STEPS, budget_heat_loss, scan_adjoint_schedule

N, STEPS = BUDGET_N, BUDGET_STEPS  # a carry of 512 bytes
_loss, _schedule = budget_heat_loss, scan_adjoint_schedule


@pytest.fixture
def heat(rng):
    return rng.uniform(0.5, 1.5, N), np.sin(np.linspace(0, 3, N))


@pytest.fixture
def budgets(tmp_path):
    """Six carries in RAM, and the two-level schedule that fits in them: a
    carry on disk every 3 steps, 2 snapshots (explicit: for carries this
    small a budget keeps them in RAM, `test_a_budget_uses_the_disk_...`)."""
    return sd.Binomial(4), sd.TwoLevel(3, 2, str(tmp_path))


@pytest.mark.parametrize("reverse", [False, True])
def test_carries_on_disk_give_the_ram_gradient_bit_for_bit(heat, budgets, tmp_path, reverse):
    k, u0 = heat
    ram, disk = budgets
    grad_ram = sd.function(sd.grad(lambda k: _loss(k, u0, ram, reverse)))
    grad_disk = sd.function(sd.grad(lambda k: _loss(k, u0, disk, reverse)))
    g = sd.trace(sd.grad(lambda k: _loss(k, u0, disk, reverse)), k)
    (adj,) = [n for n in g.nodes if n.primitive.name == "scan_adjoint"]
    assert adj.params["schedule"] == TwoLevel(3, 2, str(tmp_path))
    again = sd.graph.Graph.from_json(g.to_json())  # (the schedule round-trips)
    assert again.pretty(source=False) == g.pretty(source=False)
    assert [n.params.get("schedule") for n in again.nodes] == [n.params.get("schedule")
                                                              for n in g.nodes]
    want = np.asarray(grad_ram(k))
    got = np.asarray(grad_disk(k))
    assert np.array_equal(got, want)
    np.testing.assert_allclose(got, sd.grad(lambda k: _loss(k, u0, None, reverse))(k),
                               rtol=1e-12)
    # sd.cost shows the two levels: fewer steps recomputed than RAM alone
    text = str(sd.cost(sd.grad(lambda k: _loss(k, u0, disk, reverse)), k))
    assert "a carry on disk every 3 steps" in text and "34 carries (17.0 KiB) on disk" in text
    recomputed = int(text.split("within each: ")[1].split(" forward")[0])
    ram_text = str(sd.cost(sd.grad(lambda k: _loss(k, u0, ram, reverse)), k))
    assert recomputed < int(ram_text.split("binomial(4): ")[1].split(" forward")[0])
    # nothing in the directory, no store open, after the calls
    assert os.listdir(tmp_path) == [] and _disk.open_stores() == 0


@pytest.mark.slow  # ~16 s: four transforms' programs (the disk's runs through a loop run by default)
def test_disk_carries_through_fori_loop_forward_mode_vmap_and_to_jax(heat, budgets, rng):
    """(Compiled in other loops, the steps may round in their last bit
    otherwise than the RAM schedule's: equal to 1e-14.)"""
    k, u0 = heat
    ram, disk = budgets

    def fori(k, budget):
        u = sd.fori_loop(0, STEPS, lambda i, u: u + 0.05 * k * (snp.roll(u, 1) - u), u0,
                         checkpoints=budget)
        return snp.sum(snp.sin(u) * u)

    v = rng.normal(size=N)
    ks = np.stack([k, 2 * k, 0.5 * k])
    for f in (fori, lambda k, b: _loss(k, u0, b)):
        assert isinstance(_schedule(sd.grad(lambda k: f(k, disk)), k), TwoLevel)
        for make, x in ((lambda b: sd.grad(lambda k: f(k, b)), k),
                        (lambda b: lambda k: sd.hvp(lambda k: f(k, b), k, v), k),
                        (lambda b: sd.vmap(sd.grad(lambda k: f(k, b))), ks)):
            want, got = (np.asarray(sd.function(make(b))(x)) for b in (ram, disk))
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
        # JAX's own transforms of the exported gradient: jit, and vmap (the
        # host calls see the batch axis)
        g_ram = sd.to_jax(sd.grad(lambda k: f(k, ram)))
        g_disk = sd.to_jax(sd.grad(lambda k: f(k, disk)))
        for t, x in ((jax.jit, k), (lambda g: jax.jit(jax.vmap(g)), ks)):
            np.testing.assert_allclose(t(g_disk)(jnp.asarray(x)), t(g_ram)(jnp.asarray(x)),
                                       rtol=1e-14, atol=1e-15)
    assert _disk.open_stores() == 0


def _while_loss(k, u0, stop, budget):
    _, u = sd.while_loop(lambda c: c[0] < stop,
                         lambda c: (c[0] + 1, c[1] + 0.05 * k * (snp.roll(c[1], 1) - c[1])),
                         (0, u0), max_steps=200, checkpoints=budget)
    return snp.sum(snp.sin(u) * u)


def test_a_while_loops_snapshots_on_disk(heat, tmp_path, rng):
    """Snapshots on disk (`Segments(25, directory)`): the same gradient bit
    for bit, under `sd.vmap` and JAX's `vmap` with each example stopping at
    another step, and in forward mode."""
    k, u0 = heat
    disk = sd.Segments(25, tmp_path)
    g = sd.trace(sd.grad(lambda k: _while_loss(k, u0, 150, disk)), k)
    (adj,) = [n for n in g.nodes if n.primitive.name == "while_adjoint"]
    assert (adj.params["snapshots"], adj.params["disk"]) == (25, str(tmp_path))
    assert "segments(25) on disk" in sd.trace(lambda k: _while_loss(k, u0, 150, disk),
                                             k).pretty(source=False)
    assert ("at most 200 steps, segments(25): at most 400 forward steps recomputed, 25 carries"
            in str(sd.cost(sd.grad(lambda k: _while_loss(k, u0, 150, disk)), k)))
    want = sd.grad(lambda k: _while_loss(k, u0, 150, None))(k)
    assert np.array_equal(sd.function(sd.grad(lambda k: _while_loss(k, u0, 150, disk)))(k),
                          want)
    ks, stops = np.stack([k, 2 * k, 0.5 * k]), np.array([150, 40, 199])
    want = sd.vmap(sd.grad(lambda k, s: _while_loss(k, u0, s, None)))(ks, stops)
    got = sd.vmap(sd.grad(lambda k, s: _while_loss(k, u0, s, disk)))(ks, stops)
    assert np.array_equal(np.asarray(got), np.asarray(want))
    gj = sd.to_jax(sd.grad(lambda k, s: _while_loss(k, u0, s, disk)))
    np.testing.assert_allclose(jax.jit(jax.vmap(gj))(jnp.asarray(ks), jnp.asarray(stops)),
                               want, rtol=1e-14, atol=1e-15)
    v = rng.normal(size=N)
    np.testing.assert_allclose(sd.hvp(lambda k: _while_loss(k, u0, 150, disk), k, v),
                               sd.hvp(lambda k: _while_loss(k, u0, 150, None), k, v),
                               rtol=1e-14, atol=1e-15)
    assert os.listdir(tmp_path) == [] and _disk.open_stores() == 0


def test_odeints_replay_keeps_its_snapshots_on_disk(heat, tmp_path):
    """A Runge-Kutta solve's checkpointed adjoint replays each output
    interval as a while loop: a budget whose replay snapshots do not fit in
    RAM (12 states of 512 bytes; a replay of 400 steps needs about 41) puts
    them on disk, 45 of them, with a segment of 9 states in RAM; a budget
    without `disk=` says to give one; the interpolated adjoint, which reads
    every step's state, refuses (BDF's replay: test_stiff_checkpoints.py)."""
    k, u0 = heat

    def loss(k, budget, adjoint=None):
        ys = sd.ode.odeint(lambda t, y, k: -k * y + 0.1 * snp.roll(y, 1), u0,
                           np.linspace(0, 1, 3), k, solver="tsit5", max_steps=400,
                           checkpoints=budget, adjoint=adjoint)
        return snp.sum(ys ** 2)

    disk = sd.MemoryBudget(ram="6KiB", disk=tmp_path)
    g = sd.trace(sd.grad(lambda k: loss(k, disk)), k)
    (node,) = [n for n in g.nodes if n.primitive.name == "ode.odeint"]
    assert (node.params["checkpoints"], node.params["disk"]) == (45, str(tmp_path))
    np.testing.assert_allclose(sd.function(sd.grad(lambda k: loss(k, disk)))(k),
                               sd.grad(lambda k: loss(k, None))(k), rtol=1e-12)
    assert os.listdir(tmp_path) == [] and _disk.open_stores() == 0
    with pytest.raises(InvalidOptionError, match="or give the budget `disk=`"):
        sd.trace(sd.grad(lambda k: loss(k, sd.MemoryBudget(ram="6KiB"))), k)
    with pytest.raises(InvalidOptionError, match="reads the state at every step"):
        sd.trace(sd.grad(lambda k: loss(k, disk, "interpolated")), k)


def test_a_check_that_fails_in_the_loop_closes_the_runs_file(heat, tmp_path):
    """A solve in the step whose right-hand side is NaN only in the backward
    pass (the loss's derivative at 0 is infinite): the check fails while the
    carries are on disk, and the run's store is closed before it raises,
    eagerly, compiled, under `jax.jit` of `to_jax` and `sd.vmap`, and over
    200 failing calls."""
    k, u0 = heat
    A = np.eye(N) * 4 + np.diag(np.ones(N - 1), 1) + np.diag(np.ones(N - 1), -1)
    disk = sd.TwoLevel(3, 2, str(tmp_path))

    def loss(k):
        def step(u, _):
            return sd.linalg.solve(A, u + 0.1 * k * u), None

        u, _ = sd.scan(step, u0, length=60, checkpoints=disk)
        return snp.sqrt(snp.sum(u ** 2) - snp.sum(u ** 2))  # (its derivative: NaN)

    assert isinstance(_schedule(sd.grad(loss), k), TwoLevel)
    for fn in (sd.grad(loss), sd.function(sd.grad(loss))):
        with pytest.raises(NonFiniteError, match="right-hand side"):
            fn(k)
        assert _disk.open_stores() == 0
    with pytest.raises(NonFiniteError), sd.errors.unwrapped():
        jax.block_until_ready(jax.jit(sd.to_jax(sd.grad(loss)))(jnp.asarray(k)))
    assert _disk.open_stores() == 0 and os.listdir(tmp_path) == []
    with pytest.raises(NonFiniteError, match="right-hand side"):  # (a batch: one store)
        sd.function(sd.vmap(sd.grad(loss)))(np.stack([k, 2 * k]))
    assert _disk.open_stores() == 0
    # 200 failing calls leave no store, file descriptor or memory behind
    from helpers import rss_mib

    failing, fds = sd.function(sd.grad(loss)), lambda: len(os.listdir("/proc/self/fd"))

    def calls(count):
        for _ in range(count):
            with pytest.raises(NonFiniteError):
                failing(k)

    calls(20)
    before, files = rss_mib(), fds()
    calls(200)
    assert rss_mib() - before < 8.0 and fds() == files and _disk.open_stores() == 0

    def while_loss(k):  # (its snapshots on disk)
        _, u = sd.while_loop(lambda c: c[0] < 150,
                             lambda c: (c[0] + 1, sd.linalg.solve(A, c[1] + 0.1 * k * c[1])),
                             (0, u0), max_steps=200, checkpoints=sd.Segments(25, tmp_path))
        return snp.sqrt(snp.sum(u ** 2) - snp.sum(u ** 2))

    with pytest.raises(NonFiniteError, match="right-hand side"):
        sd.grad(while_loss)(k)
    assert _disk.open_stores() == 0 and os.listdir(tmp_path) == []


def test_a_failed_write_is_a_storage_error_that_closes_the_file(heat, budgets, monkeypatch):
    k, u0 = heat
    _, disk = budgets

    def full(*args):
        raise OSError(28, "No space left on device")

    grad = sd.function(sd.grad(lambda k: _loss(k, u0, disk)))
    monkeypatch.setattr(_disk.os, "pwritev", full)
    with pytest.raises(StorageError, match="writing a checkpointed loop's carry on disk "
                                           r"failed \(OSError: \[Errno 28\] No space"):
        grad(k)
    assert _disk.open_stores() == 0
    monkeypatch.undo()
    assert np.all(np.isfinite(grad(k)))  # (the next call writes again)


def test_the_store_gives_back_the_bytes_it_was_given(tmp_path, rng):
    arrays = [rng.normal(size=(3, 5)), np.array([np.nan, -0.0, np.inf, 5e-324]),
              (rng.normal(size=7) + 1j * rng.normal(size=7)).astype(np.complex64),
              rng.integers(-9, 9, size=(2, 2)).astype(np.int8), np.array([True, False])]
    layout = [(a.shape, a.dtype) for a in arrays]

    def at(slot, b):  # what example b of slot `slot` holds
        return [a + slot - b if a.dtype.kind in "fc" else a for a in arrays]

    store = _disk.Store(str(tmp_path))
    try:  # a batch of 2 examples; example 1 skips slot 1
        for slot in range(4):
            store.write(np.array([slot, slot]), np.array([True, slot != 1]),
                        [np.stack(x) for x in zip(at(slot, 0), at(slot, 1))])
        got = [store.read(np.array([slot, slot]), np.array([slot - 1, slot - 1]), layout)
               for slot in (3, 2, 1, 0)]
        ragged = store.read(np.array([2, -1]), np.array([-1, -1]), layout)
    finally:
        store.close()
    for slot, back in zip((3, 2, 1, 0), got):
        for b in (0, 1):
            want = at(slot, b) if (slot, b) != (1, 1) else [np.zeros_like(a) for a in arrays]
            for a, x in zip(want, back):
                assert x.dtype == a.dtype and x.shape == (2,) + a.shape
                assert x[b].tobytes() == a.tobytes()
    for a, x in zip(at(2, 0), ragged):  # (a negative slot: an example whose loop is done)
        assert x[0].tobytes() == a.tobytes() and not np.any(x[1])
    assert os.listdir(tmp_path) == []


def test_a_killed_process_leaves_nothing_in_the_directory(tmp_path):
    """The process is killed (SIGKILL) while its carries are on disk: the
    file had no name, so the directory is empty."""
    code = textwrap.dedent(f"""
        import os, signal
        import numpy as np, sciad as sd, sciad.numpy as snp
        from sciad.primitives import _disk

        def killed(self, *args):
            assert os.fstat(self.fd).st_size > 0  # (the carries were written)
            os.kill(os.getpid(), signal.SIGKILL)

        _disk.Store.read = killed

        def loss(k):
            u, _ = sd.scan(lambda u, _: (u + 0.1 * k * (snp.roll(u, 1) - u), None),
                           np.ones(64), length=100,
                           checkpoints=sd.TwoLevel(3, 2, {str(tmp_path)!r}))
            return snp.sum(u ** 2)

        sd.grad(loss)(np.ones(64))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert os.listdir(tmp_path) == []


def test_a_budget_uses_the_disk_where_the_steps_it_spares_take_longer(tmp_path):
    """The choice between RAM alone and the disk (traced, not run): a
    100,000-point heat equation's 0.8 MB carries go to disk under 8 MiB
    (they spare about 4,300 recomputed steps of ~0.3 ms for 285 trips to
    disk); a 200-point one's 1.6 KB carries stay in RAM (a trip to disk, two
    host calls, costs more than the ~30 steps it spares). The same for a
    while loop's snapshots."""
    def heat(n, steps, budget, loop="scan"):
        u0, k = np.ones(n), np.ones(n)

        def step(u):
            return u + 0.1 * k * (snp.roll(u, 1) - 2.0 * u + snp.roll(u, -1))

        def loss(k0):
            if loop == "scan":
                u, _ = sd.scan(lambda u, _: (step(u) * k0, None), u0, length=steps,
                               checkpoints=budget)
            else:
                _, u = sd.while_loop(lambda c: c[0] < steps,
                                     lambda c: (c[0] + 1, step(c[1]) * k0), (0, u0),
                                     max_steps=steps, checkpoints=budget)
            return snp.sum(u ** 2)

        g = sd.trace(sd.grad(loss), 1.0)
        (adj,) = [n for n in g.nodes if n.primitive.name.endswith("_adjoint")]
        return adj.params

    big = heat(100_000, 2000, sd.MemoryBudget(ram="8MiB", disk=tmp_path))["schedule"]
    assert big == TwoLevel(7, 6, str(tmp_path), budget=8 * 2 ** 20)
    small = heat(200, 10_000, sd.MemoryBudget(ram="16KiB", disk=tmp_path))["schedule"]
    assert small == sd.Binomial(8, budget=16 * 2 ** 10)
    p = heat(100_000, 2000, sd.MemoryBudget(ram="8MiB", disk=tmp_path), "while")
    assert (p["snapshots"], p["disk"]) == (286, str(tmp_path))
    p = heat(200, 2000, sd.MemoryBudget(ram="16KiB", disk=tmp_path), "while")
    assert p["schedule"] == sd.Binomial(8, budget=16 * 2 ** 10)


def test_bad_directories_are_refused(heat, tmp_path):
    k, u0 = heat
    disk = sd.MemoryBudget(ram="64KiB", disk=tmp_path)
    with pytest.raises(InvalidOptionError, match="`disk` must name an existing directory"):
        sd.MemoryBudget(ram="1MiB", disk=tmp_path / "missing")
    with pytest.raises(InvalidOptionError, match="`disk` must be a directory"):
        sd.MemoryBudget(ram="1MiB", disk=3.5)
    with pytest.raises(InvalidOptionError, match="`disk` must name an existing directory"):
        sd.TwoLevel(3, 2, str(tmp_path / "missing"))
    assert sd.MemoryBudget(ram="1MiB", disk=True).disk is not None
    # a budget that holds every carry keeps them in RAM, disk or not
    assert _schedule(sd.grad(lambda k: _loss(k, u0, disk)), k) == sd.Binomial(103, 65536)


def test_a_hundred_disk_budgeted_gradients_keep_memory_and_files_flat(heat, budgets):
    from helpers import rss_mib

    k, u0 = heat
    grad = sd.function(sd.grad(lambda k: _loss(k, u0, budgets[1])))
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    for _ in range(10):
        jax.block_until_ready(grad(k))
    before, files = rss_mib(), fds()
    for _ in range(100):
        jax.block_until_ready(grad(k))
    assert rss_mib() - before < 8.0 and fds() == files and _disk.open_stores() == 0
    # two threads calling the same program: a store each, the same gradient
    from concurrent.futures import ThreadPoolExecutor

    want = np.asarray(grad(k))
    with ThreadPoolExecutor(2) as pool:
        for got in pool.map(lambda _: np.asarray(grad(k)), range(6)):
            assert np.array_equal(got, want)
    assert _disk.open_stores() == 0
