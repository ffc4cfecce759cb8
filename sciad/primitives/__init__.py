"""The built-in primitives, one module per family, each rule beside its op."""

from . import _call, _contract, _creation, _elementwise, _fft, _indexing, _reduce, _shape, _sparse, _linalg
from . import _sparse_sharded
from . import _stop_gradient, _scan, _cond, _while, _take, _map, _eigen, _svd, _eigsh, _root, _ode, _ode_events, _ode_radau_adjoint, _ode_bdf_adjoint
from . import _logdet, _slq, _sparse_cholesky
from ._call import call as call, call_p as call_p
from ._schedules import Binomial as Binomial, EveryK as EveryK, MemoryBudget as MemoryBudget
from ._schedules import Segments as Segments, TwoLevel as TwoLevel
from ._scan import fori_loop as fori_loop, scan as scan
from ._scan import scan_adjoint_p as scan_adjoint_p, scan_p as scan_p
from ._cond import barrier_p as barrier_p, checkpoint as checkpoint, checkpoint_p as checkpoint_p
from ._cond import cond as cond, cond_p as cond_p
from ._while import while_loop as while_loop, while_p as while_p
from ._from_jax import primitive_from_jax as primitive_from_jax
from ._contract import einsum_p as einsum_p, matmul_p as matmul_p, parse_spec as parse_spec
from ._creation import arange_p as arange_p, eye_p as eye_p, full_p as full_p
from ._creation import linspace_p as linspace_p
from ._fft import fft_p as fft_p
from ._stop_gradient import stop_gradient as stop_gradient, stop_gradient_p as stop_gradient_p
from ._elementwise import (
    binary_primitives as binary_primitives,
    convert_p as convert_p,
    select_p as select_p,
    unary_primitives as unary_primitives,
)
from ._indexing import (
    StaticIndex as StaticIndex,
    dynamic_slice_p as dynamic_slice_p,
    dynamic_update_slice_p as dynamic_update_slice_p,
    getitem_p as getitem_p,
    index_add_p as index_add_p,
    index_set_p as index_set_p,
    normalize_index as normalize_index,
)
from ._reduce import cumsum_p as cumsum_p, reduce_primitives as reduce_primitives
from ._take import (
    argsort_p as argsort_p,
    index_bounds_p as index_bounds_p,
    scatter_add_p as scatter_add_p,
    scatter_set_p as scatter_set_p,
    searchsorted_p as searchsorted_p,
    sort_p as sort_p,
    take_p as take_p,
)
from ._weights import weights_check_p as weights_check_p
from ._shape import (
    broadcast_to_p as broadcast_to_p,
    concatenate_p as concatenate_p,
    pad_p as pad_p,
    reshape_p as reshape_p,
    roll_p as roll_p,
    transpose_p as transpose_p,
)

del _call, _contract, _creation, _elementwise, _fft, _indexing, _reduce, _shape, _sparse, _linalg
del _sparse_sharded
del _stop_gradient, _scan, _cond, _while, _take, _map, _eigen, _svd, _eigsh, _root, _ode, _ode_events
del _logdet, _slq, _sparse_cholesky
