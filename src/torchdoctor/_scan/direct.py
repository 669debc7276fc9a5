"""Which of a module's own tensors its forward computes with as they are stored, read from its code (never run).

A layer holding integer, packed or float8 weights is a problem only where its forward hands them straight to a torch
compute function (``F.linear(x, self.weight)``, ``x @ self.weight``): those compute in the storage dtype. A forward
that dequantizes or casts first is quiet, and so is a call that sits under a test of the tensor's own storage
(transformers' ``FP8Linear``: ``if self.weight.element_size() > 1: return F.linear(x, self.weight, self.bias)``,
a path taken only when the weight is no longer float8). Per class, cached.
"""
from __future__ import annotations

import ast
import types

from torchdoctor._scan.percall import _resolve, _torch_own, _tree

# torch functions that compute with a weight as it is (a module's forward handing ``self.weight`` straight to one
# computes in the weight's storage dtype)
_COMPUTE = frozenset({"linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                      "conv_transpose3d", "embedding", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum"})
_DIRECT: dict[type, frozenset[str]] = {}


def direct_operands(tp: type) -> frozenset[str]:
    """The module's own attributes (``weight``) its forward hands as they are to a torch compute function
    (``F.linear(x, self.weight, self.bias)``, ``x @ self.weight``), read from its own code; empty for torch's own
    layers (judged as such) and for a forward that cannot be read. A call under an ``if`` (or a conditional
    expression) whose test reads that same attribute is a branch on its storage, not a use of it. Per class, cached."""
    hit = _DIRECT.get(tp)
    if hit is not None:
        return hit
    _DIRECT[tp] = frozenset()
    owner = next((k for k in tp.__mro__ if "forward" in k.__dict__), None)
    fwd = owner.__dict__["forward"] if owner is not None and not _torch_own(owner) else None
    if not isinstance(fwd, types.FunctionType):
        return _DIRECT[tp]
    node = _tree(fwd)  # asked only for a layer holding integer, packed or float8 weights: parsed once per class
    if node is None:
        return _DIRECT[tp]
    params = fwd.__code__.co_varnames[:1]
    me = params[0] if params else "self"

    def own(x: ast.AST) -> str | None:
        return x.attr if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == me else None

    def tested(test: ast.AST) -> frozenset[str]:  # the module's attributes a branch's test reads
        return frozenset(a for a in map(own, ast.walk(test)) if a is not None)

    def torch_fn(f: ast.AST) -> bool:  # F.linear / torch.matmul / torch.nn.functional.conv2d: torch's own
        while isinstance(f, ast.Attribute):
            f = f.value
        base = _resolve(fwd, f.id) if isinstance(f, ast.Name) else None
        return isinstance(base, types.ModuleType) and (base.__name__ == "torch" or base.__name__.startswith("torch."))

    found: set[str] = set()

    def visit(n: ast.AST, guarded: frozenset[str]) -> None:
        if isinstance(n, (ast.If, ast.IfExp, ast.While)):
            inner = guarded | tested(n.test)
            visit(n.test, guarded)
            for child in ast.iter_child_nodes(n):
                if child is not n.test:
                    visit(child, inner)
            return
        operands: list[ast.AST] = []
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _COMPUTE \
                and torch_fn(n.func.value):
            # embedding's first operand is the indices: integers there are what it expects
            operands = [*n.args[1:], *(k.value for k in n.keywords if k.arg != "input")] \
                if n.func.attr == "embedding" else [*n.args, *(k.value for k in n.keywords)]
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
            operands = [n.left, n.right]
        found.update(a for a in map(own, operands) if a is not None and a not in guarded)
        for child in ast.iter_child_nodes(n):
            visit(child, guarded)

    for stmt in node.body:
        visit(stmt, frozenset())
    _DIRECT[tp] = frozenset(found)
    return _DIRECT[tp]


__all__ = ["direct_operands"]
