"""Graph-to-graph passes, each `Graph -> Graph`: `dce`, `cse`, `fold_constants`,
`simplify`, `share_factors` (one factorization per matrix), `hoist` (loop-invariant
code motion), and `optimize`,
which runs them to a fixed point."""

from ._passes import (
    cse as cse,
    dce as dce,
    fold_constants as fold_constants,
    hoist as hoist,
    optimize as optimize,
    share_factors as share_factors,
    simplify as simplify,
)
