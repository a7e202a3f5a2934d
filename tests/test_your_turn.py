"""The student's copy of each notebook (servelab.lab.your_turn, `make notebooks`): the answers
cleared by nbgrader, nothing else changed, and a cleared answer, run as it is, stops with what to type."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

from servelab.lab import your_turn
from servelab.lab.notebook_runs import NOTEBOOKS, sources

SOURCES = sources()
STUDENT = NOTEBOOKS / "student"


def code_and_text(path) -> list[tuple[str, str]]:
    return [(cell["cell_type"], "".join(cell["source"])) for cell in json.loads(path.read_text())["cells"]]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_student_s_copy_differs_from_the_instructor_s_only_where_an_answer_was(source):
    instructor = code_and_text(source.with_suffix(".ipynb"))
    student = code_and_text(STUDENT / f"{source.stem}.ipynb")
    assert [(kind, your_turn.without_answers(text)) for kind, text in instructor] == student, (
        f"notebooks/student/{source.stem}.ipynb: run `make notebooks`"
    )
    assert not any(your_turn.BEGIN in text or your_turn.END in text for _, text in student)
    assert sum(text.count(your_turn.STUB) for _, text in student) == sum(
        text.count(your_turn.BEGIN) for _, text in instructor
    )


def test_the_lessons_leave_the_original_lab_s_steps_to_the_student():
    """At least the original lab's own steps: notebook 6's perf_analyzer line and its two instance
    groups, notebook 7's ONNX instance group and dynamic_batching block, and a setting of notebook 3."""
    cleared = {source.stem: (STUDENT / f"{source.stem}.ipynb").read_text().count(your_turn.STUB) for source in SOURCES}
    assert cleared["6_triton_bench"] >= 3 and cleared["7_triton_batching"] >= 2 and cleared["3_fastapi"] >= 1


def test_an_answer_is_marked_for_nbgrader_and_asked_for_in_the_comment_above_it():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    notebook.cells[0].id = "abc"
    your_turn.mark_solution_cells(notebook, "9_toy")
    assert notebook.cells[0].metadata["nbgrader"]["solution"] is True
    assert notebook.cells[0].metadata["nbgrader"]["grade_id"] == "9_toy-abc"
    student = your_turn.student_notebook(notebook)
    assert student.cells[0].source == "prepared = 1\n# Your turn: x = ..., a number\n#   (how: the docs).\n" + (
        your_turn.STUB + "\nprint(x)"
    )
    unasked = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL.replace("# Your turn:", "# Type"))])
    with pytest.raises(ValueError, match="no `# Your turn: ...` comment"):
        your_turn.mark_solution_cells(unasked, "9_toy")
    unclosed = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL.replace(your_turn.END, ""))])
    with pytest.raises(ValueError, match="without its"):
        your_turn.mark_solution_cells(unclosed, "9_toy")


CELL = f"""prepared = 1
# Your turn: x = ..., a number
#   (how: the docs).
{your_turn.BEGIN}
x = 1
{your_turn.END}
print(x)"""


@pytest.mark.integration
def test_a_cleared_answer_run_as_it_is_stops_with_what_to_type_and_no_traceback():
    """In a real kernel, as JupyterLab runs the student's copy."""
    instructor = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("from servelab.lab import Lab as lab"), nbformat.v4.new_code_cell(CELL)]
    )
    your_turn.mark_solution_cells(instructor, "9_toy")
    student = your_turn.student_notebook(instructor)
    NotebookClient(student, timeout=120, allow_errors=True).execute()
    (error,) = [output for output in student.cells[1].outputs if output.output_type == "error"]
    assert error.ename == "YourTurn"
    assert error.traceback == [
        "Your turn: this cell waits for your answer.",
        "Type x = ..., a number (how: the docs).",
        "Put it in place of the line `lab.your_turn()`, then run the cell again.",
    ]
    assert not any(output.get("name") == "stdout" for output in student.cells[1].outputs), "nothing after it ran"
