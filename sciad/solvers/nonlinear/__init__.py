"""Root finding and fixed points: the loop and its strategies (`_nonlinear`),
the methods `sd.optimize.root` names (Newton, chord, Newton-Krylov,
Anderson, Picard, hybr, lm: `_root_methods`), and how a root's Jacobian is
formed and solved (dense, sparse by coloring, matrix-free GMRES)."""
