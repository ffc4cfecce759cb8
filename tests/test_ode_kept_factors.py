"""BDF's and Radau's sparse iteration matrices factored by KLU in the
program and kept over steps as handles (`sciad.solvers.ode._kept_klu`): the
same steps and solutions as SuperLU's host path, with no host call; every
factor freed, after one integration, a batch whose examples stop apart
(`sd.vmap`, and JAX's own `jax.vmap` of `sd.to_jax`) and a failed solve;
JAX's transforms of `sd.to_jax` in a child process, where a crash fails the
test."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import ConvergenceError
from sciad.solvers import _batch_split
from sciad.solvers.ode import _kept_klu, _ode

pytestmark = pytest.mark.skipif(not _kept_klu.usable(np.float64),
                                reason="needs klujax and sciad's C++ extension on the CPU")

N = 6  # cells: 12 states
TS = np.array([0.0, 0.5, 2.0])


@pytest.fixture(autouse=True)
def _klu_not_band(monkeypatch):
    """These tests' patterns are narrow bands, which the loops factor with the
    banded LU (`_band`) where they can: KLU's kept factors are what they
    test."""
    from sciad.solvers.direct import _band

    monkeypatch.setattr(_band, "usable", lambda dtype: False)


def brusselator(t, y, a):
    w = snp.reshape(y, (N, 2))
    u, v = w[:, 0], w[:, 1]
    up = snp.pad(u, 1, mode="constant", constant_values=1.0)
    vp = snp.pad(v, 1, mode="constant", constant_values=3.0)
    c = a * (N + 1) ** 2
    du = 1.0 + u * u * v - 4.0 * u + c * (up[:-2] - 2.0 * u + up[2:])
    dv = 3.0 * u - u * u * v + c * (vp[:-2] - 2.0 * v + vp[2:])
    return snp.reshape(snp.stack([du, dv], axis=1), (2 * N,))


Y0 = np.stack([1.0 + np.sin(2 * np.pi * np.arange(1, N + 1) / (N + 1)),
               np.full(N, 3.0)], axis=1).ravel()


def _solve(solver):
    # (a new function each time: its program lowered with the current path)
    return sd.function(lambda a: sd.ode.odeint(brusselator, Y0, TS, a, solver=solver,
                                               jac="sparse", rtol=1e-7, atol=1e-9,
                                               throw=False))


def _no_host(*args, **kwargs):
    raise AssertionError("a host factorization or solve")


@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_the_kept_factor_is_that_of_the_values_kept_and_no_host_call(monkeypatch, solver):
    """Each solve with a kept factor gives, to rounding, what a fresh KLU
    factorization of the values the loop kept for it gives (one call that
    factors and solves): the swaps keep the right factor, over a solve that
    factors again a dozen times. No host call. Against SuperLU on the host:
    the same solution to the solve's tolerance (the two factorizations round
    apart, and BDF's order choices can then part: 131 steps against 124
    here, Radau's steps stay the same)."""
    a = np.asarray(0.02)
    with monkeypatch.context() as m:
        m.setattr(_kept_klu, "usable", lambda dtype: False)
        host = _solve(solver)(a)
    with monkeypatch.context() as m:
        solve = _kept_klu.solve
        m.setattr(_kept_klu, "solve", lambda pattern, handle, values, b, *transpose: solve(
            pattern, _kept_klu.none(), values, b, *transpose))
        fresh = _solve(solver)(a)
    before = _batch_split.live_handles()
    monkeypatch.setattr(_ode, "_factor", _no_host)
    monkeypatch.setattr(_ode, "_solve", _no_host)
    kept = _solve(solver)(a)
    assert int(kept.status) == 0 and int(kept.nlu) >= 10
    # (to rounding: the two programs fuse apart; a solve with another factor
    # than its values' would part by the Newton tolerance, about 1e-9 here)
    np.testing.assert_allclose(np.asarray(kept.ys), np.asarray(fresh.ys), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(kept.ys), np.asarray(host.ys), rtol=1e-6)
    assert abs(int(kept.steps) - int(host.steps)) <= 0.1 * int(host.steps)
    assert _batch_split.live_handles() == before


def test_swaps_keep_each_examples_factor_under_a_batched_loop():
    """The swap's batching rule, in a `while_loop` batched over examples that
    stop apart (the loop's body runs on for those done, which must not swap,
    as the integrators ask) and refactor at their own iterations: every solve
    with a kept factor equals a fresh factorization's of the values kept
    for it, to rounding; every factor is freed."""
    import jax
    import jax.numpy as jnp
    import scipy.sparse as sp

    from sciad.graph._types import Pattern

    A = sp.diags([-1.0, 4.0, -1.5], [-1, 0, 1], shape=(5, 5), format="csr")
    pattern = Pattern(A.shape, A.indptr, A.indices)
    base, eye = jnp.asarray(A.data), jnp.asarray(_ode._structure(pattern)[2])
    b = jnp.arange(1.0, 6.0)

    def run(stop, every):
        def body(c):
            i, h, v, err = c
            need = (i % every == 0) & (i < stop)  # (False for a finished example)
            new = base + (1.0 + i) * eye
            h = _kept_klu.swap(pattern, need, h, new)
            v = jnp.where(need, new, v)
            x = _kept_klu.solve(pattern, h, v, b)
            y = _kept_klu.solve(pattern, _kept_klu.none(), v, b)
            return i + 1, h, v, jnp.maximum(err, jnp.max(jnp.abs(x - y)))

        _, h, v, err = jax.lax.while_loop(lambda c: c[0] < stop, body,
                                          (0, _kept_klu.none(), base, 0.0))
        return err + _kept_klu.release(h, after=[err, v]), v

    before = _batch_split.live_handles()
    stops, every = jnp.array([4, 9, 7]), jnp.array([3, 2, 5])
    err, v = jax.jit(jax.vmap(run))(stops, every)
    assert np.all(np.asarray(err) <= 1e-15)
    # (each example kept the values of its own last refactor)
    last = (np.asarray(stops) - 1) // np.asarray(every) * np.asarray(every)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(base)[None] + (
        1.0 + last)[:, None] * np.asarray(eye)[None])
    err1, _ = jax.jit(run)(9, 2)
    assert float(err1) <= 1e-15
    assert _batch_split.live_handles() == before


@pytest.mark.slow  # ~9 s; the swap's batching itself: the test above
@pytest.mark.parametrize("solver", ["bdf", "radau"])
def test_a_batch_whose_examples_stop_apart(solver):
    """A batch of solves whose examples take different steps, through
    `sd.vmap` and JAX's own `jax.vmap` of `sd.to_jax`: each example as its
    own solve to the tolerance (batched arithmetic rounds apart, and BDF's
    order choices may then part: 3e-7 here at rtol 1e-7), no host call,
    every factor freed."""
    import jax

    a = np.array([0.01, 0.02, 0.05])
    one = np.stack([np.asarray(_solve(solver)(x).ys) for x in a])
    assert len({int(_solve(solver)(x).steps) for x in a}) == 3

    def ys(a):
        return sd.ode.odeint(brusselator, Y0, TS, a, solver=solver, jac="sparse", rtol=1e-7,
                             atol=1e-9)

    before = _batch_split.live_handles()
    for got in (sd.function(sd.vmap(ys))(a), jax.jit(jax.vmap(sd.to_jax(ys)))(a)):
        np.testing.assert_allclose(np.asarray(got), one, rtol=1e-6)
    assert _batch_split.live_handles() == before


def _failing(t, y, k):
    # the square root of a state that decays through 0.5: NaN from there on
    return -k * y + 1e-3 * snp.sqrt(y - 0.5)


def _own_loop(solver: str) -> dict:
    """The options that run `solver` in a loop of sciad's own with kept KLU
    factors: an ESDIRK method's with a mass matrix (the identity here;
    without one, diffrax steps it)."""
    import scipy.sparse as sp

    return {"mass": sp.identity(3, format="csr")} if solver == "kvaerno5" else {}


@pytest.mark.parametrize("solver", ["bdf", "radau", "kvaerno5"])
def test_failed_solves_free_their_factors(solver):
    """A solve whose steps fail (NaN past t = ln 2) raises, and its factors
    are freed before the check raises: none left after twenty failing calls.
    The same for a singular iteration matrix (a DAE whose algebraic equation
    does not involve its variable: `M - c J` has a zero row), whose KLU
    factorization fails at every step (a 0 handle, then a NaN solve).
    (Kvaerno5: its own loop, with a mass matrix.)"""
    import scipy.sparse as sp

    f = sd.function(lambda k: sd.ode.odeint(_failing, np.ones(3), np.array([0.0, 2.0]), k,
                                            solver=solver, jac="sparse", **_own_loop(solver)))
    mass = sp.csr_matrix(np.diag([1.0, 0.0]))
    g = sd.function(lambda k: sd.ode.odeint(
        lambda t, y, k: snp.stack([-k * y[0], 0.0 * y[1]]), np.array([1.0, 0.0]),
        np.array([0.0, 1.0]), k, solver=solver, jac="sparse", mass=mass))
    before = _batch_split.live_handles()
    for fn in (f, g):
        for _ in range(10):
            with pytest.raises(ConvergenceError):
                fn(np.asarray(1.0))
    assert _batch_split.live_handles() == before


@pytest.mark.slow  # ~5 s: three hundred failing solves
@pytest.mark.parametrize("solver", ["bdf", "kvaerno5"])
def test_memory_stays_flat_over_hundreds_of_failing_solves(solver):
    """Three hundred failing solves, alone, batched (`sd.vmap`) and under
    `sd.grad` (the failure raised before any adjoint runs): each raises, no
    factor stays live, and the process's memory does not grow (a leaked
    factor of these 12-state systems is small: the live-handle count is the
    sharp measure, the resident memory the coarse one)."""
    from helpers import rss_mib

    solve = lambda k: sd.ode.odeint(_failing, np.ones(3), np.array([0.0, 2.0]), k,  # noqa: E731
                                    solver=solver, jac="sparse", **_own_loop(solver))
    calls = [sd.function(solve), sd.function(sd.vmap(solve)),
             sd.function(sd.grad(lambda k: snp.sum(solve(k))))]
    args = [np.asarray(1.0), np.array([1.0, 1.5]), np.asarray(1.0)]
    for fn, a in zip(calls, args):  # (compiled first)
        with pytest.raises(ConvergenceError):
            fn(a)
    before, mem = _batch_split.live_handles(), rss_mib()
    for i in range(300):
        with pytest.raises(ConvergenceError):
            calls[i % 3](args[i % 3])
    assert _batch_split.live_handles() == before
    assert rss_mib() - mem < 30.0


_CHILD = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import sciad as sd, sciad.numpy as snp
from sciad.solvers.direct import _band
from sciad.solvers.ode import _kept_klu

def field(t, y, k):
    lap = snp.pad(y, 1)[:-2] - 2.0 * y + snp.pad(y, 1)[2:]
    return 30.0 * k[0] * lap - k[1] * y ** 3

# (Kvaerno5 with a mass matrix, the identity: its own loop, kept KLU factors)
extra = {}
if sys.argv[1] == "kvaerno5":
    import scipy.sparse as sp
    extra["mass"] = sp.identity(5, format="csr")

def fn():
    return sd.to_jax(lambda k: snp.sum(sd.ode.odeint(
        field, np.linspace(0.5, 1.5, 5), np.array([0.0, 0.3, 1.0]), k, solver=sys.argv[1],
        jac="sparse", rtol=1e-8, atol=1e-10, **extra)[1:] ** 2))

k = jnp.array([1.0, 2.0])
v = jnp.array([0.3, -0.7])
out = {}
for path in ("band", "kept", "host"):
    if path == "kept":
        _band.usable = lambda dtype: False
    if path == "host":
        _kept_klu.usable = lambda dtype: False
    g = fn()
    out[path] = [np.ravel(np.asarray(r)).tolist() for r in (
        jax.jit(g)(k), jax.jit(jax.grad(g))(k), jax.jacfwd(jax.grad(g))(k),
        jax.jit(jax.hessian(g))(k),
        jax.vmap(lambda t: jax.jvp(g, (k,), (t,))[1])(jnp.stack([v, 2 * v])))]
json.dump(out, sys.stdout)
"""


@pytest.mark.slow  # ~20 s each, Kvaerno5 ~160 s (jacfwd and hessian compile: its stages are nodes)
@pytest.mark.parametrize("solver", ["bdf", "radau", "kvaerno5"])
def test_jax_transforms_of_to_jax_keep_the_factors_right(solver):
    """`jax.jit`, `grad`, `jacfwd` of `grad`, `hessian` and `vmap` of `jvp`
    of `sd.to_jax(f)` through a sparse BDF or Radau solve (or Kvaerno5's
    with a mass matrix, in its own loop): with KLU's kept
    factors, the same as with SuperLU on the host, and as with the banded LU
    (the pattern is tridiagonal); in a child process, where a freed factor
    read again would crash."""
    done = subprocess.run([sys.executable, "-c", _CHILD, solver], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    # (to well within the solve's rtol, 1e-8: the two factorizations round
    # apart, and a step decision may then part)
    for path in ("kept", "band"):
        for got, want in zip(out[path], out["host"]):
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
