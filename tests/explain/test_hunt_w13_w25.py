"""Two real texts the black-box hunt found read wrongly: cuDNN's CTC loss refusing GPU targets (icefall#1485,
pytorch#152421) was not recognised, and a generator on the wrong device was told backwards."""

from __future__ import annotations

from torchdoctor import explain


def fixes_text(d) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(code for _, code in d.fixes)


def test_cudnn_ctc_loss_with_gpu_targets_is_a_device_error_with_the_cpu_fix() -> None:
    for text in ("RuntimeError: Expected tensor to have CPU Backend, but got tensor with CUDA Backend (while checking "
                 "arguments for cudnn_ctc_loss)",
                 "RuntimeError: Expected tensor for argument #1 'targets' to have CPU Backend, but got tensor with "
                 "CUDA Backend (while checking arguments for cudnn_ctc_loss)"):
        d = explain(text)[0]
        assert d.category == "device_mismatch" and "cuDNN's CTC" in d.title
        assert "targets.cpu(), input_lengths.cpu(), target_lengths.cpu()" in fixes_text(d)
        assert "targets.long()" in fixes_text(d)
    assert "(targets) on cuda" in explain(text)[0].what_happened


def test_a_generator_on_the_wrong_device_is_told_the_right_way_round() -> None:
    for text in ("RuntimeError: Cannot generate a cuda tensor from a generator of type cpu",
                 "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'"):
        d = explain(text)[0]
        assert d.category == "device_mismatch", text
        assert "Generator on cpu" in d.what_happened and "tensor on cuda" in d.what_happened, d.what_happened
        assert "(cpu generator, cuda" in d.likely_causes[0], d.likely_causes[0]
        assert "only works on cpu" not in d.what_happened
        assert "torch.Generator(device=" in fixes_text(d)
        assert not [a for a in d.alternatives if a.category == "quantization_device"]
    back = explain("RuntimeError: Cannot generate a cpu tensor from a generator of type cuda.")[0]
    assert "Generator on cuda" in back.what_happened and "tensor on cpu" in back.what_happened
