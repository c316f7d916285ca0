"""`check(exercise_id)`: run an exercise's checks from a notebook cell.

The checks run right here in the kernel, against the function you just wrote, and print
each check with its hint. The cell's value is the points earned, which is how nbgrader
reads partial credit from an autograded cell.
"""

import contextlib
import io
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import labtext
from grader import settings
from grader.api import Context, Student
from grader.base.grading_devices import DEVICES, grading_devices
from grader.base.protocol import CaseOutcome
from grader.base.results import CheckResult, exercise_result
from grader.judge.registry import diagnoser, exercise_total, hidden_checks, public_checks
from grader.judge.verdicts import judge_exercise
from grader.load.reference import reference_if_available
from grader.load.runner import run_checks
from grader.manifest import Exercise, load_manifest
from grader.report.text import render_exercise
from labtext import _

_public: dict[str, tuple[object, dict]] = {}  # each exercise's function and public outcomes


def _shell():
    """Return the IPython shell this runs in, or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def globals_of(function: Callable) -> dict:
    """Return the globals of the notebook that defined `function`, or a class's (an exercise
    may ask for a class): those of its methods."""
    if isinstance(function, type):
        for member in vars(function).values():
            code = getattr(member, "__func__", member)
            if hasattr(code, "__globals__"):
                return code.__globals__
        shell = _shell()
        return shell.user_ns if shell is not None else vars(sys.modules[function.__module__])
    return function.__globals__


def _namespace(ex: Exercise, function: Callable | None) -> dict:
    """Return the names the student's code sees: those of `function`'s notebook."""
    if function is not None:
        if not callable(function):
            raise TypeError(
                _("pass the function itself, e.g. check({exercise}, {function})").format(
                    exercise=repr(ex.id), function=ex.function
                )
            )
        return globals_of(function)
    shell = _shell()
    if shell is None:
        raise TypeError(
            _("outside a notebook, pass the function: check({exercise}, {function})").format(
                exercise=repr(ex.id), function=ex.function
            )
        )
    return shell.user_ns


def _context(ex: Exercise, hidden: bool) -> Context:
    known = reference_if_available(ex.notebook) if hidden else None  # the instructor's side
    return Context(int(settings.SEED.get()), grading_devices(DEVICES), known)


def _outcomes(ex: Exercise, namespace: dict, hidden: bool) -> dict[str, CaseOutcome]:
    """Run the cases of the exercise's public (or hidden) checks; return their outcomes."""
    checks = hidden_checks(ex) if hidden else public_checks(ex)
    student = Student(namespace, ex.function, "this notebook")
    known = reference_if_available(ex.notebook)
    with contextlib.ExitStack() as pools:
        if ex.distributed:  # its cases share their ranks (loaded for these exercises alone)
            from grader.ranks.pools import rank_pools

            pools.enter_context(rank_pools(namespace, "this notebook"))
        return run_checks(checks, student, _context(ex, hidden), held=known)


def _run(
    ex: Exercise, namespace: dict, hidden: bool, public: dict[str, CaseOutcome]
) -> list[CheckResult]:
    """Judge the public checks on `public` (their outcomes), and with `hidden` the hidden
    ones too, together: a hidden check that fails for a cause a public one charges keeps its
    points here as in a grade."""
    checks = public_checks(ex) + (hidden_checks(ex) if hidden else [])
    outcomes = {**public, **(_outcomes(ex, namespace, True) if hidden else {})}
    ctx = _context(ex, hidden)
    return judge_exercise(ex.id, ex.function, checks, outcomes, ctx, diagnoser(ex)).checks


class Points(float):
    """The points a check cell earned. nbgrader reads them as the cell's partial credit from
    the plain text of its result ("6.0"); JupyterLab shows the richer line below instead of a
    bare number under the report."""

    def __new__(
        cls, earned: float, checked: float, total: float, hidden: bool, language: str = "en"
    ) -> "Points":
        points = super().__new__(cls, earned)
        points.checked, points.total, points.hidden = checked, total, hidden
        points.language = language
        return points

    def _repr_markdown_(self) -> str:
        with labtext.speaking(self.language):
            line = _("**{earned} of {total} points**").format(
                earned=f"{float(self):g}", total=f"{self.total:g}"
            )
            if self.hidden:
                return _("{points} (public and hidden checks)").format(points=line)
            if self.total <= self.checked:
                return line
            return _(
                "{points} so far: the public checks hold {public} of them. Hidden checks, "
                "run when your work is graded, hold the other {hidden}."
            ).format(
                points=line,
                public=f"{self.checked:g}",
                hidden=f"{self.total - self.checked:g}",
            )


def check_in_kernel(
    exercise_id: str, function: Callable | None = None, hidden: bool = False
) -> float:
    """Run the checks of `exercise_id`, print the verdicts and return the points earned.

    `function` is the function to check; in a notebook it may be left out, and the
    exercise's function is taken from the notebook. With hidden=True (the instructor's copy)
    the hidden checks are added to the public ones just run on the same function.
    """
    with labtext.speaking(language_for_check(exercise_id)):
        language = labtext.current()
        return _check(exercise_id, function, hidden, language)


def language_for_check(exercise_id: str) -> str:
    """Return the language of this kernel's notebook: the one Jupyter names; else, where
    nothing names it (nbgrader's autograding runs the notebook in its own folder), the
    exercise's notebook in the working folder; else LAB_LANG's or the locale's."""
    if labtext.kernel_language() is None:
        try:
            here = Path.cwd() / load_manifest().exercise(exercise_id).notebook
        except (KeyError, OSError):
            here = None
        if here is not None and here.is_file() and (language := labtext.file_language(here)):
            return language
    return labtext.default_language()


def _check(exercise_id: str, function: Callable | None, hidden: bool, language: str) -> float:
    ex = load_manifest().exercise(exercise_id)
    namespace = _namespace(ex, function)
    current = namespace.get(ex.function)
    # nbgrader gives no points to a cell that writes to stderr, so nothing may reach it.
    stray = io.StringIO()
    with contextlib.redirect_stderr(stray), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = _public.get(ex.id)
        if hidden and before and before[0] is current:
            public = before[1]  # the public cell just ran them on this function
        else:
            public = _outcomes(ex, namespace, False)
            _public[ex.id] = (current, public)
        results = _run(ex, namespace, hidden, public)
    result = exercise_result(ex.id, results)
    total = result.max_score if hidden else exercise_total(ex)
    print(render_exercise(result, ex.title, total))
    if stray.getvalue().strip():
        print(_("(printed to stderr while checking:)") + "\n" + stray.getvalue().strip()[-2000:])
    return Points(result.score, result.max_score, total, hidden, language)
