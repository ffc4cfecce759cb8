"""Numerical backends that lowering calls: plain JAX/SciPy code, no graphs.

Each solver is a record in one file, registered here by name (see
`_registry`); the graph param that picks it stays the name. Each solver
returns its result together with what a caller needs to detect failure
(pivots, residuals, iteration counts); turning that into an error is the
primitives' business.

Adding a solver: one file with its record (an `AbstractDirectSolver` or
`AbstractIterativeSolver` of `_linear`, a root method of `_root_methods`, a
preconditioner, `AbstractPreconditioner` of `_iterative`) and one
`register(...)` line below.
"""

from . import _amg as amg
from . import _dense as dense
from . import _iterative as iterative
from . import _sparse_direct as sparse_direct
from ._amg import AMG
from ._block_amg import BlockAMG
from ._anderson import Anderson
from ._bicgstab import BiCGStab
from ._cg import CG
from ._cholesky import Cholesky
from ._cholmod import Cholmod
from ._cholmod_ffi import CompiledCholmod, installed as _sparsax_installed
from ._cudss import CuDSS
from ._chord import Chord
from ._gmres import GMRES
from ._jacobi import Jacobi
from ._jacobian_dense import DenseJacobian
from ._jacobian_gmres import GMRESJacobian
from ._jacobian_sparse import SparseJacobian
from ._klu import KLU
from ._lu import LU
from ._newton import Newton
from ._newton_krylov import NewtonKrylov
from ._picard import Picard
from ._registry import lookup, names, records, register, unregister
from ._splu import SuperLU
from ._trust_region import Hybr, LevenbergMarquardt
from ._spsolve import SpSolve

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

__all__ = ["amg", "dense", "iterative", "sparse_direct", "lookup", "names", "records", "register",
           "unregister"]
