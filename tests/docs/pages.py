"""The docs as the tests read them: README.md and docs/*.md, their headings (with GitHub's anchors), links and
fenced blocks. Kept apart from the tests so each page's rule is stated once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text, the page and the line its fence opens on."""

    page: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            if opened is None:
                opened, body = (number, line[3:].strip()), []
            else:
                found.append(Block(page, opened[0], opened[1], "\n".join(body) + "\n"))
                opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{page.relative_to(REPO)}:{opened[0]}: a fence is never closed"
    return found


def prose(page: Path) -> str:
    """The page with its fenced blocks blanked out (line numbers kept)."""
    out, fence = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
            out.append("")
        else:
            out.append("" if fence else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", prose(page), flags=re.MULTILINE)}


def section(page: Path, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of the same or a higher level."""
    text = prose(page)
    found = re.search(rf"^(#+) {re.escape(heading)}$", text, flags=re.MULTILINE)
    assert found, f"{page.relative_to(REPO)} has no heading {heading!r}"
    level = len(found.group(1))
    rest = text[found.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.MULTILINE)
    return rest[: end.start()] if end else rest


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link outside code: ``[text](target)``."""
    found = []
    for number, line in enumerate(prose(page).splitlines(), start=1):
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            found.append((number, target))
    return found


def blocks_under(page: Path, heading: str) -> list[Block]:
    """The fenced blocks of the section under ``heading`` (up to the next heading of its level or higher)."""
    lines = prose(page).splitlines()
    start = next(n for n, line in enumerate(lines, start=1) if re.fullmatch(rf"#+ {re.escape(heading)}", line))
    level = len(lines[start - 1]) - len(lines[start - 1].lstrip("#"))
    end = next(
        (n for n, line in enumerate(lines, start=1) if n > start and re.match(rf"#{{1,{level}}} ", line)),
        len(lines) + 1,
    )
    return [block for block in blocks(page) if start < block.line < end]
