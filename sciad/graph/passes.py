"""Graph-to-graph passes, each `Graph -> Graph`: `dce`, `cse`, `fold_constants`,
`simplify`, `share_factors` (one factorization per matrix), `hoist` (loop-invariant
code motion), `place_releases` (where what a program makes ends), and `optimize`,
which runs them to a fixed point."""

from ._passes import (
    cse as cse,
    dce as dce,
    fold_constants as fold_constants,
    hoist as hoist,
    optimize as optimize,
    place_releases as place_releases,
    share_factors as share_factors,
    simplify as simplify,
)
