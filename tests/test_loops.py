"""Loops as nodes: `sd.scan` and `sd.fori_loop` against JAX's `lax.scan`, in
forward and reverse mode and at second order; checkpointed reverse mode
against storing every step; the binomial schedule itself; dead carries and
loop-invariant hoisting; errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, ShapeError
from sciad.graph.passes import dce, optimize
from sciad.primitives._schedules import checkpoint_runs, revolve_actions
from sciad.primitives._replay import split_step

N, STEPS = 6, 12


def _heat_jax(k, u0, d, steps=STEPS):
    def step(u, _):
        lap = jnp.roll(u, 1) + jnp.roll(u, -1) - 2 * u
        u = u + 0.1 * k * lap
        return u, u[0] ** 2
    u, ys = jax.lax.scan(step, u0, length=steps)
    return jnp.sum((u - d) ** 2) + jnp.sum(ys)


def _heat_sd(k, u0, d, steps=STEPS, checkpoints=None):
    def step(u, _):
        lap = snp.roll(u, 1) + snp.roll(u, -1) - 2 * u
        u = u + 0.1 * k * lap
        return u, u[0] ** 2
    u, ys = sd.scan(step, u0, length=steps, checkpoints=checkpoints)
    return snp.sum((u - d) ** 2) + snp.sum(ys)


@pytest.fixture
def heat(rng):
    return rng.uniform(0.5, 1.5, N), np.sin(np.linspace(0, 3, N)), rng.normal(size=N)


@pytest.mark.parametrize("checkpoints", [None, pytest.param(1, marks=pytest.mark.slow), 3, 100,
                                         pytest.param(sd.EveryK(4), marks=pytest.mark.slow)])
def test_heat_value_grad_and_hvp_match_jax(heat, rng, checkpoints):
    k, u0, d = heat
    v = rng.normal(size=N)
    f = lambda k, u0: _heat_sd(k, u0, d, checkpoints=checkpoints)  # noqa: E731
    fj = lambda k, u0: _heat_jax(k, u0, d)  # noqa: E731
    value, (gk, gu) = sd.value_and_grad(f, argnums=(0, 1))(k, u0)
    np.testing.assert_allclose(value, fj(k, u0), rtol=1e-13)
    wk, wu = jax.grad(fj, argnums=(0, 1))(k, u0)
    np.testing.assert_allclose(gk, wk, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gu, wu, rtol=1e-12, atol=1e-14)
    h = sd.hvp(lambda k: f(k, u0), k, v)
    hj = jax.jvp(jax.grad(lambda k: fj(k, u0)), (k,), (v,))[1]
    np.testing.assert_allclose(h, hj, rtol=1e-11, atol=1e-13)


def test_checkpointed_gradient_equals_store_all(heat):
    k, u0, d = heat
    want = sd.grad(lambda k: _heat_sd(k, u0, d, steps=40))(k)
    for s in (2, 5, 40):
        got = sd.grad(lambda k: _heat_sd(k, u0, d, steps=40, checkpoints=s))(k)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_forward_mode_and_grad_of_grad(heat, rng):
    k, u0, d = heat
    v = rng.normal(size=N)
    f = lambda k: _heat_sd(k, u0, d)  # noqa: E731
    fj = lambda k: _heat_jax(k, u0, d)  # noqa: E731
    _, t = sd.jvp(f, (k,), (v,))
    np.testing.assert_allclose(t, jax.jvp(fj, (k,), (v,))[1], rtol=1e-12)
    # reverse over reverse, through the scan and through the checkpointed adjoint
    g2 = sd.grad(lambda k: snp.sum(sd.grad(f)(k) * v))(k)
    g2j = jax.grad(lambda k: jnp.sum(jax.grad(fj)(k) * v))(k)
    np.testing.assert_allclose(g2, g2j, rtol=1e-11, atol=1e-13)
    fc = lambda k: _heat_sd(k, u0, d, checkpoints=2)  # noqa: E731
    g2c = sd.grad(lambda k: snp.sum(sd.grad(fc)(k) * v))(k)
    np.testing.assert_allclose(g2c, g2j, rtol=1e-11, atol=1e-13)


@pytest.mark.slow  # ~6 s; the registry's check_rules covers scan
def test_check_rules_on_a_scan(heat):
    k, u0, d = heat
    sd.testing.check_rules(lambda k, u0: _heat_sd(k, u0, d, steps=5), k, u0)
    sd.testing.check_rules(lambda k, u0: _heat_sd(k, u0, d, steps=5, checkpoints=2), k, u0)


def test_pytrees_xs_reverse_and_integer_carries(rng):
    xs = {"a": rng.normal(size=(7, 3)), "b": rng.normal(size=7)}
    w = rng.normal(size=3)

    def f_sd(w, xs):
        def step(c, x):
            i, s = c
            s = snp.tanh(s * w + x["a"]) + x["b"]
            return (i + 1, s), {"s": s, "i": i}
        (n, s), ys = sd.scan(step, (0, snp.zeros(3)), xs, reverse=True)
        return snp.sum(s ** 2) + snp.sum(ys["s"][::2] * w), n, ys["i"]

    def f_jax(w, xs):
        def step(c, x):
            i, s = c
            s = jnp.tanh(s * w + x["a"]) + x["b"]
            return (i + 1, s), {"s": s, "i": i}
        (n, s), ys = jax.lax.scan(step, (0, jnp.zeros(3)), xs, reverse=True)
        return jnp.sum(s ** 2) + jnp.sum(ys["s"][::2] * w), n, ys["i"]

    out = sd.function(f_sd)(w, xs)
    want = f_jax(w, xs)
    np.testing.assert_allclose(out[0], want[0], rtol=1e-13)
    assert int(out[1]) == 7
    np.testing.assert_array_equal(out[2], want[2])
    g = sd.grad(lambda w, xs: f_sd(w, xs)[0], argnums=(0, 1))(w, xs)
    gj = jax.grad(lambda w, xs: f_jax(w, xs)[0], argnums=(0, 1))(w, xs)
    np.testing.assert_allclose(g[0], gj[0], rtol=1e-12)
    np.testing.assert_allclose(g[1]["a"], gj[1]["a"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g[1]["b"], gj[1]["b"], rtol=1e-12, atol=1e-15)


def test_fori_loop_with_an_implicit_step_factors_once(rng):
    # backward Euler on a 1-D Laplacian: the matrix is loop-invariant, so its
    # factorization is hoisted out of the loop, forward and in the adjoint
    n = 8
    lap = (np.diag(-2.0 * np.ones(n)) + np.diag(np.ones(n - 1), 1)
           + np.diag(np.ones(n - 1), -1))
    u0 = rng.normal(size=n)

    def f(kappa):
        A = snp.eye(n) - 0.1 * kappa * lap

        def body(i, u):
            return sd.linalg.solve(A, u + 0.01 * snp.sin(u))
        return snp.sum(sd.fori_loop(0, 15, body, u0) ** 2)

    def fj(kappa):
        A = jnp.eye(n) - 0.1 * kappa * lap
        return jnp.sum(jax.lax.fori_loop(0, 15, lambda i, u: jnp.linalg.solve(
            A, u + 0.01 * jnp.sin(u)), u0) ** 2)

    kappa = 1.3
    np.testing.assert_allclose(sd.function(f)(kappa), fj(kappa), rtol=1e-12)
    np.testing.assert_allclose(sd.grad(f)(kappa), jax.grad(fj)(kappa), rtol=1e-10)
    g = optimize(sd.trace(sd.grad(f), kappa))
    text = g.pretty(source=False)
    top = [n.primitive.name for n in g.nodes]
    assert top.count("linalg.factor") == 1, text  # once, outside both loops
    assert "linalg.factor" not in "".join(str(b) for n in g.nodes for b in n.subgraphs)


def test_closures_over_traced_values_are_operands(rng):
    a = rng.normal(size=4)

    def f(a, b):
        c, _ = sd.scan(lambda c, _: (c * snp.cos(a) + b, None), snp.ones(4), length=5)
        return snp.sum(c)

    def fj(a, b):
        c, _ = jax.lax.scan(lambda c, _: (c * jnp.cos(a) + b, None), jnp.ones(4), length=5)
        return jnp.sum(c)

    g = sd.trace(f, a, 0.5)
    (scan,) = [n for n in g.nodes if n.primitive.name == "scan"]
    assert scan.params["body"].num_consts == 2  # cos(a) (hoisted) and b
    got = sd.grad(f, argnums=(0, 1))(a, 0.5)
    want = jax.grad(fj, argnums=(0, 1))(a, 0.5)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_body_with_a_dead_value_reading_a_hoisted_const(rng):
    # the dead `c + zeros(2)` read `zeros(2)`, hoisted out of the body as a
    # const that no output needs: pruned from the body's inputs but not
    # from that node, the body read an undefined value (a KeyError in jvp)
    a = rng.normal(size=2)

    def f(a):
        def step(c, _):
            c + snp.zeros(2)
            return 0.5 * c + snp.sum(snp.sin(a * a)), None
        return sd.scan(step, snp.asarray(0.3), length=2)[0]

    _, t = sd.jvp(f, (a,), (np.ones(2),))
    np.testing.assert_allclose(t, 1.5 * np.sum(2 * a * np.cos(a * a)), rtol=1e-12)


def test_dce_drops_dead_carries_and_outputs():
    def f(x):
        def step(c, _):
            a, b, n = c
            return (a * 2.0, b + a, n + 1), (a, b)
        (a, b, n), (ys_a, ys_b) = sd.scan(step, (x, x, 0), length=3)
        return a + ys_a[1]  # b, n and ys_b are dead; a needs nothing else

    g = dce(sd.trace(f, 1.0))
    (scan,) = [n for n in g.nodes if n.primitive.name == "scan"]
    assert scan.params["body"].num_carry == 1 and len(scan.outputs) == 2, str(g)
    assert len(scan.params["body"].nodes) == 1, str(g)
    np.testing.assert_allclose(sd.graph.evaluate(g, 1.5)[0], 12.0 + 3.0)


def test_revolve_schedule_bounds_and_order():
    for n, s in ((1, 1), (10, 3), (57, 4), (200, 16), (30, 40)):
        rows = revolve_actions(n, min(s, n))
        kinds = rows[:, 0]
        reversed_steps = rows[kinds == 3, 1].tolist()
        assert reversed_steps == list(range(n - 1, -1, -1))
        assert set(rows[kinds == 0, 1].tolist()) <= set(range(s))
        advanced = sum(int(b - a) for k, a, b in rows if k == 1)
        assert advanced < n * (1 + np.log2(max(n, 2)))  # binomial: O(n log n) at worst


def test_every_k_schedule_bounds_and_order():
    for n in (1, 2, 7, 16, 17, 60):
        for k in (1, 2, 3, 4, 8, 100):
            sched = sd.EveryK(k)
            rows, pos, slots, done = sched.actions(n).tolist(), 0, {}, []
            for kind, a, b in rows:  # run the actions on step numbers
                if kind == 0:
                    slots[a] = pos
                elif kind == 1:
                    assert pos == a
                    pos = b
                elif kind == 2:
                    pos = slots[a]
                else:
                    assert pos == a
                    done.append(a)
                    pos = None
            assert done == list(range(n - 1, -1, -1))
            assert len(slots) <= sched.slots(n) <= -(-n // min(k, n)) + min(k, n) - 1 or n == 0
            assert sum(b - a for kind, a, b in rows if kind == 1) < 2 * n
    with pytest.raises(ShapeError, match="k >= 1"):
        sd.EveryK(0)


def _replay_on_step_numbers(runs, n: int, stored: bool) -> int:
    """Runs `runs` on step numbers (a cell holds ("carry", t) or ("res", t)):
    each backward part must read its own step's residuals, in the order
    n - 1, ..., 0. Returns the steps advanced."""
    cells = [None] * (runs.cells + 1)
    if stored:  # what the forward pass writes
        for t in range(n):
            cells[runs.forward[t]] = ("carry", t)
    else:
        cells[runs.start] = ("carry", 0)
    done, advanced = [], 0
    for load, lo, r0, hi, at, count in (runs.stored() if stored else runs.runs).tolist():
        assert cells[load] == ("carry", lo)
        pos = lo
        for t, cell in runs.stores[at:at + count].tolist():
            advanced, pos = advanced + t - pos, t
            cells[cell] = ("carry", t)
        advanced += hi - pos
        for t in range(r0, hi + 1):
            cells[hi - t] = ("res", t)
        for j in range(hi - r0 + 1):
            assert cells[j] == ("res", hi - j)
            done.append(hi - j)
    assert done == list(range(n - 1, -1, -1))
    return advanced


def test_schedules_compile_to_runs_that_replay_them():
    for n in (1, 2, 7, 17, 60, 200):
        for p in (1, 2, 3, 8, 100):
            for sched in (sd.Binomial(p), sd.EveryK(p)):
                rows, runs = sched.actions(n), checkpoint_runs(sched, n)
                want = sum(b - a for kind, a, b in rows.tolist() if kind == 1)
                assert _replay_on_step_numbers(runs, n, False) == want
                # the forward pass makes the first run's stores: that stretch is not rerun
                assert _replay_on_step_numbers(runs, n, True) == want - runs.runs[0, 2]
                # a cell for each carry the schedule stores, the kept residuals in
                # the place of those it keeps for the next backward parts
                assert runs.cells <= sched.slots(n) + 1, (sched, n)


def _loop(a, c0, xs, checkpoints, reverse=False, leaves=1, rich=False):
    def step(c, x):
        u = c[0]
        # linear in the carry: the backward part reads one array (`lap`), and
        # with two carries (a leapfrog) half a carry
        lap = snp.roll(u, 1) - u
        new = u + 0.3 * a * lap + x if leaves == 1 else 2 * u - c[1] + 0.1 * a * lap
        if rich:  # a backward part that reads more than a carry's worth
            new = snp.tanh(new) * snp.cos(u)
        return (new,) + c[:leaves - 1], snp.sum(new)
    c, ys = sd.scan(step, (c0,) * leaves, xs, reverse=reverse, checkpoints=checkpoints)
    return sum(snp.sum(v ** 2) for v in c) + snp.sum(ys * snp.arange(1.0, 14.0))


@pytest.mark.parametrize("leaves, rich, kind", [
    pytest.param(1, False, "res", marks=pytest.mark.slow), (2, False, "res"),
    pytest.param(1, True, "carry", marks=pytest.mark.slow)])
def test_checkpointed_backward_parts_read_residuals_or_recompute(rng, leaves, rich, kind):
    a, c0, xs = rng.normal(size=4), rng.normal(size=4), rng.normal(size=(13, 4))
    g = sd.trace(sd.grad(lambda a: _loop(a, c0, xs, 3, leaves=leaves, rich=rich)), a)
    (adj,) = [n for n in g.nodes if n.primitive.name == "scan_adjoint"]
    p = adj.params
    nc, nk = p["body"].num_consts, p["body"].num_carry
    split = split_step(p["step"], nc, nk, len(p["body"].inputs) - nc - nk, p["step"].num_carry)
    # residuals no larger than the carry are kept (packed into its cell: one
    # array in a two-array carry); larger ones are not, and the carry is
    assert (split.residuals.nodes != ()) == (kind == "res"), split.residuals
    for reverse, schedules in ((False, (3,)), (True, (sd.EveryK(4),))):
        want = sd.grad(lambda a, c0, xs: _loop(a, c0, xs, None, reverse, leaves, rich),
                       argnums=(0, 1, 2))(a, c0, xs)
        for ck in schedules:
            got = sd.grad(lambda a, c0, xs: _loop(a, c0, xs, ck, reverse, leaves, rich),
                          argnums=(0, 1, 2))(a, c0, xs)
            for x, y in zip(got, want):
                np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)


def test_checkpointed_forward_pass_stores_the_first_checkpoints(heat):
    k, u0, d = heat
    for ck in (sd.EveryK(5), sd.Binomial(4)):
        g = sd.trace(sd.grad(lambda k: _heat_sd(k, u0, d, steps=40, checkpoints=ck)), k)
        (fwd,) = [n for n in g.nodes if n.primitive.name == "scan"]
        (adj,) = [n for n in g.nodes if n.primitive.name == "scan_adjoint"]
        assert fwd.params["body"].num_carry == 2 and adj.params["stored"], g
        # so the backward pass does not run the loop forward once more first
        note = str(sd.cost(sd.grad(lambda k: _heat_sd(k, u0, d, steps=40, checkpoints=ck)),
                           k))
        runs = checkpoint_runs(ck, 40)
        rows = ck.actions(40)
        advanced = sum(b - a for kind, a, b in rows.tolist() if kind == 1)
        assert f"{advanced - runs.runs[0, 2]} forward steps recomputed" in note, note


def test_graph_prints_the_schedule(heat):
    k, u0, d = heat
    for ck, shown in ((3, "binomial(3)"), (sd.EveryK(5), "every_k(5)")):
        g = sd.trace(sd.grad(lambda k, ck=ck: _heat_sd(k, u0, d, checkpoints=ck)), k)
        text = g.pretty(source=False)
        assert f"checkpoints={shown}" in text and f"schedule={shown}" in text
        again = sd.graph.Graph.from_json(g.to_json())
        assert again.pretty(source=False) == text


def test_eager_scan_on_arrays():
    c, ys = sd.scan(lambda c, x: (c + x, c * x), 0.0, np.arange(4.0))
    assert float(c) == 6.0
    np.testing.assert_allclose(ys, [0.0, 0.0, 2.0, 9.0])


def test_errors_name_the_problem():
    with pytest.raises(ShapeError, match="needs `length` when `xs` is None"):
        sd.trace(lambda x: sd.scan(lambda c, _: (c, None), x)[0], 1.0)
    with pytest.raises(ShapeError, match=r"enters `f` as f32\[2\] and leaves it as f64\[2\]"):
        sd.trace(lambda x: sd.scan(lambda c, _: (c + snp.ones(2), None), x, length=2)[0],
                 np.ones(2, np.float32))
    with pytest.raises(ShapeError, match="share their leading length"):
        sd.trace(lambda a, b: sd.scan(lambda c, x: (c, None), 0.0, (a, b))[0],
                 np.ones(3), np.ones(4))
    with pytest.raises(ShapeError, match="`length` is 5 but `xs` has leading length 3"):
        sd.trace(lambda a: sd.scan(lambda c, x: (c, None), 0.0, a, length=5)[0], np.ones(3))
    with pytest.raises(InvalidOptionError, match="`checkpoints` must be None, an int"):
        sd.trace(lambda x: sd.scan(lambda c, _: (c, None), x, length=2,
                                   checkpoints="all")[0], 1.0)
    with pytest.raises(InvalidOptionError, match="snapshots >= 1"):
        sd.Binomial(0)
    with pytest.raises(ShapeError, match="must be a Python int"):
        sd.trace(lambda n, x: sd.fori_loop(0, n, lambda i, v: v, x), 3, 1.0)
    with pytest.raises(ShapeError, match="must return a pair"):
        sd.trace(lambda x: sd.scan(lambda c, _: c, x, length=2), 1.0)


@pytest.mark.slow  # (the default suite's time budget)
def test_traced_indices_in_a_loop_body_match_jax(rng):
    X, w = rng.normal(size=(5, 4)), rng.normal(size=4)

    def f(X, w):
        def body(i, acc):
            acc = acc.at[i].set(snp.sum(X[i] * w))
            return acc.at[-1].add(X[i, 2] * X[:, 1][i] + X[..., i - 5, 0])
        return snp.sum(sd.fori_loop(0, 5, body, snp.zeros(5)) ** 2)

    def fj(X, w):
        X = jnp.asarray(X)

        def body(i, acc):
            acc = acc.at[i].set(jnp.sum(X[i] * w))
            return acc.at[-1].add(X[i, 2] * X[:, 1][i] + X[..., i - 5, 0])
        return jnp.sum(jax.lax.fori_loop(0, 5, body, jnp.zeros(5)) ** 2)

    np.testing.assert_allclose(sd.function(f)(X, w), fj(X, w), rtol=1e-13)
    g = sd.grad(f, argnums=(0, 1))(X, w)
    gj = jax.grad(fj, argnums=(0, 1))(X, w)
    np.testing.assert_allclose(g[0], gj[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g[1], gj[1], rtol=1e-12, atol=1e-14)
    sd.testing.check_rules(f, X, w)


def test_traced_index_errors():
    from sciad.errors import IndexingError

    with pytest.raises(IndexingError, match="must be an integer scalar"):
        sd.trace(lambda x, i: x[i], np.ones(3), np.ones(()))
    with pytest.raises(IndexingError, match="traced or static ints and full slices"):
        sd.trace(lambda x, i: x.at[i, 1:].set(0.0), np.ones((3, 3)), np.int64(0))


def test_a_bounded_loop_stops_at_its_bound_with_no_check_in_the_program():
    """`bounded_while_loop` (sciad's passes over a solve's recorded steps,
    whose count cannot pass the bound): it stops at `max_steps` where
    `while_loop` raises, its program holds no host call (which would keep
    XLA from compiling a loop around it as one function), and its
    derivatives are `while_loop`'s."""
    from sciad.errors import ConvergenceError
    from sciad.primitives._while import bounded_while_loop

    def doubled(loop, x, bound):
        return loop(lambda s: s[0] < 8, lambda s: (s[0] + 1, s[1] * x), (0, x),
                    max_steps=bound)[1]

    bounded = sd.function(lambda x: doubled(bounded_while_loop, x, 5))
    assert float(bounded(2.0)) == 2.0 ** 6
    with pytest.raises(ConvergenceError, match="max_steps=5"):
        sd.function(lambda x: doubled(sd.while_loop, x, 5))(2.0)
    assert "callback" not in bounded.lower(2.0).as_text()
    assert "callback" in sd.function(lambda x: doubled(sd.while_loop, x, 9)).lower(2.0).as_text()
    # within the bound, the same loop, and the same derivatives to second order
    for order in (sd.grad, lambda f: sd.grad(sd.grad(f))):
        got = sd.function(order(lambda x: doubled(bounded_while_loop, x, 9)))(1.3)
        want = sd.function(order(lambda x: doubled(sd.while_loop, x, 9)))(1.3)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-14)
    np.testing.assert_allclose(float(sd.function(sd.grad(
        lambda x: doubled(bounded_while_loop, x, 9)))(1.3)), 9 * 1.3 ** 8, rtol=1e-13)
