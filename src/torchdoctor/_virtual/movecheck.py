"""The recorder's checks of moves, casts, factories and host reads of a virtual run (a mixin of ``recorder``): a
device the profile lacks, a dtype the device cannot hold (a refused cast of a tensor already there keeps its line),
a lossy cast of a model tensor, meta data copied out, a factory drawing from another device's generator, and
``.numpy()`` of a device tensor."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._rules.profile import DeviceProfile, factory_refusal, refusal
from torchdoctor._placement import compact, device_str, dtype_str, norm_device
from torchdoctor._virtual import hostmade
from torchdoctor._virtual.datadtype import data_dtype, factory_call, maker_name
from torchdoctor._virtual.origin import maker_of, moved_by_apply, where_called
from torchdoctor._virtual.tensor import is_entry as _is_entry


class MoveChecks:
    """Mixed into the recorder, which supplies ``_note``, the profile, the module stack and the problem list."""

    profile: DeviceProfile
    modules: Any
    promotions: Any
    problems: list[Any]
    sources: dict[tuple[str, ...], tuple[str, ...]]
    _apart: bool | None
    seen: set[tuple[str, ...]]

    def _note(self, kind: str, path: str | None, found: str, expected: str, message: str, op: str = "Tensor.to",
              role: str = "activation", key: str | None = None) -> None:
        raise NotImplementedError

    def _said_refused(self, dtype: Any) -> None:
        """A factory, cast or move of ``dtype`` refused at its line is that dtype's cause in the run: the ops that later
        compute in it are its tensors' (``freqs / dim`` after ``torch.arange(..., dtype=torch.float64)``), not another
        problem. Each refusing line stays its own (a rope's ``arange`` and its ``pos.to(torch.float64)``)."""
        self.seen.add(("unsupported_dtype", dtype_str(dtype), "op"))

    def exists(self, target: torch.device, path: str | None, op: str) -> None:
        if target.type == self.profile.type and (target.index or 0) >= self.profile.count:
            self._note("device", path, device_str(target), f"{self.profile.type}:0..{self.profile.count - 1}",
                       f"{device_str(target)} does not exist (invalid device ordinal): the simulated profile has "
                       f"{self.profile.count} {self.profile.type} device(s)", op=op, key=device_str(target))

    def _moving(self, tensor: torch.Tensor, target: torch.device, dtype: torch.dtype) -> torch.dtype:
        refused = target.type == self.profile.type and not self.profile.supports(dtype, "storage")
        src, path = getattr(tensor, "_td_device", tensor.device), getattr(tensor, "_td_path", None) or (
            moved_by_apply(tensor) if refused else None)  # a refused move named by Module.to's frames
        if src != target and norm_device(src) != norm_device(target):  # a rotary's per-call .to(x.device) is none
            self._apart = None  # the parts' placement may change: read again when next asked (a walk of the model)
        self.exists(target, path, "Tensor.to")
        if not refused and (src.type != "meta" or target.type == "meta"):
            return dtype
        what = f"{path or maker_of(tensor, self.modules.path_of) or 'a tensor'} " \
            f"{compact(tensor.dtype, tuple(tensor.shape), src)}"
        made = hostmade.refused(path, tensor) if refused and src.type == "cpu" and path else ""
        what += made  # a model tensor a factory of the program made: that line, one problem per line
        if refused and src.type == "cpu" and (cast := hostmade.cast_of(tensor)) is not None:
            from torchdoctor._virtual.dtypevar import named  # the program's cast that made its dtype, and its name

            what += named(cast)
        if src.type == "meta" and target.type != "meta":
            from torchdoctor._virtual.metaread import offloaded_here  # an offloaded weight moved outside its call

            hit = offloaded_here()
            self._note("meta", path, "meta", device_str(target), f"{what} holds no data (meta): moving it to "
                       f"{device_str(target)} raises 'Cannot copy out of meta tensor'. " + (
                           f"{hit[1][0].splitlines()[0].removeprefix('culprit ')}" if hit else "Load or materialise "
                           "it first, or pass assume_device= if the model is built on meta on purpose"))
            if hit and self.problems and self.problems[-1].kind == "meta":
                q = self.problems[-1]
                self.sources.setdefault((q.kind, q.path, q.op or "", q.found), (hit[0],))
        if refused:
            # a cast of a tensor already there (``sigmas.to(torch.float64)`` on mps): its line, where the fix goes
            at = where_called() if norm_device(src) == norm_device(target) else None
            if at and ("unsupported_dtype", dtype_str(dtype), "op") in self.seen and _carried(dtype):
                return dtype  # ``x.to(sig.dtype)``: ``sig``'s refused line, already said, is this dtype's maker
            self._note("unsupported_dtype", path, dtype_str(dtype), f"a dtype {target.type} supports",
                       f"{what} moved to {device_str(target)} as {dtype_str(dtype)}" + (f" (cast at {at})" if at else "")
                       + f": {refusal(target.type, dtype)}" + ("" if self.modules.stack else _library()),
                       key=f"{dtype_str(dtype)}{made}" if path else f"{dtype_str(dtype)}:{at}" if at else
                       _per_line(dtype))
            self._said_refused(dtype)
            if at and self.problems and self.problems[-1].found == dtype_str(dtype):
                p = self.problems[-1]
                self.sources.setdefault((p.kind, p.path, p.op or "", p.found), (f"cast at {at}",))
        return dtype

    def creating(self, name: str, device: torch.device, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> None:
        self.exists(device, None, f"torch.{name}")
        dt = kwargs.get("dtype") if (said := "dtype" in kwargs) else data_dtype(name, args)  # float64 numpy data
        if (why := factory_refusal(self.profile, name, dt, device)) is not None:
            at = where_called()  # one call is one problem (``x.new_tensor`` runs as ``torch.tensor`` at its line)
            self._note("unsupported_dtype", None, dtype_str(dt), f"a dtype {device.type} supports",
                       f"{factory_call(name, dtype_str(dt), said, device_str(device), at)}: {why}"
                       f"{'' if self.modules.stack else _library()}",
                       maker_name(name),
                       "factory", key=f"{dtype_str(dt)}:{at or name}")
            if isinstance(dt, torch.dtype) and not self.profile.supports(dt, "storage"):  # (a card that holds float64 but has no kernels for it: the
                self._said_refused(dt)  # ops that compute in it are where it fails, said too)
        gdev = getattr(kwargs.get("generator"), "device", None)
        if isinstance(gdev, torch.device) and gdev.type != device.type:
            at = where_called()  # the draw, at its line: "Cannot generate a cpu tensor from a generator of type cuda"
            self._note("device", None, device_str(device), device_str(gdev), f"torch.{name}(device="
                       f"{device_str(device)!r}){f' at {at}' if at else ''} draws from a generator on "
                       f"{device_str(gdev)}: real PyTorch raises (Cannot generate a {device.type} tensor from a "
                       f"generator of type {gdev.type}); " + ("pass device=generator.device" if device.type == "cpu" else
                       f"real PyTorch expects a '{device.type}' generator: torch.Generator({device.type!r})"),
                       f"torch.{name}", "generator")
            if at:  # fixed at that call: device= the generator's; a DataLoader's sampler: a cpu generator given it
                self.sources.setdefault(("device", self.problems[-1].path, f"torch.{name}", device_str(device)),
                                        (f"sampler draws at {at}" if _in_sampler() else f"factory torch.{name} at {at}",))

    def drawing(self, func: Any, device: torch.device, generator: Any) -> None:
        gdev = getattr(generator, "device", None)
        if not isinstance(gdev, torch.device) or gdev.type == device.type:
            return
        at, op = where_called(), f"torch.{getattr(func, '__name__', func)}"
        self._note("device", None, device_str(gdev), device_str(device),
                   f"{op}{f' at {at}' if at else ''} draws with a generator on {device_str(gdev)} from tensors on "
                   f"{device_str(device)}: real PyTorch raises (Expected a '{device.type}' device type for generator "
                   f"but found '{gdev.type}'); make the generator on their device, torch.Generator(device=...)",
                   op, "generator", key=f"generator:{at or op}")
        if at and self.problems:  # fixed where the generator is made or passed: said at the draw's line
            self.sources.setdefault(("device", self.problems[-1].path, op, device_str(gdev)), (f"draws at {at}",))

    def reading(self, tensor: torch.Tensor, what: str) -> None:
        from torchdoctor._virtual.libout import own_frame
        from torchdoctor._virtual.origin import LINES

        path, dev, at = getattr(tensor, "_td_path", None), getattr(tensor, "_td_device", tensor.device), where_called()
        if (own := own_frame(3)) is not None:  # the program's line, never numpy's own (``np.sum`` of a list)
            at, LINES[own[2]] = own[2], own[:2]
        self._note("device", path or (f"<numpy read at {at}>" if at else None), device_str(dev), "cpu",
                   f"{what}() of {path or 'a tensor'} "
                   f"{compact(tensor.dtype, tuple(tensor.shape), dev)}: can't convert {device_str(dev)} device type "
                   "tensor to numpy; call .cpu() first" + (f" (at {at})" if at else ""), op=what,
                   key=f"{what}:{path}:{at}")  # each line that reads one is its own problem
        if at:  # what the line read: its fix is proven on a cpu copy of it (``hostread``)
            from torchdoctor._virtual.hostread import note_read
            note_read(tensor, at)
        if at and self.problems:  # the user's line that read it: the fix writes ``.cpu()`` there (``fixes``)
            self.sources.setdefault(("device", self.problems[-1].path, what, device_str(dev)), (f"read at {at}",))

    def moving(self, tensor: torch.Tensor, target: torch.device, dtype: torch.dtype) -> torch.dtype:
        if not self.modules.stack:  # the program moves or casts its model: the promotion check walks it again
            self.promotions.moved(tensor)
        # a model tensor cast with loss (a complex freqs_cis under dtype=bf16); computations that round on purpose
        # (T5's position buckets: float -> long) are activations, not model tensors
        if _is_entry(tensor) and ((tensor.is_complex() and not dtype.is_complex) or (tensor.is_floating_point() and not (
                dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool)):
            path = getattr(tensor, "_td_path", None)
            src = getattr(tensor, "_td_device", tensor.device)
            self._note("dtype", path, dtype_str(tensor.dtype), dtype_str(tensor.dtype),
                       f"{path or 'a tensor'} {compact(tensor.dtype, tuple(tensor.shape), src)} is cast to "
                       f"{dtype_str(dtype)}: the cast loses data (complex to real drops the imaginary part, float to "
                       "int the fraction); keep it or cast the result instead", key=f"lossy:{path}:{dtype}")
        return self._moving(tensor, target, dtype)


def not_refused(problems: list[Any], among: list[Any]) -> list[Any]:
    """``problems`` less the silent promotions by a model tensor whose move the device refused in that dtype
    (``among``): numpy's float64 buffer bound for mps never computes there in float64, so the ops it promoted in the
    run are that refusal's, not problems of their own (float8 computed with as it is stays a problem: its fix is
    another dtype, not the move)."""
    refused = {(p.path, p.found) for p in among if p.kind == "unsupported_dtype" and p.op == "Tensor.to" and
               not p.path.startswith("<")}  # a refused move, never a kernel's refusal (float8 computed with)
    return [p for p in problems if not (p.kind == "dtype" and p.role in ("parameter", "buffer") and
                                        (p.path, p.found) in refused and " silently" in p.message)] \
        if refused else problems


def _carried(dtype: torch.dtype) -> bool:
    """The cast at the program's line reads its dtype from another tensor (``.to(t.dtype)``, ``.type_as(t)``)."""
    from torchdoctor._virtual.carried import donor
    from torchdoctor._virtual.origin import user_frame

    return donor(user_frame(3), dtype) is not None


def _library() -> str:
    """The library line that made or cast a tensor in a dtype the device refuses (a mark in the problem's message:
    ``libfloat``), or ''. Asked only when it refuses."""
    from torchdoctor._virtual.libfloat import library_line

    return library_line(2) or ""  # outside a forward only: the caller asks when no module runs


def _per_line(dtype: Any) -> str:
    """One refused move of a tensor no module holds per dtype; inside a library's code, one per line of the program
    that called it (a library's float64 in one call is one problem; the same library's second site, reached from
    another of the program's lines — a scheduler's ``step`` after its ``set_timesteps`` — is its own)."""
    from torchdoctor._virtual.libout import own_frame
    from torchdoctor._virtual.origin import user_frame

    own, first = own_frame(3), user_frame(3)
    if own is None or first is None or first.f_code.co_filename == own[0]:
        return dtype_str(dtype)
    return f"{dtype_str(dtype)}:{own[2]}"


def _in_sampler() -> bool:
    """The draw is torch.utils.data's own (a ``RandomSampler`` shuffling with the DataLoader's ``generator=``)."""
    import sys

    f: Any = sys._getframe(2)
    for _ in range(12):
        if f is None:
            return False
        if f.f_code.co_filename.replace("\\", "/").endswith("torch/utils/data/sampler.py"):
            return True
        f = f.f_back
    return False

