"""The student's steps: what the student types, and the student's copy of each notebook.

In a notebook's source (notebooks/*.py), an answer sits between nbgrader's markers,
`### BEGIN SOLUTION` and `### END SOLUTION`, right under a comment that asks for it:

    # Your turn: batching = "dynamic_batching { ... }", preferred sizes 4 and 8 (fields:
    #   preferred_batch_size; Triton's model configuration guide, "Dynamic Batcher").
    ### BEGIN SOLUTION
    batching = "dynamic_batching { preferred_batch_size: [ 4, 8 ] }"
    ### END SOLUTION

`make notebooks` writes two notebooks from each source (scripts/build_notebooks.py): the
instructor's, notebooks/*.ipynb, with the answers (what nbmake runs in `make test`), and the
student's, notebooks/student/*.ipynb, where nbgrader's own preprocessor (ClearSolutions) left
`lab.your_turn()` in place of each answer. Run as it is, that line stops the notebook with the
comment's request, not a traceback: the student types the answer in its place.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

from servelab.time_plan import ANSWER

BEGIN, END = ANSWER, "### END SOLUTION"
ASKS = "# Your turn:"
STUB = "lab.your_turn()  # type your answer in place of this line, then run the cell again"
# nbgrader's metadata version (nbgrader.utils: the schema its `generate_assignment` reads).
NBGRADER_SCHEMA = 3


class YourTurn(Exception):
    """A step left for the student: IPython shows `_render_traceback_`'s lines instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


def request(cell_source: str) -> str | None:
    """What the cell's `# Your turn:` comment asks for (its lines, comment marks removed), or None."""
    lines = cell_source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(ASKS)]
    if not starts:
        return None
    asked = [lines[starts[0]].lstrip()[len(ASKS) :].strip()]
    for line in lines[starts[0] + 1 :]:
        stripped = line.lstrip()
        if not stripped.startswith("#") or stripped.startswith(BEGIN):
            break
        asked.append(stripped.lstrip("#").strip())
    return " ".join(asked)


def stop(cell_source: str | None) -> NoReturn:
    """Stop the run at a step the student has not typed yet, saying what to type."""
    asked = request(cell_source or "")
    raise YourTurn(
        "Your turn: this cell waits for your answer.\n"
        + (f"Type {asked}\n" if asked else "Type what the comment above `lab.your_turn()` asks for.\n")
        + "Put it in place of the line `lab.your_turn()`, then run the cell again."
    )


def running_cell() -> str | None:
    """The source of the cell IPython is running now (None outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    return history[-1] if history else None


# ---- the two notebooks, from one source -----------------------------------------------------


def has_answer(source: str) -> bool:
    return BEGIN in source


def without_answers(source: str, placeholder: str = STUB) -> str:
    """`source` with each answer region (its markers included) replaced by `placeholder`, indented as
    the region's first marker: what ClearSolutions leaves, and what the test compares both copies by."""
    kept, inside = [], False
    for line in source.split("\n"):
        if BEGIN in line:
            kept.append(line[: len(line) - len(line.lstrip())] + placeholder)
            inside = True
        elif END in line:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


def check_regions(name: str, source: str) -> None:
    """Every region closes, and the comment right above it asks for the answer (what `stop` says)."""
    lines = source.split("\n")
    begins = [i for i, line in enumerate(lines) if BEGIN in line]
    if len(begins) != sum(END in line for line in lines):
        raise ValueError(f"{name}: a `{BEGIN}` without its `{END}`")
    for i in begins:
        above = lines[:i]
        comment: list[str] = []
        while above and above[-1].lstrip().startswith("#"):
            comment.insert(0, above.pop())
        if not any(line.lstrip().startswith(ASKS) for line in comment):
            raise ValueError(f"{name}: the answer at line {i + 1} of its cell has no `{ASKS} ...` comment right above")


def mark_solution_cells(notebook: Any, name: str) -> None:
    """Give each cell with an answer nbgrader's solution metadata: the instructor's notebook is one
    that nbgrader's own tools read as the source of an assignment."""
    for cell in notebook.cells:
        if cell.cell_type == "code" and has_answer(cell.source):
            check_regions(name, cell.source)
            cell.metadata["nbgrader"] = {
                "grade": False,
                "grade_id": f"{name}-{cell.id}",
                "locked": False,
                "schema_version": NBGRADER_SCHEMA,
                "solution": True,
            }


def student_notebook(instructor: Any) -> Any:
    """The student's copy: nbgrader's ClearSolutions, which puts STUB where each answer was."""
    from nbgrader.preprocessors import ClearSolutions  # the instructor's extra: `make notebooks` installs it

    student = copy.deepcopy(instructor)
    clear = ClearSolutions(code_stub={"python": STUB}, begin_solution_delimeter=BEGIN, end_solution_delimeter=END)
    student, _ = clear.preprocess(student, {})
    for cell in student.cells:
        cell.metadata.pop("nbgrader", None)  # a student's copy is no assignment source
    return student
