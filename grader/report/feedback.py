"""A feedback file per student: `DIR/<id>.md`, in Markdown that reads as plain text too.

It holds the total, a table of the exercises' scores, every public check with its verdict
(and, where it failed, the message and hint the student's own `check` shows), every hidden
check by name and points only (its message and hint would give its inputs away), and the
notes that loading the notebooks produced."""

import os
import re
from collections.abc import Collection
from pathlib import Path

from grader.base.results import CheckResult, ExerciseResult, SubmissionResult
from grader.report.paths import write_report
from grader.report.text import check_said, same_cause
from labtext import _, speaking

# What Markdown would act on in a line of text, escaped only where it would: a backslash
# before punctuation, a backtick left over, `*`/`_`/`~` that could open emphasis or
# strikethrough, `<` of a tag, `&` of an entity, `](` of a link (so `copy_(...)`, `2 * 3` and
# `[[3., 3.]]` stay as they are).
SPECIAL = re.compile(
    r"\\(?=[!-/:-@\[-`{-~]|$)|`|\*(?=\S)|(?<![0-9A-Za-z])_(?=\S)|~(?=\S)"
    r"|<(?=[A-Za-z/!?])|&(?=#?\w+;)|\](?=\()"
)
# What would make the start of a line a heading, a quote or a list item.
BLOCK_START = re.compile(r"^([#>+-])")
NUMBERED = re.compile(r"^(\d+)([.)])")
# A code span: a run of backticks, then text, then a run of as many (and no more).
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


class FeedbackError(ValueError):
    """The folder for the feedback files cannot be used (it is a file, say)."""


def check_feedback_folder(folder: Path) -> None:
    """Raise FeedbackError unless `folder` is, or can be made, a folder to write into."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        if existing == folder:
            raise FeedbackError(
                _("--feedback {folder} is a file, not a folder").format(folder=folder)
            )
        raise FeedbackError(
            _("--feedback {folder}: {file} is a file, not a folder").format(
                folder=folder, file=existing
            )
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FeedbackError(
            _("--feedback {folder}: cannot write into {where}").format(
                folder=folder, where=existing
            )
        )


def _points(x: float) -> str:
    """Return a score as the other reports show it: 2, 0.5, 11."""
    return f"{x:g}"


def _plain(text: str, table: bool) -> str:
    """Return text outside code spans with what Markdown would act on escaped."""
    text = SPECIAL.sub(lambda m: "\\" + m.group(0), text)
    return text.replace("|", r"\|") if table else text


def inline(text: str, table: bool = False) -> str:
    """Return text as one line of Markdown that shows it as written (balanced `code` stays
    code); in a table cell (`table`), `|` is escaped too."""
    text = " ".join(text.split("\n")).strip()
    parts, end = [], 0
    for span in CODE_SPAN.finditer(text):
        code = span.group(0).replace("|", r"\|") if table else span.group(0)
        parts += [_plain(text[end : span.start()], table), code]
        end = span.end()
    parts.append(_plain(text[end:], table))
    return "".join(parts)


def _line_start(line: str) -> str:
    """Return a line of Markdown whose first character cannot start a block (`- x`, `1. x`)."""
    return NUMBERED.sub(r"\1\\\2", BLOCK_START.sub(r"\\\1", line, count=1), count=1)


def block(text: str, indent: str) -> list[str]:
    """Return text of several lines as a fenced block, its lines kept as they are."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = [f"{indent}{line}".rstrip() for line in text.splitlines()]
    return [f"{fence}text", *body, f"{indent}{fence}"]


def item(text: str, indent: str, prefix: str = "") -> list[str]:
    """Return a list item of `text`: inline when it is one line, a fenced block if more."""
    text = text.strip("\n")
    if "\n" not in text:
        return [f"{indent}- {prefix}{inline(text) if prefix else _line_start(inline(text))}"]
    first, *rest = block(text, indent + "  ")
    if prefix:
        return [f"{indent}- {prefix.rstrip()}", f"{indent}  {first}", *rest]
    return [f"{indent}- {first}", *rest]


def what_it_proves(check: CheckResult) -> list[str]:
    """Return the line that says, in the reader's language, what a check proves (none where
    its docstring is unknown)."""
    return item(" ".join(_(check.doc).split()), "  ") if check.doc else []


def public_check(check: CheckResult, said: dict[str, str]) -> list[str]:
    """Return a public check's lines: verdict and points, what it proves, and what its `check`
    says of it (an error already shown for another check of the exercise is not repeated)."""
    mark = "✓" if check.passed else "✗"
    points = {"score": _points(check.points), "total": _points(check.max_points)}
    name = f"`{check.name}`"
    if check.passed:
        verdict = _("{mark} {name}: passed, {score}/{total} points")
    else:
        verdict = _("{mark} {name}: failed, {score}/{total} points")
    lines = ["- " + verdict.format(mark=mark, name=name, **points)]
    lines += what_it_proves(check)
    core = check_said(check, alone=True)
    key = same_cause(check)
    if not check.passed and key in said:
        return [*lines, "  - " + _("the same as {check} above").format(check=said[key])]
    if core:
        lines += item(core, "  ")
        if not check.passed:
            said[key] = name
    if not check.passed and check.hint:
        lines += item(check.hint, "  ", _("hint: "))
    return lines


def hidden_check(check: CheckResult) -> list[str]:
    """Return a hidden check's lines: its name and points, what it proves, nothing it said."""
    points = _("{name}: {score}/{total} points").format(
        name=f"`{check.name}`", score=_points(check.points), total=_points(check.max_points)
    )
    return [f"- {points}", *what_it_proves(check)]


def exercise_section(exercise: ExerciseResult, title: str = "") -> list[str]:
    """Return an exercise's section: its score, notes, public and hidden checks."""
    name = f"`{exercise.name}`"
    heading = _("{name}: {title}").format(name=name, title=inline(title)) if title else name
    score = {"score": _points(exercise.score), "total": _points(exercise.max_score)}
    lines = [f"## {heading}", "", _("{score}/{total} points.").format(**score), ""]
    if exercise.notes:
        lines += [line for note in exercise.notes for line in item(note, "")] + [""]
    if exercise.checks and all(c.not_run for c in exercise.checks):
        return lines  # the note says why none of its checks ran
    public = [c for c in exercise.checks if not c.hidden]
    hidden = [c for c in exercise.checks if c.hidden]
    if public:
        said: dict[str, str] = {}
        lines += [_("Public checks (the ones your own `check` runs):"), ""]
        lines += [line for c in public for line in public_check(c, said)] + [""]
    if hidden:
        lines += [
            _("Hidden checks (their inputs stay private, so only the points are shown):"),
            "",
        ]
        lines += [line for c in hidden for line in hidden_check(c)] + [""]
    return lines


def score_table(result: SubmissionResult, titles: dict[str, str]) -> list[str]:
    """Return the table of exercises and their scores, with the total as its last row."""
    rows = [_("| exercise | score |"), "|---|---|"]
    for e in result.exercises:
        name = f"`{e.name}`"
        if titles.get(e.name):
            title = inline(_(titles[e.name]), table=True)
            name = _("{name} ({title})").format(name=name, title=title)
        rows.append(f"| {name} | {_points(e.score)}/{_points(e.max_score)} |")
    total = f"{_points(result.score)}/{_points(result.max_score)}"
    rows.append(_("| **total** | **{total}** |").format(total=total))
    return rows


def _without_path(note: str, path: str) -> str:
    """Return a note with the submission's path on the grader's machine named as a student
    knows it ("your submission"). The path is one where spaces, quotes, brackets or
    punctuation (a Chinese note's full-width ones too) set it apart."""
    if not path:
        return note
    where = re.compile(rf"(?<![^\s'\"(（]){re.escape(path)}(?=$|[\s:,;)'\"：，；）])")
    return where.sub(_("your submission"), note)


def loading_notes(result: SubmissionResult) -> list[str]:
    """Return the section of notes from loading the notebooks, the grader's paths left out."""
    if not result.notes:
        return []
    notes = [_without_path(str(note), result.path) for note in result.notes]
    lines = ["## " + _("While loading your notebooks"), ""]
    return lines + [line for note in notes for line in item(note, "")] + [""]


def feedback_title(result: SubmissionResult, notebook: str = "") -> str:
    """Return the feedback's title, as plain text in the current language: whose it is, and
    for a notebook's page (`notebook`), which notebook's."""
    if notebook:
        return _("Feedback for {id}: {notebook}").format(id=result.id, notebook=notebook)
    return _("Feedback for {id}").format(id=result.id)


def feedback_markdown(
    result: SubmissionResult,
    titles: dict[str, str] | None = None,
    notebook: str = "",
    exercises: Collection[str] | None = None,
) -> str:
    """Return one submission's feedback as Markdown, in the submission's language. A
    notebook's page (`notebook`, with the ids of its `exercises`) keeps the whole submission's
    total, table and notes, and the checks of those exercises alone."""
    titles = titles or {}
    with speaking(result.language):
        total = {"score": _points(result.score), "total": _points(result.max_score)}
        if notebook:
            title = _("Feedback for {id}: {notebook}").format(
                id=inline(result.id), notebook=f"`{notebook}`"
            )
        else:
            title = _("Feedback for {id}").format(id=inline(result.id))
        lines = [
            "# " + title,
            "",
            "**" + _("Total: {score}/{total} points").format(**total) + "**",
            "",
            *score_table(result, titles),
            "",
        ]
        for e in result.exercises:
            if exercises is None or e.name in exercises:
                lines += exercise_section(e, _(titles.get(e.name, "")))
        lines += loading_notes(result)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_feedback(
    result: SubmissionResult, folder: Path, titles: dict[str, str] | None = None
) -> Path:
    """Write `folder/<id>.md` for one submission, atomically; return its path."""
    path = Path(folder) / f"{result.id}.md"
    write_report(path, feedback_markdown(result, titles))
    return path
