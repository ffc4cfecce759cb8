"""Numerical backends that lowering calls: plain JAX/SciPy code, no graphs.

Each solver is a record in one file, registered here by name (see
`_registry`); the graph param that picks it stays the name. Each solver
returns its result together with what a caller needs to detect failure
(pivots, residuals, iteration counts); turning that into an error is the
primitives' business.

The records are grouped by family, one subpackage each: `direct` (dense
and sparse factorizations), `iterative` (Krylov solvers and
preconditioners), `nonlinear` (root methods and Jacobians), `ode`
(steppers and step control); `csrc/` holds the C++ the compiled backends
share, and this package's own modules what every family uses (the registry,
the linear solvers' base records and "auto"'s ranking, index arithmetic on
patterns, host calls, measures).

Adding a solver: one file in its family with its record (an
`AbstractDirectSolver` or `AbstractIterativeSolver` of `_linear`, a root
method of `nonlinear._root_methods`, a preconditioner,
`AbstractPreconditioner` of `iterative._iterative`) and one `register(...)`
line below.
"""

from .iterative._amg import AMG
from .iterative._block_amg import BlockAMG
from .nonlinear._anderson import Anderson
from .iterative._bicgstab import BiCGStab
from .iterative._cg import CG
from .direct._cholesky import Cholesky
from .direct._cholmod import Cholmod
from .direct._cholmod_ffi import CompiledCholmod, installed as _sparsax_installed
from .direct._cudss import CuDSS
from .nonlinear._chord import Chord
from .iterative._gmres import GMRES
from .iterative._jacobi import Jacobi
from .nonlinear._jacobian_band import BandJacobian
from .nonlinear._jacobian_dense import DenseJacobian
from .nonlinear._jacobian_gmres import GMRESJacobian
from .nonlinear._jacobian_klu import KLUJacobian
from .nonlinear._jacobian_sparse import SparseJacobian
from .direct._klu import KLU
from .direct._lu import LU
from .nonlinear._newton import Newton
from .nonlinear._newton_krylov import NewtonKrylov
from .nonlinear._picard import Picard
from ._registry import lookup, names, records, register, unregister
from .direct._splu import SuperLU
from .nonlinear._trust_region import Hybr, LevenbergMarquardt
from .direct._spsolve import SpSolve

# linear solvers, in the order error messages list them
register(LU())
register(Cholesky())
register(SuperLU())
# ("cholmod": CHOLMOD compiled into the program where sparsax is installed,
# else cvxopt's on the host; `pip install "sciad[cholmod]"` installs one)
register(CompiledCholmod() if _sparsax_installed() else Cholmod())
register(SpSolve())
register(KLU())
register(CuDSS())
register(CG())
register(GMRES())
register(BiCGStab())

# preconditioners of the iterative solvers (`linalg.solve`'s `preconditioner`)
register(Jacobi())
register(AMG())
register(BlockAMG())

# root methods (and the names `sd.optimize.root` / `fixed_point` take for them)
register(Newton())
register(Chord())
register(NewtonKrylov())
register(Anderson())
register(Picard())
register(Hybr())
register(LevenbergMarquardt())

# how a root's Jacobian is formed and solved
register(SparseJacobian())
register(DenseJacobian())
register(GMRESJacobian())
register(KLUJacobian())
register(BandJacobian())

__all__ = ["lookup", "names", "records", "register", "unregister"]
