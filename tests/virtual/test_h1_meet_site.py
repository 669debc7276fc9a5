"""A tensor fixed where it meets the tensor it disagrees with, not at its maker, when the maker's line is the wrong
place for a device (``_virtual/meetsite``), under ``torchdoctor run --device cuda`` on tiny apps written here:

- a loader in the app's own package returns its mask on the cpu by convention; a plugin node multiplies it with
  images on cuda: the fix goes into the plugin's node, ``mask = mask.to(image1.device)``, never the loader;
- a mask made with a literal ``device="cpu"`` in a function with no tensor to read a device from meets an image
  whose device a flag decides (``intermediate_device()``): the fix reads the image's device where they meet, and the
  patched app runs clean in both of its modes (a literal ``'cuda:0'`` at the maker broke the default one);
- a maker whose partner's device is written out (``.to("cuda")``) in the same file keeps its maker-line fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def _run(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "main.py", *args],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout
    return proc, json.loads(out[out.index('{\n  "schema"'):])


def _apply(root: Path, patch: str) -> None:
    subprocess.run(["git", "init", "-q", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-"], cwd=root, input=patch, text=True, check=True)


_MM = """
    import sys, torch
    GPU_ONLY = "--gpu-only" in sys.argv
    def get_torch_device(): return torch.device("cuda", 0)
    def intermediate_device(): return get_torch_device() if GPU_ONLY else torch.device("cpu")
"""

LOADER_APP = {
    "app/__init__.py": "",
    "app/mm.py": _MM,
    "app/loaders.py": """
        import numpy as np, torch
        from app import mm
        class Decode:
            def decode(self, z):
                return (z.to(mm.intermediate_device()) * 0.5,)
        class LoadMask:
            def load(self, h, w):
                arr = (np.arange(h * w).reshape(h, w) % 2).astype(np.float32)
                return (torch.from_numpy(arr)[None, ..., None],)
    """,
    "plugins/pack/__init__.py": "from .nodes import Mix\n",
    "plugins/pack/nodes.py": """
        class Mix:
            def mix(self, image1, image2, mask):
                out = image1 * (1. - mask) + image2 * mask
                return (out,)
    """,
    "main.py": """
        import os, sys, torch
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"))
        from app.loaders import Decode, LoadMask
        from pack import Mix
        a, = Decode().decode(torch.randn(1, 4, 4, 3))
        b, = Decode().decode(torch.randn(1, 4, 4, 3))
        m, = LoadMask().load(4, 4)
        out, = Mix().mix(a, b, m)
        print("mixed", tuple(out.shape), out.device)
    """,
}


def test_a_loaders_cpu_mask_is_fixed_in_the_plugin_node_that_uses_it(tmp_path: Path) -> None:
    _write(tmp_path, LOADER_APP)
    proc, doc = _run(tmp_path, "--gpu-only")
    assert proc.returncode == 1 and doc["problems"], proc.stderr[-3000:]
    codes = [f["code"] for f in doc["fixes"]]
    fix = next(f for f in doc["fixes"] if f["code"].startswith("mask = mask.to(image1.device)"))
    assert fix["proven"], fix
    assert "made by torch.from_numpy at app/loaders.py:9" in fix["code"], fix["code"]
    assert "`load` (loaders.py) returns it as it is to every caller" in fix["code"], fix["code"]
    assert not any("from_numpy(arr).to(" in c or "'cuda:0'" in c.split("#")[0] for c in codes), codes
    patch = doc["patch"]
    assert "+++ b/plugins/pack/nodes.py" in patch and "app/loaders.py" not in patch, patch
    _apply(tmp_path, patch)
    text = (tmp_path / "plugins/pack/nodes.py").read_text()
    assert "        mask = mask.to(image1.device)\n        out = image1 * (1. - mask)" in text, text
    again, doc2 = _run(tmp_path, "--gpu-only")
    assert again.returncode == 0 and doc2["problems"] == [], again.stderr[-2000:]
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=120)  # the default mode, on this machine's cpu: the loader's mask untouched
    assert plain.returncode == 0 and "mixed (1, 4, 4, 3) cpu" in plain.stdout, plain.stderr[-2000:]


FLAG_APP = {
    "comfy/__init__.py": "",
    "comfy/mm.py": _MM,
    "images.py": """
        import torch
        import comfy.mm as mm
        class EmptyImage:
            def generate(self, width, height):
                r = torch.full([1, height, width, 1], 0.5, device=mm.intermediate_device())
                g = torch.full([1, height, width, 1], 0.25, device=mm.intermediate_device())
                return (torch.cat((r, g, r), dim=-1),)
    """,
    "masks.py": """
        import torch
        class SolidMask:
            def solid(self, value, width, height):
                out = torch.full((1, height, width), value, dtype=torch.float32, device="cpu")
                return (out,)
        class Composite:
            def combine(self, destination, source, operation):
                output = destination.clone()
                src = source.reshape((-1, source.shape[-2], source.shape[-1]))
                region = output[:, :src.shape[1], :src.shape[2]]
                if operation == "multiply":
                    output[:, :src.shape[1], :src.shape[2]] = region * src
                elif operation == "add":
                    output[:, :src.shape[1], :src.shape[2]] = region + src
                return (output,)
    """,
    "main.py": """
        import os, sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from images import EmptyImage
        from masks import SolidMask, Composite
        img, = EmptyImage().generate(8, 8)
        dest = img[..., 0]
        src, = SolidMask().solid(0.5, 4, 4)
        out, = Composite().combine(dest, src, "multiply")
        print("mask", tuple(out.shape), out.device)
    """,
}


def test_a_literal_device_meeting_one_a_flag_decides_follows_it_where_they_meet(tmp_path: Path) -> None:
    _write(tmp_path, FLAG_APP)
    proc, doc = _run(tmp_path, "--gpu-only")
    assert proc.returncode == 1 and doc["problems"], proc.stderr[-3000:]
    fix = next(f for f in doc["fixes"] if f["code"].startswith("src = src.to(region.device)"))
    assert fix["proven"], fix
    assert "region's device is decided at run time (images.py:5: mm.intermediate_device())" in fix["code"] or \
        "region's device is decided at run time (images.py:6: mm.intermediate_device())" in fix["code"], fix
    assert "`solid` has no tensor to read a device from" in fix["code"], fix["code"]
    assert "device='cuda:0'" not in doc["patch"], doc["patch"]
    _apply(tmp_path, doc["patch"])
    text = (tmp_path / "masks.py").read_text()
    # before the branch, so the "add" branch gets it too
    assert '        src = src.to(region.device)\n        if operation == "multiply":' in text, text
    for flags in (("--gpu-only",), ()):  # both of the app's modes, the fixed line following the image
        again, doc2 = _run(tmp_path, *flags)
        assert again.returncode == 0 and doc2["problems"] == [], (flags, again.stderr[-2000:])


def test_a_mask_written_out_on_cuda_follows_images_a_helper_placed_through_an_op(tmp_path: Path) -> None:
    """The app patched the old way (the mask's ``device="cpu"`` turned to 'cuda:0'), in its default mode: the cpu
    image the run blames was made by ``torch.cat`` at images.py:7 of tensors whose lines ask the helper for their
    device; the mask written out on 'cuda:0' follows the image where they meet, and both modes then run clean."""
    files = dict(FLAG_APP)
    files["masks.py"] = files["masks.py"].replace('device="cpu"', "device='cuda:0'")
    _write(tmp_path, files)
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert any("made by Tensor.cat" in p["message"] and "images.py:7" in p["message"] for p in doc["problems"]), doc
    fix = next(f for f in doc["fixes"] if f["code"].startswith("src = src.to(region.device)"))
    assert fix["proven"], fix
    assert ("region was made by Tensor.cat at images.py:7 from tensors whose device the program picks at run time "
            "(images.py:5: mm.intermediate_device()), src's is written out (masks.py:4: 'cuda:0')") in fix["code"], fix
    _apply(tmp_path, doc["patch"])
    for flags in (("--gpu-only",), ()):
        again, doc2 = _run(tmp_path, *flags)
        assert again.returncode == 0 and doc2["problems"] == [], (flags, again.stderr[-2000:])


def test_a_tensor_made_by_a_recorded_op_is_said_so_never_unrecorded(tmp_path: Path) -> None:
    """Both devices written out (the image's ``device="cpu"``, the mask's 'cuda:0'): nothing says which one follows;
    the cpu image made by ``torch.cat`` at images.py:7 is named by its maker, never "no line that made them was
    recorded" beside a message that names that line."""
    files = dict(FLAG_APP)
    files["images.py"] = files["images.py"].replace("device=mm.intermediate_device()", 'device="cpu"')
    files["masks.py"] = files["masks.py"].replace('device="cpu"', "device='cuda:0'")
    _write(tmp_path, files)
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert any("made by Tensor.cat" in p["message"] and "images.py:7" in p["message"] for p in doc["problems"]), doc
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "no line that made them was recorded" not in codes, codes
    assert "the tensor made by Tensor.cat at images.py:7 (on cpu) reached the failing op" in codes, codes


def test_a_maker_that_picks_its_device_at_run_time_is_never_given_one_written_out(tmp_path: Path) -> None:
    """The run blames the image (cpu, default mode) made at a line that asks the app's helper for its device: that
    line is never rewritten with 'cuda:0'; the mask whose device is written out follows the image where they meet,
    and the patched app is clean in both modes."""
    files = dict(FLAG_APP)
    files["images.py"] = files["images.py"].replace("torch.cat((r, g, r), dim=-1)", "torch.cat((r, r, r), dim=-1)")
    files["masks.py"] = files["masks.py"].replace('device="cpu"', "device='cuda:0'")
    _write(tmp_path, files)
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1 and doc["problems"], proc.stderr[-3000:]
    fix = next(f for f in doc["fixes"] if f["code"].startswith("src = src.to(region.device)"))
    assert fix["proven"], fix
    assert ("region's device is the program's pick at run time (images.py:5: mm.intermediate_device()), src's is "
            "written out (masks.py:4: 'cuda:0'): the one written out follows") in fix["code"], fix["code"]
    assert "images.py" not in doc["patch"], doc["patch"]
    _apply(tmp_path, doc["patch"])
    for flags in (("--gpu-only",), ()):
        again, doc2 = _run(tmp_path, *flags)
        assert again.returncode == 0 and doc2["problems"] == [], (flags, again.stderr[-2000:])


def test_a_maker_whose_partner_device_is_written_out_keeps_its_maker_line_fix(tmp_path: Path) -> None:
    _write(tmp_path, {"main.py": """
        import torch
        def make_mask():
            return torch.ones(4)
        def apply(x, mask):
            return x * mask
        x = torch.randn(4).to("cuda")
        print(apply(x, make_mask()).device)
    """})
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1 and doc["problems"], proc.stderr[-3000:]
    codes = [f["code"] for f in doc["fixes"]]
    assert any("torch.ones(..., device='cuda:0')" in c for c in codes), codes
    assert not any(".to(x.device)" in c.split("#")[0] for c in codes), codes
