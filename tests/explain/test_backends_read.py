"""What explain keeps for one text only: a "Could not run ... is only available for these backends: [...]" list
read once per text (``_explain.backends``), and whether a line is typed prose (``_explain.prose.LINES``): each text's
diagnoses read their own, and a new text starts with nothing remembered."""

from __future__ import annotations

from torchdoctor import explain
from torchdoctor._explain import backends

_TEXT = ("NotImplementedError: Could not run '{op}' with arguments from the '{backend}' backend. This could be because "
         "the operator doesn't exist for this backend. '{op}' is only available for these backends: [{listed}].")


def _one(op: str, backend: str, listed: str) -> str:
    return _TEXT.format(op=op, backend=backend, listed=listed)


def _said(report) -> str:  # type: ignore[no-untyped-def]
    return " ".join(report[0].likely_causes + (report[0].what_happened,))


def test_each_text_reads_its_own_list_of_backends() -> None:
    listed = "CUDA, Meta, BackendSelect, Python, AutogradCPU, AutogradCUDA"
    cuda_absent = _one("aten::_scaled_mm", "CPU", listed)
    cpu_only = _one("torchvision::nms", "CUDA", "CPU, Meta, QuantizedCPU, BackendSelect, Python, AutogradCPU")
    first = explain(cuda_absent + "\n\n" + cuda_absent)
    assert first and "CUDA, Meta, BackendSelect, Python, ..." in _said(first)
    second = explain(cpu_only)
    assert second and "CPU, Meta, QuantizedCPU, BackendSelect, ..." in _said(second)
    # what the last text read is never used for the next: a wrong reading left behind is forgotten at its start
    backends._READ[listed] = ("not this list", "xpu", frozenset({"CPU"}))
    again = explain(cuda_absent + "\n\n" + cuda_absent)
    assert again.to_dict() == first.to_dict() and "not this list" not in _said(again)


def test_a_backend_the_list_lacks_is_named_absent() -> None:
    short, accel, named = backends.backends("CPU, Meta, QuantizedCPU, BackendSelect")
    assert (short, accel) == ("CPU, Meta, QuantizedCPU, BackendSelect", "cpu") and "CUDA" not in named
    short, accel, named = backends.backends(" XPU,  CPU , Meta, AutogradXPU, AutogradCPU ")
    assert (short, accel) == ("XPU, CPU, Meta, AutogradXPU, ...", "xpu") and "AUTOGRADXPU" in named
    backends.forget()


def test_what_a_line_is_is_kept_for_one_text_only() -> None:
    # rank reads whether a line is typed prose once per text (``prose.LINES``); a new text starts without it
    from torchdoctor._explain import prose

    text = ("i fine-tune llama with qlora and get this\nRuntimeError: Expected all tensors to be on the same device, "
            "but found at least two devices, cuda:0 and cpu!")
    fresh = explain(text).to_dict()
    prose.LINES["i fine-tune llama with qlora and get this"] = (0, False)  # a wrong reading left behind
    assert explain(text).to_dict() == fresh
    assert "i fine-tune llama with qlora and get this" in prose.LINES  # read again, as prose
    assert prose.LINES["i fine-tune llama with qlora and get this"][1] is True
