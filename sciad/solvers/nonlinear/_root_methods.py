"""What a root method record is (optimistix's solver classes are the model):
the interface that `optimize.root`'s rules and `sd.optimize.root` /
`fixed_point` ask, in two families of the registry.

- `"root"`: the method, the node's `method` param (`newton`, `chord`,
  `anderson`) or a name the public functions take for one (`newton_krylov`,
  `picard`): the loop it runs (`run`, from `sciad.solvers.nonlinear._nonlinear`),
  whether it keeps its factorization over iterations (`chord`) and may be
  started with a given matrix (`takes_jac0`), and how its failures read.
- `"jacobian"`: how Newton's linear systems and the derivatives' are solved
  (the node's `jac` param: `sparse`, `dense`, `gmres`): the `LinearSolve` of
  an iteration, the linear solver record the derivatives use, whether the
  node keeps the last factorization as an output, and its cost per iteration.
"""

from __future__ import annotations

from .._registry import lookup


class AbstractRootMethod:
    """A root method: a record registered in the `"root"` family.

    - `kind`: the problem it solves, "root" (`F(x) = 0`) or "fixed_point"
      (`x = G(x)`; the node's body is then `G`).
    - `node_method`: the `method` param of the node it makes (a public alias:
      another record's name; None: its own).
    - `jac`, `memory`: a Jacobian form or Anderson depth the alias fixes.
    - `uses_jacobian`: each iteration solves with the Jacobian (a
      `LinearSolve` from the node's Jacobian record).
    - `chord`: it keeps the Jacobian's factorization over iterations (so it
      needs a form that factors: not matrix-free).
    - `takes_jac0`: it may be started with a given matrix (`jac0`).
    - `flattens_x0`: `sd.optimize.root` flattens `x0` (SciPy's `hybr`, `lm`).
    """

    family = "root"
    name: str
    kind: str = "root"
    node_method: str | None = None
    jac: str | None = None
    memory: int | None = None
    uses_jacobian: bool = True
    chord: bool = False
    takes_jac0: bool = False
    #: `sd.optimize.root` flattens `x0` for it (SciPy's `hybr` and `lm` do)
    flattens_x0: bool = False

    def describe(self, jac: str) -> str:
        """The method as a failure's message names it."""
        return self.name

    def default_maxiter(self, n: int) -> int:
        """The iteration limit where `maxiter` is not given, for `n` unknowns."""
        return 50

    def maxiter_advice(self, maxiter: int) -> str:
        """What to do when it ran out of iterations."""
        return (f"Raise `maxiter` (it is {maxiter}), start closer to the root, or loosen "
                "`tol`.")

    def run(self, F, x, *, linear, tol: float, atol: float, maxiter: int, memory: int,
            at_floor: bool):
        """The loop on the flat residual `F` from `x` (with `linear`, the
        Jacobian's `LinearSolve`, where `uses_jacobian`): a
        `sciad.solvers.nonlinear._nonlinear.Result`."""
        raise NotImplementedError


class AbstractNewtonJacobian:
    """How a root's Jacobian is formed and solved: a record registered in the
    `"jacobian"` family.

    - `matrix_free`: only its products are formed (JVPs), solved by a Krylov
      method; else a matrix, factored.
    - `sparse`: the matrix is sparse, on the pattern detected from the body.
    - `keeps_factor`: the node keeps the last iteration's factorization (an
      output, held on the host) for the derivatives' solves to refine with.
    - `solver`: the linear solver record (a name) of the derivatives' solves
      (and of the kept factorization).
    - `derivative_rtol`: their tolerance, for a Krylov solver.
    """

    family = "jacobian"
    name: str
    matrix_free: bool = False
    sparse: bool = False
    keeps_factor: bool = False
    solver: str
    derivative_rtol: float | None = None

    def linear_solve(self, jacobian, *, pattern, x, uses, chord: bool, start):
        """The `LinearSolve` Newton uses, given `jacobian`, the lowered
        Jacobian function (`x -> (values,)`, `x -> (J,)` or `(x, v) -> (J v,)`),
        for the flat unknowns `x`; `chord`: keep the factorization over
        iterations; `start`: the matrix a chord's first iterations solve with;
        `uses`: how many solves read a kept factorization."""
        raise NotImplementedError

    def step_flops(self, n: int, jvp_flops: float, colors: int, factor_flops: float,
                   solve_flops: float) -> float:
        """FLOPs of a Newton step's linear algebra: forming the Jacobian and
        solving with it (`factor_flops`, `solve_flops`: of `solver`)."""
        raise NotImplementedError

    def temp_bytes(self, n: int, factor_bytes: int) -> int:
        """The memory a step holds (`factor_bytes`: the kept factorization's)."""
        return 0


def sparse_jacobian(jac: str | None) -> bool:
    """Whether the Jacobian form `jac` names (None: not chosen yet) is a
    sparse matrix on a detected pattern (its record's `sparse`)."""
    return jac is not None and lookup(jac, "jacobian").sparse
