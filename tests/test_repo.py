"""The repository's promises to a student and to CI."""

import re
import subprocess

from servelab import paths


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (paths.REPO_ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    assert "make up" in block and "make test" in block
    ci = (paths.REPO_ROOT / ".ci" / "run").read_text()
    run = re.search(r"^make test( PYTEST_ARGS=\"(?P<args>[^\"]*)\")?$", ci, re.M)
    assert run, "CI runs the README's test command"
    assert "--durations=20" in (run.group("args") or ""), "CI prints the 20 slowest tests"


def test_makefile_targets_bootstrap_their_own_environment():
    dry_run = subprocess.run(["make", "-n", "test"], cwd=paths.REPO_ROOT, capture_output=True, text=True, check=True)
    assert "scripts/bootstrap.sh" in dry_run.stdout
    assert "servelab artifacts" in dry_run.stdout
    assert "pytest" in dry_run.stdout


def test_no_tracked_source_names_an_absolute_host_path():
    # Tests that check for such paths necessarily spell them; every other tracked file must not.
    tracked = subprocess.run(["git", "ls-files"], cwd=paths.REPO_ROOT, capture_output=True, text=True, check=True)
    offenders = []
    for name in tracked.stdout.split():
        path = paths.REPO_ROOT / name
        if name.startswith("tests/") or path.suffix in {".jpg", ".png"} or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        if re.search(r"/home/cc/|/work/main|/root/", text):
            offenders.append(name)
    assert offenders == []


def test_make_help_lists_every_target_with_what_it_does_and_how_long_it_takes():
    makefile = (paths.REPO_ROOT / "Makefile").read_text()
    targets = re.search(r"^\.PHONY: (.+)$", makefile, re.M).group(1).split()
    shown = subprocess.run(["make", "help"], cwd=paths.REPO_ROOT, capture_output=True, text=True, check=True).stdout
    lines = {line.split()[1]: line for line in shown.splitlines() if line.startswith("  make ")}
    assert set(lines) == set(targets)
    untimed = [
        target
        for target, line in lines.items()
        if target != "help" and not re.search(r"\d+ (s|minutes?)\b|seconds|a minute|a few minutes", line)
    ]
    assert untimed == [], "each target's `## ...` says how long it takes"
