"""What a linear solver record is: the interface that `linalg.solve`'s rules
ask (lineax's `AbstractLinearSolver` is the model), and "auto", which picks a
solver by asking the registered records.

A record applies to some matrices (`"dense"`, `"sparse"` on a pattern, or a
matrix-free `"operator"`) of some dtypes; a direct one factors the matrix once
(`factor`, a tuple of arrays, the value `linalg.factor` makes and
`share_factors` shares) and solves with the factor (`solve`, plain or
transposed); an iterative one solves with a `matvec` (`solve_matvec`). It says
where its work runs (`where`: "device" or "host"), how its failures read
(`breakdown`), what it costs (`factor_flops`, `solve_flops`,
`iteration_flops`: what `sd.cost` reports) and whether, for a symmetric
matrix, its adjoint solve is the forward solve itself (`symmetric_adjoint`)
rather than the transposed one.
"""

from __future__ import annotations

import jax
import numpy as np

from ..errors import DTypeError, InvalidOptionError, SingularMatrixError
from ._registry import lookup, names, records

MATRICES = ("dense", "sparse", "operator")


class AbstractLinearSolver:
    """A linear solver: a record registered in the `"linear"` family.

    - `name`: the graph param that names it.
    - `matrices`: which of "dense", "sparse", "operator" it takes.
    - `dtype_kinds`: the dtype kinds it takes ("f" real, "c" complex).
    - `direct`: True for a factorization (`AbstractDirectSolver`), False for
      a Krylov method (`AbstractIterativeSolver`).
    - `where`: "device" (runs in the compiled program) or "host" (a host call).
    - `symmetric_adjoint`: for a matrix declared symmetric, the adjoint solve
      is this same solve (not the transposed one).
    """

    family = "linear"
    name: str
    matrices: frozenset = frozenset()
    dtype_kinds: str = "fc"
    direct: bool = False
    where: str = "device"
    symmetric_adjoint: bool = False

    def preference(self, *, matrix: str, tags: frozenset, dtype) -> float | None:
        """How much "auto" wants this solver for such a matrix (the highest
        wins); None: "auto" never picks it (it may still be asked for)."""
        return None

    def preference_for(self, pattern, *, matrix: str, tags: frozenset, dtype) -> float | None:
        """`preference` for a sparse matrix on `pattern` (None: unknown); a
        solver whose speed depends on the pattern overrides it."""
        return self.preference(matrix=matrix, tags=tags, dtype=dtype)

    def rejects(self, *, matrix: str, dtype, tags: frozenset, shown: str = ""):
        """Why this solver cannot solve such a system: `(exception class,
        message)`, or None where it can. `shown`: the matrix's type as the
        message shows it."""
        if matrix not in self.matrices:
            return InvalidOptionError, (
                f"solver {self.name!r} does not take a {matrix} matrix; choose one of "
                f"{', '.join(map(repr, names_for(matrix)))}.")
        kind = np.dtype(dtype).kind
        if kind not in self.dtype_kinds:
            words = {"f": "real", "c": "complex"}
            alt = [r.name for r in records() if matrix in r.matrices
                   and kind in r.dtype_kinds and r.direct]
            return DTypeError, (
                f"solver {self.name!r} takes {' or '.join(words[k] for k in self.dtype_kinds)} "
                f"matrices, got {shown or np.dtype(dtype)}"
                + (f"; use a direct solver ({', '.join(map(repr, alt))}) for "
                   f"{words.get(kind, kind)} ones." if alt else "."))
        return None


class AbstractDirectSolver(AbstractLinearSolver):
    """A solver that factors the matrix once and solves with the factor.

    - `sparse`: it factors sparse matrices (on a pattern), else dense ones.
    - `held_on_host`: its factor lives in a host store (the run-time value is a
      handle), freed by the last solve that reads it (`uses`).
    - `host_checks`: its factorization and solves are checked in its own host
      calls (`report` callbacks), not measured in the program.
    - `frees_factor`: its factor holds resources the program makes and must
      release (compiled handles): `factor` makes them only when given `uses`
      (all readers in the program that factors), and `release(factor,
      after)` frees them once the values `after` are computed;
      `release_now(handles)` (or None), from the host, where a check stops
      the program before that (safe on handles released already).
    - `breakdown`: the exception class and message of a failed factorization,
      and the extra fields the exception carries; `breakdown_for(tags)`, the
      same for a matrix with `tags` (a Cholesky's, for "spd", say).
    - `nan_on_breakdown`: (a sparse solver that factors in its solves' calls)
      a solve whose factorization broke down returns all NaN, which the
      program judges as `breakdown` says.
    """

    direct = True
    sparse: bool = False
    held_on_host: bool = False
    host_checks: bool = False
    frees_factor: bool = False
    nan_on_breakdown: bool = False
    breakdown = (SingularMatrixError,
                 "the matrix is singular: the factorization found a zero pivot.",
                 {"rcond": 0.0})

    def breakdown_for(self, tags) -> tuple:
        """`breakdown` for a matrix with `tags` (its structure: "spd", ...)."""
        return self.breakdown

    def factor_layout(self, n: int, dtype, pattern) -> tuple:
        """`((shape, dtype), ...)` of the arrays `factor` returns."""
        raise NotImplementedError(f"solver {self.name!r} declares no factor layout.")

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None) -> tuple:
        """The factorization of `a` (dense `(n, n)`, or a sparse matrix's values
        on `pattern`), a tuple of arrays. A `host_checks` solver calls
        `report(**status)` on the host (it may raise); `uses`: the number of
        solves that will read a factor held on the host."""
        raise NotImplementedError

    def release(self, factor, after) -> None:
        """A `frees_factor` solver: frees what `factor` holds, after the values
        `after` (a list of JAX arrays) are computed."""
        raise NotImplementedError

    #: (a `frees_factor` solver) frees `factor[0]`'s handles, a NumPy
    #: array, from the host (a failed check's), or None where it cannot
    release_now = None

    def solve(self, factor, a, b, *, pattern=None, transpose: bool = False, **checks):
        """`x` with `a x = b` (`a^T x = b` if `transpose`: never conjugated),
        from `factor`. `checks` (a `host_checks` solver: `refine_above`,
        `estimate`, `report`) ask it to check in its host call; `numeric` (a
        `frees_factor` solver) says the factor is one the program made and
        frees itself, not a placeholder for a factor made elsewhere."""
        raise NotImplementedError

    def ok(self, factor):
        """A dense factorization: False where it broke down (measured in the
        program)."""
        return np.bool_(True)

    def rcond_host(self, m: np.ndarray, anorm: float) -> float:
        """A dense factorization, on the host: the reciprocal 1-norm condition
        estimate from `m = factor[0]` and `||A||_1`."""
        return float("nan")

    def rcond(self, factor, a, *, pattern=None):
        """A sparse factorization: the reciprocal 1-norm condition estimate of
        the matrix with values `a`, in the program."""
        raise NotImplementedError

    def product(self, pattern):
        """A sparse solver with a compiled product of its own: `(values, x,
        transpose) -> op(A) x` on `pattern`, which the checks of its solves
        use (residuals, norms, empty rows); None: sciad's sparse product (a
        gather and a scatter, each compiled by XLA into every checked
        program)."""
        return None

    def factor_flops(self, n: int, fill) -> float:
        """FLOPs of a factorization (`fill`: the pattern's LU fill, or None for
        a dense matrix)."""
        raise NotImplementedError

    def solve_flops(self, n: int, fill) -> float:
        """FLOPs of a solve with the factor, per right-hand side."""
        if fill is not None:
            return 2.0 * (fill.nnz_l + fill.nnz_u)
        return 2.0 * n * n


class AbstractIterativeSolver(AbstractLinearSolver):
    """A Krylov method on a `matvec` (see `sciad.solvers.iterative._iterative`): real
    matrices, dense, sparse or matrix-free.

    - `left_preconditioned`: a preconditioner is applied on the left (CG,
      which needs it symmetric), else on the right (the residual tested is
      then the true one).
    """

    matrices = frozenset(MATRICES)
    dtype_kinds = "f"
    left_preconditioned: bool = False
    #: appended to the message of a solve that did not converge
    convergence_hint: str = ""

    def krylov(self, op, u, rtol: float, tol, maxiter: int, precond):
        """Solves `op(y) = u` (`u` of order 1) to `||u - op(y)|| <= tol`;
        returns `(y, steps)`. `precond`: the left preconditioner, a linear
        `v -> M^-1 v` (a left-preconditioned method only), or None."""
        raise NotImplementedError

    def iteration_flops(self, n: int, matvec_flops: float) -> float:
        """FLOPs per iteration: a product with the matrix and a few vector
        operations."""
        return matvec_flops + 10.0 * n


def names_for(matrix: str) -> tuple[str, ...]:
    """The registered solvers that take a `matrix` ("dense", "sparse",
    "operator")."""
    return tuple(r.name for r in records() if matrix in r.matrices)


def backend() -> str:
    """JAX's default backend ("cpu", "gpu", "tpu", ...), where the programs
    that "auto" chooses for run; "cpu" where none can be had."""
    try:
        return jax.default_backend()
    except RuntimeError:
        return "cpu"


def ranking(*, matrix: str, tags: frozenset, dtype, pattern=None) -> list:
    """`(record, preference, why not)` of every registered record, the most
    preferred first: `why not` is None for the records "auto" may pick,
    else the reason it may not (the record's own refusal; no preference for
    such a matrix; a host factorization where the program runs on an
    accelerator: "auto" never moves a solve to the host silently)."""
    device = backend()
    out = []
    for r in records():
        s = r.preference_for(pattern, matrix=matrix, tags=tags, dtype=dtype)
        why = r.rejects(matrix=matrix, dtype=dtype, tags=tags)
        if why is not None:
            why = why[1]
        elif s is None:
            why = f"not a choice of 'auto' for a {matrix} matrix here"
        elif r.where == "host" and device != "cpu":
            why = (f"it runs on the host, and the program on the {device}: ask for it by "
                   "name to factor there")
        out.append((r, s, why))
    out.sort(key=lambda t: (t[2] is not None, -(t[1] if t[1] is not None else -np.inf)))
    return out


def choose(*, matrix: str, tags: frozenset, dtype, pattern=None):
    """The record "auto" picks: the most preferred applicable one (for a
    sparse matrix, given its `pattern`, as the records measured it; see
    `ranking`)."""
    best, _, why = ranking(matrix=matrix, tags=tags, dtype=dtype, pattern=pattern)[0]
    assert why is None, f"no solver applies to a {matrix} matrix of {dtype}"
    return best


def requested(solver, preconditioner, *, tags: frozenset, partition=None, op=None):
    """`(solver, preconditioner)` as a solve's arguments ask, resolved at the
    API boundary: a sharded solve's "auto" is a Krylov method ("cg" for an
    spd matrix, else "gmres"); `solver="amg"` is shorthand for that Krylov
    method preconditioned by "amg"."""
    known = ("auto", "amg") + names("linear")
    if not isinstance(solver, str) or solver not in known:
        raise InvalidOptionError(
            f"unknown solver {solver!r}; choose one of {', '.join(map(repr, known))} "
            "(sd.linalg.explain_solver(A) says what \"auto\" picks for A, and why).", op=op)
    krylov = "cg" if "spd" in tags else "gmres"
    if partition is not None and solver == "auto":  # (a sharded solve is a Krylov one)
        solver = krylov
    # (a name or a configured record: known, or refused here)
    pre = None if preconditioner is None else \
        lookup(preconditioner, "preconditioner", op=op, what="preconditioner")
    if solver == "amg":
        if pre is not None and pre.name != "amg":
            raise InvalidOptionError(f"solver='amg' is preconditioned by 'amg', got "
                                     f"preconditioner={preconditioner!r}; name a Krylov "
                                     "solver ('cg', 'gmres') to use another.", op=op)
        solver, preconditioner = krylov, preconditioner or "amg"
    return solver, preconditioner


def auto_preconditioner(solver, record, preconditioner, *, sparse: bool, tags: frozenset):
    """The preconditioner of a solve: the one asked for, or, where "auto"
    chose a Krylov method for a sparse spd matrix (the device path on an
    accelerator without a direct solver there), algebraic multigrid."""
    if solver == "auto" and sparse and not record.direct and preconditioner is None \
            and "spd" in tags:
        return "amg"
    return preconditioner


def resolve(name, *, matrix: str, tags: frozenset, dtype, op: str | None = None,
            pattern=None):
    """The record a solve asks for: `choose`'s if `name` is "auto", else the
    registered one (an unknown name raises `InvalidOptionError`)."""
    if name == "auto":
        return choose(matrix=matrix, tags=tags, dtype=dtype, pattern=pattern)
    return lookup(name, "linear", op=op)
