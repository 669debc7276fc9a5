"""An operand fixed at the program's call (``inputs_embeds.masked_scatter(mask, image_features.to(
inputs_embeds.device))``, ``loss_fn(out, target.to(torch.float32))``: ``makers.operand_fix``; ``net(x.to(device))``:
``devname``) proven by a re-run: while it runs, a torch call or a module call at that line that is given the tensor
the program names there gets it moved or cast as the fixed line would (to the device of the other operand the line
names, or to the dtype). A module call's argument is moved by a forward pre-hook, in the program's own context (the
run's modes all active, as the fixed line's ``.to`` would be); the hook is removed by its handle after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["reoperand", "reoperated"]


def reoperand(source: str, target: Any) -> tuple[str, int, str, str | None, Any] | None:
    """(file, line, the operand's name, the other operand's name, the dtype or device) of ``source`` (``operand
    image_features at app.py:17``) for a re-run; None when its line is not on record."""
    from torchdoctor._virtual.origin import LIKE, LINES

    name, _, at = source.removeprefix("operand ").partition(" at ")
    file, line = LINES.get(at, ("", 0))
    if not file or not name.isidentifier():
        return None
    return file, line, name, LIKE.get(source), target


class _Operands(torch.overrides.TorchFunctionMode):
    def __init__(self, sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torchdoctor._virtual.origin import user_frame

        kwargs = dict(kwargs or {})
        f = user_frame(2)
        wants = self.sites.get((f.f_code.co_filename, f.f_lineno)) if f is not None else None
        for name, like, target in wants or ():
            t = f.f_locals.get(name)
            if not isinstance(t, torch.Tensor):
                continue
            other = f.f_locals.get(like) if like else None
            to = other.device if isinstance(other, torch.Tensor) and not isinstance(target, torch.dtype) else target
            args = tuple(a.to(to) if a is t else a for a in args)
            kwargs = {k: v.to(to) if v is t else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def reoperated(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: each operand a fix moves or casts at its line is given so there."""
    sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]] = {}
    for f in fixes:
        if (r := getattr(f, "reoperand", None)) is not None:
            sites.setdefault((r[0], r[1]), []).append(r[2:])
    if not sites:
        yield
        return
    handle = torch.nn.modules.module.register_module_forward_pre_hook(_ModuleArgs(sites))
    outs = {at: made for at, wants in sites.items() if (made := [w for w in wants if w[0].endswith("(...)")])}
    out = torch.nn.modules.module.register_module_forward_hook(_MadeOutputs(outs)) if outs else None
    try:
        with _Operands(sites):
            yield
    finally:
        handle.remove()
        if out is not None:
            out.remove()


class _MadeOutputs:
    """A global forward hook: a module called at a fixed line whose output the fixed line casts or moves as it hands
    it on (``lm(inputs_embeds=projector(feats).to(lm.dtype))``: the fix names it ``projector(...)``) returns it so."""

    def __init__(self, sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]]) -> None:
        self.sites = sites

    def __call__(self, module: Any, args: Any, output: Any) -> Any:
        from torchdoctor._virtual.origin import user_frame
        from torchdoctor._virtual.usesite import resolve

        f = user_frame(1)
        wants = self.sites.get((f.f_code.co_filename, f.f_lineno)) if f is not None else None
        for name, _, target in wants or ():
            if isinstance(output, torch.Tensor) and resolve(name[:-5], f.f_locals, f.f_globals) is module:
                return output.to(target)
        return None


class _ModuleArgs:
    """A global forward pre-hook: a module called at a fixed line with the tensor the fix names there, as the line
    writes the call (``net(x)``: the callee resolves to the module, the name is its positional argument), gets it
    moved or cast so (the run may hand the module a stand-in of the program's tensor: the position decides)."""

    def __init__(self, sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]]) -> None:
        self.sites = sites

    def __call__(self, module: Any, args: Any) -> Any:
        from torchdoctor._virtual.origin import user_frame
        from torchdoctor._virtual.usesite import resolve

        f = user_frame(1)
        wants = self.sites.get((f.f_code.co_filename, f.f_lineno)) if f is not None else None
        if not wants or not isinstance(args, tuple):
            return None
        calls = _module_calls(f.f_code.co_filename, f.f_lineno)
        for name, like, target in wants:
            at = next((i for callee, names in calls if resolve(callee, f.f_locals, f.f_globals) is module
                       for i, n in enumerate(names) if n == name and i < len(args)), None)
            t = f.f_locals.get(name)
            if at is None or not isinstance(t, torch.Tensor) or not isinstance(args[at], torch.Tensor):
                continue
            other = f.f_locals.get(like) if like else None
            to = other.device if isinstance(other, torch.Tensor) and not isinstance(target, torch.dtype) else target
            args = (*args[:at], t.to(to), *args[at + 1:])  # the program's own tensor, as the fixed line moves it
        return args


def _module_calls(file: str, line: int) -> list[tuple[str, list[str]]]:
    """(the callee's text, the names of its positional arguments, "" for other expressions) of each call at the
    program's line whose callee is a name or an attribute chain; empty when the line does not parse alone."""
    import ast
    import linecache

    try:
        tree = ast.parse(linecache.getline(file, line).strip().rstrip(":"))
    except SyntaxError:
        return []
    return [(ast.unparse(n.func), [a.id if isinstance(a, ast.Name) else "" for a in n.args]) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))]
