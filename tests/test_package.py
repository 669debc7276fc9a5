"""Package invariants: the layout docs/architecture.md describes, no import cycles (function-level imports
included), no private name imported across subpackages, small files, one public table, cheap import, torch-free
``_env``/``_explain``/``_checkpoint``, and no comment citing a document outside the repository."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import torchdoctor

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "torchdoctor"
DOC = ROOT / "docs" / "architecture.md"
# pure data tables: allowed over the size limit
DATA_TABLES = {"_report/html_assets.py", "_explain/sigs_device.py", "_explain/sigs_dtype.py",
               "_explain/causes_device.py", "_explain/causes_dtype.py", "_rules/table.py"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: pathlib.Path, name: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names, line) of every torchdoctor import, function-level and ``TYPE_CHECKING`` ones too
    (except the package facade's public table, which imports nothing at run time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    if name == "torchdoctor":
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                skip.update(id(n) for child in node.body for n in ast.walk(child))
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, mod] if mod else base)
            if not mod.startswith("torchdoctor"):
                continue
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{mod}.{n}" in MODULES]  # ``from torchdoctor._x import sub``: a submodule
            out.extend((f"{mod}.{n}", [], node.lineno) for n in subs)
            if len(subs) < len(names):
                out.append((mod, [n for n in names if n not in subs], node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names if a.name.startswith("torchdoctor"))
    return out


def _graph() -> dict[str, set[str]]:
    return {name: {m for m, _, _ in _imports(path, name) if m in MODULES and m != name}
            for name, path in MODULES.items()}


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    # the default limit is restored at once: this worker goes on running other tests, and a runaway recursion there
    # must end as a RecursionError, not as a segfault of the C stack at depth 10,000 (CI lost a worker so)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    assert cycles == []


def test_no_private_name_imported_across_subpackages() -> None:
    def area(mod: str) -> str:
        parts = mod.split(".")
        return ".".join(parts[:2])

    bad = []
    for name, path in MODULES.items():
        for mod, names, line in _imports(path, name):
            if area(mod) == area(name) or mod == "torchdoctor":
                continue
            hidden = [n for n in names if n.startswith("_") and f"{mod}.{n}" not in MODULES]
            if hidden:
                bad.append(f"{path.relative_to(PKG)}:{line} imports {hidden} from {mod}")
    assert bad == []


def test_small_files_and_a_small_top_level() -> None:
    big = [f"{p.relative_to(PKG)} ({n} lines)" for p in PKG.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400
           and str(p.relative_to(PKG)) not in DATA_TABLES]
    assert big == []
    top = [p.name for p in PKG.iterdir() if p.name != "__pycache__"]
    assert len(top) <= 20, sorted(top)


def test_architecture_doc_names_every_subpackage_and_only_existing_ones() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`(_[a-z_]+)/`", text))
    actual = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert named == actual, (sorted(named - actual), sorted(actual - named))
    for mod in re.findall(r"`(_[a-z_]+\.py)`", text):  # top-level modules it names exist
        assert (PKG / mod).exists(), mod


def test_no_comment_cites_a_document_outside_the_repository() -> None:
    pattern = re.compile(r"\bSTYLE \d|FIELD-NOTES|DESIGN\.md|\.\./shared/|DESIGN \"")
    hits = [f"{p.relative_to(ROOT)}:{i}" for base in (PKG, ROOT / "tests", ROOT / "bench")
            for p in base.rglob("*.py") for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line) and p.name != "test_package.py"]
    hits += [f"README.md:{i}" for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
             if pattern.search(line)]
    assert hits == []


def test_one_public_table() -> None:
    assert len(torchdoctor.__all__) == len(set(torchdoctor.__all__))
    source = (PKG / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {a.asname or a.name for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert imported == set(torchdoctor.__all__)
    # the package reads its table with string operations (import cost): it must read what ast reads
    by_ast = {a.asname or a.name: (f"torchdoctor.{a.name}", None) if node.module == "torchdoctor"
              else (node.module, a.name) for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert torchdoctor._TABLE == by_ast
    for name in torchdoctor.__all__:
        value = getattr(torchdoctor, name)
        if inspect.isclass(value):
            assert value.__module__ == "torchdoctor", name  # errors print as torchdoctor.PlacementError


@pytest.mark.parametrize("area", ["_env.report", "_env.rules", "_env.devices", "_explain.api", "_checkpoint.collect",
                                  "_checkpoint.result", "_cli.checkpoint"])
def test_env_and_explain_import_without_torch(area: str) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            f"import torchdoctor.{area}\n"
            "print('torch' in sys.modules and sys.modules['torch'] is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(PKG.parent)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_import_is_cheap() -> None:
    code = ("import sys, time; t = time.perf_counter(); import torchdoctor; dt = time.perf_counter() - t\n"
            "heavy = [m for m in ('torch', 'transformers', 'rich', 'diffusers') if m in sys.modules]\n"
            "print(heavy, dt < 0.5)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[] True", out.stdout + out.stderr


# what only an error needs: explain, the report's diffs and names, guard's and the virtual run's culprit and proof
# machinery (issue 43 point 4: `run --device` adds < 50 ms to a program's start)
_ERROR_ONLY = ("torchdoctor._explain", "torchdoctor._run.evidence", "torchdoctor._run.names", "torchdoctor._run.rerun",
               "torchdoctor._run.offloaded", "torchdoctor._report.diff", "torchdoctor._guard.diagnose",
               "torchdoctor._guard.provenance", "torchdoctor._guard.maker", "torchdoctor._guard.remedy",
               "torchdoctor._guard.proof", "torchdoctor._guard.notes", "torchdoctor._virtual.prove",
               "torchdoctor._virtual.fixes", "torchdoctor._virtual.castfix", "torchdoctor._virtual.restfix",
               "torchdoctor._virtual.atop", "torchdoctor._virtual.libout", "bitsandbytes")
_WATCHED = """
import atexit, sys
import torch

NAMES = {names!r}
def loaded():
    return sorted(m for m in sys.modules if m.startswith(NAMES))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("cuda")
y = model(torch.ones(3, 4, device="cuda"{extra})).sum()
print("at the last line:", loaded())
atexit.register(lambda: print("at exit:", loaded()))
"""


def test_run_device_loads_the_error_machinery_only_for_an_error(tmp_path: pathlib.Path) -> None:
    for name in _ERROR_ONLY[:-1]:  # every name is a module of the package: a renamed one must be renamed here
        assert (PKG / (name.removeprefix("torchdoctor.").replace(".", "/") + ".py")).exists() or \
            (PKG / name.removeprefix("torchdoctor.").replace(".", "/")).is_dir(), name
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    outs = []
    for extra in ("", ", dtype=torch.float64"):  # clean; then a dtype error the run records and explains
        app = tmp_path / f"app{len(outs)}.py"
        app.write_text(_WATCHED.format(names=_ERROR_ONLY, extra=extra), encoding="utf-8")
        outs.append(subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda:1", str(app)],
                                   capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env))
    app = tmp_path / "plain.py"  # `run` on this machine's own devices alike
    app.write_text(_WATCHED.format(names=_ERROR_ONLY, extra="").replace('"cuda"', '"cpu"'), encoding="utf-8")
    outs.append(subprocess.run([sys.executable, "-m", "torchdoctor", "run", str(app)], capture_output=True, text=True,
                               timeout=300, cwd=tmp_path, env=env))
    clean, failing, plain = outs
    for proc in (clean, plain):
        assert proc.returncode == 0, proc.stderr
        assert "at the last line: []\nat exit: []" in proc.stdout, proc.stdout + proc.stderr
        assert "no placement error" in proc.stderr
    assert failing.returncode == 1 and "at exit: [" in failing.stdout and "at exit: []" not in failing.stdout, \
        failing.stdout + failing.stderr
