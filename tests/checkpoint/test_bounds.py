"""The opcode pre-scan that bounds every pickle, checked against ``pickletools.genops`` (the reference walk).

The pre-scan skips arguments by their lengths instead of decoding them; on every pickle genops can walk it
must end at the same byte, and on damaged ones it may only refuse or pass on, never hang or crash.
"""

from __future__ import annotations

import collections
import datetime
import io
import pickle
import pickletools
import random
import zipfile

import pytest
import torch

from torchdoctor._checkpoint.bounds import Budget, prescan
from torchdoctor._checkpoint.unpickle import CheckpointError
from checkpoint import hostile


def _corpus() -> list[bytes]:
    data = {"a": [1, 2.5, -3, 2**70, -(2**200), True, None, "é", b"\x00\xff", (1,), frozenset({1}), {1, 2}],
            "od": collections.OrderedDict(x=1), "dt": datetime.date(2026, 1, 1), "c": 1 + 2j,
            "big": "x" * 70_000, "bytes": b"y" * 300, "nested": [[[[{"k": [1]}]]]]}
    out = [pickle.dumps(data, protocol=p) for p in range(6)]
    z = zipfile.ZipFile(io.BytesIO(hostile.torch_zip({"w": torch.zeros(2), "m": torch.nn.Linear(2, 2).state_dict()})))
    out.append(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    out.append(pickle.dumps({"t": torch.ones(3), "p": torch.nn.Parameter(torch.zeros(1))}))
    out.append(pickle.dumps(list(range(100_000)), protocol=4))  # framed
    return out


def _genops_end(data: bytes) -> int | None:
    f = io.BytesIO(data)
    try:
        for _ in pickletools.genops(f):
            pass
    except Exception:
        return None
    return f.tell()


def test_prescan_ends_where_genops_ends():
    for data in _corpus():
        assert prescan(data, 0, Budget(), "x") == _genops_end(data) == len(data)


def test_prescan_on_mutants_never_disagrees_with_genops():
    rng = random.Random(7)
    checked = 0
    for data in _corpus()[:8]:
        for _ in range(150):
            raw = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw[: rng.randint(1, len(raw))] if rng.random() < 0.3 else raw)
            reference = _genops_end(raw)
            try:
                end = prescan(raw, 0, Budget(), "x")
            except CheckpointError:
                end = None
            if reference is not None and end is not None:
                assert end == reference
                checked += 1
            elif reference is not None:  # genops walked it: the pre-scan may only refuse it for a bound
                with pytest.raises(CheckpointError, match="refused|corrupted pickle \\(memo"):
                    prescan(raw, 0, Budget(), "x")
    assert checked > 100


@pytest.mark.parametrize("opcode", ["LONG_BINPUT", "PUT"])
def test_memo_bomb_is_refused_before_any_allocation(opcode):
    with pytest.raises(CheckpointError, match="refused: pickle memo index 1000000000"):
        prescan(hostile.memo_bomb(opcode), 0, Budget(), "bomb.pkl")


def test_opcode_budget_is_shared():
    budget = Budget(ops=1000)
    data = pickle.dumps(list(range(300)), protocol=2)
    prescan(data, 0, budget, "x")
    with pytest.raises(CheckpointError, match="more than .* pickle opcodes"):
        for _ in range(10):
            prescan(data, 0, budget, "x")


def test_opcode_table_is_pickletools_own():
    """The argument table is written out (``pickletools`` costs more to import than a small scan); it must say
    what ``pickletools.opcodes`` says for every opcode byte."""
    from torchdoctor._checkpoint.bounds import _KINDS

    expected: list[int | None] = [None] * 256
    prefixed = {pickletools.TAKEN_FROM_ARGUMENT1: -11, pickletools.TAKEN_FROM_ARGUMENT4: -14,
                pickletools.TAKEN_FROM_ARGUMENT4U: -14, pickletools.TAKEN_FROM_ARGUMENT8U: -18}
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None:
            kind = 0
        elif arg.n == pickletools.UP_TO_NEWLINE:
            kind = -2 if arg.name == "stringnl_noescape_pair" else -1
        else:
            kind = prefixed.get(arg.n, arg.n)
        expected[ord(op.code)] = kind
    assert _KINDS == expected
