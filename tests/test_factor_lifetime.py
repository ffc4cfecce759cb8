"""Where a factorization the program makes ends is part of the graph.

`place_releases` (the last step of `optimize`) puts a `linalg.release` node
after the last reader of every value a node `holds` (a compiled backend's
handles); lowering is a plain interpreter that keeps no state of its own
between runs and knows no solver. Checked here on the graphs the user's
paths make (a value and gradient, a batch, a loop) and on the process: no
handle outlives a successful call either (failed calls:
`tests/test_failure_release.py`).
"""

from __future__ import annotations

import ast
import inspect

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.graph import _lower, passes
from helpers import tridiagonal
from sciad.solvers import _batch_split
from sciad.solvers.direct import _klu_ffi

pytestmark = pytest.mark.skipif(not _klu_ffi.available(), reason="klujax is not installed")


def _A(M):
    return lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)


def _releases(g):
    return [k for k, n in enumerate(g.nodes) if n.primitive.releases]


def _all_bodies(g):
    for n in g.nodes:
        for s in n.subgraphs:
            yield s
            yield from _all_bodies(s)


def test_the_release_follows_the_last_reader():
    M = tridiagonal(12)
    loss = lambda d, b: snp.sum(sd.linalg.solve(_A(M)(d), b, solver="klu") ** 2)  # noqa: E731
    g = passes.optimize(sd.trace(sd.value_and_grad(loss, argnums=(0, 1)), M.data, np.ones(12)))
    (k,) = _releases(g)
    release = g.nodes[k]
    f = release.inputs[0]
    (made,) = [j for j, n in enumerate(g.nodes) if f in n.outputs]
    assert g.nodes[made].params["uses"] == 2
    readers = [j for j, n in enumerate(g.nodes) if f in n.inputs and j != k]
    assert len(readers) == 2 and max(readers) < k
    # (it waits for every output of every reader)
    assert {v for j in readers for v in g.nodes[j].outputs} <= set(release.inputs[1:])
    assert "linalg.release[solver='klu']" in str(g)
    # optimizing again places each release once, where it was
    again = passes.optimize(g)
    assert len(_releases(again)) == 1 and str(again) == str(g)


def test_a_batch_is_released_by_the_enclosing_graph():
    """`sd.vmap` of a value and gradient: the forward map's body makes the
    batch of factors and returns it; the enclosing graph releases the batch
    after the backward map, and no body holds a release."""
    M = tridiagonal(10)
    D = np.tile(M.data, (3, 1))
    B = np.ones((3, 10))
    loss = lambda d, b: snp.sum(sd.linalg.solve(_A(M)(d), b, solver="klu") ** 2)  # noqa: E731
    g = passes.optimize(sd.trace(sd.vmap(sd.value_and_grad(loss)), D, B))
    (k,) = _releases(g)
    f = g.nodes[k].inputs[0]
    (maker,) = [n for n in g.nodes if f in n.outputs]
    assert maker.primitive.name == "map" and maker.primitive.holds(maker.params) is not None
    assert not any(n.primitive.releases for s in _all_bodies(g) for n in s.nodes)
    with jax.enable_x64(True):
        live = _batch_split.live_handles()
        v, gr = sd.function(sd.vmap(sd.value_and_grad(loss)))(D, B)
        jax.effects_barrier()
        assert _batch_split.live_handles() == live
    A = M.toarray()
    x = np.linalg.solve(A, np.ones(10))
    np.testing.assert_allclose(np.asarray(v), np.full(3, x @ x), rtol=1e-12)


def test_a_factor_hoisted_out_of_a_loop_is_released_after_it():
    """Backward Euler's one matrix: factored once before the loop (hoisted),
    read by the loop and its adjoint loop, released after the last of
    them, in the enclosing graph."""
    n = 20
    M = tridiagonal(n)

    def run(d, y0):
        a = _A(M)(d)
        y = sd.fori_loop(0, 5, lambda i, y: sd.linalg.solve(a, y, solver="klu"), y0)
        return snp.sum(y ** 2)

    g = passes.optimize(sd.trace(sd.grad(run, argnums=(0, 1)), M.data, np.ones(n)))
    (k,) = _releases(g)
    f = g.nodes[k].inputs[0]
    loops = [j for j, node in enumerate(g.nodes) if f in node.inputs and node.subgraphs]
    assert loops and max(loops) < k
    assert not any(node.primitive.releases for s in _all_bodies(g) for node in s.nodes)


@pytest.mark.parametrize("case", ["forward", "gradient", "batch", "loop"])
def test_successful_calls_leave_no_handle(case):
    """The normal exit: every handle a program makes is released by it (the
    failed exits: `test_failure_release`)."""
    n = 40
    M = tridiagonal(n)
    A = _A(M)

    def loss(d, b):
        return snp.sum(sd.linalg.solve(A(d), b, solver="klu") ** 2)

    def loop_loss(d, b):
        a = A(d)
        return snp.sum(sd.fori_loop(0, 3, lambda i, u: sd.linalg.solve(a, u + b,
                                                                        solver="klu"), b) ** 2)

    b = np.ones(n)
    if case == "forward":  # (two solves with one factor)
        g, args = sd.function(lambda d, b: sd.linalg.solve(A(d), sd.linalg.solve(A(d), b))), \
            (M.data, b)
    elif case == "gradient":
        g, args = sd.function(sd.value_and_grad(loss, argnums=(0, 1))), (M.data, b)
    elif case == "loop":
        g, args = sd.function(sd.value_and_grad(loop_loss, argnums=(0, 1))), (M.data, b)
    else:
        g, args = sd.function(sd.vmap(sd.value_and_grad(loss))), \
            (np.tile(M.data, (4, 1)), np.ones((4, n)))
    jax.block_until_ready(g(*args))
    jax.effects_barrier()
    before = _batch_split.live_handles()
    for _ in range(5):
        jax.block_until_ready(g(*args))
    jax.effects_barrier()
    assert _batch_split.live_handles() == before


def test_lowering_keeps_no_state_and_knows_no_solver():
    """`sciad.graph._lower` is an interpreter: no module-level mutable state
    but the warning registry and a cache of signatures, no thread-local or
    context variable, and no solver, factorization or handle in its code."""
    src = inspect.getsource(_lower)
    tree = ast.parse(src)
    imported = {a.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for a in node.names} | {
        (node.module or "").split(".")[0] for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)}
    assert not imported & {"threading", "contextvars", "weakref"}
    code = "\n".join(line.split("#")[0] for line in src.splitlines())
    for word in ("klu", "cudss", "splu", "cholmod", "handle", "solvers", "linalg"):
        assert word not in code.lower(), word
