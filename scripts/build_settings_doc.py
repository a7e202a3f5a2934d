"""Write docs/settings.md's tables of environment variables: the tooling's from servelab.settings, the
services' from servelab/service/settings.py's own table.

Each class is the source of truth for its side (the tooling's fields name their variable, default
and meaning; the services' module documents each variable it reads, and a test keeps that list
complete): edit it, then run `.venv/bin/python scripts/build_settings_doc.py`.
tests/test_settings.py fails when the page's tables and their sources disagree.
"""

from pathlib import Path

from servelab.service import settings as service_settings
from servelab.settings import markdown_table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
TOOLING = ("<!-- settings table: python scripts/build_settings_doc.py -->\n", "<!-- end of settings table -->")
SERVICES = (
    "<!-- service settings table: python scripts/build_settings_doc.py -->\n",
    "<!-- end of service settings table -->",
)


def service_table() -> str:
    """The variables table of servelab/service/settings.py's docstring, as a preformatted block."""
    doc = service_settings.__doc__ or ""
    lines = doc.split("\nVariable ", 1)[1].split("\n\n", 1)[0]
    return "```\nVariable " + lines + "\n```\n"


def replaced(text: str, markers: tuple[str, str], table: str) -> str:
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{PAGE} has no table to replace between {start.strip()} and {end}")
    before, rest = text.split(start, 1)
    return before + start + table + end + rest.split(end, 1)[1]


def main() -> int:
    text = replaced(PAGE.read_text(), TOOLING, markdown_table())
    PAGE.write_text(replaced(text, SERVICES, service_table()))
    print(f"wrote the settings tables in {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
