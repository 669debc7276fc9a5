"""Every expectation says where it came from (issue 27, point 6) through the API too: ``scan`` /
``assert_placement`` arguments, the policy's rules, ``simulate``'s arguments and profile, in text and JSON."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._report.order import with_whence


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))


def test_scan_arguments_are_named_in_text_and_json() -> None:
    report = torchdoctor.scan(_model(), device="cuda:0", dtype="bfloat16")
    row = report.to_dict()["expected"][""]
    assert (row["device_source"], row["dtype_source"]) == ("the device= argument", "the dtype= argument")
    assert "(device from the device= argument; dtype from the dtype= argument)" in str(report)
    assert report.expected[""].get("device_source") is None  # the report's own field is left as the policy made it


def test_the_policy_is_named_when_nothing_was_asked() -> None:
    model = _model().to(torch.bfloat16)
    row = torchdoctor.scan(model).to_dict()["expected"][""]
    assert row["device_source"] == "the policy: where most of its layers are"
    assert row["dtype_source"] == "the policy: the dtype most of its layers have"
    assert "dtype from the policy: the dtype most of its layers have" in str(torchdoctor.scan(model))


def test_declared_dtype_and_recorded_sources() -> None:
    rows = with_whence({"unet": {"device": "cpu", "device_rule": "vote", "dtype": "float16",
                                 "dtype_rule": "declared-dtype"},
                        "": {"device": "cuda:0", "device_rule": "config", "device_source": "[tool.torchdoctor] in x",
                             "dtype": "none", "dtype_rule": "vote"}})
    assert rows["unet"]["dtype_source"] == "the policy: the dtype the model declares in its config"
    assert rows[""]["device_source"] == "[tool.torchdoctor] in x" and "dtype_source" not in rows[""]


def test_assert_placement_names_the_argument() -> None:
    try:
        torchdoctor.assert_placement(_model(), device="cuda:0")
    except AssertionError as exc:
        assert str(exc).startswith("placement is not device=cuda:0:")
    else:
        raise AssertionError("assert_placement passed a model on cpu against device='cuda:0'")


def test_simulate_names_its_arguments_and_profile() -> None:
    model, x = _model(), torch.ones(1, 2)
    report = torchdoctor.simulate(model, (x,), device="cuda:1", dtype="float16")
    e = report.to_dict()["expected"]
    assert (e["device_source"], e["dtype_source"]) == ("the device= argument", "the dtype= argument")
    assert e["profile_source"] == "the default profile of cuda"
    report = torchdoctor.simulate(model, (x,), device="cuda:0", profile="t4")
    e = report.to_dict()["expected"]
    assert e["profile"] == "NVIDIA T4 16GB" and e["profile_source"] == "the profile= argument"
    assert str(report).splitlines()[-1] == ("expected: cuda:0 on NVIDIA T4 16GB (device from the device= argument; "
                                            "profile from the profile= argument)")
