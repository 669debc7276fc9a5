"""The code blocks of README.md and docs/*.md, as a reader would copy them.

`blocks()` finds every ```python and ```bash fence; `bash_commands()` turns a bash block into the command lines a
reader would paste, one per command, with the lines that cannot run on a test machine split off by an explicit
list (`CANNOT_RUN`) rather than by skipping a block wholesale. A line (or a whole block, by its first line) that
needs real hardware says so on the page with `# needs a GPU`; that visible marker is the only one honoured.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))

# The one marker a page uses for an example that needs hardware no test machine has; the reader sees it too.
NEEDS_GPU = "# needs a GPU"

# Commands that cannot run on any test machine, each with why; matched on the start of the command.
CANNOT_RUN: dict[str, str] = {
    "make demo": "creates a venv and installs everything: the suite already runs inside that venv",
    "make test": "runs the whole suite, this test included",
    "python -m pip install": "installs into the environment the suite runs in",
    "pip install": "installs into the environment the suite runs in",
    "git clone": "needs the network",
    "torchrun --nproc-per-node 4": "four ranks: tests/distributed launches real ranks under a timeout",
}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def needs_gpu(self) -> bool:
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return NEEDS_GPU in first


def blocks(page: str) -> list[Block]:
    """Every fenced block of `page` (path relative to the repository) whose language is python or bash."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m["indent"], m["lang"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and not _FENCE.match(lines[i]):
            # a fence inside a list item is indented: the reader copies the code without that indent
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if lang in ("python", "bash"):
            out.append(Block(page, start + 1, lang, "\n".join(body) + "\n"))
    return out


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def bash_commands(block: Block) -> list[tuple[str, str | None]]:
    """(command, why it cannot run or None) for each command of a bash block; comment-only lines are dropped."""
    out: list[tuple[str, str | None]] = []
    pending = ""
    for raw in block.text.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        command = line.strip()
        if not command or command.startswith("#"):
            continue
        why = next((w for start, w in CANNOT_RUN.items() if command.startswith(start)), None)
        if why is None and NEEDS_GPU in command:
            why = "marked on the page: needs a GPU"
        out.append((command, why))
    return out


def python_source(block: Block) -> str:
    """The block as a program, with each line the page marks as needing a GPU replaced by `pass`."""
    return "\n".join(
        (line[: len(line) - len(line.lstrip())] + "pass") if NEEDS_GPU in line else line
        for line in block.text.splitlines()
    ) + "\n"
