"""A corpus of checkpoint files for the scanner comparison (bench/scanners.py) and torchdoctor's own verdicts.

Three kinds of file, each a :class:`Case` with the verdict torchdoctor must give:

- ``payload``: a file whose unpickling runs code (``touch MARKER`` or writing MARKER): every one must be flagged
  "can run code" (exit 1) with the global named. Built byte by byte, so each reaches its global exactly as
  written (``torch.os.system`` through protocol 4's dotted names, copyreg extension codes, a name computed at
  load time, the five pickles of a legacy file, protocol 0 and 1, DCP ``.metadata``).
- ``benign``: what real libraries save (transformers, diffusers, peft, accelerate, optimizers, schedulers,
  training checkpoints with argparse / numpy values): never a "can run code" alarm.
- ``hostile``: damaged or oversized files that run no code: never "ok", never a traceback.

Building needs torch and the libraries of the benign files; nothing is downloaded (tiny configs).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    kind: str  # "payload", "benign", "hostile"
    names: tuple[str, ...] = ()  # for a payload: a global torchdoctor must name (any one of them)
    refused: str = ""  # for a payload torchdoctor cannot see into: the refusal (exit 2) must say this


# ---- pickle bytes, opcode by opcode -------------------------------------------------------------------------

def _str(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE: the one torch's weights-only reader knows


def _sglobal(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"  # STACK_GLOBAL (protocol 4: the name may be dotted)


def _call(fn: bytes, *args: bytes) -> bytes:
    return fn + b"(" + b"".join(args) + b"tR"  # MARK args TUPLE REDUCE


def _p4(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def _cmd(marker: str) -> bytes:
    return _str(f"touch {marker}")


def dotted(module: str, name: str, marker: str) -> bytes:
    """``module`` + dotted ``name`` called with the shell command (``torch`` + ``os.system``)."""
    return _p4(_call(_sglobal(module, name), _cmd(marker)))


def path_touch(marker: str) -> bytes:
    return _p4(_call(_sglobal("pathlib", "Path.touch"), _call(_sglobal("pathlib", "PosixPath"), _str(marker))))


def exec_with_source(marker: str) -> bytes:
    src = f"import pathlib; pathlib.Path({marker!r}).touch()"
    return _p4(_call(_sglobal("torch.fx.graph_module", "_exec_with_source"), _str(src), b"}"))


def proto0(marker: str) -> bytes:
    return b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."


def proto1(marker: str) -> bytes:
    cmd = f"touch {marker}".encode()
    return b"cposix\nsystem\n(X" + struct.pack("<I", len(cmd)) + cmd + b"tR."


def builtin_eval_py2(marker: str) -> bytes:
    """Protocol 0 with Python 2 names: ``__builtin__.eval`` is mapped to ``builtins.eval`` by the unpickler."""
    return b"c__builtin__\neval\n(V__import__('os').system('touch " + marker.encode() + b"')\ntR."


def ext_code(marker: str, width: int) -> bytes:
    """The pickle registers ``os.system`` as a copyreg extension code, then loads it by EXT1/EXT2/EXT4."""
    code = {1: 0xF0, 2: 0x1234, 4: 0x12345678}[width]
    op = {1: lambda: b"\x82" + bytes([code]), 2: lambda: b"\x83" + struct.pack("<H", code),
          4: lambda: b"\x84" + struct.pack("<I", code)}[width]()
    register = _call(_sglobal("copyreg", "add_extension"), _str("os"), _str("system"),
                     b"J" + struct.pack("<i", code)) + b"0"  # POP
    return _p4(register + _call(op, _cmd(marker)))


def computed_name(marker: str) -> bytes:
    """STACK_GLOBAL whose module is computed at load time: ``getattr("OS", "lower")()`` is ``"os"``."""
    module = _call(_call(_sglobal("builtins", "getattr"), _str("OS"), _str("lower")))
    return _p4(_call(module + _str("system") + b"\x93", _cmd(marker)))


def legacy(slot: int, payload: bytes) -> bytes:
    """A legacy (non-zip) torch.save stream of an empty dict whose pickle number ``slot`` (0 magic, 1 protocol,
    2 sys info, 3 the object, 4 storage keys) is ``payload``."""
    parts = [pickle.dumps(LEGACY_MAGIC, 2), pickle.dumps(1001, 2),
             pickle.dumps({"protocol_version": 1001, "little_endian": True,
                           "type_sizes": {"short": 2, "int": 4, "long": 4}}, 2),
             pickle.dumps({}, 2), pickle.dumps([], 2)]
    parts[slot] = payload
    return b"".join(parts)


def zip_pickle(data_pkl: bytes, name: str = "archive") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", data_pkl)
        zf.writestr(f"{name}/byteorder", "little")
        zf.writestr(f"{name}/version", "3\n")
    return buf.getvalue()


def payloads(marker: str) -> dict[str, tuple[bytes, tuple[str, ...]]]:
    """name -> (file bytes, globals of which one must be named)."""
    out: dict[str, tuple[bytes, tuple[str, ...]]] = {
        "torch.os.system.pt": (dotted("torch", "os.system", marker), ("torch.os.system",)),
        "torch.serialization.os.system.pt": (dotted("torch.serialization", "os.system", marker),
                                             ("torch.serialization.os.system",)),
        "argparse._os.system.pt": (dotted("argparse", "_os.system", marker), ("argparse._os.system",)),
        "pathlib.os.system.pt": (dotted("pathlib", "os.system", marker), ("pathlib.os.system",)),
        "collect_env.run.pt": (dotted("torch.utils.collect_env", "run", marker), ("torch.utils.collect_env.run",)),
        "pathlib.Path.touch.pt": (path_touch(marker), ("pathlib.Path.touch",)),
        "exec_with_source.pt": (exec_with_source(marker), ("torch.fx.graph_module._exec_with_source",)),
        "os.system.pkl": (dotted("os", "system", marker), ("os.system",)),
        "proto0.pkl": (proto0(marker), ("os.system",)),
        "proto1.pkl": (proto1(marker), ("posix.system",)),
        "py2-builtin-eval.pkl": (builtin_eval_py2(marker), ("builtins.eval",)),
        "computed-name.pkl": (computed_name(marker), ("builtins.getattr",)),
        "zip-os.system.pt": (zip_pickle(dotted("os", "system", marker)), ("os.system",)),
        "zip-runstring.pt": (zip_pickle(_p4(_call(_sglobal("numpy.testing._private.utils", "runstring"),
                                                  _str(f"import os; os.system('touch {marker}')"), b"}"))),
                             ("numpy.testing._private.utils.runstring",)),
        "zip-import_module.pt": (zip_pickle(_p4(_call(_sglobal("importlib", "import_module"), _str("antigravity")))),
                                 ("importlib.import_module",)),
        "zip-torch.hub.load.pt": (zip_pickle(_p4(_call(_sglobal("torch.hub", "load"), _str("x/y"), _str("m")))),
                                  ("torch.hub.load",)),
        "zip-builtins.exec.pt": (zip_pickle(_p4(_call(_sglobal("builtins", "exec"),
                                                      _str(f"import os; os.system('touch {marker}')")))),
                                 ("builtins.exec",)),
    }
    for width in (1, 2, 4):
        out[f"ext{width}.pkl"] = (ext_code(marker, width), ("os.system", "copyreg.add_extension"))
    for slot, what in enumerate(("magic", "protocol", "sysinfo", "object", "keys")):
        out[f"legacy-{what}.pt"] = (legacy(slot, dotted("os", "system", marker)), ("os.system",))
    return out


# ---- benign files from real libraries --------------------------------------------------------------------

def _benign(root: Path) -> dict[str, str]:
    """Files as real libraries write them; returns name -> path (a file or a directory)."""
    import argparse

    import numpy as np
    import torch

    out: dict[str, str] = {}

    def save(name: str, obj: object, **kw: object) -> None:
        torch.save(obj, root / name, **kw)  # type: ignore[arg-type]
        out[name] = str(root / name)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    save("state_dict.pt", model.state_dict())
    save("state_dict-legacy.pt", model.state_dict(), _use_new_zipfile_serialization=False)
    save("optimizer.pt", opt.state_dict())
    save("scheduler.pt", sched.state_dict())
    save("training.ckpt", {"epoch": 3, "state_dict": model.state_dict(), "optimizer": opt.state_dict(),
                           "lr_scheduler": sched.state_dict(), "args": argparse.Namespace(lr=1e-3, name="run"),
                           "np_step": np.int64(7), "np_loss": np.float32(0.25), "np_hist": np.zeros(3),
                           "rng": np.random.get_state()})
    save("whole-model.pt", model)
    torch.jit.save(torch.jit.script(model), root / "torchscript.pt")
    out["torchscript.pt"] = str(root / "torchscript.pt")
    _hf(root, out)
    return out


def _hf(root: Path, out: dict[str, str]) -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
    except Exception:  # a machine without transformers: the torch-only files still make the corpus
        return
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    model = GPT2LMHeadModel(cfg)
    torch.save(model, root / "whole-gpt2.pt")  # weights_only refuses it for its classes alone
    out["whole-gpt2.pt"] = str(root / "whole-gpt2.pt")
    model.save_pretrained(root / "gpt2-safetensors")
    out["gpt2-safetensors"] = str(root / "gpt2-safetensors")
    (root / "gpt2-bin").mkdir(exist_ok=True)  # what transformers 4 wrote with safe_serialization=False
    torch.save(model.state_dict(), root / "gpt2-bin" / "pytorch_model.bin")
    out["gpt2-bin/pytorch_model.bin"] = str(root / "gpt2-bin" / "pytorch_model.bin")
    torch.save(TrainingArguments(output_dir=str(root / "run"), report_to=[]), root / "training_args.bin")
    out["training_args.bin"] = str(root / "training_args.bin")
    try:
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"]))
        peft_model.save_pretrained(root / "lora")
        out["lora"] = str(root / "lora")
    except Exception:
        pass
    try:
        from diffusers import UNet2DModel

        unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                           block_out_channels=(8,), down_block_types=("DownBlock2D",),
                           up_block_types=("UpBlock2D",), norm_num_groups=4)
        unet.save_pretrained(root / "unet")
        out["unet"] = str(root / "unet")
    except Exception:
        pass
    try:
        from accelerate import Accelerator

        acc = Accelerator(cpu=True)
        m = torch.nn.Linear(2, 2)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        s = torch.optim.lr_scheduler.StepLR(o, 1)
        m, o, s = acc.prepare(m, o, s)
        acc.save_state(str(root / "accelerate-state"))
        out["accelerate-state"] = str(root / "accelerate-state")
    except Exception:
        pass


def build(root: str | os.PathLike[str], marker: str, with_benign: bool = True) -> list[Case]:
    """Write the corpus under ``root``; payloads would create ``marker`` if anything ran them."""
    base = Path(root)
    (base / "payload").mkdir(parents=True, exist_ok=True)
    cases = []
    for name, (data, names) in payloads(marker).items():
        path = base / "payload" / name
        path.write_bytes(data)
        cases.append(Case(name, str(path), "payload", names))
    dcp = base / "payload" / "dcp-metadata"  # dcp.load calls plain pickle.load on .metadata
    dcp.mkdir(exist_ok=True)
    (dcp / ".metadata").write_bytes(dotted("os", "system", marker))
    (dcp / "__0_0.distcp").write_bytes(b"")
    cases.append(Case("dcp-metadata", str(dcp), "payload", ("os.system",)))
    cases += _container_payloads(base / "payload", marker)
    cases += [Case(n, p, "hostile") for n, p in _hostile(base / "hostile").items()]
    if with_benign:
        (base / "benign").mkdir(exist_ok=True)
        cases += [Case(n, p, "benign") for n, p in _benign(base / "benign").items()]
    return cases


_SYSTEM = ("os.system", "posix.system")


def _container_payloads(root: Path, marker: str) -> list[Case]:
    """The container families (tests/checkpoint/containers.py): tar v7 / ustar, zip duplicates, case and name
    mismatches, a pickle before trailing data, nested storage blobs, DCP values, a tar in a model folder."""
    try:  # beside this file: the tests import it as a package, bench/scanners.py puts this folder on sys.path
        from . import containers
    except ImportError:
        import containers  # type: ignore[no-redef]

    cases = []
    for name, (data, _) in containers.live_payloads(marker).items():
        (root / name).write_bytes(data)
        cases.append(Case(name, str(root / name), "payload", _SYSTEM))
    folder = root / "tar-in-model-folder"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    (folder / "pytorch_model.bin").write_bytes(containers.v7_tar(marker))
    cases.append(Case("tar-in-model-folder", str(folder), "payload", _SYSTEM))
    target = root / "symlink-target.bin"
    target.write_bytes(containers.evil(marker) + pickle.dumps([], 2))
    (root / "tar-symlinked-storages.pt").write_bytes(containers.tar_symlinked_storages(str(target)))
    cases.append(Case("tar-symlinked-storages.pt", str(root / "tar-symlinked-storages.pt"), "payload",
                      refused="tar member 'storages' is a symlink"))
    try:
        dcp = containers.dcp_with_value(root / "dcp-value", marker)
        cases.append(Case("dcp-value", str(dcp), "payload", _SYSTEM))
    except Exception:  # a torch without torch.distributed.checkpoint
        pass
    return cases


HOSTILE: dict[str, Callable[[], bytes]] = {}


def _hostile(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, make in HOSTILE.items():
        (root / name).write_bytes(make())
        out[name] = str(root / name)
    return out


# ---- hostile tensor records: shapes, strides and offsets that do not fit their storage --------------------------

def _int(v: int) -> bytes:
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return (b"\x8a" + bytes([len(raw)]) if len(raw) < 256 else b"\x8b" + struct.pack("<I", len(raw))) + raw


def _tuple(values: list[int]) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def tensor_zip(size: list[int], stride: list[int], offset: int = 0, numel: int = 2) -> bytes:
    """A zip ``torch.save`` of {"w": tensor} whose record says ``size`` / ``stride`` / ``offset`` over a float32
    storage of ``numel`` elements (the storage's bytes are there)."""
    pid = b"(" + _str("storage") + b"ctorch\nFloatStorage\n" + _str("0") + _str("cpu") + _int(numel) + b"tQ"
    record = (b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + _int(offset) + _tuple(size) + _tuple(stride)
              + b"\x89ccollections\nOrderedDict\n)RtR")
    data = b"\x80\x02}" + _str("w") + record + b"s."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", data)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/data/0", bytes(4 * numel))
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


HOSTILE.update({
    "big-on-small-storage.pt": lambda: tensor_zip([1000, 1000], [1000, 1]),
    "size-10e1000.pt": lambda: tensor_zip([10**1000], [1]),
    "size-2e600.pt": lambda: tensor_zip([2**600, 1], [1, 1]),
    "dims-60000.pt": lambda: tensor_zip([2] * 60_000, [1] * 60_000),
    "negative-size.pt": lambda: tensor_zip([-4], [1]),
    "negative-stride.pt": lambda: tensor_zip([2], [-1], offset=1),
    "offset-past-end.pt": lambda: tensor_zip([2], [1], offset=5),
    "stride-past-end.pt": lambda: tensor_zip([2, 2], [1, 7]),
    "rank-mismatch.pt": lambda: tensor_zip([2, 1], [1]),
})
VALID_TENSORS: dict[str, Callable[[], bytes]] = {  # edge cases torch loads: never refused
    "empty-on-empty.pt": lambda: tensor_zip([0, 5], [5, 1], numel=0),
    "expanded-stride-0.pt": lambda: tensor_zip([1000, 2], [0, 1]),
    "view-with-offset.pt": lambda: tensor_zip([1], [1], offset=1),
    "scalar.pt": lambda: tensor_zip([], [], numel=1),
    "zero-size-far-offset.pt": lambda: tensor_zip([0], [1], offset=2),
    "dims-60000-of-1.pt": lambda: tensor_zip([1] * 60_000, [1] * 60_000),
}
