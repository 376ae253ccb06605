"""Documentation citations: code and docs cite ``docs/behaviour.md``, never files a clone lacks.

The behaviours nipflow keeps or changes of the original library are described in
``docs/behaviour.md``, one section per behaviour, each with an explicit anchor
(``<a id="b12"></a>``). Comments cite them as ``docs/behaviour.md#b12`` (several as
``docs/behaviour.md#b19, #b20``); the docs link ``behaviour.md#b12``. These tests check
that no citation of the original library's spec or of the removed ``docs/decisions.md``
is left, and that every cited anchor exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEHAVIOUR = ROOT / "docs" / "behaviour.md"

# Where the forbidden citations may not appear (the scope).
CLEAN_TREES = ("nip_core", "flows", "tasks", "docs")
CLEAN_FILES = ("README.md",)
# Where citations of docs/behaviour.md are looked for and must resolve.
CITING_TREES = ("nip_core", "flows", "tasks", "docs", "tests", "benchmarks", "scripts", "deployments")
CITING_FILES = ("README.md",)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh"}

# Citations of documents that a clone of the repository does not contain.
FORBIDDEN = ("QUIRK", "spec §", "nip_spec", "../shared", "DESIGN.md", "decisions.md")

ANCHOR_DEF_RE = re.compile(r'<a id="([A-Za-z0-9_-]+)"></a>')
SECTION_RE = re.compile(r"^### (B\d+) ", re.MULTILINE)
# behaviour.md#b19, #b20  /  (docs/behaviour.md, B12)  /  ](#b13) inside behaviour.md
CITATION_RE = re.compile(r"behaviour\.md((?:#[A-Za-z0-9_-]+)(?:,\s*#[A-Za-z0-9_-]+)*)")
SECTION_CITATION_RE = re.compile(r"behaviour\.md,\s*(B\d+)\b")
LOCAL_LINK_RE = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")


def _text_files(trees: tuple[str, ...], files: tuple[str, ...]) -> list[Path]:
    out = [ROOT / f for f in files if (ROOT / f).is_file()]
    for tree in trees:
        base = ROOT / tree
        if not base.is_dir():
            continue
        out.extend(p for p in sorted(base.rglob("*"))
                   if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts)
    return out


def cited_anchors(text: str) -> list[str]:
    """Anchors of ``docs/behaviour.md`` cited in ``text``, in order of appearance."""
    found: list[tuple[int, str]] = []
    for m in CITATION_RE.finditer(text):
        for k, anchor in enumerate(re.findall(r"#([A-Za-z0-9_-]+)", m.group(1))):
            found.append((m.start() + k, anchor))
    for m in SECTION_CITATION_RE.finditer(text):
        found.append((m.start(), m.group(1).lower()))
    return [anchor for _, anchor in sorted(found)]


def defined_anchors() -> list[str]:
    return ANCHOR_DEF_RE.findall(BEHAVIOUR.read_text(encoding="utf-8"))


def test_cited_anchors_parses_every_citation_form():
    text = ("see docs/behaviour.md#b19, #b20 and (docs/behaviour.md, B12); "
            "[x](behaviour.md#b24) and docs/behaviour.md#index.")
    assert cited_anchors(text) == ["b19", "b20", "b12", "b24", "index"]
    assert cited_anchors("docs/behaviour.md without an anchor") == []


def test_behaviour_sections_have_unique_matching_anchors():
    text = BEHAVIOUR.read_text(encoding="utf-8")
    anchors = defined_anchors()
    assert len(anchors) == len(set(anchors)), "duplicate anchors in docs/behaviour.md"
    sections = SECTION_RE.findall(text)
    assert len(sections) >= 40
    for section in sections:
        # Each "### Bn" heading is directly preceded by its anchor line.
        assert f'<a id="{section.lower()}"></a>\n### {section} ' in text, section
    assert "index" in anchors


@pytest.mark.parametrize("forbidden", FORBIDDEN)
def test_no_citation_of_documents_outside_the_repository(forbidden):
    offenders = []
    for path in _text_files(CLEAN_TREES, CLEAN_FILES):
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if forbidden in line:
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert offenders == [], f"{forbidden!r} still cited:\n" + "\n".join(offenders)


def test_decisions_page_is_merged_into_behaviour():
    assert not (ROOT / "docs" / "decisions.md").exists()
    assert BEHAVIOUR.is_file()


def test_every_cited_behaviour_section_exists():
    defined = set(defined_anchors())
    missing, cited = [], 0
    for path in _text_files(CITING_TREES, CITING_FILES):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for anchor in cited_anchors(text):
            cited += 1
            if anchor not in defined:
                missing.append(f"{path.relative_to(ROOT)}: #{anchor}")
    assert missing == [], "citations of sections docs/behaviour.md does not have:\n" + "\n".join(missing)
    # The code cites the page many times; a scanner that finds nothing is broken.
    assert cited >= 50


def test_links_inside_behaviour_resolve():
    defined = set(defined_anchors())
    links = LOCAL_LINK_RE.findall(BEHAVIOUR.read_text(encoding="utf-8"))
    assert links, "docs/behaviour.md has no internal links"
    assert sorted(set(links) - defined) == []
