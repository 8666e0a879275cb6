"""How a graph's tensors map onto the equal-rank graph its kernels are built for.

``KernelGraph`` broadcasting promotes ranks numpy style; the search works on graphs where
lower-rank tensors carry explicit leading size-1 dims. :class:`Shapes` reshapes the caller's
tensors to that form and the outputs back (views, no copies). The kernel object and the
numeric check both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from yirage._errors import ShapeError
from yirage._graph import KernelGraph

__all__ = ["Shapes"]


class Shapes:
    """How a graph's inputs and outputs map onto the equal-rank graph its kernels are built
    for (``KernelGraph.promote_ranks``): the two differ only by leading size-1 dims, so the
    caller's tensors are reshaped (views, never copies) on the way in and the outputs on the
    way out."""

    def __init__(self, graph: KernelGraph) -> None:
        self.world_size = graph.world_size
        self.kernel_graph = KernelGraph._wrap(graph._g.promote_ranks())
        self.user_in = [t.dims for t in graph.inputs]
        self.kernel_in = [t.dims for t in self.kernel_graph.inputs]
        self.user_out = [t.dims for t in graph.outputs]
        self.kernel_out = [t.dims for t in self.kernel_graph.outputs]
        self.identity = self.user_in == self.kernel_in and self.user_out == self.kernel_out

    def to_kernel(self, tensors: Sequence[Any]) -> list[Any]:
        """The caller's inputs (the graph's shapes, or already the kernel's) as the kernel's."""
        if self.identity or len(tensors) != len(self.user_in):
            return list(tensors)  # a wrong count: the launcher names what it takes
        out = []
        for i, (x, user, kernel) in enumerate(
            zip(tensors, self.user_in, self.kernel_in, strict=True)
        ):
            shape = tuple(getattr(x, "shape", ()))
            if user == kernel or shape == kernel:
                out.append(x)
            elif shape == user:
                out.append(x.reshape(kernel))  # leading 1s only: a view
            else:
                raise ShapeError(f"input {i} has shape {shape}; expected {user}")
        return out

    def to_user(self, outputs: Sequence[Any]) -> list[Any]:
        """The kernel's outputs in the graph's shapes."""
        if self.identity:
            return list(outputs)
        return [
            o if user == kernel else o.reshape(user)
            for o, user, kernel in zip(outputs, self.user_out, self.kernel_out, strict=True)
        ]
