"""The command line: `python -m grader {check,grade,list,mistakes,sync,translate}`."""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import labtext
from grader.base.limits import OPTIONS, Limits
from grader.class_grading import ClassOptions, Outputs, expand, grade_class, one_slice
from grader.grading import (
    GradeOptions,
    grade_submission,
    load_for_judging,
    sandbox_said,
    select_exercises,
)
from grader.judge.registry import HiddenChecksUnavailable, exercise_points, exercise_total
from grader.load.submission import find_submission, unfit_notebooks
from grader.manifest import Manifest, load_manifest
from grader.report.exports import GradebookError, check_nbgrader_gradebook, summary_table
from grader.report.feedback import FeedbackError
from grader.report.paths import ReportPathError, is_stdout, stdout_kept_for_reports
from grader.report.text import render_submission
from labtext import _


def exercise_table() -> str:
    """Return the manifest's exercises as a Markdown table (the README shows the same)."""
    manifest = load_manifest()
    rows = [_("| id | notebook | function | points | what you write |"), "|---|---|---|---|---|"]
    for ex in manifest.exercises:
        rows.append(
            f"| `{ex.id}` | `{ex.notebook}` | `{ex.function}` | "
            f"{exercise_points(ex):g} | {_(ex.title)} |"
        )
    return "\n".join(rows)


def mistake_table(exercises: list[str] | None = None) -> str:
    """Return the catalogue of known mistakes as a Markdown table."""
    from grader.exercises.catalogue import mistakes_of

    manifest = load_manifest()
    wanted = [manifest.exercise(e) for e in exercises] if exercises else manifest.exercises
    rows = [_("| exercise | mistake | caught by | seen in |"), "|---|---|---|---|"]
    for ex in wanted:
        for name, m in mistakes_of(ex).items():
            rows.append(f"| `{ex.id}` | {name.replace('_', ' ')} | `{m.fails}` | {m.seen_in} |")
    return "\n".join(rows)


def add_limits(p: argparse.ArgumentParser) -> None:
    """The limits every grading child runs under (grader.base.limits)."""
    d = Limits()
    for name, (flag, said) in OPTIONS.items():
        kind = "GIB" if name == "memory_gib" else "S"
        p.add_argument(
            flag,
            dest=name,
            type=float,
            default=getattr(d, name),
            metavar=kind,
            help=said + " (default: %(default)g)",
        )


def shard_spec(text: str) -> tuple[int, int]:
    """`I/N` as (I, N), with 0 <= I < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index = count = -1
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(
            _("{text}: say which slice of how many, as I/N with 0 <= I < N, such as 0/4").format(
                text=text
            )
        )
    return index, count


def limits_of(args: argparse.Namespace) -> Limits:
    return Limits(**{name: getattr(args, name) for name in OPTIONS})


NBGRADER_FEEDBACK = (
    "for each submission nbgrader collected, write its feedback as a page per notebook where "
    "`nbgrader release_feedback` takes it, DIR/<student>/<assignment>/ (DIR: the course's "
    "feedback/), so that each student's Fetch Feedback brings theirs"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
    p.add_argument(
        "--lang",
        metavar="LANGUAGE",
        help="the language of messages: en or zh_CN (default: LAB_LANG, else the locale's; "
        "a notebook released in Chinese is always spoken of in Chinese)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="run the public checks on your notebook(s) and show hints")
    c.add_argument("path", help="a notebook, or a folder holding the exercise notebooks")
    c.add_argument(
        "--exercise",
        "-e",
        action="append",
        metavar="ID",
        help="check only this exercise (repeat for more; default: all in PATH)",
    )
    add_limits(c)

    g = sub.add_parser("grade", help="grade submissions with public and hidden checks")
    g.add_argument(
        "submissions",
        nargs="+",
        metavar="SUBMISSION",
        help="a notebook, a folder of exercise notebooks, or a folder of students' "
        "folders such as nbgrader's submitted/",
    )
    g.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        metavar="N",
        help="submissions graded side by side, and up to twice as many while the cores sit "
        "idle (default: %(default)s)",
    )
    g.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the full report here; submissions already in it with the same "
        "notebooks and options are not graded again",
    )
    g.add_argument(
        "--csv",
        type=Path,
        metavar="FILE",
        help="write a gradebook here: a row per student, a column per exercise",
    )
    g.add_argument(
        "--gradescope",
        type=Path,
        metavar="DIR",
        help="write Gradescope's results.json for each submission into DIR/<id>/",
    )
    g.add_argument(
        "--gradebook",
        type=Path,
        metavar="FILE",
        help="write each exercise's score into nbgrader's gradebook (the gradebook.db of "
        "`nbgrader generate_assignment`), as its check cell's automatic score: the scores "
        "to trust, as `nbgrader autograde` runs the checks inside the student's kernel",
    )
    g.add_argument(
        "--feedback",
        type=Path,
        metavar="DIR",
        help="write a feedback file for each submission, DIR/<id>.md (Markdown): its "
        "scores, its public checks' messages and hints, its hidden checks' points only",
    )
    g.add_argument("--nbgrader-feedback", type=Path, metavar="DIR", help=NBGRADER_FEEDBACK)
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random inputs, mixed with each submission's id; keep it "
        "to yourself (default: %(default)s)",
    )
    g.add_argument(
        "--exercise",
        "-e",
        action="append",
        metavar="ID",
        help="grade only this exercise (repeat for more; default: all)",
    )
    g.add_argument(
        "--public-only",
        action="store_true",
        help="skip the hidden checks (for a copy of the lab without them)",
    )
    g.add_argument(
        "--shard",
        type=shard_spec,
        metavar="I/N",
        help="grade only slice I of N of the class (0 <= I < N; the class's ids in sorted "
        "order, every N-th from the I-th), as one job of N; `merge` joins the slices' reports",
    )
    g.add_argument(
        "--regrade",
        action="store_true",
        help="grade every submission again, even those already in the JSON report",
    )
    add_limits(g)

    j = sub.add_parser(
        "merge", help="join the JSON reports of a class graded in slices (grade --shard)"
    )
    j.add_argument("reports", nargs="+", type=Path, metavar="REPORT", help="a slice's JSON report")
    for option, kind, what in (
        ("--json", Path, "write the whole class's report here"),
        ("--csv", Path, "write the gradebook here: a row per student, a column per exercise"),
        (
            "--gradescope",
            Path,
            "write Gradescope's results.json for each submission into DIR/<id>/",
        ),
        ("--feedback", Path, "write a feedback file for each submission, DIR/<id>.md"),
        ("--nbgrader-feedback", Path, NBGRADER_FEEDBACK),
    ):
        j.add_argument(option, type=kind, help=what)

    b = sub.add_parser(
        "gradescope-bundle", help="write Gradescope's autograder zip (docs/grading.md)"
    )
    b.add_argument("out", type=Path, metavar="OUT.zip")
    r = sub.add_parser("gradescope-run", help="grade inside Gradescope (run_autograder calls it)")
    r.add_argument("submission", type=Path, help="the folder of the student's files")
    r.add_argument("results", type=Path, help="where Gradescope reads results.json")
    r.add_argument("--metadata", type=Path, help="Gradescope's submission_metadata.json")
    st = sub.add_parser(
        "gradescope-stopped",
        help="where gradescope-run ended without results, write results.json that says why",
    )
    st.add_argument("submission", type=Path, help="the folder of the student's files")
    st.add_argument("results", type=Path, help="where Gradescope reads results.json")
    st.add_argument("--exit-code", type=int, required=True, help="gradescope-run's exit code")
    st.add_argument("--log", type=Path, help="what gradescope-run printed")

    sub.add_parser("list", help="list the exercises, their notebooks and points")
    m = sub.add_parser("mistakes", help="list the catalogue of known mistakes and their checks")
    m.add_argument(
        "--exercise",
        "-e",
        action="append",
        metavar="ID",
        help="only this exercise's mistakes (repeat for more)",
    )
    sub.add_parser("sync", help="write each exercise's points (its checks') into the notebooks")
    t = sub.add_parser(
        "translate", help="write the reference notebooks in another language (see i18n/)"
    )
    t.add_argument("language", help="a language of i18n/, such as zh_CN")
    t.add_argument("folder", type=Path, help="where to write them (FOLDER/<assignment>/)")
    msg = sub.add_parser(
        "messages",
        help="compile the grader's translations, list the missing, or refresh where each is said",
    )
    msg.add_argument("action", choices=("missing", "compile", "locations"))
    msg.add_argument(
        "--language", default="zh_CN", help="the catalogue to look at (missing, locations)"
    )
    msg.add_argument(
        "--under", help="only messages from here, e.g. grader/exercises/allreduce/checks.py"
    )
    return p


def run_check(args: argparse.Namespace) -> int:
    manifest = load_manifest()
    sub = select_exercises(find_submission(args.path, manifest), args.exercise)
    labtext.choose(sub.language)  # the student at the terminal reads the notebook's language
    with labtext.speaking(sub.language):
        unfit = unfit_notebooks(sub, manifest)
        if unfit:  # one clear error, and no report of checks that could judge nothing
            for problem in unfit:
                print(_("error: {error}").format(error=problem), file=sys.stderr)
            return 2
        # Notes about other exercises' cells are not the question of a student who chose one.
        chosen = tuple(manifest.exercise(e) for e in args.exercise) if args.exercise else None
        options = GradeOptions(hidden=False, limits=limits_of(args), notes_about=chosen)
        result = grade_submission(sub, options)
        titles = {ex.id: ex.title for ex in manifest.exercises}
        totals = {ex.id: exercise_total(ex) for ex in manifest.exercises}
        print(render_submission(result, titles, totals))
    everything = all(c.passed for e in result.exercises for c in e.checks)
    return 0 if everything else 1


def run_grade(args: argparse.Namespace) -> int:
    manifest = load_manifest()
    if args.exercise:
        for e in args.exercise:
            manifest.exercise(e)
    outputs = Outputs(args.json, args.csv, args.gradescope, args.gradebook, args.feedback)
    outputs.nbgrader_feedback = args.nbgrader_feedback
    outputs.check()  # before anything is graded
    if args.gradebook:
        check_nbgrader_gradebook(args.gradebook, manifest)
    with stdout_kept_for_reports(outputs.to_stdout()):
        return grade_into(args, manifest, outputs)


def grade_into(args: argparse.Namespace, manifest: Manifest, outputs: Outputs) -> int:
    """Grade what `args` names into `outputs` (checked already), saying how it went."""
    subs = expand(args.submissions, manifest)
    graded_here = one_slice(subs, *args.shard) if args.shard else subs
    # (a reference's cells print into a buffer while they load); where a report goes to
    # standard output, what the command says goes to standard error
    terminal = sys.stderr if outputs.to_stdout() else sys.stdout
    if graded_here:  # what judging needs, loaded while the fork server may still be importing
        load_for_judging(graded_here[0], references=not args.public_only)
    print(
        _("grading {count} submission(s), {jobs} at a time; sandbox: {sandbox}").format(
            count=len(graded_here), jobs=args.jobs, sandbox=sandbox_said()
        ),
        file=terminal,
        flush=True,
    )
    grading = GradeOptions(seed=args.seed, hidden=not args.public_only, limits=limits_of(args))
    run = ClassOptions(grading, args.jobs, args.regrade, args.exercise, args.shard)
    results = grade_class(subs, outputs, run)
    say(results, manifest, terminal)
    for written, where in (
        (_("report written to {path}"), args.json),
        (_("gradebook written to {path}"), args.csv),
        (_("Gradescope results written to {path}"), args.gradescope),
        (_("nbgrader's gradebook written to {path}"), args.gradebook),
        (_("feedback written to {path}"), args.feedback),
    ):
        if where and not is_stdout(where):
            print(written.format(path=where), file=terminal)
    outputs.say_nbgrader_feedback(manifest.assignment, terminal)
    return 0


def say(results: list, manifest: Manifest, terminal: TextIO) -> None:
    """Print each submission's score and the summary table to `terminal`."""
    for r in results:
        print(f"{r.id}: {r.score:g}/{r.max_score:g}", file=terminal)
    print(file=terminal)
    points = {ex.id: exercise_points(ex) for ex in manifest.exercises}
    print(summary_table(results, manifest, points), file=terminal)


def run_merge(args: argparse.Namespace) -> int:
    from grader.front.merge import MergeError, merge

    try:
        run, results = merge(args.reports)
    except MergeError as error:
        print(_("error: {error}").format(error=error), file=sys.stderr)
        return 2
    outputs = Outputs(args.json, args.csv, args.gradescope, None, args.feedback, run)
    outputs.nbgrader_feedback = args.nbgrader_feedback
    outputs.check()
    terminal = sys.stderr if outputs.to_stdout() else sys.stdout
    with stdout_kept_for_reports(outputs.to_stdout()):
        outputs.write(results, None)
    say(results, load_manifest(), terminal)
    outputs.say_nbgrader_feedback(load_manifest().assignment, terminal)
    print(_("{count} slices joined: {students} submissions").format(
        count=run["merged"], students=len(results)), file=terminal)  # fmt: skip
    return 0


def run_messages(args: argparse.Namespace) -> int:
    from grader.tools import messages

    return messages.main(args.action, args.language, args.under)


def run_list(args: argparse.Namespace) -> int:
    print(exercise_table())
    return 0


def run_mistakes(args: argparse.Namespace) -> int:
    try:
        print(mistake_table(args.exercise))
    except ModuleNotFoundError:
        print(
            _(
                "error: the catalogue of mistakes is not installed here; it stays on the "
                "instructor's side"
            ),
            file=sys.stderr,
        )
        return 2
    return 0


def run_sync(args: argparse.Namespace) -> int:
    """`sync`: write the points into the notebooks; 1 where the notebooks have problems."""
    from grader.tools.authoring import manifest_problems, sync_points

    for line in sync_points() + manifest_problems():
        print(line)
    return 1 if manifest_problems() else 0


def run_translate(args: argparse.Namespace) -> int:
    """`translate`: write the notebooks in another language, unless a translation is amiss."""
    from grader.tools.translate import translation_problems, write_edition

    found = [p for nb in load_manifest().notebooks for p in translation_problems(args.language, nb)]
    for problem in found:
        print(_("error: {error}").format(error=problem), file=sys.stderr)
    if found:
        return 2
    for path in write_edition(args.language, args.folder):
        print(_("wrote {path}").format(path=path))
    return 0


def run_gradescope_bundle(args: argparse.Namespace) -> int:
    from grader.front.gradescope import write_bundle

    names = write_bundle(args.out)
    print(_("wrote {path}: {count} files").format(path=args.out, count=len(names)))
    return 0


def run_gradescope_run(args: argparse.Namespace) -> int:
    from grader.front.gradescope import run

    return run(args.submission, args.results, args.metadata)


def run_gradescope_stopped(args: argparse.Namespace) -> int:
    """`gradescope-stopped`: write the results.json that says why gradescope-run stopped."""
    from grader.front.gradescope import stopped

    if said := stopped(args.submission, args.results, args.exit_code, args.log):
        print(said)
    return 0


# Each sub-command's function; what only one of them needs, it imports itself, when run.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": run_check,
    "grade": run_grade,
    "merge": run_merge,
    "list": run_list,
    "mistakes": run_mistakes,
    "sync": run_sync,
    "translate": run_translate,
    "messages": run_messages,
    "gradescope-bundle": run_gradescope_bundle,
    "gradescope-run": run_gradescope_run,
    "gradescope-stopped": run_gradescope_stopped,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        labtext.choose(args.lang)
    except ValueError as error:
        print(_("error: {error}").format(error=error), file=sys.stderr)
        return 2
    try:
        return COMMANDS.get(args.command, run_grade)(args)
    except (FileNotFoundError, KeyError, GradebookError, FeedbackError, ReportPathError) as error:
        said = error.args[0] if error.args else error
        print(_("error: {error}").format(error=said), file=sys.stderr)
        return 2
    except HiddenChecksUnavailable as error:
        print(
            _("error: {error}; add --public-only to grade with the public checks").format(
                error=error
            ),
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(
            "\n" + _("interrupted: the submissions graded so far are in the reports"),
            file=sys.stderr,
        )
        return 130
