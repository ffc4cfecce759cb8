"""The IR and everything that reads or rewrites it."""

from ._core import (
    Factored as Factored,
    Holding as Holding,
    Graph as Graph,
    Literal as Literal,
    Node as Node,
    Primitive as Primitive,
    Var as Var,
    lookup_primitive as lookup_primitive,
    primitive as primitive,
    registered_primitives as registered_primitives,
)
from ._body import Body as Body
from ._interpret import Interpreter as Interpreter
from ._params import Param as Param, REQUIRED as REQUIRED
from ._lower import Site as Site, evaluate as evaluate, lower as lower
from ._print import format_node as format_node
from ._serialize import (
    graph_from_json as graph_from_json,
    graph_to_json as graph_to_json,
    register_param_type as register_param_type,
    register_v1_migration as register_v1_migration,
)
from ._source import SourceInfo as SourceInfo
from ._trace import Tracer as Tracer, trace as trace, trace_flat as trace_flat
from ._types import (
    AbstractType as AbstractType,
    Pattern as Pattern,
    SparseArray as SparseArray,
    SparseType as SparseType,
    TensorType as TensorType,
    register_type_kind as register_type_kind,
    runtime_type as runtime_type,
)
from ._verify import verify as verify
from ._autodiff import (
    UndefinedPrimal as UndefinedPrimal,
    VJPGraph as VJPGraph,
    Zero as Zero,
    add_any_p as add_any_p,
    add_tangents as add_tangents,
    instantiate as instantiate,
    is_differentiable as is_differentiable,
    is_linear as is_linear,
    is_zero as is_zero,
    jvp_eval as jvp_eval,
    jvp_graph as jvp_graph,
    jvp_primal as jvp_primal,
    jvp_primal_p as jvp_primal_p,
    needs_ct as needs_ct,
    transpose_eval as transpose_eval,
    vjp_eval as vjp_eval,
    vjp_graph as vjp_graph,
    zeros as zeros,
    zeros_p as zeros_p,
)
from . import passes as passes
from . import _batch  # noqa: F401  (the batch rules of add_any and jvp_primal)
from ._sparsity import Deps as Deps
from ._cost import Cost as Cost
