"""The README routes each reader to a page of docs/: a link to a missing file or heading fails, as
GitHub would render it (its anchors), and the README stays short enough to be read first."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from servelab import paths

PAGES = [paths.REPO_ROOT / "README.md", *sorted((paths.REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
README_WORDS = 1500


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, inline code's backticks and every
    character but letters, digits, spaces, hyphens and underscores dropped, spaces made hyphens,
    and a repeated one numbered (-1, -2...)."""
    seen: Counter[str] = Counter()
    found = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        heading = re.match(r"#{1,6} (.+)", line)
        if in_fence or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not this repository's to check
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def test_anchors_are_github_s():
    page = "# The lab in Docker: the GPU node\n## `make bench`, briefly\n## Notes\n## Notes\n```\n# not a heading\n```"
    assert anchors(page) == {"the-lab-in-docker-the-gpu-node", "make-bench-briefly", "notes", "notes-1"}


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section) [gone](missing.md) [no](other.md#nowhere) [web](https://x.org/y)\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md"]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_link_of_the_readme_and_docs_reaches_its_file_and_heading(page):
    assert broken_links(page) == []


def test_the_readme_is_read_first_and_links_every_page_of_docs():
    readme = (paths.REPO_ROOT / "README.md").read_text()
    assert len(readme.split()) <= README_WORDS
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(readme)}
    assert {page.name for page in PAGES[1:]} <= linked
