"""Write README.md's table of the tooling's environment variables from servelab.settings.

The settings class is the source of truth (each field names its variable, default and meaning):
edit it, then run `.venv/bin/python scripts/build_readme_settings.py`. tests/test_settings.py
fails when README's table and the class disagree.
"""

from pathlib import Path

from servelab.settings import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- settings table: python scripts/build_readme_settings.py -->\n"
END = "<!-- end of settings table -->"


def main() -> int:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{README} has no settings table to replace (its markers: {START.strip()} ... {END})")
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    README.write_text(before + START + markdown_table() + END + after)
    print(f"wrote the settings table in {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
