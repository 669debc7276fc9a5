"""``torchdoctor simulate TARGET... --device D | --profile NAME``: would it run there, without the hardware?"""

from __future__ import annotations

import argparse
import os
from typing import Any

from torchdoctor._cli.common import assume_option, each_target, UsageError, failure, mps_is_one, parse_common, resolve_target
from torchdoctor._cli.scan import single, write_html
from torchdoctor._placement import parse_device
from torchdoctor._report.progress import progress
from torchdoctor._report.terminal import emit
from torchdoctor._report.text import EXIT_OK
from torchdoctor._rules.presets import describe, preset
from torchdoctor._rules.profile import DeviceProfile


def _profile(args: argparse.Namespace) -> tuple[Any, DeviceProfile]:
    """The virtual device and its profile from ``--device``, ``--profile`` and ``--count``, checked together."""
    from torchdoctor._virtual.tensor import is_virtual

    named = None
    if getattr(args, "profile", None):
        try:
            named = preset(args.profile)
        except ValueError as exc:
            raise UsageError(f"--profile: {exc}") from None
    if not args.device and named is None:
        raise UsageError("simulate needs --device (e.g. cuda:1, mps, xpu) or --profile (e.g. t4, a100, m2)")
    device, _ = parse_common(args) if args.device else (parse_device(named.type if named else "cpu"), None)
    if named is not None and device.type != named.type:
        raise UsageError(f"--profile {args.profile} is a {named.type} device ({named.name}); --device {args.device} "
                         f"is {device.type}: drop one of them")
    profile = named or DeviceProfile.for_device(device if is_virtual(device) else "cuda")
    mps_is_one(device, args.count)
    need = (device.index or 0) + 1
    if args.count is not None:
        if args.count < need:
            raise UsageError(f"--count {args.count} gives {device.type}:0..{args.count - 1}, but --device "
                             f"{args.device} needs at least {need} devices: raise --count or pick a lower index")
        profile = profile.with_count(args.count)
    return device, profile.with_count(need)


def _sources(args: argparse.Namespace) -> dict[str, str]:
    """Where device, dtype and profile came from: the option or ``[tool.torchdoctor] in FILE``; a device only a
    profile gave comes from that profile."""
    src = dict(getattr(args, "sources", None) or {})
    if not args.device and "profile" in src:
        src["device"] = f"the profile ({src['profile']})"
    return src


class _Counted:
    """The progress line as a bar over the model's leaf modules: each leaf module's forward that ends advances it
    (one global forward hook, removed by its handle). Only while the line is drawn: a run nobody watches pays
    nothing."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.handle: Any = None

    def __enter__(self) -> _Counted:
        return self

    def start(self, target: Any) -> None:
        import torch

        obj = getattr(target, "obj", target)
        if not self.bar.drawing or self.handle is not None or not isinstance(obj, torch.nn.Module):
            return
        self.bar.total = sum(1 for m in obj.modules() if not m._modules)
        self.bar.label += ", modules"

        def ended(module: Any, args: Any, out: Any) -> None:
            if not module._modules:
                self.bar.advance()

        self.handle = torch.nn.modules.module.register_module_forward_hook(ended)

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.remove()


def _one(spec: str, args: argparse.Namespace, device: Any, profile: DeviceProfile, docs: list[Any]) -> int:
    from torchdoctor._virtual.simulate import simulate_target

    _, dtype = parse_common(argparse.Namespace(device=None, dtype=args.dtype))
    if os.path.exists(spec):
        raise UsageError(f"simulate needs an object (path/to/file.py:name or package.module:name); {spec!r} is "
                         "a file or directory: use `torchdoctor scan` for checkpoints")
    if device.type == "cpu" and dtype is None:  # the API's words name dtype=; these name the option
        raise UsageError("--device cpu checks a dtype on this CPU: add --dtype (e.g. --dtype float16), or pick a "
                         "virtual device (--device cuda:1, xpu, mps)")
    assume = assume_option(getattr(args, "assume_device", None))
    target: Any = None
    try:
        where = f"{device}" + (f" ({profile.name})" if profile.name else "")
        on = f"this {device}" if device.type == "cpu" else f"virtual {where}"
        # no progress line in a JSON run (a program reads it) nor with -q; on a terminal, or when asked
        with progress(f"simulating {spec} on {on}", quiet=args.quiet or args.json) as bar, _Counted(bar) as count:
            # TARGET's own code runs on the virtual devices (it may build its model on cuda:N); a model built on
            # meta is taken as loaded on --device (or --assume-device), as simulate() does
            loaded: list[Any] = []

            def load() -> Any:
                loaded.append(resolve_target(spec))
                count.start(loaded[-1])
                return loaded[-1]

            report = simulate_target(load, device, dtype, profile=profile, assume_device=assume,
                                     sources=_sources(args), data=args.data or "meta", select=False)
            target = loaded[-1] if loaded else None
            if device.type == "cpu":  # the CPU's check names the API's arguments: these name the options
                from dataclasses import replace

                from torchdoctor._virtual.session import expectation

                report = replace(report, expected=expectation(report.device, report.dtype, report.profile,
                                                              _sources(args)))
    except UsageError:
        raise
    except (ValueError, TypeError) as exc:  # bad arguments, or an object that cannot be copied
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # the target's own code failed before any placement problem was seen
        raise UsageError(f"running {spec} failed before any placement problem: {failure(exc)}") from exc
    if report.nothing_to_check:
        raise UsageError(_nothing_ran(spec, target, device))
    if args.html:
        write_html(report, args.html)
    if args.json:
        docs.append(report.to_dict())
    else:
        emit(report.text(limit=args.limit))
    return int(report.exit_code())


def _nothing_ran(spec: str, target: Any, device: Any) -> str:
    """Why a simulate checked nothing: an object without tensors, or a model given without inputs where a forward
    is the check (``--device cpu --dtype``: the dtype is checked by running the model on this CPU)."""
    from torchdoctor._report.model import Target

    obj = target.obj if isinstance(target, Target) else target
    name = type(obj).__name__
    tensors = 0
    if not isinstance(target, Target):
        try:
            from torchdoctor import scan

            tensors = len(scan(obj).tensors)
        except Exception:  # noqa: BLE001 - the count only picks the words
            tensors = 0
    if not tensors:
        return f"nothing to check: {spec} holds no tensors and ran no tensor op (a {name})"
    what = f"a {name} module" if _is_module(obj) else f"a {name} holding {tensors} tensor(s)"
    where = "on this cpu (a dtype on the CPU is checked by running the model)" if device.type == "cpu" else \
        f"on virtual {device}"
    return (f"{spec} returned {what} but no inputs, so no forward ran {where}: return "
            "torchdoctor.Target(model, (x,)) from it with an input x, as the README's `torchdoctor simulate "
            "my_app.py:build_target` does")


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def command(args: argparse.Namespace) -> int:
    targets: list[str] = list(args.target) if isinstance(args.target, (list, tuple)) else [args.target]
    if getattr(args, "profile", None) in ("help", "list"):
        print("\n".join(describe()))
        return EXIT_OK
    if getattr(args, "distributed", False):
        if len(targets) != 1:
            raise UsageError("--distributed simulates one TARGET per run")
        from torchdoctor._distributed.cli import command as distributed_command

        return distributed_command("simulate", single(args, targets[0]))
    if args.html and len(targets) > 1:
        raise UsageError("--html writes the map of one TARGET; give one TARGET (or run once per TARGET)")
    device, profile = _profile(args)
    return each_target("simulate", targets, args, lambda spec, docs: _one(spec, args, device, profile, docs))
