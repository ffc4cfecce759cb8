"""Solvers are records, registered by name (`sciad.solvers`): the registry,
"auto" asking the records, and the test of the design, a new solver added by
one record and one `register` line, used through `sd.linalg.solve` with its
derivatives, factor sharing, checks and cost, and then removed again."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
from sciad import solvers
from sciad.errors import InvalidOptionError, RegistrationError, SingularMatrixError
from sciad.solvers._linear import AbstractDirectSolver, choose


class ToySolve(AbstractDirectSolver):
    """A dense direct solver wrapping `jnp.linalg.solve`: its "factor" is the
    matrix, every solve factors again. (The whole of what a new solver needs.)"""

    name = "toy"
    matrices = frozenset({"dense"})
    dtype_kinds = "f"

    def factor_layout(self, n, dtype, pattern):
        return (((n, n), dtype),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return (a,)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        (m,) = factor
        return jnp.linalg.solve(m.T if transpose else m, b)

    def ok(self, factor):
        return jnp.all(jnp.isfinite(factor[0]))

    def rcond_host(self, m, anorm):
        try:
            inv = np.linalg.inv(m)
        except np.linalg.LinAlgError:
            return 0.0
        return 1.0 / (anorm * np.abs(inv).sum(axis=0).max())

    def factor_flops(self, n, fill):
        return 1234.0


def _registered(record):
    """A fixture's body: `record` registered for the test, then removed."""
    solvers.register(record)
    try:
        yield record
    finally:
        solvers.unregister(record.name)


@pytest.fixture
def toy():
    yield from _registered(ToySolve())


def _system(rng, n=5):
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    return A, rng.standard_normal(n)


def test_a_new_solver_is_one_record_and_one_registration(toy, rng):
    A, b = _system(rng)
    x = sd.linalg.solve(A, b, solver="toy")
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(A, b), rtol=1e-12)
    assert "solver='toy'" in str(sd.trace(lambda A, b: sd.linalg.solve(A, b, solver="toy"),
                                        A, b))

    # derivatives in both operands, forward, reverse and second order, by the
    # solve's own rules (which emit more solves with the same record)
    sd.testing.check_rules(lambda A, b: sd.linalg.solve(A, b, solver="toy"), A, b)

    def loss(A, b):
        return sd.numpy.sum(sd.linalg.solve(A, b, solver=toy.name) ** 2)

    def loss_lu(A, b):
        return sd.numpy.sum(sd.linalg.solve(A, b, solver="lu") ** 2)

    gA, gb = sd.grad(loss, argnums=(0, 1))(A, b)
    wA, wb = sd.grad(loss_lu, argnums=(0, 1))(A, b)
    np.testing.assert_allclose(np.asarray(gA), np.asarray(wA), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(wb), rtol=1e-10)

    # its cost model is what `sd.cost` reports for a solve with it
    rep = sd.cost(lambda A, b: sd.linalg.solve(A, b, solver="toy"), A, b)
    assert rep.flops >= 1234.0
    # its checks: the rcond it reports, a singular matrix caught
    _, info = sd.linalg.solve(A, b, solver="toy", throw=False)
    assert bool(info.converged) and 0 < float(info.rcond) <= 1
    with pytest.raises(SingularMatrixError):
        sd.linalg.solve(np.zeros((3, 3)), np.ones(3), solver="toy")


def test_unregistered_names_are_unknown(toy):
    solvers.unregister("toy")
    with pytest.raises(InvalidOptionError, match="unknown solver 'toy'; choose one of 'auto', 'amg', 'lu'"):
        sd.linalg.solve(np.eye(2), np.ones(2), solver="toy")
    solvers.register(toy)
    with pytest.raises(RegistrationError, match="already registered"):
        solvers.register(ToySolve())


def test_auto_asks_the_records():
    f64, c128 = np.dtype(np.float64), np.dtype(np.complex128)
    assert choose(matrix="dense", tags=frozenset(), dtype=f64).name == "lu"
    assert choose(matrix="dense", tags=frozenset({"spd", "symmetric"}), dtype=f64).name \
        == "cholesky"
    assert choose(matrix="dense", tags=frozenset({"spd"}), dtype=c128).name == "cholesky"
    # (on the CPU: KLU, compiled, up to 12,000 unknowns; SuperLU above)
    sparse = "klu" if jax.default_backend() == "cpu" else "splu"
    assert choose(matrix="sparse", tags=frozenset({"spd"}), dtype=f64).name == sparse
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (240, 240))
    L = sp.csr_array(sp.kron(T, sp.eye(240)) + sp.kron(sp.eye(240), T))
    L.sort_indices()
    big = sd.graph.Pattern(L.shape, L.indptr, L.indices)  # (2-D, 57,600 unknowns)
    assert choose(matrix="sparse", tags=frozenset(), dtype=f64, pattern=big).name == "splu"
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (100, 100))
    L = sp.csr_array(sp.kron(T, sp.eye(100)) + sp.kron(sp.eye(100), T))
    L.sort_indices()
    small = sd.graph.Pattern(L.shape, L.indptr, L.indices)  # (2-D, 10,000 unknowns)
    assert choose(matrix="sparse", tags=frozenset(), dtype=f64, pattern=small).name == sparse
    line = sp.csr_array(sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (10**5, 10**5)))
    line.sort_indices()
    one_d = sd.graph.Pattern(line.shape, line.indptr, line.indices)  # (3 entries a row)
    assert choose(matrix="sparse", tags=frozenset(), dtype=f64, pattern=one_d).name == sparse
    assert choose(matrix="operator", tags=frozenset({"spd"}), dtype=f64).name == "cg"
    assert choose(matrix="operator", tags=frozenset(), dtype=f64).name == "gmres"


def test_records_say_what_they_take():
    with pytest.raises(sd.errors.DTypeError, match="'cg' takes real matrices"):
        sd.linalg.solve(np.eye(3) * (1 + 1j), np.ones(3), solver="cg")
    lu, splu = solvers.lookup("lu"), solvers.lookup("splu")
    assert lu.direct and not lu.sparse and lu.where == "device"
    assert splu.direct and splu.sparse and splu.where == "host" and splu.held_on_host
    assert solvers.lookup("cg").symmetric_adjoint and not lu.symmetric_adjoint


def test_root_methods_are_records_and_the_node_names_its_parts():
    from sciad.primitives._root import RootOutputs

    assert solvers.lookup("chord", "root").takes_jac0
    assert not solvers.lookup("newton", "root").takes_jac0
    assert solvers.lookup("newton_krylov", "root").node_method == "newton"
    assert solvers.lookup("gmres", "jacobian").matrix_free
    assert solvers.lookup("sparse", "jacobian").keeps_factor
    assert solvers.lookup("hybr", "root").jac == "dense"  # (SciPy's, globalized)
    with pytest.raises(InvalidOptionError, match="unknown solver 'broyden1'"):
        solvers.lookup("broyden1", "root")

    def f(c):
        return sd.optimize.root(lambda x, c: x ** 3 + x - c, sd.numpy.zeros(4), (c,),
                                jac="sparse").x

    graph = sd.trace(f, np.ones(4))
    (node,) = [n for n in graph.nodes if n.primitive.name == "optimize.root"]
    assert "body" in node.params and "graph" not in node.params
    outs = RootOutputs.of(node.outputs)
    assert outs.x.type.shape == (4,) and outs.factor is not None
    np.testing.assert_allclose(np.asarray(f(np.full(4, 2.0))), np.ones(4), rtol=1e-10)


@pytest.fixture
def scipy_splu():
    from _scipy_splu_backend import ScipySplu

    yield from _registered(ScipySplu())


def test_a_new_sparse_backend_is_one_file(scipy_splu, rng):
    """SciPy's `splu` behind the protocol (`tests/_scipy_splu_backend.py`, one
    file): its solves and their rules (`check_rules`), `sd.vmap`, and JAX's
    own transforms of `sd.to_jax`, as every built-in backend's."""
    n = 8
    M = sp.csr_array(sp.random(n, n, density=0.3, random_state=1) + 4 * sp.eye(n))
    M.sort_indices()
    A0 = sd.sparse.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape)
    b = rng.standard_normal(n)

    def f(d, b):
        return sd.linalg.solve(sd.sparse.with_data(A0, d), b, solver="scipy_splu")

    np.testing.assert_allclose(np.asarray(f(M.data, b)), np.linalg.solve(M.toarray(), b),
                               rtol=1e-12)
    sd.testing.check_rules(f, M.data, b)
    D = M.data * (1 + 0.1 * rng.standard_normal((3, M.nnz)))
    B = rng.standard_normal((3, n))
    got = sd.function(sd.vmap(f))(D, B)
    want = [np.linalg.solve(sp.csr_array((d, M.indices, M.indptr), shape=M.shape).toarray(),
                            bb) for d, bb in zip(D, B)]
    np.testing.assert_allclose(np.asarray(got), np.stack(want), rtol=1e-11)
    g = sd.to_jax(lambda d: sd.numpy.sum(f(d, b) ** 2))
    lu = sd.to_jax(lambda d: sd.numpy.sum(sd.linalg.solve(sd.sparse.with_data(A0, d), b,
                                                          solver="splu") ** 2))
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        np.testing.assert_allclose(np.asarray(jax.jit(transform(g))(M.data)),
                                   np.asarray(jax.jit(transform(lu))(M.data)), rtol=1e-9,
                                   atol=1e-12)
    with pytest.raises(SingularMatrixError), sd.errors.unwrapped():
        jax.block_until_ready(jax.jit(g)(np.zeros(M.nnz)))
