"""Issue 25 in virtual runs (``virtual_devices``, ``simulate(call=)``, the pytest marker): a tensor from outside the
model is named as the caller passed it — an argument of the top-level call by name and index or key, with where it
was made (a factory's file:line, or before the run) — never "a tensor made in forward"; and a module the caller
reaches through its holder (``model.forward(x)``, ``model[0](x)``, a loop over layers) is named by the holder's
paths (``0.bias``), as scan names it. Each case both ways: named first when it reached the op, quiet when right."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor import PlacementError

pytest_plugins = ["pytester"]


def _line_of(text: str) -> int:
    """The line of this file that holds ``text`` (once): where a report must say a tensor was made."""
    with open(__file__) as f:
        [n] = [i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line]
    return n


class _Extra(nn.Module):
    """A forward that reads a list passed by keyword (``model(x, extra=[t])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, extra: list[torch.Tensor] | None = None) -> torch.Tensor:
        y = self.lin(x)
        return y + extra[0] if extra is not None else y


class _Rotary(nn.Module):
    """Qwen2-VL's vision blocks take ``rotary_pos_emb_list`` through ``**kwargs`` (re-created in a few lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, **kwargs: list[torch.Tensor]) -> torch.Tensor:
        return self.lin(x) * kwargs["rotary_pos_emb_list"][0]


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg).eval()


def test_a_list_passed_by_keyword_is_named_by_its_argument_and_index() -> None:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = _Extra().to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), extra=[torch.randn(2, 8)])  # the list's tensor stays on cpu
    [p] = sim.problems
    assert p.kind == "device" and p.found == "cpu" and p.module_path == ""
    assert p.message.startswith("extra[0] (an argument of the _Extra call, made by torch.randn at "), p.message
    assert "test_blame_arguments.py:" in p.message and "made in forward" not in p.message
    assert "torch.randn(..., device=" in (sim.error().fix or "")  # the line that made it is where to fix it
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as quiet:
        model = _Extra().to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), extra=[torch.randn(2, 8, device="cuda:1")])
    assert quiet.ok, quiet.problems


def test_a_tensor_in_star_kwargs_is_named_as_guard_names_it_and_fixed_as_the_caller_wrote_it() -> None:
    made_before = [torch.randn(2, 8)]
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = _Rotary().to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), rotary_pos_emb_list=made_before)
    [p] = sim.problems
    assert p.message.startswith("kwargs['rotary_pos_emb_list'][0] (an argument of the _Rotary call, made before "
                                "the run) f32[2,8]@cpu is on cpu while aten.mul.Tensor runs on cuda:1"), p.message
    assert "# pass kwarg rotary_pos_emb_list[0] as tensor.to('cuda:1')" in (sim.error().fix or "")
    assert made_before[0].device.type == "cpu" and type(made_before[0]) is torch.Tensor  # the caller's list untouched
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as quiet:
        model = _Rotary().to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), rotary_pos_emb_list=[made_before[0].to("cuda:1")])
    assert quiet.ok, quiet.problems


def test_tokens_built_before_the_run_name_the_argument_of_a_real_transformers_model() -> None:
    tokens = torch.tensor([[1, 2, 3, 4]])  # built before the block, as an app builds them before moving the model
    model = _llama()
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model.to("cuda:0")
        model(tokens)
    [p] = sim.problems
    assert p.module_path == "model.embed_tokens" and p.found == "cpu"
    assert p.message.startswith("input_ids (an argument of the LlamaForCausalLM call, made before the run) "
                                "i64[1,4]@cpu is on cpu while aten.embedding.default runs on cuda:0"), p.message
    assert "# pass input 0 (input_ids) as tensor.to('cuda:0')" in (sim.error().fix or "")
    assert type(tokens) is torch.Tensor and tokens.device.type == "cpu"
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as quiet:
        model(tokens.to("cuda:0"))
    assert quiet.ok, quiet.problems


def test_tokens_built_in_the_block_name_the_factory_line() -> None:
    model = _llama()
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model.to("cuda:0")
        ids = torch.tensor([[1, 2, 3, 4]])  # no device=
        model(input_ids=ids, attention_mask=torch.ones(1, 4, dtype=torch.long, device="cuda:0"))
    [p] = sim.problems
    assert p.message.startswith("input_ids (an argument of the LlamaForCausalLM call, made by torch.tensor at "), \
        p.message
    line = p.message.split(" at ", 1)[1].split(")", 1)[0]
    assert line.endswith("test_blame_arguments.py:" + str(test_tokens_built_in_the_block_name_the_factory_line
                                                           .__code__.co_firstlineno + 4)), line


def test_simulate_call_names_inputs_made_before_it() -> None:
    tokens = torch.tensor([[1, 2, 3, 4]])
    report = torchdoctor.simulate(_llama(), device="cuda:0", call=lambda m: m.to("cuda:0")(tokens))
    [p] = report.problems
    assert "input_ids (an argument of the LlamaForCausalLM call, made before the run)" in p.message
    assert report.fix == "# pass input 0 (input_ids) as tensor.to('cuda:0')"
    assert torchdoctor.simulate(_llama(), device="cuda:0", call=lambda m: m.to("cuda:0")(tokens.to("cuda:0"))).ok


def test_an_argument_in_another_dtype_is_named_alike_by_guard_and_by_a_virtual_run() -> None:
    class Proj(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, proj: list[torch.Tensor]) -> torch.Tensor:
            return self.lin(x) @ proj[0]

    weights = [torch.randn(8, 8, dtype=torch.float64)]  # the caller's float64 matrix
    model = Proj()
    guard_text = ""
    try:
        with torchdoctor.guard(model):
            model(torch.randn(2, 8), proj=weights)
    except PlacementError as err:
        guard_text = str(err)
    assert "culprit proj[0] (an argument of the Proj call)" in guard_text, guard_text
    strict_text = ""
    try:
        with torchdoctor.guard(model, mode="strict"):
            model(torch.randn(2, 8), proj=weights)
    except PlacementError as err:
        strict_text = str(err)
    assert "culprit proj[0] (an argument of the Proj call)" in strict_text, strict_text
    assert "pass proj[0] as tensor.to(torch.float32)" in strict_text, strict_text
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model.to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), proj=[weights[0].to("cuda:1")])
    [p] = sim.problems
    assert p.kind == "dtype" and p.found == "float64"
    # moved onto the device in the block: the line that moved it is where the dtype can be fixed too
    assert p.message.startswith("proj[0] (an argument of the Proj call, made by Tensor.to at "), p.message
    assert ") f64[8,8]@cuda:1 is float64 " in p.message, p.message
    assert "kwarg proj[0]" in (sim.error().fix or "")
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as quiet:
        model(torch.randn(2, 8, device="cuda:1"), proj=[weights[0].to("cuda:1", torch.float32)])
    assert quiet.ok, quiet.problems


def test_a_tensor_made_from_an_argument_names_the_argument_it_came_from() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * (scale * 2).unsqueeze(0)

    scale = torch.ones(8)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = Scale().to("cuda:1")
        model(torch.randn(2, 8, device="cuda:1"), scale)
    [p] = sim.problems
    assert "2 ops after scale (an argument of the Scale call, made before the run)" in p.message, p.message
    assert "# pass input 1 (scale) as tensor.to('cuda:1')" in (sim.error().fix or "")


def test_an_argument_moved_to_another_virtual_device_keeps_its_origin_and_is_fixed_as_passed() -> None:
    for dtype in (torch.float32, torch.long):  # integer tensors keep their origin too
        with torchdoctor.virtual_devices("cuda:1", count=2, raise_on_exit=False) as sim:
            model = _Extra().to("cuda:1")
            extra = torch.ones(2, 8, dtype=dtype).to("cuda:0")  # moved, but to the wrong card
            model(torch.randn(2, 8, device="cuda:1"), extra=[extra])
        [p] = sim.problems
        assert p.found == "cuda:0" and p.message.startswith("extra[0] (an argument of the _Extra call, made by "
                                                            "torch.ones at "), p.message
        assert sim.error().fix == "# pass kwarg extra[0] as tensor.to('cuda:1')"  # not "torch.ones(device=)"


@pytest.mark.parametrize("asked", ["float16", None])
def test_a_float32_condition_into_a_float16_diffusers_unet_names_the_argument_not_the_weights(asked: str | None) -> None:
    """diffusers #2924-style: ``encoder_hidden_states`` from a float32 text encoder fed to a float16 UNet. The
    culprit is the argument (by its name), never the UNet's float16 weights — also when the block was given no
    ``dtype=`` (the model's own dtype, from the module the code called, decides)."""
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=4, sample_size=8,
                                in_channels=4, out_channels=4, cross_attention_dim=8, attention_head_dim=2,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")).eval()
    cond = torch.randn(2, 3, 8)
    for dtype in (torch.float32, torch.float16):
        with torchdoctor.virtual_devices("cuda:0", dtype=asked, raise_on_exit=False) as sim:
            unet.to("cuda:0", torch.float16)
            unet(torch.randn(2, 4, 8, 8, device="cuda:0", dtype=torch.float16), 10,
                 encoder_hidden_states=cond.to("cuda:0", dtype))
        if dtype == torch.float16:
            assert sim.ok, sim.problems
            continue
        assert sim.problems and all(p.kind == "dtype" and p.found == "float32" for p in sim.problems)
        line = f"test_blame_arguments.py:{_line_of('encoder_hidden_states=cond.to(')}"
        # the line that moved it onto the device is named: that is where its dtype is fixed too
        assert all("from encoder_hidden_states (an argument of the UNet2DConditionModel call, made by Tensor.to at "
                   in p.message and f"{line})" in p.message for p in sim.problems), sim.problems[0].message
        assert "# pass kwarg encoder_hidden_states as tensor.to(torch.float16)" in (sim.error().fix or "")


# -- paths: the holder names its children (the marker's Sequential showed `bias` at `<root>`) ---------------------


def _half_bias(call: str) -> list[tuple[str, str, str | None]]:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model.to("cuda:1")
        model[2].bias.data = model[2].bias.data.half()
        x = torch.randn(2, 4, device="cuda:1")
        if call == "forward":
            model.forward(x)  # Sequential's own call never runs a hook: its children start the run
        elif call == "child first":
            model[2](x)
            model(x)
        else:
            for layer in model:
                x = layer(x)
    return [(p.kind, p.path, p.module_path) for p in sim.problems]


def test_children_reached_through_their_holder_are_named_by_the_holders_paths() -> None:
    for call in ("forward", "child first", "loop"):
        assert _half_bias(call) == [("dtype", "2.bias", "2")], call


def test_the_marker_names_a_sequential_childs_tensor_by_its_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marker_paths='''
        import pytest, torch
        from torch import nn

        @pytest.fixture
        def model():
            return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

        @pytest.mark.simulate(device="cuda:1")
        def test_forward_of_the_holder(model):
            model.to("cuda:1")
            model[0].bias.data = model[0].bias.data.cpu()
            model.forward(torch.randn(2, 4, device="cuda:1"))

        @pytest.mark.simulate(device="cuda:1")
        def test_right(model):
            model.to("cuda:1")
            model.forward(torch.randn(2, 4, device="cuda:1"))
    ''')
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore", timeout=300)
    out = result.stdout.str()
    result.assert_outcomes(failed=1, passed=1)
    assert "device 0.bias f32[4]@cpu is on cpu when 0 (Linear) starts on cuda:1" in out, out
    assert "model[0].bias.data = model[0].bias.data.to('cuda:1')" in out, out
    assert "<root>" not in out, out


def test_a_tensor_made_before_the_run_and_cast_in_the_block_names_that_line_and_gets_one_fix() -> None:
    """``x.to(torch.float16)`` in the block, then passed still on cpu: the argument names the line that cast it, and
    the fix moves and casts it in one ``.to`` (the dtype problem's fix was lost behind the device one)."""
    x = torch.randn(2, 4)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model.to("cuda:0")
        y = x.to(torch.float16)  # the line the report names
        model(y)
    line = _line_of("y = x.to(torch.float16)  # the line")
    assert sorted(p.kind for p in sim.problems) == ["device", "dtype"]
    for p in sim.problems:
        assert "(an argument of the Sequential call, made by `to(torch.float16)` at " in p.message, p.message
        assert f"test_blame_arguments.py:{line})" in p.message, p.message
    assert sim.error().fix == "# pass input 0 (input) as tensor.to('cuda:0', torch.float32)"
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as quiet:
        model(x.to("cuda:0"))
    assert quiet.ok, quiet.problems
    assert x.device.type == "cpu" and x.dtype == torch.float32
