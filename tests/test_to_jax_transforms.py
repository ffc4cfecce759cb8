"""Every JAX transform of `sd.to_jax(f)`, for every linear-solver record.

`f` solves with one solver of the registry (`records("linear")`: the
dense, the sparse direct ones, the cuDSS stand-in, the Krylov ones) on a
matrix built from its argument, and each of JAX's own transforms of
`sd.to_jax(f)` (jit, grad, jacrev, jacfwd, hessian, jvp, vjp, vmap of jvp,
and `jax.jit` of jacfwd and hessian) must run and agree with the same
derivatives of a dense NumPy solve.

It runs in a child process: `jax.jacfwd` of a KLU solve once freed one
factor once per tangent (a SIGSEGV), and a crash must fail this test, not
kill the test worker. `jax.jacfwd` and `jax.hessian` are `jax.vmap` over
tangents of programs that factor outside the batch: the factor is made and
freed once, its solves batched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sciad.solvers._registry import lookup, records

# (the cuDSS record runs its host stand-in: KLU's kernels with a ledger)
SOLVERS = sorted(r.name for r in records("linear"))
ITERATIVE = ("cg", "gmres", "bicgstab")
#: the records walked to second order by default: the compiled ones, whose
#: factors `jax.jacfwd` and `jax.hessian` batch over (where the SIGSEGV was);
#: the others' second order, compile-heavy, runs with `-m slow`
SECOND_ORDER = ("klu", "cudss", "cholmod")
#: walked with `-m slow`: dense Cholesky and LU (a factor in the program, its
#: solves batched by JAX: no handle to outlive a transform; the registry walk
#: lowers them too) and SciPy's spsolve (the host SuperLU path splu takes)
SAME_PATH = ("cholesky", "lu", "spsolve")
#: the records the default walk takes: all but the Krylov solves, whose
#: walk (13-20 s of compilation each) runs with `-m slow`, to second order
#: (`test_second_order_jax_transforms_of_the_other_records`), and SAME_PATH
DEFAULT_WALK = [s for s in SOLVERS if s not in ITERATIVE and s not in SAME_PATH]

_CHILD = textwrap.dedent('''
    import contextlib, json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import sciad as sd, sciad.numpy as snp
    from sciad.solvers import _batch_split
    from sciad.solvers.direct import _cudss

    n = 4
    rows = np.array([0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    cols = np.array([0, 1, 0, 1, 2, 1, 2, 3, 2, 3])
    v = jnp.array([4.0, 1.0, 5.0, 0.5, 6.0, 0.3, 7.0])
    t = jnp.array([0.3, -0.2, 0.1, 0.4, -0.5, 0.2, 0.6])

    def run(solver, second):
        dense = solver in ("lu", "cholesky")
        kw = dict(tol=1e-12) if solver in ("cg", "gmres", "bicgstab") else {}

        def f(v):   # v: the matrix's entries (symmetric: mirrored), x = A(v)^-1 b
            d = snp.concatenate([v[:1], v[1:2], v[1:2], v[2:3], v[3:4], v[3:4], v[4:5],
                                 v[5:6], v[5:6], v[6:7]])
            A = sd.sparse.coo_matrix((d, (rows, cols)), shape=(n, n), tags={"spd"})
            if dense:
                A = A.todense()
            return sd.linalg.solve(A, np.arange(1.0, n + 1), solver=solver, **kw)

        g = sd.to_jax(f)
        s = lambda v: jnp.sum(g(v) ** 2)
        out = {}
        live = _batch_split.live_handles()
        out["jit"] = jax.jit(g)(v)
        out["grad"] = jax.grad(s)(v)
        out["jacrev"] = jax.jacrev(g)(v)
        out["jacfwd"] = jax.jacfwd(g)(v)
        out["jit_jacfwd"] = jax.jit(jax.jacfwd(g))(v)
        if second:
            out["hessian"] = jax.hessian(s)(v)
            out["jit_hessian"] = jax.jit(jax.hessian(s))(v)
        out["jvp"] = jax.jvp(g, (v,), (t,))[1]
        out["vjp"] = jax.vjp(g, v)[1](jnp.arange(1.0, n + 1))[0]
        out["vmap_jvp"] = jax.vmap(lambda t: jax.jvp(g, (v,), (t,))[1])(jnp.eye(7)[:3])
        jax.effects_barrier()
        out["live"] = _batch_split.live_handles() - live
        return {k: np.asarray(x).tolist() for k, x in out.items()}

    results = {}
    for item in sys.argv[1:]:   # solver:all or solver:first
        solver, which = item.split(":")
        print(f"running {item}", file=sys.stderr, flush=True)  # (a crash names its solver)
        with _cudss.use_kernels(_cudss.StandIn()) if solver == "cudss" else \\
                contextlib.nullcontext():
            results[item] = run(solver, which == "all")
    print("RESULT " + json.dumps(results))
''')


def _available(solver) -> bool:
    if solver == "cholmod":
        return lookup("cholmod").available()
    if solver in ("klu", "cudss"):
        try:
            import klujax_cpp  # noqa: F401
        except ImportError:
            return False
    return True


def _walk(items):
    """Runs the child on `items` ("solver:all" / "solver:first"); returns its
    results by item."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, *items], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (
        f"the child process died (status {proc.returncode}):\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT "):])


def _depth(solver) -> str:
    return "all" if solver in SECOND_ORDER else "first"


@pytest.fixture(scope="module")
def walked():
    """One child for the default walk: every record but the Krylov solves,
    second order for the compiled ones (the others' second order, and the
    Krylov solves' whole walk: `-m slow`)."""
    return _walk([f"{s}:{_depth(s)}" for s in DEFAULT_WALK if _available(s)])


def _dense_truth():
    """The same derivatives of a dense NumPy solve, by hand (A symmetric)."""
    n = 4
    b = np.arange(1.0, n + 1)
    v = np.array([4.0, 1.0, 5.0, 0.5, 6.0, 0.3, 7.0])
    t = np.array([0.3, -0.2, 0.1, 0.4, -0.5, 0.2, 0.6])
    where = [[(0, 0)], [(0, 1), (1, 0)], [(1, 1)], [(1, 2), (2, 1)], [(2, 2)],
             [(2, 3), (3, 2)], [(3, 3)]]
    E = np.zeros((7, n, n))
    for k, ij in enumerate(where):
        for i, j in ij:
            E[k, i, j] = 1.0
    A = np.einsum("k,kij->ij", v, E)
    Ai = np.linalg.inv(A)
    x = Ai @ b
    J = -np.einsum("ij,kjl,l->ik", Ai, E, x)  # dx/dv_k = -A^-1 E_k x
    # s = |x|^2: ds = 2 x.J; d2s/dv_k dv_l = 2 (J^T J + x . d2x)
    d2x = np.einsum("ij,kjl,lm,pmq,q->ikp", Ai, E, Ai, E, x)
    H = 2 * (J.T @ J + np.einsum("i,ikp->kp", x, d2x + d2x.transpose(0, 2, 1)))
    return dict(jit=x, grad=2 * J.T @ x, jacrev=J, jacfwd=J, jit_jacfwd=J, hessian=H,
                jit_hessian=H, jvp=J @ t, vjp=J.T @ b, vmap_jvp=J[:, :3].T)


@pytest.mark.parametrize("solver", DEFAULT_WALK)
def test_every_jax_transform_of_to_jax_runs_and_agrees(walked, solver):
    if not _available(solver):
        pytest.skip(f"{solver}'s optional dependency is not installed")
    _agrees(solver, walked[f"{solver}:{_depth(solver)}"])


@pytest.mark.slow
@pytest.mark.parametrize("solver", [s for s in SOLVERS if s not in SECOND_ORDER])
def test_second_order_jax_transforms_of_the_other_records(solver):
    if not _available(solver):
        pytest.skip(f"{solver}'s optional dependency is not installed")
    _agrees(solver, _walk([f"{solver}:all"])[f"{solver}:all"])


def _agrees(solver, got):
    assert got.pop("live") == 0, "a factor made by a transform was not freed"
    iterative = solver in ITERATIVE
    for name, want in _dense_truth().items():
        if name not in got:
            assert "hessian" in name and solver not in SECOND_ORDER
            continue
        np.testing.assert_allclose(np.asarray(got[name]), want,
                                   rtol=1e-7 if iterative else 1e-10, atol=1e-12,
                                   err_msg=f"{solver}: {name}")


DIRECT = sorted(r.name for r in records("linear") if r.direct)


@pytest.mark.parametrize("solver", DIRECT)
def test_a_singular_matrix_names_the_users_line(solver):
    """A singular matrix is sciad's error, with its text and the user's line,
    for every direct backend, under `sd.function`, `sd.grad` and the user's
    own `jax.jit(sd.to_jax(f))` (there it crosses XLA as JAX's runtime error
    carrying sciad's; `sd.errors.unwrapped()` raises it as sciad's class).
    KLU's factorization once failed inside its kernel, with the kernel's text
    alone."""
    import jax
    import jax.numpy as jnp

    import sciad as sd
    import sciad.numpy as snp
    from sciad.errors import NotPositiveDefiniteError, SingularMatrixError
    from sciad.solvers.direct import _cudss

    if not _available(solver):
        pytest.skip(f"{solver} is not installed")
    spd = solver in ("cholesky", "cholmod")
    rows = np.array([0, 0, 1, 1, 2])
    cols = np.array([0, 1, 0, 1, 2])

    def f(v):  # [[1, 1, 0], [1, 1, 0], [0, 0, 1]] scaled: singular
        A = sd.sparse.coo_matrix((v, (rows, cols)), shape=(3, 3))
        if solver in ("lu", "cholesky"):
            A = A.todense()
        x = sd.linalg.solve(A, np.arange(1.0, 4.0), solver=solver,
                            assume="spd" if spd else None)
        return snp.sum(x ** 2)

    v = jnp.array([1.0, 1.0, 1.0, 1.0, 1.0])
    want = (SingularMatrixError, NotPositiveDefiniteError)
    with _cudss.use_kernels(_cudss.StandIn()) if solver == "cudss" else \
            __import__("contextlib").nullcontext():
        for name, call in [("function", lambda: sd.function(f)(v)),
                           ("grad", lambda: sd.grad(f)(v)),
                           ("jit_to_jax", lambda: jax.jit(sd.to_jax(f))(v)),
                           ("jit_grad_to_jax", lambda: jax.jit(jax.grad(sd.to_jax(f)))(v))]:
            with pytest.raises(want) as e, sd.errors.unwrapped():
                jax.block_until_ready(call())
            assert "test_to_jax_transforms.py" in str(e.value), (solver, name, str(e.value))
            assert "singular" in str(e.value) or "positive definite" in str(e.value)
