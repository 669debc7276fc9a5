"""The agreement zoo, part 1: what a case is, and the cases built from plain modules.

A case is the user's code in two halves: ``make()`` builds the object on the CPU as the user has it before the
move, and ``step(obj, device)`` is what the user then does (moves it as they would, runs a forward or a training
step) and returns the output. The real outcome is ``step(make(), "cuda:0")`` on the hardware; ``simulate`` gets the
same ``make()`` and runs the same ``step`` as its ``call=``, so both sides run one program. ``expect`` is what the
hardware is believed to do; on a GPU the hardware is the judge and a wrong belief is reported, never hidden.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Case", "CASES", "PLANTED", "case", "planted"]


@dataclass(frozen=True)
class Case:
    name: str
    mechanism: str  # the seed mechanism it re-creates, or "control: ..." for correct code
    make: Callable[[], Any]
    step: Callable[[Any, str], Any]
    expect: str  # "raises" or "runs" on the hardware
    kind: str | None = None  # device / dtype / memory: the class of a failing case
    culprit: str | None = None  # path (from the object) of the tensor really off, where the culprit is one
    # why simulate may name a problem that the hardware runs through (the policy asks for more than the kernels)
    expected_policy_only: str | None = None
    quick: bool = False  # in the --quick subset the suite runs
    cpu_real: str | None = None  # why the real step is not run on the CPU in cpu-check (None: it is run)
    data: str = "cpu"  # the virtual runs' data: "meta" where values would fill this machine's memory


CASES: list[Case] = []
PLANTED: dict[str, Case] = {}


def case(name: str, mechanism: str, expect: str, **kw: Any) -> Callable[[Callable[[], tuple[Any, Any]]], None]:
    """Register ``fn() -> (make, step)`` as the case ``name`` (a decorator keeps each case's code in one place)."""
    def register(fn: Callable[[], tuple[Any, Any]]) -> None:
        if any(c.name == name for c in CASES):
            raise ValueError(f"two agreement cases named {name!r}")
        make, step = fn()
        CASES.append(Case(name, mechanism, make, step, expect, **kw))
    return register


def planted(name: str, mechanism: str, expect: str, **kw: Any) -> Callable[[Callable[[], tuple[Any, Any]]], None]:
    """A case whose declared outcome is wrong on purpose: ``--plant`` adds it, and the run must then fail."""
    def register(fn: Callable[[], tuple[Any, Any]]) -> None:
        make, step = fn()
        PLANTED[name] = Case(name, mechanism, make, step, expect, **kw)
    return register


def seeded(fn: Callable[[], Any]) -> Callable[[], Any]:
    def make() -> Any:
        torch.manual_seed(0)
        return fn()
    return make


def forward(module_dtype: torch.dtype | None = None, width: int = 8) -> Callable[[Any, str], Any]:
    """The common user step: ``model.to(device)``, then a forward on an input made on the device."""
    def step(model: Any, device: str) -> Any:
        model.to(device)
        x = torch.randn(2, width, device=device, dtype=module_dtype or torch.float32)
        with torch.no_grad():
            return model(x)
    return step


class Scaled(nn.Module):
    def __init__(self, read: bool = True) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)  # a plain attribute: Module.to leaves it where it is
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * self.scale if self.read else y


@case("attr_left_behind", "plain attribute left behind by Module.to", "raises", kind="device", culprit="scale",
      quick=True)
def _attr() -> tuple[Any, Any]:
    return seeded(Scaled), forward()


@case("attr_left_unread", "control: a plain attribute left behind that no op reads", "runs")
def _attr_unread() -> tuple[Any, Any]:
    return seeded(lambda: Scaled(read=False)), forward()


class Registered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@case("buffer_registered", "control: the same scale as a non-persistent buffer (Module.to moves it)", "runs",
      quick=True)
def _buffer() -> tuple[Any, Any]:
    return seeded(Registered), forward()


class ListHeld(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.layers = [nn.Linear(8, 8)]  # a Python list: not a submodule, so Module.to never sees it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[0](self.first(x))


@case("list_held_module", "list-held module (a Python list, not nn.ModuleList)", "raises", kind="device",
      culprit="layers.0.weight", quick=True)
def _list() -> tuple[Any, Any]:
    return seeded(ListHeld), forward()


class ModuleListHeld(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@case("module_list", "control: the same layers in an nn.ModuleList", "runs")
def _modlist() -> tuple[Any, Any]:
    return seeded(ModuleListHeld), forward()


class QuantLike(nn.Module):
    """A weight with its scales hanging off the Parameter object, as bitsandbytes hangs ``quant_state`` there."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        # hung on the Parameter object, as bitsandbytes does (setattr: a Tensor declares no such attribute)
        setattr(self.lin.weight, "quant_state", types.SimpleNamespace(absmax=torch.ones(8, 1), blocksize=8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.lin.weight * getattr(self.lin.weight, "quant_state").absmax
        return F.linear(x, w, self.lin.bias)


@case("quant_state_left", "quant_state-like tensors hanging off a weight", "raises", kind="device",
      culprit="lin.weight.quant_state.absmax")
def _quant() -> tuple[Any, Any]:
    return seeded(QuantLike), forward()


class Noisy(nn.Module):
    def __init__(self, on_device: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.on_device = on_device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the generator is made where the user made it: on the CPU unless told otherwise
        gen = torch.Generator(device=x.device if self.on_device else "cpu").manual_seed(0)
        return self.lin(x) + torch.randn(x.shape, generator=gen, device=x.device)


@case("cpu_generator", "a CPU generator drawing noise on the device", "raises", kind="device", quick=True)
def _gen() -> tuple[Any, Any]:
    return seeded(lambda: Noisy(False)), forward()


@case("device_generator", "control: the generator made on the input's device", "runs")
def _gen_ok() -> tuple[Any, Any]:
    return seeded(lambda: Noisy(True)), forward()


class Indexed(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.tensor([1, 0, 3])  # made on the CPU
        y = self.lin(x)
        if self.how == "index_select":
            return torch.index_select(y, 1, idx)
        if self.how == "gather":
            return torch.gather(y, 1, idx.expand(y.shape[0], 3))
        return y[:, idx]  # advanced indexing: torch copies CPU indices to the data's device itself


@case("cpu_indices_index_select", "CPU indices into a device tensor (index_select)", "raises", kind="device",
      quick=True)
def _isel() -> tuple[Any, Any]:
    return seeded(lambda: Indexed("index_select")), forward()


@case("cpu_indices_gather", "CPU indices into a device tensor (gather)", "raises", kind="device")
def _gather() -> tuple[Any, Any]:
    return seeded(lambda: Indexed("gather")), forward()


@case("cpu_indices_subscript", "control: CPU indices in x[:, idx] (torch moves them itself)", "runs")
def _subscript() -> tuple[Any, Any]:
    return seeded(lambda: Indexed("subscript")), forward()


class TimestepEmbed(nn.Module):
    """A timestep embedding given a scheduler's 0-dim CPU step: ``embedding`` is ``index_select`` underneath, whose
    device check has no exemption for a 0-dim CPU tensor (only the elementwise kernels take one as a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.temb = nn.Linear(8, 8), nn.Embedding(10, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.temb(torch.tensor(5))  # made on the CPU, 0-dim


@case("cpu_0dim_index_embedding", "a 0-dim CPU index into a device embedding", "raises", kind="device")
def _emb_0dim() -> tuple[Any, Any]:
    return seeded(TimestepEmbed), forward()


class MadeInside(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.how == "ones":
            return y * torch.ones(8)  # no device=: made on the CPU
        if self.how == "cat":
            return torch.cat([y, torch.zeros(y.shape[0], 2)], dim=1)
        if self.how == "scalar":
            return y * torch.tensor(2.0)  # a 0-dim CPU tensor: every kernel takes it as a scalar
        return y * torch.ones(8, device=x.device)


@case("made_on_cpu_in_forward", "a tensor made on the CPU inside forward (torch.ones, no device=)", "raises",
      kind="device", quick=True)
def _ones() -> tuple[Any, Any]:
    return seeded(lambda: MadeInside("ones")), forward()


@case("made_on_cpu_cat", "a CPU padding concatenated to a device activation", "raises", kind="device")
def _cat() -> tuple[Any, Any]:
    return seeded(lambda: MadeInside("cat")), forward()


@case("cpu_scalar_tensor", "control: a 0-dim CPU tensor times a device activation", "runs", quick=True)
def _scalar() -> tuple[Any, Any]:
    return seeded(lambda: MadeInside("scalar")), forward()


@case("made_on_input_device", "control: the same tensor made with device=x.device", "runs")
def _ones_ok() -> tuple[Any, Any]:
    return seeded(lambda: MadeInside("device")), forward()


class Float8Plain(nn.Module):
    def __init__(self, cast: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8, dtype=torch.bfloat16)
        self.lin.weight.data = self.lin.weight.data.to(torch.float8_e4m3fn)  # float8 storage in a plain layer
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cast:  # what casting layers do: upcast per call to the compute dtype
            return F.linear(x, self.lin.weight.to(x.dtype), self.lin.bias)
        return self.lin(x)


@case("float8_plain_linear", "float8 weights in a plain nn.Linear", "raises", kind="dtype", culprit="lin.weight",
      quick=True)
def _f8() -> tuple[Any, Any]:
    return seeded(lambda: Float8Plain(False)), forward(torch.bfloat16)


@case("float8_cast_per_call", "control: float8 storage upcast per call (per-call casting)", "runs")
def _f8_ok() -> tuple[Any, Any]:
    return seeded(lambda: Float8Plain(True)), forward(torch.bfloat16)


class MixedNorm(nn.Module):
    def __init__(self, upcast: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.upcast = upcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.upcast:  # fp32 norm, as transformers' keep-in-fp32 layers compute it
            return self.norm(y.float()).to(y.dtype)
        return self.norm(y)


def bf16_but_norm(upcast: bool) -> Callable[[], Any]:
    def make() -> Any:
        torch.manual_seed(0)
        m = MixedNorm(upcast).to(torch.bfloat16)
        m.norm.float()
        return m
    return make


@case("fp32_norm_upcast", "control: an fp32 norm in a bf16 model, input upcast per call", "runs", quick=True)
def _norm_ok() -> tuple[Any, Any]:
    return bf16_but_norm(True), forward(torch.bfloat16)


# CPU's layer_norm takes a bf16 input with fp32 weights; CUDA's dispatches on the input's dtype alone and refuses
# them ("expected scalar type BFloat16 but found Float", pytorch/pytorch#135969): the hardware decides here
@case("fp32_norm_no_upcast", "an fp32 LayerNorm fed bf16 activations, no upcast (CPU's kernel accepts it)", "raises",
      kind="dtype", culprit="norm.weight")
def _norm_bad() -> tuple[Any, Any]:
    return bf16_but_norm(False), forward(torch.bfloat16)


class Adapter(nn.Module):
    def __init__(self, cast: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.adapter = nn.Linear(8, 8, bias=False)
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.adapter(x.to(self.adapter.weight.dtype)).to(x.dtype) if self.cast else self.adapter(x)
        return self.lin(x) + a


def adapter_fp32(cast: bool) -> Callable[[], Any]:
    def make() -> Any:
        torch.manual_seed(0)
        m = Adapter(cast).to(torch.bfloat16)
        m.adapter.float()  # the adapter loaded in fp32 after the model was cast
        return m
    return make


@case("fp32_adapter_plain", "an fp32 adapter in a bf16 model, no per-call cast", "raises", kind="dtype",
      culprit="adapter.weight", quick=True)
def _adapter_bad() -> tuple[Any, Any]:
    return adapter_fp32(False), forward(torch.bfloat16)


@case("fp32_adapter_cast", "control: the fp32 adapter casting its input per call", "runs")
def _adapter_ok() -> tuple[Any, Any]:
    return adapter_fp32(True), forward(torch.bfloat16)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 1, x.shape[0], 24).chunk(3, dim=-1)
        mask = torch.ones(x.shape[0], x.shape[0], dtype=torch.bool).tril()  # made on the CPU
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@case("sdpa_cpu_mask", "a causal mask made on the CPU, passed to scaled_dot_product_attention", "raises",
      kind="device")
def _sdpa() -> tuple[Any, Any]:
    return seeded(Attention), forward()


@planted("planted_missed", "planted: a correct model declared to raise (simulate must be called wrong)", "raises",
         kind="device", culprit="lin.weight")
def _p_missed() -> tuple[Any, Any]:
    return seeded(Registered), forward()


@planted("planted_unjustified", "planted: a failing model declared to run, with no policy reason", "runs")
def _p_unjust() -> tuple[Any, Any]:
    return seeded(Scaled), forward()


@planted("planted_culprit", "planted: the culprit declared as another tensor", "raises", kind="device",
         culprit="lin.weight")
def _p_culprit() -> tuple[Any, Any]:
    return seeded(Scaled), forward()
