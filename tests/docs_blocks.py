"""The fenced blocks of README.md and docs/**/*.md, as tests/test_docs_examples.py runs them.

A block is a fence with a language (```` ```python ````, ```` ```sh ````, ```` ```console ````,
```` ```bash ````; a fence without one is output or a synopsis, and is not run). The line directly
before the opening fence may mark it up:

- ``<!-- docs-test: skip: REASON -->``: not run (REASON required: a pip install, a server config);
- ``<!-- docs-test: server -->``: needs a real server (run only under ``-m server``);
- ``<!-- docs-test: continues -->``: run after the previous block of the same file, in one script;
- ``<!-- docs-test: partial: REASON -->``: a fragment: checked with ``compile()`` only.

Unmarked blocks run. This module only reads the files; it runs nothing.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "python"
SHELL = ("sh", "bash", "console")
MARKS = ("skip", "server", "continues", "partial")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<lang>[\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<mark>[\w-]+)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass
class Block:
    """One fenced block: where it is, its language, its mark-up and its text (dedented)."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None = None
    reason: str | None = None
    follows: list[Block] = field(default_factory=list)  # the `continues` blocks run after it

    @property
    def doc(self) -> str:
        """The document's path, relative to the checkout when it is in it."""
        return relpath(self.path)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def first_line(self) -> int:
        """The document line of the block's first line of text."""
        return self.line + 1


def relpath(path: Path) -> str:
    """``path`` relative to the checkout, or as it is when outside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


class MarkupError(ValueError):
    """A docs-test mark that cannot be obeyed (unknown, no reason, nothing to continue)."""


def documents() -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with a language, marks attached; ``continues`` blocks are
    attached to the block they continue (in ``follows``), not returned on their own."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        ticks, indent = opening["ticks"], opening["indent"]
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise MarkupError(f"{relpath(path)}:{i + 1}: a fence that is never closed")
        body = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        )
        block = Block(path, i + 1, opening["lang"].lower(), textwrap.dedent(body) + "\n")
        marked = _MARK.match(lines[i - 1]) if i > 0 else None
        if marked is not None:
            block.mark, block.reason = marked["mark"], marked["reason"] or None
            _check_mark(block)
        if block.lang:
            found.append(block)
        elif block.mark is not None:
            raise MarkupError(f"{block.where}: a docs-test mark on a fence without a language")
        i = end + 1
    chained: list[Block] = []
    for block in found:
        if block.mark == "continues":
            if not chained or chained[-1].lang != block.lang:
                raise MarkupError(
                    f"{block.where}: 'continues' needs a previous {block.lang} block in the file"
                )
            chained[-1].follows.append(block)
        else:
            chained.append(block)
    return chained


def _check_mark(block: Block) -> None:
    if block.mark not in MARKS:
        raise MarkupError(f"{block.where}: unknown docs-test mark {block.mark!r} (one of {MARKS})")
    if block.mark in ("skip", "partial") and not block.reason:
        raise MarkupError(f"{block.where}: 'docs-test: {block.mark}' needs a reason")
    if block.mark in ("server", "continues") and block.reason:
        raise MarkupError(f"{block.where}: 'docs-test: {block.mark}' takes no reason")


def all_blocks() -> list[Block]:
    """Every runnable-language block of every document."""
    return [block for path in documents() for block in blocks(path)]


# ---- Python ---------------------------------------------------------------------------------


def python_source(text: str) -> str:
    """A block's code: an interactive session (``>>>`` prompts) keeps its input lines only."""
    lines = text.splitlines()
    if not any(line.startswith(">>>") for line in lines):
        return text
    code = [
        line[4:] for line in lines if line.startswith((">>> ", "... ")) or line in (">>>", "...")
    ]
    return "\n".join(code) + "\n"


def is_pytest_file(code: str) -> bool:
    """True when the block is a test module: it defines top-level ``test_*`` functions."""
    return re.search(r"^(async )?def test_\w*\(", code, re.MULTILINE) is not None


# ---- shell ----------------------------------------------------------------------------------


@dataclass
class Command:
    """One shell command of a block: its environment assignments and its words."""

    line: int  # document line
    env: dict[str, str]
    argv: list[str]
    text: str


def shell_commands(block: Block) -> list[Command]:
    """The commands of a sh/bash/console block (console: only ``$ `` lines), ``&&`` chains
    split, comments dropped, backslash continuations joined."""
    commands: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line, at = lines[i], block.first_line + i
        i += 1
        if block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        while line.rstrip().endswith("\\") and i < len(lines):
            line = line.rstrip()[:-1] + " " + lines[i].lstrip()
            i += 1
        words = shlex.split(line, comments=True)
        if not words:
            continue
        chain: list[list[str]] = [[]]
        for word in words:
            if word == "&&":
                chain.append([])
            else:
                chain[-1].append(word)
        for part in chain:
            env: dict[str, str] = {}
            while part and re.match(r"^[A-Za-z_]\w*=", part[0]):
                name, value = part.pop(0).split("=", 1)
                env[name] = value
            if part:
                commands.append(Command(at, env, part, line.strip()))
    return commands
