"""Write docs/settings.md's table of the tooling's environment variables, from servelab.settings.

The class is the source of truth (its fields name their variable, default and meaning): edit it,
then run `.venv/bin/python scripts/build_settings_doc.py`. tests/test_settings.py fails when the
page's table and the class disagree. The services' variables are read at the top of each app
(fastapi_pt/app.py, fastapi_onnx/app.py, ray_serve/app.py); the page lists them by hand, and the
same test checks that it lists exactly those.
"""

from pathlib import Path

from servelab.settings import markdown_table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
TOOLING = ("<!-- settings table: python scripts/build_settings_doc.py -->\n", "<!-- end of settings table -->")


def replaced(text: str, markers: tuple[str, str], table: str) -> str:
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{PAGE} has no table to replace between {start.strip()} and {end}")
    before, rest = text.split(start, 1)
    return before + start + table + end + rest.split(end, 1)[1]


def main() -> int:
    PAGE.write_text(replaced(PAGE.read_text(), TOOLING, markdown_table()))
    print(f"wrote the settings table in {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
