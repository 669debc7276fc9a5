"""Blame the culprit: which of the model's own tensors made a failure happen, before the op where it surfaced.

Nothing here runs on the happy path. At a failure, the policy's view of the guarded model (the same decisions scan
makes) lists the off-policy tensors; they are ranked by whether they hold the value the failing op found wrong and
by whether their module ran in this forward before the failing module (the order guard's pre-hooks recorded).
A float32 that entered by promotion (an fp32 embedding in a bf16 model) is named at the module where it entered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from torchdoctor._report.model import Problem

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._walk import Walk

DEPTH = 4  # container levels read in the caller's arguments: deep enough for kwargs['extra'][0]['bias'][1]
_KINDS = {"dtype": ("dtype",), "device": ("device", "meta"), "meta": ("meta",), "unsupported_dtype": ("dtype",)}


@dataclass(frozen=True)
class Suspect:
    problem: Problem  # the policy's problem for the tensor, with its path in the guarded model
    ran: bool  # its module ran in this forward before (or around) the failing module
    matches: bool  # it holds the value the failing op found wrong
    reached: bool = True  # the data flow shows it reached the failing op (else: also off-policy, not involved)

    @property
    def culprit(self) -> bool:
        return self.matches and self.reached

    @property
    def entered_at(self) -> str:
        return self.problem.module_path or "<root>"

    def line(self) -> str:
        p = self.problem
        shown = f"{p.path}: {p.tensors[0] if p.tensors else p.found}  is {p.found}, expected {p.expected}"
        if not self.culprit:
            return f"also off-policy, not involved in this failure: {shown}"
        where = f" (entered at `{self.entered_at}`)" if self.ran else ""
        return f"culprit {shown}{where}"


def policy_problems(walk: Walk) -> list[Problem]:
    """The guarded model's off-policy tensors, as ``scan`` would report them (computed once per map)."""
    from torchdoctor._scan.policy import Policy

    return Policy(walk, None, None, False).judge()


def suspects(problems: list[Problem], kind: str, bad: set[str], ran_paths: list[str],
             failing_path: str | None, flow: Flow | None = None, tensors: dict[str, Any] | None = None
             ) -> list[Suspect]:
    """Off-policy tensors that may have caused a ``kind`` failure, best first. ``bad`` are the values (``float32``,
    ``cpu``) the failing op found wrong; ``ran_paths`` the module paths that started in this forward, in order.
    With ``flow`` a suspect is a culprit (``reached``) only when the data flow shows it reached the failing op."""
    kinds = _KINDS.get(kind, (kind,))
    order = {p: i for i, p in enumerate(ran_paths)}
    out = []
    for p in problems:
        if p.kind not in kinds:
            continue
        mp = p.module_path or ""
        ran = mp in order or (failing_path is not None and _under(failing_path, mp))
        matches = p.found in bad or (p.kind == "meta" and kind in ("device", "meta"))
        reached = ran if flow is None else flow.reached(p.path, p.module_path, (tensors or {}).get(p.path))
        s = Suspect(p, ran, matches, reached)
        out.append((not (matches and reached), not matches, not ran, order.get(mp, len(order)), p.path, s))
    out.sort(key=lambda x: x[:5])
    return [x[5] for x in out if x[5].matches or x[5].ran]


def ran_paths(modules: dict[int, str], ran: list[nn.Module]) -> list[str]:
    """Paths of the modules that started in this forward, first start first."""
    seen: dict[str, None] = {}
    for m in ran:
        p = modules.get(id(m))
        if p is not None:
            seen.setdefault(p, None)
    return list(seen)


def headline(s: Suspect, kind: str, where: str, surfaced: str) -> str:
    p = s.problem
    enter = f"; {p.found} entered at `{s.entered_at}`" if s.ran and p.kind != "meta" else ""
    return (f"{kind} mismatch caused by `{p.path}` ({p.found}, expected {p.expected}){enter}; it surfaced in "
            f"{where}: {surfaced}")


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


def target_of(p: Problem) -> Any:
    """The value a suspect's fix casts or moves it to."""
    import torch

    from torchdoctor._placement import parse_device, parse_dtype

    if p.kind == "dtype":
        return parse_dtype(p.expected)
    try:
        return parse_device(p.expected)
    except ValueError:
        return torch.device("cpu")


# --- data flow: which off-policy tensors reached the failing op -------------------------------------------------

_NAMES: dict[Any, frozenset[str] | None] = {}


def code_names(code: Any, owner: type | None = None, depth: int = 2) -> frozenset[str]:
    """Attribute names a forward's code reads (``self.x``, ``getattr(self, "x")``), with nested code (comprehensions)
    and the owner's own methods it calls (``self._pos()``), ``depth`` levels down."""
    out: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        out.update(c.co_names)
        for k in c.co_consts:
            if isinstance(k, str) and k.isidentifier():
                out.add(k)
            elif hasattr(k, "co_names"):
                todo.append(k)
    if owner is not None and depth > 0:
        for name in list(out):
            fn = getattr(owner, name, None)
            fn = getattr(fn, "__func__", fn)
            sub = getattr(fn, "__code__", None)
            if sub is not None and sub is not code and name != "forward":
                out |= code_names(sub, owner, depth - 1)
    return frozenset(out)


def forward_names(mod: nn.Module) -> frozenset[str] | None:
    """What ``mod``'s forward reads, over its class's forwards (``super().forward``); None when a wrapper replaced
    ``forward`` on the instance (accelerate, diffusers hooks: it may read anything)."""
    if "forward" in mod.__dict__:
        return None
    tp = type(mod)
    if tp not in _NAMES:
        names: set[str] = set()
        for klass in tp.__mro__:
            fn = klass.__dict__.get("forward")
            if fn is not None and hasattr(fn, "__code__"):
                names |= code_names(fn.__code__, tp)
        _NAMES[tp] = frozenset(names) if names else None
    return _NAMES[tp]


@dataclass
class Flow:
    """What is known, at a failure, of the data that reached the failing op (gathered once, only on failure):
    modules that ran to completion before it, the forwards still running (their frames' code), and the leaf
    tensors autograd recorded behind the failing op's inputs."""

    modules: dict[str, nn.Module]  # path -> module of the guarded model
    completed: set[str]  # paths of modules that started in this forward and returned
    running: dict[str, frozenset[str] | None]  # path of a running module -> names its running code reads
    leaves: set[int]  # ids of the leaf tensors autograd recorded behind the failing inputs (empty: unknown)
    failing: str | None = None
    aliases: dict[str, list[tuple[str, str]]] | None = None  # canonical path -> (alias path, its module's path)

    def reached(self, path: str, module_path: str | None, tensor: Any = None) -> bool:
        """Did the tensor at ``path`` (owned by the module at ``module_path``) flow into the failing op?"""
        if tensor is not None and self.leaves:
            if id(tensor) in self.leaves:
                return True
            if getattr(tensor, "requires_grad", False):
                return False  # autograd saw every tensor that requires grad behind the inputs: not this one
        for alias, owner in (self.aliases or {}).get(path, ()):
            if self.reached(alias, owner):
                return True
        mp = module_path or ""
        rest = path[len(mp) + 1:] if mp and path.startswith(mp + ".") else path
        name = rest.split(".", 1)[0]
        if mp in self.running:
            names = self.running[mp]
            return names is None or name in names
        if mp in self.completed:
            mod = self.modules.get(mp)
            names = forward_names(mod) if mod is not None else None
            return names is None or name in names
        return False


def leaves_behind(tensors: list[Any], limit: int = 20000) -> set[int]:
    """ids of the leaf tensors (parameters that require grad) autograd recorded behind ``tensors``."""
    out: set[int] = set()
    seen: set[int] = set()
    todo = [t.grad_fn for t in tensors if getattr(t, "grad_fn", None) is not None]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None:
            out.add(id(var))
        todo.extend(n for n, _ in node.next_functions)
    return out


def flow(walk: Walk, ran: list[nn.Module], frames: list[tuple[nn.Module, Any]], inputs: list[Any],
         failing: str | None) -> Flow:
    """The data-flow view at a failure: ``frames`` are (module, its running frame or None), outermost first."""
    walk_modules = walk.modules
    modules = {p: m for p, m in walk_modules}
    paths_of: dict[int, list[str]] = {}  # a shared module (a tied embedding) has several paths: all of them
    for p, m in walk_modules:
        paths_of.setdefault(id(m), []).append(p)
    running: dict[str, frozenset[str] | None] = {}
    for mod, frame in frames:
        names = code_names(frame.f_code, type(mod)) if frame is not None else forward_names(mod)
        for p in paths_of.get(id(mod), ()):
            prev = running.get(p, frozenset())
            running[p] = None if names is None or prev is None else prev | names
    completed = {p for m in ran for p in paths_of.get(id(m), ())} - set(running)
    aliases: dict[str, list[tuple[str, str]]] = {}  # a tied weight is read through every module holding it
    for e in walk.entries:
        if e.alias_of is not None and e.module_path is not None:
            aliases.setdefault(e.alias_of, []).append((e.path, e.module_path))
    return Flow(modules, completed, running, leaves_behind(inputs), failing, aliases)


def running_frames(tb: Any = None) -> list[tuple[nn.Module, Any]]:
    """(module, frame) of the module forwards on a traceback (or, without one, on the current stack), outermost
    first: the code each one runs says which of its tensors it reads."""
    import sys

    out: list[tuple[nn.Module, Any]] = []
    if tb is not None:
        while tb is not None:
            f = tb.tb_frame
            s = f.f_locals.get("self")
            if isinstance(s, nn.Module):
                out.append((s, f))
            tb = tb.tb_next
        return out
    f = sys._getframe(1)
    while f is not None:
        s = f.f_locals.get("self")
        if isinstance(s, nn.Module):
            out.append((s, f))
        f = f.f_back
    return out[::-1]


def call_arguments(frames: list[tuple[nn.Module, Any]], root: Any) -> dict[int, tuple[str, Any]]:
    """id(tensor) -> how the caller passed it to the outermost forward: ``input_ids``, ``pixel_values[0]``,
    ``kwargs["extra"][0]["bias"][1]`` (containers up to four levels deep)."""
    mine = [f for m, f in frames if m is root and f is not None]  # a decorator's wrapper frame holds self too
    top = next((f for f in mine if f.f_code.co_name == "forward"), mine[0] if mine else None)
    if top is None and frames and not isinstance(root, nn.Module):
        top = frames[0][1]
    if top is None:
        return {}
    code, loc = top.f_code, top.f_locals
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[1:n])
    if code.co_flags & 0x04:  # *args
        names.append(code.co_varnames[n])
    star = code.co_varnames[n + bool(code.co_flags & 0x04)] if code.co_flags & 0x08 else None
    out: dict[int, tuple[str, Any]] = {}

    def add(name: str, v: Any, depth: int) -> None:
        import torch

        if isinstance(v, torch.Tensor):
            out.setdefault(id(v), (name, v))
        elif depth and type(v) in (list, tuple):
            for i, x in enumerate(v[:64]):
                add(f"{name}[{i}]", x, depth - 1)
        elif depth and isinstance(v, dict):
            for k, x in list(v.items())[:64]:
                add(f"{name}[{k!r}]", x, depth - 1)

    varargs = code.co_varnames[n] if code.co_flags & 0x04 else None
    for name in names:
        if name == varargs and type(loc.get(name)) is tuple:  # forward(*args): the caller's positions
            for i, v in enumerate(loc[name][:64]):
                add(f"input {i}", v, DEPTH)
        else:
            add(name, loc.get(name), DEPTH)
    if star is not None and isinstance(loc.get(star), dict):
        for k, v in loc[star].items():
            add(f"{star}[{k!r}]", v, DEPTH)
    return out


def call_owner(frames: list[tuple[nn.Module, Any]], root: Any) -> str:
    """The class whose call :func:`call_arguments` read (the root's; in a pipeline, the outermost running
    module's), so "an argument of the call" says whose: ``an argument of the Sequential call``."""
    if isinstance(root, nn.Module) and any(m is root for m, _ in frames):
        return type(root).__name__
    return type(frames[0][0]).__name__ if frames else type(root).__name__


def odd_component(walk: Any, mpath: str | None, inputs: list[Any], ref: Any) -> tuple[str, Any] | None:
    """(component path, dtype) when a float32 component is fed reduced-precision data by the rest of the model or
    pipeline (a ControlNet left in float32 in a bf16 pipeline): the fix casts or loads the component, not the data
    flowing in."""
    import torch

    low = {t.dtype for t in inputs if t.is_floating_point()}
    if ref != torch.float32 or len(low) != 1 or not low <= {torch.bfloat16, torch.float16}:
        return None
    comps = [p for p, _ in walk.roots if p and mpath is not None and _under(mpath, p)]
    return (max(comps, key=len) if comps else ""), low.pop()
