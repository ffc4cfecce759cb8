"""Krylov solvers (CG, GMRES, BiCGStab) and their preconditioners (Jacobi,
smoothed-aggregation AMG, block AMG over a row partition), on the shared
loop of `_iterative`. Each record is one file; `sciad.solvers` registers
them."""
