"""Every entry that code, templates, tests and lab files cite as "docs/design.md, `name`" exists
as an entry heading in docs/design.md (also where a comment wraps the name onto the next line)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("dashgen", "templates", "tests", "lab")
SKIPPED_PARTS = {"__pycache__", ".git"}

# A line break and the next line's comment marker read as one space, so a citation that a comment
# wraps ("docs/design.md,\n  // `name`") reads as written on one line.
_WRAP = re.compile(r"[ \t]*\n[ \t]*(?:#|//|/?\*+|--)?[ \t]*")
# "design.md, `a`", "design.md `a`", "design.md (`a`, `b` and `c`)".
_TICKED = re.compile(r"design\.md[,:]?\s*\(?\s*((?:`[a-z0-9][a-z0-9-]*`(?:,\s*|\s+and\s+|\s*)?)+)")
# "docs/design.md, first-dq-store": a bare name with at least one hyphen.
_BARE = re.compile(r"design\.md,\s+([a-z0-9]+(?:-[a-z0-9]+)+)\b")
_NAME = re.compile(r"`([a-z0-9][a-z0-9-]*)`")
_HEADING = re.compile(r"^#{1,6}\s.*$", re.M)


def citations(text: str) -> set[str]:
    """The entry names a text cites as docs/design.md's."""
    flat = _WRAP.sub(" ", text)
    names = set()
    for m in _TICKED.finditer(flat):
        names.update(_NAME.findall(m.group(1)))
    names.update(m.group(1) for m in _BARE.finditer(flat))
    return names


def entries(design: str) -> set[str]:
    """The names docs/design.md has as entries: the backticked names of its headings."""
    return {name for heading in _HEADING.findall(design) for name in _NAME.findall(heading)}


def scanned_files():
    for top in SCANNED:
        folder = ROOT / top
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if (path.is_file() and not SKIPPED_PARTS & set(path.parts)
                    and path != Path(__file__).resolve()):
                yield path


def cited_names() -> dict[str, list[str]]:
    """Each cited name and the files that cite it."""
    cited: dict[str, list[str]] = {}
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for name in citations(text):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return cited


def missing(cited: dict[str, list[str]], design: str) -> dict[str, list[str]]:
    have = entries(design)
    return {name: files for name, files in sorted(cited.items()) if name not in have}


def test_every_cited_entry_exists_in_design_md():
    cited = cited_names()
    # The scan finds the citations at all (a broken pattern would pass every check below).
    assert len(cited) >= 20, sorted(cited)
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert missing(cited, design) == {}


def test_the_scan_reads_wrapped_and_listed_citations():
    text = (
        "x = 1  # measured (docs/design.md,\n"
        "# `wrapped-name`)\n"
        "  // ... docs/design.md\n  // `cuh-wrapped`\n"
        '"""docs/design.md, bare-name: a docstring."""\n'
        "docs/design.md (`one-a`, `two-b` and `three-c`)\n"
        "docs/design.md holds the `not-cited` entries\n"
    )
    assert citations(text) == {"wrapped-name", "cuh-wrapped", "bare-name", "one-a", "two-b",
                               "three-c"}


def test_a_missing_entry_is_reported():
    design = "# t\n\n## `kept-entry`\ntext\n\n### `a-one` and `b-two`\ntext\n"
    cited = {"kept-entry": ["x.py"], "b-two": ["y.cuh"], "gone-entry": ["z.py"]}
    assert missing(cited, design) == {"gone-entry": ["z.py"]}
    assert missing(cited, design.replace("## `kept-entry`", "## kept")) == {
        "gone-entry": ["z.py"], "kept-entry": ["x.py"]}
