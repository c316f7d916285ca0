"""Keep the reference notebooks in step with the manifest (for the people who write exercises).

Every exercise has, in its reference notebook, a solution cell `<id>-solution` and an
autograded check cell `<id>-checks` whose points are the exercise's (the sum of its checks'
points). `sync_points` writes them into those cells; `problems` lists what does not match.
"""

import json
from pathlib import Path

from grader.judge.registry import exercise_points
from grader.load.notebook import cells_by_grade_id
from grader.manifest import load_manifest, solutions_dir
from labtext import _


def manifest_problems(folder: Path | None = None) -> list[str]:
    """Return every way the reference notebooks disagree with the manifest."""
    folder = folder or solutions_dir()
    found = []
    for ex in load_manifest().exercises:
        path = folder / ex.notebook
        if not path.is_file():
            found.append(
                _("{exercise}: its notebook {path} is missing").format(exercise=ex.id, path=path)
            )
            continue
        cells = cells_by_grade_id(path)
        if f"{ex.id}-solution" not in cells:
            found.append(
                _("{exercise}: {notebook} has no solution cell '{cell}'").format(
                    exercise=ex.id, notebook=ex.notebook, cell=f"{ex.id}-solution"
                )
            )
        checks = cells.get(f"{ex.id}-checks")
        if checks is None:
            found.append(
                _("{exercise}: {notebook} has no check cell '{cell}'").format(
                    exercise=ex.id, notebook=ex.notebook, cell=f"{ex.id}-checks"
                )
            )
        elif float(checks["metadata"]["nbgrader"].get("points", -1)) != exercise_points(ex):
            found.append(
                _(
                    "{exercise}: the check cell gives {cell_points} points, its checks "
                    "{points} (run `python -m grader sync`)"
                ).format(
                    exercise=ex.id,
                    cell_points=checks["metadata"]["nbgrader"].get("points"),
                    points=f"{exercise_points(ex):g}",
                )
            )
    return found


def sync_points(folder: Path | None = None) -> list[str]:
    """Write each exercise's points into its check cell; return the cells changed."""
    folder = folder or solutions_dir()
    changed = []
    for name in load_manifest().notebooks:
        path = folder / name
        nb = json.loads(path.read_text(encoding="utf-8"))
        dirty = False
        for cell in nb["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            grade_id = meta.get("grade_id", "")
            if grade_id.endswith("-checks"):
                exercise = load_manifest().exercise(grade_id.removesuffix("-checks"))
                points = exercise_points(exercise)
                if meta.get("points") != points:
                    meta["points"] = points
                    dirty = True
                    changed.append(
                        _("{notebook}: {cell} now gives {points} points").format(
                            notebook=name, cell=grade_id, points=f"{points:g}"
                        )
                    )
        if dirty:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def reference_answers(notebook: str, folder: Path | None = None) -> dict[str, str]:
    """Return the reference solution of every solution cell of `notebook`, by grade id."""
    answers = {}
    for grade_id, cell in cells_by_grade_id((folder or solutions_dir()) / notebook).items():
        if cell["metadata"]["nbgrader"].get("solution"):
            lines = "".join(cell["source"]).splitlines()
            answers[grade_id] = "\n".join(x for x in lines if x.strip() not in SOLUTION_MARKERS)
    return answers


def filled_in(released: Path, answers: dict[str, str]) -> dict:
    """Return the released notebook with the given solution cells (by grade id) filled in,
    as a student's submission would be."""
    nb = json.loads(released.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


def hidden_parts(notebook: str, folder: Path | None = None) -> dict[str, str]:
    """Return, per solution cell, only the code between the solution markers: what the
    released notebook replaces with a stub."""
    parts = {}
    for grade_id, cell in cells_by_grade_id((folder or solutions_dir()) / notebook).items():
        source = "".join(cell["source"])
        if cell["metadata"]["nbgrader"].get("solution") and SOLUTION_MARKERS[0] in source:
            parts[grade_id] = source.split(SOLUTION_MARKERS[0])[1].split(SOLUTION_MARKERS[1])[0]
    return parts
