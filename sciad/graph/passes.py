"""Graph-to-graph passes, each `Graph -> Graph`: `dce`, `cse`, `fold_constants`,
`simplify`, and `optimize`, which runs the four to a fixed point."""

from ._passes import (
    cse as cse,
    dce as dce,
    fold_constants as fold_constants,
    optimize as optimize,
    simplify as simplify,
)
