"""The lessons' checks: each expectation a notebook judges, as a function of its runs.

A notebook states an expectation in prose, measures, then calls the check here that judges it,
and records the verdict with `lab.record(...)`. Each check returns a
`servelab.lessons.expectations.Expectation` whose conditions are judged on figures read from the runs
(`expectations.figure`), so a verdict can only say what the tables beside it say; its `reason`
is computed from the same runs (cores, device, measured costs), or says plainly that it is a
hypothesis. Living here, every check has a unit test that feeds it a failing case
(tests/test_lessons_*.py): a check that cannot fail teaches nothing.

A notebook's helpers moved out of its cells (printouts, say) live in its module too, tested
without servers where they can be (tests/test_lessons_<module>.py).

One module per notebook; a module imports from servelab's measuring tools and records, never
from the notebooks' facade (servelab.lab.facade).
"""
