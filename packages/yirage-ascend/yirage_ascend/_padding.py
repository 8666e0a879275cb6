"""The block shapes the shared Triton printer gives each tile of a generated kernel: every
dim padded to the next power of two, dims of a ``tl.dot`` (M, N, K) to at least 16, one size
per class of dims that elementwise ops, reductions and matmuls tie together.

The printer's own rule is private to yirage-triton; this is the same rule for the checker, and
tests/ascend holds it equal to the printer's on the fixture plans.
"""

from __future__ import annotations

from yirage.plan import GeneratedKernel

__all__ = ["padded_dims"]

Dim = tuple[int, int]  # (op id, axis)


def _np2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class _Classes:
    """Union-find over (op id, axis)."""

    def __init__(self) -> None:
        self.parent: dict[Dim, Dim] = {}

    def find(self, x: Dim) -> Dim:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Dim, b: Dim) -> None:
        self.parent[self.find(a)] = self.find(b)


def _tie(k: GeneratedKernel, classes: _Classes) -> set[Dim]:
    """Tie the dims each op shares with its operands; return the dims a ``tl.dot`` uses."""
    by_id = {o.id: o for o in k.ops}
    dot: set[Dim] = set()
    for o in k.ops:
        for d in range(len(o.dims)):
            classes.find((o.id, d))
        args = [by_id[a] for a in o.args]
        r = len(o.dims)
        if o.op in ("unary", "rms_norm") or (o.op == "accum" and o.attr("acc") == "iter"):
            for d in range(r):
                classes.union((o.id, d), (args[0].id, d))
        elif o.op == "binary":
            for d in range(r):
                for a in args:
                    if a.dims[d] == o.dims[d]:
                        classes.union((o.id, d), (a.id, d))
        elif o.op in ("reduction", "reduction_to_dimx", "concat"):
            for d in range(r):
                if d != o.attr("dim"):
                    for a in args:
                        classes.union((o.id, d), (a.id, d))
        elif o.op == "accum":
            for d in range(r - 1):
                classes.union((o.id, d), (args[0].id, d))
        elif o.op == "matmul":
            a, b = args
            for d in range(r - 2):
                classes.union((o.id, d), (a.id, d))
                classes.union((o.id, d), (b.id, d))
            classes.union((a.id, r - 1), (b.id, r - 2))  # K
            classes.union((o.id, r - 2), (a.id, r - 2))  # M
            classes.union((o.id, r - 1), (b.id, r - 1))  # N
            dot.update({(a.id, r - 1), (o.id, r - 2), (o.id, r - 1)})
    return dot


def padded_dims(k: GeneratedKernel) -> dict[int, tuple[int, ...]]:
    """The printed (padded) block shape of every op's value in ``k``, by op id."""
    classes = _Classes()
    dot = _tie(k, classes)
    size: dict[Dim, int] = {}
    for o in k.ops:
        for d, n in enumerate(o.dims):
            root = classes.find((o.id, d))
            size[root] = max(size.get(root, 1), _np2(n))
    for m in dot:
        root = classes.find(m)
        size[root] = max(size[root], 16)
    return {o.id: tuple(size[classes.find((o.id, d))] for d in range(len(o.dims))) for o in k.ops}
