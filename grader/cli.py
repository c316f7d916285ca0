"""The command line: `python -m grader {check,grade,list}`."""

import argparse
import sys
from pathlib import Path

from grader.grading import DEFAULT_TIMEOUT, grade_path
from grader.manifest import load_manifest
from grader.registry import HiddenChecksUnavailable
from grader.report import SubmissionResult, render_submission, write_json


def exercise_table() -> str:
    """Return the manifest's exercises as a Markdown table (the README shows the same)."""
    manifest = load_manifest()
    rows = ["| id | notebook | function | points | what you write |", "|---|---|---|---|---|"]
    for ex in manifest.exercises:
        rows.append(
            f"| `{ex.id}` | `{ex.notebook}` | `{ex.function}` | {ex.points:g} | {ex.title} |"
        )
    return "\n".join(rows)


def mistake_table(exercises: list[str] | None = None) -> str:
    """Return the catalogue of known mistakes as a Markdown table."""
    from grader.mistakes import mistakes_of

    manifest = load_manifest()
    wanted = [manifest.exercise(e) for e in exercises] if exercises else manifest.exercises
    rows = ["| exercise | mistake | caught by | seen in |", "|---|---|---|---|"]
    for ex in wanted:
        for name, m in mistakes_of(ex).items():
            rows.append(f"| `{ex.id}` | {name.replace('_', ' ')} | `{m.fails}` | {m.seen_in} |")
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
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
    c.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds before the checks are stopped (default: %(default)s)",
    )

    g = sub.add_parser("grade", help="grade submissions with public and hidden checks")
    g.add_argument(
        "submissions",
        nargs="+",
        metavar="SUBMISSION",
        help="a notebook, or a folder of exercise notebooks, per submission",
    )
    g.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the full report here (rewritten after each submission)",
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
        "--seed",
        type=int,
        default=0,
        help="seed of the random inputs, mixed with each submission's id (default: %(default)s)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds allowed per submission (default: %(default)s)",
    )

    sub.add_parser("list", help="list the exercises, their notebooks and points")
    sub.add_parser("sync", help="write the manifest's points into the reference notebooks")
    m = sub.add_parser("mistakes", help="list the catalogue of known mistakes and their checks")
    m.add_argument(
        "--exercise",
        "-e",
        action="append",
        metavar="ID",
        help="only this exercise's mistakes (repeat for more)",
    )
    return p


def run_check(args: argparse.Namespace) -> int:
    result = grade_path(args.path, args.exercise, hidden=False, timeout=args.timeout)
    print(render_submission(result, {ex.id: ex.title for ex in load_manifest().exercises}))
    everything = all(c.passed for e in result.exercises for c in e.checks)
    return 0 if everything else 1


def run_grade(args: argparse.Namespace) -> int:
    results: list[SubmissionResult] = []
    ids: set[str] = set()
    for path in args.submissions:
        result = grade_path(
            path, args.exercise, hidden=not args.public_only, seed=args.seed, timeout=args.timeout
        )
        base, n = result.id, 2
        while result.id in ids:
            result.id, n = f"{base}-{n}", n + 1
        ids.add(result.id)
        results.append(result)
        print(f"{result.id}: {result.score:g}/{result.max_score:g}", flush=True)
        if args.json:
            write_json(results, args.json)
    if args.json:
        print(f"report written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "list":
            print(exercise_table())
            return 0
        if args.command == "check":
            return run_check(args)
        if args.command == "mistakes":
            print(mistake_table(args.exercise))
            return 0
        if args.command == "sync":
            from grader.authoring import problems, sync_points

            for line in sync_points() + problems():
                print(line)
            return 1 if problems() else 0
        return run_grade(args)
    except (FileNotFoundError, KeyError) as error:
        print(f"error: {error.args[0] if error.args else error}", file=sys.stderr)
        return 2
    except HiddenChecksUnavailable as error:
        print(f"error: {error}; add --public-only to grade with the public checks", file=sys.stderr)
        return 2
