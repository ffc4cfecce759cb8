"""The IR and everything that reads or rewrites it."""

from ._core import (
    Graph as Graph,
    Literal as Literal,
    Node as Node,
    Primitive as Primitive,
    Var as Var,
    lookup_primitive as lookup_primitive,
    primitive as primitive,
    registered_primitives as registered_primitives,
)
from ._interpret import Interpreter as Interpreter
from ._lower import evaluate as evaluate, lower as lower
from ._print import format_node as format_node
from ._serialize import register_param_type as register_param_type
from ._source import SourceInfo as SourceInfo
from ._trace import Tracer as Tracer, trace as trace, trace_flat as trace_flat
from ._types import (
    AbstractType as AbstractType,
    TensorType as TensorType,
    register_type_kind as register_type_kind,
)
from ._verify import verify as verify
