"""The design document is in the repository and what cites it finds it: every `DESIGN.md "<section>"`
citation names a heading of docs/DESIGN.md, no file cites a design document elsewhere, every README
links to it, and the relative links of the Markdown files resolve (anchors included)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "DESIGN.md"
THIS = Path(__file__).resolve()
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".sbatch", ".cfg", ".ini", ".txt"}
SKIP_DIRS = {"__pycache__", "dist", "build", "runs", "node_modules"}

# `DESIGN.md "A"`, also `DESIGN.md, "A"` and `DESIGN.md "A" and "B"` (whitespace may break the line)
CITATION = re.compile(r'DESIGN\.md[\s,]*((?:"[^"\n]+"(?:\s*(?:,|and)\s*)?)+)')
QUOTED = re.compile(r'"([^"\n]+)"')
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _skipped(folder: str) -> bool:
    """Hidden folders (but .ci), build and run outputs."""
    return folder in SKIP_DIRS or folder.endswith(".egg-info") or (folder.startswith(".") and folder != ".ci")


def _tree_files() -> list[Path]:
    """The text files of the checkout: sources, tests, configs, scripts, docs (this file aside)."""
    files = []
    for root, folders, names in os.walk(REPO):
        folders[:] = sorted(f for f in folders if not _skipped(f))  # pruned: never walks .git or runs/
        here = Path(root)
        files += [
            here / name
            for name in sorted(names)
            if (Path(name).suffix in TEXT_SUFFIXES or here.name == ".ci") and (here / name).resolve() != THIS
        ]
    return files


def _without_code(markdown: str) -> str:
    """Markdown without fenced blocks (they hold `#` comments and `a[i](x)` code, not headings or links)."""
    return FENCE.sub("", markdown)


def headings(markdown: str) -> list[str]:
    """Heading texts of a Markdown document."""
    return [
        m.group(2).strip() for m in re.finditer(r"^(#{1,6})\s+(.+?)\s*#*$", _without_code(markdown), re.M)
    ]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def citations(text: str) -> list[str]:
    """The sections a text cites as `DESIGN.md "<section>"`."""
    return [name for group in CITATION.findall(text) for name in QUOTED.findall(group)]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


FILES = _tree_files()
READMES = [REPO / "README.md", *sorted(REPO.glob("libs/*/README.md")), *sorted(REPO.glob("apps/*/README.md"))]


def test_the_design_document_is_in_the_repository_with_its_sections():
    sections = headings(DESIGN.read_text())
    assert {"Layers", "Build order", "The model contract", "Pipelines", "Adding a model"} <= set(sections)


def test_every_design_citation_names_a_section_of_docs_design_md():
    sections = set(headings(DESIGN.read_text())) if DESIGN.is_file() else set()
    bad = [
        f"{_rel(path)}: {name!r}"
        for path in FILES
        if path != DESIGN
        for name in citations(path.read_text(errors="replace"))
        if name not in sections
    ]
    assert not bad, f"sections docs/DESIGN.md does not have ({sorted(sections)}):\n" + "\n".join(bad)


def test_no_file_cites_a_design_document_outside_the_repository():
    """Every mention of DESIGN.md is the one in docs/ (by its path or a link to it); nothing points into
    a sibling `shared/` folder."""
    bad = []
    for path in FILES:
        text = path.read_text(errors="replace")
        for m in re.finditer(r"DESIGN\.md", text):
            if text[max(m.start() - 5, 0) : m.start()] == "docs/" or path == DESIGN:
                continue
            bad.append(f"{_rel(path)}: {text[max(m.start() - 40, 0) : m.end()].split()[-1]}")
        bad += [f"{_rel(path)}: {m.group()}" for m in re.finditer(r"\.\./shared/\S*", text)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("readme", READMES, ids=_rel)
def test_every_readme_links_to_the_design_document(readme: Path):
    targets = [
        (readme.parent / t.split("#")[0]).resolve() for t in LINK.findall(_without_code(readme.read_text()))
    ]
    assert DESIGN.resolve() in targets


def test_relative_links_of_the_markdown_files_resolve():
    bad = []
    for path in (p for p in FILES if p.suffix == ".md"):
        text = INLINE_CODE.sub("", _without_code(path.read_text()))
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, fragment = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{_rel(path)}: {target} (no such file)")
            elif (
                fragment
                and dest.suffix == ".md"
                and fragment not in {anchor(h) for h in headings(dest.read_text())}
            ):
                bad.append(f"{_rel(path)}: {target} (no heading with anchor #{fragment})")
    assert not bad, "\n".join(bad)


PACKAGES = {p.name: p for p in REPO.glob("*/*/src/*") if (p / "__init__.py").is_file()}
SOURCE_PATH = re.compile(r"\b(" + "|".join(sorted(PACKAGES)) + r")/([\w/]+\.py)\b")


def test_every_source_file_a_text_names_exists():
    """`mm_trainer/loop/engine.py` in a README, a docstring or a comment names a file of that package
    (a module moved to another room takes its mentions with it)."""
    bad = [
        f"{_rel(path)}: {m.group(0)}"
        for path in FILES
        for m in SOURCE_PATH.finditer(path.read_text(errors="replace"))
        if not (PACKAGES[m.group(1)] / m.group(2)).is_file()
    ]
    assert not bad, "\n".join(bad)
