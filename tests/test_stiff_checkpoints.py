"""BDF's and Radau's checkpointed adjoints. With `checkpoints=` (or a
`MemoryBudget` whose RAM does not hold every step's state) the forward pass
records no states (BDF only its record of each step's order and step size
changes), and the reverse pass re-runs the steps on the recorded grid from
snapshots (`_ode_replay.bdf_step`, `radau_step`): each step's implicit
equation is an `optimize.root` node, solved far below the steps' local
error, so the gradient is the stored pass's to that tolerance, for ODEs and
DAEs, sparse and dense Newton matrices, with snapshots in RAM or on disk.
The exactness of the stored passes themselves is test_stiff_methods.py's;
check_rules of the checkpointed passes is its slow `test_check_rules`."""

from __future__ import annotations

import os

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError
from sciad.primitives import _disk

TS = np.array([0.0, 0.05, 0.3])
Y0 = np.linspace(0.5, 1.5, 12)


def _chain(t, y, k):  # a stiff nonlinear 1-D reaction-diffusion chain
    lap = snp.pad(y, 1)[:-2] - 2.0 * y + snp.pad(y, 1)[2:]
    return 100.0 * k[0] * lap - k[1] * y ** 3 + 0.1 * snp.sin(t)


def _loss(solver, checkpoints, jac=None):
    def loss(k, y0):
        ys = sd.ode.odeint(_chain, y0, TS, k, solver=solver, jac=jac, rtol=1e-7, atol=1e-10,
                           checkpoints=checkpoints)
        return snp.sum(ys[1:] ** 2) + ys[2, 3]
    return loss


def _odeint_node(fn, *args):
    (node,) = [n for n in sd.trace(fn, *args).nodes if n.primitive.name == "ode.odeint"]
    return node


@pytest.mark.parametrize("solver,jac", [("bdf", "sparse"),
                                        pytest.param("radau", None, marks=pytest.mark.slow)])
def test_the_replay_gives_the_stored_passs_gradient(solver, jac):
    """The gradient in the field's parameters and the initial state from 3
    snapshots an output interval equals the stored pass's (its states
    recorded at every step) to the steps' Newton tolerance (1e-3 rtol); the
    forward pass records no states (BDF: its step record, 37 numbers a
    step, which the replay reads), and no `ode.bdf_adjoint` or
    `ode.radau_adjoint` node runs."""
    k = np.array([1.0, 2.0])
    want = sd.grad(_loss(solver, None, jac), argnums=(0, 1))(k, Y0)
    fn = sd.grad(_loss(solver, 3, jac), argnums=(0, 1))
    got = fn(k, Y0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9 * np.abs(w).max())
    node = _odeint_node(fn, k, Y0)
    assert node.params["checkpoints"] == 3 and len(node.outputs) == (6 if solver == "bdf" else 5)
    if solver == "bdf":
        assert node.outputs[-1].type.shape == (4097, 37)  # (its history, no states)
    names = {n.primitive.name for n in sd.trace(fn, k, Y0).nodes}
    assert not names & {"ode.bdf_adjoint", "ode.radau_adjoint"}


@pytest.mark.slow  # ~25 s: both solvers, three transforms
@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_a_dae_replayed(solver):
    """Robertson's problem as an index-1 DAE (`mass=diag(1, 1, 0)`): the
    checkpointed gradient in the rate constants equals the stored pass's,
    forward mode (the sensitivities integrated with the mass matrix) agrees
    with it, and so does the Hessian-vector product (forward over the
    replay's reverse pass)."""
    def rob(t, y, k):
        y1, y2, y3 = y[0], y[1], y[2]
        return snp.stack([-k[0] * y1 + k[2] * y2 * y3,
                          k[0] * y1 - k[1] * y2 ** 2 - k[2] * y2 * y3, y1 + y2 + y3 - 1.0])

    k = np.array([0.04, 3e7, 1e4])
    w = np.array([1.0, 1e4, 2.0])

    def loss(k, checkpoints):
        ys = sd.ode.odeint(rob, np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.4, 40.0]), k,
                           solver=solver, rtol=1e-7, atol=1e-11, max_steps=500,
                           mass=np.diag([1.0, 1.0, 0.0]), checkpoints=checkpoints)
        return snp.sum(ys[-1] * w) + snp.sum(ys[1])

    want = np.asarray(sd.grad(lambda k: loss(k, None))(k))
    got = np.asarray(sd.grad(lambda k: loss(k, 4))(k))
    np.testing.assert_allclose(got, want, rtol=1e-7)
    v = np.array([1.0, 2e7, -3e3]) * 1e-2
    np.testing.assert_allclose(sd.jvp(lambda k: loss(k, 4), (k,), (v,))[1], got @ v, rtol=1e-7)
    np.testing.assert_allclose(sd.hvp(lambda k: loss(k, 4), k, v),
                               sd.hvp(lambda k: loss(k, None), k, v), rtol=1e-6)


def test_a_budget_replays_from_snapshots_in_ram_or_on_disk(tmp_path):
    """A memory budget that holds every step's states keeps BDF's own pass;
    one that does not replays the steps, from snapshots of BDF's
    differences (8 states each) in RAM where `s + ceil(max_steps / s) + 1`
    of them fit, else on disk with `disk=`; a budget too small for either
    says what to give. The interpolated adjoint, which reads every step's
    state, refuses a budget that does not hold them."""
    k = np.array([1.0, 2.0])
    n_bytes = Y0.size * 8
    want = sd.grad(_loss("bdf", None), argnums=(0, 1))(k, Y0)

    def node_for(budget, adjoint=None):
        def loss(k, y0):
            ys = sd.ode.odeint(_chain, y0, TS, k, solver="bdf", rtol=1e-7, atol=1e-10,
                               max_steps=2000, checkpoints=budget, adjoint=adjoint)
            return snp.sum(ys[1:] ** 2) + ys[2, 3]
        fn = sd.grad(loss, argnums=(0, 1))
        return fn, _odeint_node(fn, k, Y0)

    _, node = node_for(sd.MemoryBudget(ram=2100 * n_bytes))
    assert node.params.get("checkpoints") is None and len(node.outputs) == 7
    _, node = node_for(sd.MemoryBudget(ram=130 * 8 * n_bytes))
    assert 45 <= node.params["checkpoints"] < 2000 and node.params.get("disk") is None
    fn, node = node_for(sd.MemoryBudget(ram=12 * 8 * n_bytes, disk=tmp_path))
    assert node.params["disk"] == str(tmp_path)
    for g, w in zip(sd.function(fn)(k, Y0), want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9 * np.abs(w).max())
    assert os.listdir(tmp_path) == [] and _disk.open_stores() == 0
    with pytest.raises(InvalidOptionError, match=r"give at least ram=.*or give the budget"):
        node_for(sd.MemoryBudget(ram=12 * 8 * n_bytes))
    with pytest.raises(InvalidOptionError, match="interpolated adjoint reads the state at"):
        node_for(sd.MemoryBudget(ram=12 * 8 * n_bytes), adjoint="interpolated")
