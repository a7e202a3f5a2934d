"""The notebooks' python-chi calls match the python-chi the lab pins, and only run on Chameleon:
checked by following every python-chi value through the notebook sources (tests/helpers/chi_uses.py),
since the Chameleon cells cannot run in CI (they need credentials and a reservation)."""

from __future__ import annotations

import re
import textwrap
from importlib import metadata

import pytest

from servelab import paths
from servelab.lab.notebook_runs import sources
from tests.helpers.chi_uses import GUARD, Use, check_cells, notebook_uses

SOURCES = sources()
# Fewer checked uses than this means the checker has stopped following the notebooks.
MIN_CHECKED_CHI_USES = 20


def _all_uses() -> list[Use]:
    """Every checked use: python-chi's, and those of the objects it returns (fabric's Result)."""
    return [use for source in SOURCES for use in notebook_uses(source)]


# ---- the notebooks ---------------------------------------------------------------------------


def test_the_installed_python_chi_is_the_pinned_release():
    pin = re.search(r'"python-chi==([^"]+)"', (paths.REPO_ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml should pin python-chi: the notebooks are checked against one release"
    assert metadata.version("python-chi") == pin.group(1)


def test_every_python_chi_call_and_attribute_in_the_notebooks_exists_and_binds():
    problems = [f"{use.where}: {use.what}: {use.problem}" for use in _all_uses() if use.problem]
    assert not problems, "python-chi uses that do not match the installed release:\n" + "\n".join(problems)
    uses = [use for use in _all_uses() if use.is_chi]
    calls = [use for use in uses if use.what.startswith("call ")]
    assert len(uses) >= MIN_CHECKED_CHI_USES and len(calls) >= MIN_CHECKED_CHI_USES // 2, (
        f"only {len(uses)} python-chi uses ({len(calls)} calls) were checked: is the checker still "
        f"following the notebooks?\n" + "\n".join(f"{use.where}: {use.what}" for use in uses)
    )


def test_every_python_chi_use_in_the_notebooks_is_guarded():
    unguarded = [f"{use.where}: {use.what}" for use in _all_uses() if not use.guarded]
    assert not unguarded, f"python-chi used outside an `if {GUARD}(...):` block:\n" + "\n".join(unguarded)


def test_the_python_chi_notebooks_use_the_apis_this_lab_depends_on():
    checked = {use.what for use in _all_uses() if use.is_chi}
    expected = {
        "set chi.context.version",
        "call chi.context.choose_project",
        "call chi.context.choose_site",
        "call chi.lease.Lease",
        "call chi.lease.Lease.add_node_reservation",
        "call chi.lease.Lease.submit",
        "call chi.lease.get_lease",
        "call chi.lease.Lease.show",
        "call chi.server.Server",
        "call chi.server.Server.submit",
        "call chi.server.Server.associate_floating_ip",
        "call chi.server.Server.check_connectivity",
        "call chi.server.Server.execute",
        "read Lease().node_reservations",
    }
    assert expected <= checked, f"not checked: {sorted(expected - checked)}"


# ---- the checker itself ------------------------------------------------------------------------

GOOD_CELLS = [
    "from chi import context, hardware, lease, server\nfrom servelab.lessons.node import chameleon_only",
    textwrap.dedent("""
        if chameleon_only("set up"):
            context.version = "1.0"
            context.choose_site(default="CHI@TACC")
            found = lease.get_lease("name")
            node = server.Server("n", reservation_id=found.node_reservations[0]["id"], image_name="img")
            node.submit(idempotent=True)
            for candidate in hardware.get_nodes(node_type="gpu_p100"):
                candidate.next_free_timeslot(minimum_hours=3)
            print(node.execute("true").stdout)
    """),
]


def test_the_checker_accepts_correct_guarded_calls():
    uses = check_cells("good", GOOD_CELLS)
    assert [use for use in uses if use.problem or not use.guarded] == []
    assert len([use for use in uses if use.what.startswith("call ")]) == 7


@pytest.mark.parametrize(
    "body, problem",
    [
        ('server.Server("n", nonexistent_kw=1)', "unexpected keyword argument 'nonexistent_kw'"),
        ('server.Server("n", "reservation", "image", None, None, "key", None, "net", "extra")', "too many positional"),
        ("lease.get_lease()", "missing a required argument: 'ref'"),
        ("lease.no_such_function('x')", "has no attribute 'no_such_function'"),
        ("from chi import no_such_module", "chi has no 'no_such_module'"),
        ('context.no_such_setting = "x"', "has no attribute 'no_such_setting'"),
        (
            'node = server.Server("n")\n    node.check_connectivity(no_such_option=True)',
            "unexpected keyword argument 'no_such_option'",
        ),
        ('node = server.Server("n")\n    node.submit(no_such_option=True)', "no_such_option: not a named parameter"),
        ('node = server.Server("n")\n    node.no_such_method()', "objects have no attribute 'no_such_method'"),
        ('found = lease.get_lease("x")\n    print(found.no_such_field)', "objects have no attribute 'no_such_field'"),
        (
            "for n in hardware.get_nodes():\n        n.next_free_timeslot(hours=3)",
            "unexpected keyword argument 'hours'",
        ),
        ('node = server.Server("n")\n    node.execute("true").stdout.strip()', None),
        ("lease.get_lease(*names)", "cannot bind"),
        ('lease.Lease("x").submit().anything()', "add its return type to RETURN_TYPES"),
    ],
    ids=lambda value: value.split("\n")[0][:40] if isinstance(value, str) else str(value),
)
def test_the_checker_catches_a_wrong_call_or_attribute(body, problem):
    cell = f'if chameleon_only("x"):\n    {body}\n'
    uses = check_cells("bad", [GOOD_CELLS[0], cell])
    problems = [use.problem for use in uses if use.problem]
    if problem is None:
        assert problems == [], "the checker flagged a correct call"
    else:
        assert any(problem in found for found in problems), f"expected {problem!r}, found {problems}"


@pytest.mark.parametrize(
    ("cell", "guarded"),
    [
        ('lease.get_lease("x")', False),
        ('if True:\n    lease.get_lease("x")', False),
        ('if chameleon_only("x"):\n    pass\nelse:\n    lease.get_lease("x")', False),
        ('found = lease.get_lease("x") if chameleon_only("x") else None', False),
        ('if ready and chameleon_only("x"):\n    lease.get_lease("x")', True),
    ],
    ids=["top level", "other condition", "else branch", "conditional expression", "an and-ed guard"],
)
def test_the_checker_catches_an_unguarded_call(cell, guarded):
    uses = check_cells("guard", [GOOD_CELLS[0], cell])
    calls = [use for use in uses if use.what.startswith("call ")]
    assert calls and all(use.guarded == guarded for use in calls)
