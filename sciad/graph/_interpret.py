"""`Interpreter`: walks a graph node by node.

Lowering, evaluation and type propagation are interpreters; each overrides
`run_node` (and `literal` if constants need converting).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import SciadError
from ._core import Graph, Literal, Node, Var


class Interpreter:
    """Runs `graph` on values; subclasses say what running a node means."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def literal(self, lit: Literal) -> Any:
        return lit.value

    def run_node(self, node: Node, invals: Sequence[Any]) -> Sequence[Any]:
        raise NotImplementedError

    def run(self, *args) -> list:
        graph = self.graph
        if len(args) != len(graph.inputs):
            raise TypeError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, "
                            f"got {len(args)}.")
        env: dict[Var, Any] = dict(zip(graph.inputs, args))
        literal = self.literal

        def read(a):
            return literal(a) if isinstance(a, Literal) else env[a]

        for node in graph.nodes:
            outs = self.run_node(node, [read(a) for a in node.inputs])
            for v, o in zip(node.outputs, outs):
                env[v] = o
        return [read(a) for a in graph.outputs]


def node_error(cls, node: Node, err: BaseException, what: str) -> SciadError:
    """`err` re-raised as `cls`, with the node's printed line and source."""
    from ._print import format_node

    msg = f"{what} failed: {type(err).__name__}: {err}\n  while running: {format_node(node)}"
    return cls(msg, op=node.primitive.name, source=node.source)
