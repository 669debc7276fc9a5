"""The module outline of the device map: the model's blocks with their sizes, repeated blocks folded into ranges
(``model.layers.0-79  80 x 1.6 GiB``, as accelerate prints device maps), bars proportional to bytes, so an
80-layer model reads at a glance. Torch-free: built from the rows of the page's payload.

>>> rows = [[f"model.layers.{i}.w", 0, 0, 0, [4], 16, 0] for i in range(80)] + [["lm_head.w", 0, 1, 0, [4], 8, 0]]
>>> [(r.label, r.count, r.nbytes) for r in outline(rows, ["cpu"], ["bfloat16", "float32"])]
[('model', 1, 1280), ('model.layers', 1, 1280), ('model.layers.0-79', 80, 1280), ('lm_head', 1, 8)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_ROWS = 80
MAX_DEPTH = 3  # module levels shown below the root; a range counts as one level


@dataclass
class _Node:
    nbytes: int = 0
    tensors: list[tuple[str, str, str, tuple[int, ...]]] = field(default_factory=list)  # (rel path, dev, dtype, shape)
    kids: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class Block:
    """One outline row: a module, or ``count`` alike numbered blocks (``label`` ends in ``.0-79``)."""

    label: str
    depth: int
    count: int
    nbytes: int  # all blocks together
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]


def _tree(rows: Sequence[Sequence[Any]], devices: Sequence[str], dtypes: Sequence[str]) -> _Node:
    top = _Node()
    for r in rows:
        if r[6]:  # an alias: its storage is counted at its canonical path
            continue
        parts = str(r[0]).split(".")
        dev, dt, shape, nbytes = devices[r[1]], dtypes[r[2]], tuple(r[4] or ()), int(r[5] or 0)
        node = top
        node.nbytes += nbytes
        for i, part in enumerate(parts[:-1]):
            node = node.kids.setdefault(part, _Node())
            node.nbytes += nbytes
            node.tensors.append((".".join(parts[i + 1:]), dev, dt, shape))
    return top


def _signature(node: _Node) -> tuple[Any, ...]:
    return tuple(sorted(node.tensors))


def _summary(node: _Node) -> tuple[tuple[str, ...], tuple[str, ...]]:
    devs: dict[str, None] = {}
    dts: dict[str, None] = {}
    for _, dev, dt, _ in node.tensors:
        devs[dev] = None
        dts[dt] = None
    return tuple(devs), tuple(dts)


def outline(rows: Sequence[Sequence[Any]], devices: Sequence[str], dtypes: Sequence[str]) -> list[Block]:
    """Rows of the outline, depth first; numbered children with the same structure, devices, dtypes and shapes
    are one range row."""
    out: list[Block] = []

    def visit(prefix: str, node: _Node, depth: int) -> None:
        names = list(node.kids)
        i = 0
        while i < len(names) and len(out) < MAX_ROWS:
            name, kid = names[i], node.kids[names[i]]
            j = i + 1
            if name.isdigit():
                sig = _signature(kid)
                while j < len(names) and names[j].isdigit() and int(names[j]) == int(names[j - 1]) + 1 \
                        and _signature(node.kids[names[j]]) == sig:
                    j += 1
            path = f"{prefix}{name}"
            devs, dts = _summary(kid)
            if j - i > 1:
                total = sum(node.kids[n].nbytes for n in names[i:j])
                out.append(Block(f"{prefix}{name}-{names[j - 1]}", depth, j - i, total, devs, dts))
            else:
                out.append(Block(path, depth, 1, kid.nbytes, devs, dts))
                if kid.kids and depth < MAX_DEPTH:  # a lone child (model -> layers) costs no level
                    visit(path + ".", kid, depth + (len(kid.kids) > 1))
            i = j

    visit("", _tree(rows, devices, dtypes), 0)
    return out
