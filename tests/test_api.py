"""One API: the object first in every verb, device and dtype positional or by keyword, frozen results with torch
objects in Python and strings in JSON, and a logger per verb."""

from __future__ import annotations

import dataclasses
import inspect
import logging

import pytest
import torch

import torchdoctor


def test_the_object_first_and_device_dtype_positional_everywhere() -> None:
    for verb in (torchdoctor.scan, torchdoctor.move, torchdoctor.simulate, torchdoctor.guard):
        params = list(inspect.signature(verb).parameters)
        assert params[0] == "obj", (verb, params)
    m = torch.nn.Linear(2, 2)
    assert torchdoctor.scan(m, "cpu", torch.float32).ok
    sim = torchdoctor.simulate(m, (torch.ones(1, 2),), "cuda:1", torch.bfloat16)
    assert sim.ok and sim.device == torch.device("cuda:1") and sim.dtype == torch.bfloat16
    assert sim.to_dict()["device"] == "cuda:1" and sim.to_dict()["dtype"] == "bfloat16"
    moved = torchdoctor.move(m, "meta", torch.bfloat16)
    assert moved.device == torch.device("meta") and moved.to_dict()["storage_bytes"] == moved.storage_bytes
    for report in (sim, moved, torchdoctor.scan(m)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.problems = ()  # type: ignore[misc]


def test_each_verb_logs_on_its_own_logger(caplog: pytest.LogCaptureFixture) -> None:
    m = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.INFO, logger="torchdoctor"):
        torchdoctor.scan(m)
        torchdoctor.simulate(m, (torch.ones(1, 2),), "cuda:1")
        torchdoctor.move(m, "meta")
    names = {r.name for r in caplog.records}
    assert {"torchdoctor.scan", "torchdoctor.simulate", "torchdoctor.move"} <= names, names
