"""A failing computation is loud in every program derived from it.

Walks the primitive registry: every built-in primitive that checks its values
when it runs (`Primitive(runtime_checks=True)`: solves, root, odeint, bounded
loops, guards, index checks) has a failing example here, and each transform
of that example (compiled call, grad, value_and_grad, jvp, vjp, hvp, jacfwd,
jacrev, second order both ways, vmap, `sd.to_jax` under `jax.jit` and
`jax.grad`) must raise the example's error. A gradient whose program needs
none of a failed node's results (a loss linear in an ODE's states, a loop's
step count) is exactly what used to come back finite and wrong.

The examples are functions of one float vector `x`, with the failure built
in; `derivative_only` marks guards that judge derivatives (a loss depending
on an eigenvector inside a degenerate cluster), whose forward call succeeds.
"""

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from registry_examples import builtin_primitives
from sciad.errors import (ConvergenceError, DegenerateEigenvalueError, IndexingError,
                          NonFiniteError, NotPositiveDefiniteError, SingularMatrixError)

_NAN3 = np.array([1.0, np.nan, 2.0])
_A3 = np.array([[4.0, 1.0, 0.0], [1.0, 5.0, 2.0], [0.0, 2.0, 6.0]])


def _while(x):
    # never ends: x + a stays positive; the gradient needs only the step count
    a = snp.sum(x)
    return sd.while_loop(lambda u: u > 0, lambda u: u + a, a, max_steps=10)


def _odeint(x):
    # y' = th y^2 blows up at t = 1/th: the step limit is met near it
    ys = sd.ode.odeint(lambda t, y, th: th * y ** 2, snp.ones(1), np.array([0.0, 2.0]),
                       snp.sum(x), max_steps=30)
    return snp.sum(ys)  # linear in the states: the gradient reads only the record


def _odeint_throw_false(x):
    ys = sd.ode.odeint(lambda t, y, th: th * y ** 2, snp.ones(1), np.array([0.0, 2.0]),
                       snp.sum(x), max_steps=30, throw=False).ys
    return snp.sum(ys)


def _blowup(loss, solver="tsit5", max_steps=30):
    """A failing solve (past the blow-up of y' = th y^2) under a loss of its states."""
    def f(x):
        ys = sd.ode.odeint(lambda t, y, th: th * y ** 2, snp.ones(2), np.array([0.0, 1.5, 2.0]),
                           snp.sum(x), solver=solver, max_steps=max_steps)
        return loss(ys)
    return f


def _radau_adjoint(x):
    # the field's Jacobian is NaN at the final time only (0 times the
    # derivative of sqrt at 0): the forward solve never evaluates it there,
    # the reverse pass's last stage does
    def f(t, y, k):
        return -k * y + 0.0 * snp.sqrt((1.0 - t) * y ** 2)

    ys = sd.ode.odeint(f, snp.ones(2), np.array([0.0, 0.5, 1.0]), snp.sum(x), solver="radau")
    return snp.sum(ys ** 2)


def _bdf_adjoint(x):
    # as _radau_adjoint's: the Jacobian NaN at the final time only, which
    # the reverse pass reads at the last step's result
    def f(t, y, k):
        return -k * y + 0.0 * snp.sqrt((1.0 - t) * y ** 2)

    ys = sd.ode.odeint(f, snp.ones(2), np.array([0.0, 0.5, 1.0]), snp.sum(x), solver="bdf")
    return snp.sum(ys ** 2)


def _radau_tangent(x):
    # the same field's forward sensitivity (forward mode through the steps)
    return sd.jvp(_radau_adjoint, (x,), (np.ones_like(x),))[1]


def _event(x):
    # y decays from 1 towards 0 and never crosses 2
    ev = sd.ode.odeint_event(lambda t, y, k: -k * y, snp.ones(1), (0.0, 1.0),
                             lambda t, y, k: y[0] - 2.0, snp.sum(x))
    return ev.t


def _root(x):
    # x^2 + c = 0 has no real root for c > 0
    return sd.optimize.root(lambda z, c: z ** 2 + c, snp.ones(1), (snp.sum(x),),
                            maxiter=8).x[0]


def _root_guard(x):
    r = sd.optimize.root(lambda z, c: z ** 2 + c, snp.ones(1), (snp.sum(x),), maxiter=8,
                         throw=False)
    return r.x[0]


def _solve(x):
    # a NaN right-hand side: the gradient in `b` needs no forward solution
    return snp.sum(sd.linalg.solve(_A3, x))


def _solve_singular(x):
    return snp.sum(sd.linalg.solve(snp.outer(x, x), x))


def _slogdet(x):
    # NaN in the matrix (x holds one)
    return sd.linalg.slogdet(snp.diag(x) + _A3)[1]


def _factor_slogdet(x):
    # NaN in the matrix, read from a given factorization
    from sciad.primitives._linalg import linalg_factor_p
    from sciad.primitives._logdet import linalg_factor_slogdet_p

    a = snp.diag(x) + _A3
    return linalg_factor_slogdet_p.bind(linalg_factor_p.bind(a, solver="lu", throw=False), a,
                                        solver="lu")[1]


def _selected_inverse(x):
    # [[x0, x1], [x1, x2]] = [[1, 2], [2, 4]]: singular, a zero pivot
    A = sd.sparse.coo_matrix((snp.stack([x[0], x[1], x[1], x[2]]), ([0, 0, 1, 1], [0, 1, 0, 1])),
                             shape=(2, 2))
    return snp.sum(sd.sparse.data(sd.linalg.selected_inverse(A)))


def _sparse_cholesky(x):
    # [[x0, x1], [x1, x2]] = [[1, 2], [2, 1]]: indefinite, the factor breaks down
    A = sd.sparse.coo_matrix((snp.stack([x[0], x[1], x[1], x[2]]), ([0, 0, 1, 1], [0, 1, 0, 1])),
                             shape=(2, 2))
    return snp.sum(sd.linalg.precision_sample(A, snp.ones(2)))


def _slq_logdet(x):
    # NaN in the matrix (x holds one), its log-determinant estimated
    A = sd.sparse.coo_matrix((x * x + 1.0, (np.arange(3), np.arange(3))), shape=(3, 3),
                             tags={"spd"})
    return sd.linalg.slogdet(A, solver="slq", probes=2, steps=3)[1]


def _factor(x):
    from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p

    a = snp.outer(x, x)  # rank one: the factorization finds a zero pivot
    return snp.sum(linalg_backsolve_p.bind(linalg_factor_p.bind(a, solver="lu"), a, x,
                                           solver="lu"))


def _backsolve(x):
    from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p

    a = snp.asarray(_A3)
    return snp.sum(linalg_backsolve_p.bind(linalg_factor_p.bind(a, solver="lu"), a, x,
                                           solver="lu"))


def _solve_operator(x):
    # CG on an indefinite operator with two iterations allowed
    d = snp.asarray([1.0, -2.0, 3.0])
    A = sd.linalg.operator(lambda v: d * v * snp.sum(x * x), (3, 3))
    return snp.sum(sd.linalg.solve(A, x, solver="cg", maxiter=1))


def _eigh_guard(x):
    # a repeated eigenvalue: an eigenvector's entry depends on the basis
    w, v = sd.linalg.eigh(snp.diag(snp.stack([x[0], x[0], x[1]])))
    return v[0, 0] ** 2 + w[0]


def _eigh_apply(x):
    # the square root of an indefinite matrix
    return snp.sum(sd.linalg.funm_hermitian(snp.diag(x), "sqrt"))


def _svd_guard(x):
    u, s, vh = sd.linalg.svd(snp.diag(snp.stack([x[0], x[0], x[1]])))
    return u[0, 0] ** 2 + s[0]


def _laplacian(c):
    n = 6
    i = np.arange(n)
    off = -c * snp.ones(n - 1)
    return sd.sparse.coo_matrix((snp.concatenate([2.0 * c * snp.ones(n), off, off]),
                                 (np.concatenate([i, i[:-1], i[1:]]),
                                  np.concatenate([i, i[1:], i[:-1]]))), shape=(n, n))


def _eigsh(x):
    # a repeated smallest eigenvalue, eigenvectors of its cluster used
    c = snp.sum(x)
    d = snp.concatenate([snp.stack([c, c]), snp.asarray([3.0, 4.0, 5.0, 6.0])])
    a = sd.sparse.coo_matrix((d, (np.arange(6), np.arange(6))), shape=(6, 6))
    w, v = sd.linalg.eigsh(a, k=2, which="SA")
    return snp.sum(v[0] ** 2) + w[0]


def _eigsh_operator(x):
    c = snp.sum(x)
    d = snp.concatenate([snp.stack([c, c]), snp.asarray([3.0, 4.0, 5.0, 6.0])])
    w, v = sd.linalg.eigsh(sd.linalg.operator(lambda u: d * u, (6, 6)), k=2, which="SA")
    return snp.sum(v[0] ** 2) + w[0]


def _index_bounds(x):
    i = snp.argmax(x) + 5  # out of range for three elements
    return snp.sum(snp.take(x, i))


def _weights_check(x):
    # weights that sum to zero (NumPy's ZeroDivisionError), known at run time
    return snp.average(np.array([1.0, 2.0, 3.0]), weights=x)


#: name -> (function, argument, error class, derivative_only)
FAILING = {
    "while": (_while, np.array([0.5]), ConvergenceError, False),
    "linalg.slogdet": (_slogdet, _NAN3, NonFiniteError, False),
    "linalg.factor_slogdet": (_factor_slogdet, _NAN3, NonFiniteError, False),
    "linalg.selected_inverse": (_selected_inverse, np.array([1.0, 2.0, 4.0]),
                                SingularMatrixError, False),
    "linalg.sparse_cholesky": (_sparse_cholesky, np.array([1.0, 2.0, 1.0]),
                               NotPositiveDefiniteError, False),
    "linalg.slq_logdet": (_slq_logdet, _NAN3, NonFiniteError, False),
    "ode.odeint": (_odeint, np.array([1.0]), ConvergenceError, False),
    "ode.event_guard": (_event, np.array([0.5]), ConvergenceError, False),
    "ode.radau_adjoint": (_radau_adjoint, np.array([1.0]), (NonFiniteError, ConvergenceError),
                          True),
    "ode.radau_tangent": (_radau_tangent, np.array([1.0]), (NonFiniteError, ConvergenceError),
                          False),
    # (forward mode takes other paths: sciad's solves the step's matrix,
    # NaN there; JAX's jvp of to_jax integrates the sensitivity system,
    # whose steps then shrink to nothing)
    "ode.bdf_adjoint": (_bdf_adjoint, np.array([1.0]), (NonFiniteError, ConvergenceError),
                        True),
    "optimize.root": (_root, np.array([1.0]), ConvergenceError, False),
    "optimize.root_guard": (_root_guard, np.array([1.0]), ConvergenceError, True),
    "linalg.solve": (_solve, _NAN3, NonFiniteError, False),
    "linalg.factor": (_factor, np.array([1.0, 2.0, 3.0]), SingularMatrixError, False),
    "linalg.backsolve": (_backsolve, _NAN3, NonFiniteError, False),
    "linalg.solve_operator": (_solve_operator, np.array([1.0, 2.0, 3.0]), ConvergenceError,
                              False),
    "linalg.eigh_guard": (_eigh_guard, np.array([1.0, 3.0]), DegenerateEigenvalueError, True),
    "linalg.eigh_apply": (_eigh_apply, np.array([1.0, -2.0, 3.0]), sd.errors.SciadError,
                          False),
    "linalg.svd_guard": (_svd_guard, np.array([2.0, 1.0]), DegenerateEigenvalueError, True),
    "linalg.eigsh": (_eigsh, np.array([1.0, 0.5]), DegenerateEigenvalueError, True),
    "linalg.eigsh_operator": (_eigsh_operator, np.array([1.0, 0.5]),
                              DegenerateEigenvalueError, True),
    "index_bounds": (_index_bounds, np.array([1.0, 2.0, 3.0]), IndexingError, False),
    "weights_check": (_weights_check, np.array([1.0, -2.0, 1.0]), sd.errors.ZeroSumError,
                      False),
}

#: failures beyond one per primitive: the cases a gradient used to drop
EXTRA = {
    "odeint throw=False": (_odeint_throw_false, np.array([1.0]), ConvergenceError, True),
    "solve of a singular matrix": (_solve_singular, np.array([1.0, 2.0, 3.0]),
                                   SingularMatrixError, False),
    "odeint ys[-1, 0]": (_blowup(lambda ys: ys[-1, 0]), np.array([1.0]), ConvergenceError,
                         False),
    "odeint sum(w * ys)": (_blowup(lambda ys: snp.sum(np.array([[1.0, 2.0]]) * ys)),
                           np.array([1.0]), ConvergenceError, False),
    "odeint mean(ys[:, 1])": (_blowup(lambda ys: snp.mean(ys[:, 1])), np.array([1.0]),
                              ConvergenceError, False),
    "odeint kvaerno5": (_blowup(snp.sum, "kvaerno5", 5), np.array([1.0]), ConvergenceError,
                        False),
}

#: examples whose every transform is slow (an implicit solver's compile, an
#: event's five solves, the report's further ODE losses)
SLOW = {"odeint kvaerno5", "ode.event_guard", "odeint sum(w * ys)", "odeint mean(ys[:, 1])"}


def _ones(x):
    return np.ones_like(x)


def _scalar(f):
    return lambda x: snp.sum(f(x))


# each transform runs the example (a function of one vector) and forces the result
TRANSFORMS = {
    "function": (False, lambda f, x: sd.function(f)(x)),
    "grad": (True, lambda f, x: sd.grad(f)(x)),
    "value_and_grad": (True, lambda f, x: sd.value_and_grad(f)(x)),
    "jvp": (True, lambda f, x: sd.jvp(f, (x,), (_ones(x),))),
    "vjp": (True, lambda f, x: sd.vjp(f, x)[1](np.float64(1.0))),
    "hvp": (True, lambda f, x: sd.hvp(f, x, _ones(x))),
    "jacfwd": (True, lambda f, x: sd.jacfwd(f)(x)),
    "jacrev": (True, lambda f, x: sd.jacrev(f)(x)),
    "jacrev(grad)": (True, lambda f, x: sd.jacrev(sd.grad(f))(x)),
    "jacfwd(grad)": (True, lambda f, x: sd.jacfwd(sd.grad(f))(x)),
    "vmap": (False, lambda f, x: sd.vmap(f)(np.stack([x, x]))),
    "vmap(grad)": (True, lambda f, x: sd.vmap(sd.grad(f))(np.stack([x, x]))),
    "to_jax jit": (False, lambda f, x: jax.jit(sd.to_jax(f))(x)),
    "to_jax jit(grad)": (True, lambda f, x: jax.jit(jax.grad(sd.to_jax(f)))(x)),
    "to_jax jacrev(grad)": (True, lambda f, x: jax.jacrev(jax.grad(sd.to_jax(f)))(x)),
    "to_jax jvp": (True, lambda f, x: jax.jvp(sd.to_jax(f), (x,), (_ones(x),))),
}

#: by default every transform of two cheap representative failures, two of
#: the ODE's, and the gradient of every other; the rest with -m slow
DEFAULT = {"while": set(TRANSFORMS), "linalg.solve": set(TRANSFORMS),
           "ode.odeint": {"grad", "to_jax jit(grad)"},
           "optimize.root_guard": {"grad", "jacfwd", "to_jax jit(grad)"},
           "ode.radau_tangent": {"function"}}


def _raises(fn, cls):
    """Runs `fn`, which must raise `cls` (the sciad error also when it comes
    out of a JAX runtime error, as from a user's own `jax.jit`)."""
    try:
        out = fn()
        jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001 - the class is checked below
        err = sd.errors.runtime_error_from(e) or e
        assert isinstance(err, cls), f"raised {type(err).__name__}: {err}"
        return
    pytest.fail(f"no error; returned {out}")


#: checked primitives that have no failure of their own: a condition number
#: is an answer for every matrix (infinite for a singular one, NaN for one
#: holding NaN, as NumPy's `cond`); they take the run-time `site` for the
#: factorization they make or read, whose failures are `linalg.factor`'s
NO_FAILURE = {"linalg.rcond", "linalg.factor_rcond"}


def test_every_failing_primitive_has_a_failing_example():
    checked = {name for name in builtin_primitives()
               if sd.graph.lookup_primitive(name).runtime_checks}
    missing = sorted(checked - set(FAILING) - NO_FAILURE)
    assert not missing, ("add a failing example to tests/test_failure_transforms.py "
                         f"for: {missing}")


def _cases():
    for name, (fn, x, cls, deriv_only) in {**FAILING, **EXTRA}.items():
        for t, (is_derivative, _) in TRANSFORMS.items():
            if deriv_only and not is_derivative:
                continue
            slow = name in SLOW or t not in DEFAULT.get(name, {"grad"})
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(name, t, marks=marks, id=f"{name}-{t}")


@pytest.mark.parametrize("name,transform", list(_cases()))
def test_every_transform_of_a_failure_raises(name, transform):
    fn, x, cls, _ = {**FAILING, **EXTRA}[name]
    _, run = TRANSFORMS[transform]
    _raises(lambda: run(fn, x), cls)


@pytest.mark.parametrize("name", sorted(FAILING))
def test_each_failing_example_uses_its_primitive(name):
    fn, x, _, _ = FAILING[name]
    ops = set()

    def walk(g):
        for n in g.nodes:
            ops.add(n.primitive.name)
            for s in n.subgraphs:
                walk(s)

    walk(sd.trace(fn, x))
    walk(sd.trace(sd.grad(fn), x))
    assert name in ops


def test_dce_keeps_a_node_that_can_fail():
    """A checked node whose results nothing reads still runs (and raises);
    a pure one goes."""
    def f(x):
        sd.linalg.solve(_A3, x)  # unused: its check must still run
        snp.sin(x)  # unused and pure: dropped
        return snp.sum(x)

    g = sd.graph.passes.dce(sd.trace(f, np.ones(3)))
    assert [n.primitive.name for n in g.nodes] == ["linalg.solve", "reduce_sum"]
    _raises(lambda: sd.function(f)(_NAN3), NonFiniteError)
    _raises(lambda: sd.grad(f)(_NAN3), NonFiniteError)


def test_no_pass_removes_a_check():
    """`optimize` (simplify, fold_constants, cse, share_factors, hoist, dce)
    keeps checked nodes whose results nothing reads, at the top level and in
    a loop's body."""
    def f(x):
        sd.linalg.solve(_A3, x)
        sd.while_loop(lambda u: u > 0, lambda u: u + 1.0, snp.sum(x * 0.0) + 1.0,
                      max_steps=3)

        def step(c, _):
            sd.linalg.solve(_A3, x * c)  # loop-invariant but for c: stays in the body
            return c, None

        c, _ = sd.scan(step, 1.0, None, length=2)
        return snp.sum(x) * c

    g = sd.graph.passes.optimize(sd.trace(f, np.ones(3)))
    names = [n.primitive.name for n in g.nodes]
    assert names.count("linalg.solve") + names.count("linalg.backsolve") >= 1
    assert "while" in names and "scan" in names
    _raises(lambda: sd.graph.evaluate(g, _NAN3), NonFiniteError)
    _raises(lambda: sd.graph.evaluate(g, np.ones(3)), ConvergenceError)
