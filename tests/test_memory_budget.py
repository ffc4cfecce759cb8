"""`checkpoints=sd.MemoryBudget(ram=...)` on the loops: the schedule chosen
from the carry's size, the same gradient as storing every step, the budget
shown by `sd.cost` and in the graph, and budgets that hold no carry refused
with the minimum."""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError

N, STEPS = 64, 50  # a carry of 512 bytes


def _heat(k, u0, steps=STEPS, checkpoints=None):
    def step(u, _):
        u = u + 0.1 * k * (snp.roll(u, 1) + snp.roll(u, -1) - 2 * u)
        return u, None

    u, _ = sd.scan(step, u0, length=steps, checkpoints=checkpoints)
    return snp.sum(u ** 2)


def _adjoint_schedule(g):
    (adj,) = [n for n in g.nodes if n.primitive.name == "scan_adjoint"]
    return adj.params["schedule"]


@pytest.fixture
def heat(rng):
    return rng.uniform(0.5, 1.5, N), np.sin(np.linspace(0, 3, N))


def test_a_scan_budget_stores_the_carries_that_fit_for_the_same_gradient(heat):
    k, u0 = heat
    want = sd.grad(_heat)(k, u0)
    budget = sd.MemoryBudget(ram="4KiB")  # 8 carries of 512 bytes: 6 snapshots
    loss = lambda k: _heat(k, u0, checkpoints=budget)  # noqa: E731
    g = sd.trace(sd.grad(loss), k)
    assert _adjoint_schedule(g) == sd.Binomial(6, budget=4096)
    assert "binomial(6) for a 4.0 KiB budget" in g.pretty(source=False)
    np.testing.assert_allclose(sd.function(sd.grad(loss))(k), want, rtol=1e-12)
    # sd.cost names the schedule and its recomputation; the carries the
    # gradient program holds (the forward pass's stored cells, the backward
    # pass's) fit in the budget
    report = sd.cost(sd.grad(loss), k)
    text = str(report)
    recomputed = int(text.split("for a 4.0 KiB budget: ")[1].split(" forward")[0])
    assert STEPS < recomputed < STEPS * 3, text
    (fwd,) = [n for n in g.nodes if n.primitive.name == "scan"]
    cells = fwd.params["body"].inputs[2].type  # (the stored cells, a carry)
    assert cells.shape[0] * N * 8 <= budget.ram, cells
    # a graph with a budgeted schedule round-trips
    again = sd.graph.Graph.from_json(g.to_json())
    assert again.pretty(source=False) == g.pretty(source=False)


def test_a_budget_that_holds_every_carry_recomputes_each_step_once(heat):
    # (a checkpointed step's residuals are recomputed from its carry: once
    # each, the least a checkpointed loop does)
    k, u0 = heat
    loss = lambda k: _heat(k, u0, checkpoints=sd.MemoryBudget(ram=10**6))  # noqa: E731
    g = sd.trace(sd.grad(loss), k)
    assert _adjoint_schedule(g) == sd.Binomial(STEPS, budget=10**6)
    assert f"{STEPS - 1} forward steps recomputed" in str(sd.cost(sd.grad(loss), k))


def test_a_budget_smaller_than_one_carry_is_refused_with_the_minimum(heat):
    k, u0 = heat
    with pytest.raises(InvalidOptionError, match=r"scan: a memory budget of 1.0 KiB holds 2 "
                                                 r"carries of this loop \(512 B each\); "
                                                 r"reverse mode needs at least 3 .* Give at "
                                                 r"least ram=1536") as info:
        sd.trace(lambda k: _heat(k, u0, checkpoints=sd.MemoryBudget(ram=1024)), k)
    assert "test_memory_budget.py" in str(info.value)  # the user's line
    with pytest.raises(InvalidOptionError, match=r"MemoryBudget: `ram` must be a number of "
                                                 r"bytes .* got '40 parsecs'"):
        sd.MemoryBudget(ram="40 parsecs")
    for bad in (0, -1, None, True):
        with pytest.raises(InvalidOptionError, match="MemoryBudget: `ram` must"):
            sd.MemoryBudget(ram=bad)
    assert sd.MemoryBudget("1MiB") == sd.MemoryBudget(2 ** 20)


def test_fori_loop_and_forward_mode_under_a_budget(heat, rng):
    k, u0 = heat

    def loss(k, checkpoints):
        def body(i, u):
            return u + 0.05 * k * (snp.roll(u, 1) - u)
        return snp.sum(sd.fori_loop(0, 30, body, u0, checkpoints=checkpoints) ** 2)

    budget = sd.MemoryBudget(ram=5 * (N * 8 + 8))  # five carries and their counters
    g = sd.trace(sd.grad(lambda k: loss(k, budget)), k)
    assert _adjoint_schedule(g) == sd.Binomial(3, budget=budget.ram)
    np.testing.assert_allclose(sd.grad(lambda k: loss(k, budget))(k),
                               sd.grad(lambda k: loss(k, None))(k), rtol=1e-12)
    v = rng.standard_normal(N)
    np.testing.assert_allclose(sd.jvp(lambda k: loss(k, budget), (k,), (v,))[1],
                               sd.jvp(lambda k: loss(k, None), (k,), (v,))[1], rtol=1e-12)


def test_a_while_loop_budget_picks_segments_where_they_fit_else_binomial(heat):
    k, u0 = heat

    def loss(k, checkpoints, max_steps=400):
        def body(s):
            u, t = s
            return u + 0.01 * k * (snp.roll(u, 1) - u), t + 1.0

        u, _ = sd.while_loop(lambda s: s[1] < 37.0, body, (u0, 0.0), max_steps=max_steps,
                             checkpoints=checkpoints)
        return snp.sum(u ** 2)

    want = sd.grad(lambda k: loss(k, None))(k)
    carry = N * 8 + 8  # the value and the time
    for carries, kind in ((46, "segments"), (30, "binomial")):
        budget = sd.MemoryBudget(ram=carries * carry)
        g = sd.trace(sd.grad(lambda k: loss(k, budget)), k)
        text = g.pretty(source=False)
        if kind == "segments":  # s + ceil(400 / s) + 1 <= 46: the largest s is 32
            (adj,) = [n for n in g.nodes if n.primitive.name == "while_adjoint"]
            assert adj.params["snapshots"] == 32, text
        else:  # 2 sqrt(400) + 1 = 41 carries do not fit: the bounded loop's binomial
            assert _adjoint_schedule(g) == sd.Binomial(28, budget=budget.ram), text
        np.testing.assert_allclose(sd.grad(lambda k: loss(k, budget))(k), want, rtol=1e-12)


def _ode_node(g):
    (node,) = [n for n in g.nodes if n.primitive.name == "ode.odeint"]
    return node


@pytest.mark.slow  # ~8 s; odeint under a budget also runs in the disk-budget tests
def test_odeint_under_a_budget_replays_with_the_snapshots_that_fit(rng):
    n = 32  # states of 256 bytes
    y0, k = rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, n)
    ts = np.linspace(0.0, 1.0, 3)

    def loss(k, checkpoints, solver="tsit5", max_steps=400, adjoint=None):
        ys = sd.ode.odeint(lambda t, y, k: -k * y + 0.1 * snp.roll(y, 1), y0, ts, k,
                           solver=solver, max_steps=max_steps, checkpoints=checkpoints,
                           adjoint=adjoint)
        return snp.sum(ys[-1] ** 2)

    want = sd.grad(lambda k: loss(k, None))(k)
    # 401 states do not fit 46 of them: the replay's segments, s + ceil(400 / s) + 1 <= 46
    budget = sd.MemoryBudget(ram=46 * n * 8)
    g = sd.trace(sd.grad(lambda k: loss(k, budget)), k)
    assert _ode_node(g).params["checkpoints"] == 32
    np.testing.assert_allclose(sd.grad(lambda k: loss(k, budget))(k), want, rtol=1e-10)
    # every state fits: the forward pass records them, as without a budget
    g = sd.trace(sd.grad(lambda k: loss(k, sd.MemoryBudget("1MiB"))), k)
    assert "checkpoints" not in _ode_node(g).params
    # a replay needs about 2 sqrt(max_steps) states
    with pytest.raises(InvalidOptionError, match=r"ode.odeint: the checkpointed adjoint "
                                                 r"replays .* holds 30 states of 256 B: give "
                                                 r"at least ram=11008"):
        sd.trace(lambda k: loss(k, sd.MemoryBudget(ram=30 * n * 8)), k)
    # BDF and the interpolated adjoint read every step's state
    with pytest.raises(InvalidOptionError, match=r"'bdf''s reverse mode reads the state at "
                                                 r"every step \(max_steps \+ 1 = 401 states"):
        sd.trace(lambda k: loss(k, budget, solver="bdf"), k)
    with pytest.raises(InvalidOptionError, match="the interpolated adjoint reads the state"):
        sd.trace(lambda k: loss(k, budget, adjoint="interpolated"), k)
    small = sd.MemoryBudget(ram=401 * n * 8)  # (BDF with all of its states held)
    np.testing.assert_allclose(sd.grad(lambda k: loss(k, small, solver="bdf"))(k),
                               sd.grad(lambda k: loss(k, None, solver="bdf"))(k), rtol=1e-10)


def _nested(k, u0, checkpoints=None, outer="scan"):
    """An outer loop of 30 steps whose step is an inner scan of 20 (stored
    whole by the inner reverse pass: 20 carries of 512 bytes)."""
    def inner(u):
        def step(v, _):
            return v + 0.05 * k * (snp.roll(v, 1) + snp.roll(v, -1) - 2 * v), None
        return sd.scan(step, u, length=20)[0]

    if outer == "scan":
        u, _ = sd.scan(lambda u, _: (inner(u), None), u0, length=30, checkpoints=checkpoints)
    else:
        _, u = sd.while_loop(lambda c: c[0] < 30, lambda c: (c[0] + 1, inner(c[1])), (0, u0),
                             max_steps=40, checkpoints=checkpoints)
    return snp.sum(u ** 2)


@pytest.mark.parametrize("outer", ["scan", "while_loop"])
def test_a_nested_loops_own_reverse_pass_counts_against_the_budget(heat, outer):
    """The outer loop's schedule leaves the inner loop's reverse pass its
    share of the budget (`inner_needs`: the peak of the body's gradient
    program, about 14 KiB here): 24 KiB hold 20 outer carries beside it,
    not 48; the gradient program's peak stays near the budget (it held
    every outer carry, 29 KiB, when the inner needs were not counted); the
    gradient is the unbudgeted one; and a budget the inner pass alone
    outgrows is refused, saying the minimum and why."""
    from sciad.primitives._schedules import inner_needs

    k, u0 = heat
    budget = sd.MemoryBudget(ram="24KiB")
    loss = lambda k: _nested(k, u0, budget, outer)  # noqa: E731
    (node,) = [n for n in sd.trace(loss, k).nodes if n.primitive.name in ("scan", "while")]
    inner = inner_needs(node.params["body"])
    assert 10 * 1024 < inner < 20 * 1024
    want = (budget.ram - inner) // (N * 8)  # (the outer carries that fit beside it)
    sched = node.params["checkpoints"]
    if outer == "scan":
        assert sched == sd.Binomial(want - 2, budget=budget.ram)
    else:
        assert sched.snapshots + -(-40 // sched.snapshots) + 1 <= want
    assert sd.cost(sd.grad(loss), k).peak <= budget.ram + 2048
    np.testing.assert_allclose(sd.function(sd.grad(loss))(k),
                               sd.function(sd.grad(lambda k: _nested(k, u0, None, outer)))(k),
                               rtol=1e-12)
    with pytest.raises(InvalidOptionError, match="beside the .* a step's own reverse pass"):
        sd.trace(sd.grad(lambda k: _nested(k, u0, sd.MemoryBudget(ram="8KiB"), outer)), k)


@pytest.mark.slow  # ~16 s: a hundred calls of three budgeted gradients
def test_a_hundred_budgeted_gradients_keep_the_process_memory_flat(rng):
    """Issue 52's "flat across calls": 100 calls of a budgeted gradient (a
    scan, a while loop, an ODE adjoint) leave the process's resident memory
    where ten calls left it. Each call stores 256 KiB of carries: a call
    that kept them would grow the process by 25 MiB over the hundred."""
    import jax
    from helpers import rss_mib

    n = 4096  # a carry of 32 KiB
    k, u0 = rng.uniform(0.5, 1.5, n), np.sin(np.linspace(0, 3, n))
    budget = sd.MemoryBudget(ram="256KiB")

    def step(u, kk):
        return u + 0.1 * kk * (snp.roll(u, 1) + snp.roll(u, -1) - 2 * u)

    def scan_loss(kk):
        u, _ = sd.scan(lambda u, _: (step(u, kk), None), u0, length=200, checkpoints=budget)
        return snp.sum(u ** 2)

    def while_loss(kk):
        _, u = sd.while_loop(lambda c: c[0] < 150, lambda c: (c[0] + 1, step(c[1], kk)),
                             (0, u0), max_steps=200, checkpoints=budget)
        return snp.sum(u ** 2)

    def ode_loss(kk):
        ys = sd.ode.odeint(lambda t, y, kk: -kk[:64] * y, u0[:64], np.linspace(0, 1, 3), kk,
                           solver="tsit5", max_steps=400,
                           checkpoints=sd.MemoryBudget(ram="24KiB"))
        return snp.sum(ys ** 2)

    grads = [sd.function(sd.grad(f)) for f in (scan_loss, while_loss, ode_loss)]

    def calls(count):
        for _ in range(count):
            for g in grads:
                jax.block_until_ready(g(k))

    calls(10)
    before = rss_mib()
    calls(100)
    assert rss_mib() - before < 8.0
