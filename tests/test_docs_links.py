"""The documentation stays navigable and small: every relative Markdown link resolves, and the
size limits of issue 37 hold (README, the results index, each docs page, the docs/ folder)."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

README_MAX_LINES = 220
RESULTS_INDEX_MAX_LINES = 150
PAGE_MAX_LINES = 300
DOCS_MAX_FILES = 100
DOCS_MAX_BYTES = 2 * 1024 * 1024
RESULTS_CELL_MAX_CHARS = 120

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown_files():
    files = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), *sorted((ROOT / "examples").rglob("README.md"))]
    return [f for f in files if f.is_file()]


def _prose_lines(text):
    """The lines outside fenced code blocks (links inside code are not links)."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield line


def _strip_code_spans(line):
    return re.sub(r"`[^`]*`", "", line)


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(path):
    seen = {}
    anchors = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def _links(path):
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(_strip_code_spans(line)):
            yield match.group(1)


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    broken = []
    for target in _links(md):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = md if not path_part else (md.parent / path_part).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{md.relative_to(ROOT)}: broken links: {broken}"


def test_slug_matches_github():
    assert _slug('The authors\' Controller attention (`content_read="controller"`)') == (
        "the-authors-controller-attention-content_readcontroller"
    )
    assert _slug("Which checkpoint: the paper's L+1 rule and the authors' 2(L+1)") == (
        "which-checkpoint-the-papers-l1-rule-and-the-authors-2l1"
    )


def test_readme_length():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_results_table_cells_are_short():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    assert len(rows) >= 10, "the results table lost its rows"
    long_cells = []
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a results row without its four columns: {row[:80]}"
        assert "](" in cells[0], f"a results row without a link to its page: {row[:80]}"
        long_cells += [cell for cell in cells if len(cell) > RESULTS_CELL_MAX_CHARS]
    assert not long_cells, f"cells over {RESULTS_CELL_MAX_CHARS} characters: {long_cells}"


def test_results_index_length():
    lines = (DOCS / "RESULTS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= RESULTS_INDEX_MAX_LINES, f"docs/RESULTS.md has {len(lines)} lines"


def test_docs_pages_length():
    long_pages = {
        str(page.relative_to(ROOT)): n
        for page in DOCS.rglob("*.md")
        if (n := len(page.read_text(encoding="utf-8").splitlines())) > PAGE_MAX_LINES
    }
    assert not long_pages, f"pages over {PAGE_MAX_LINES} lines: {long_pages}"


def test_docs_folder_size():
    files = [f for f in DOCS.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    assert len(files) <= DOCS_MAX_FILES, f"docs/ holds {len(files)} files (at most {DOCS_MAX_FILES})"
    assert total <= DOCS_MAX_BYTES, f"docs/ holds {total} bytes (at most {DOCS_MAX_BYTES})"
