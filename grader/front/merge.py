"""Join the JSON reports of a class graded in slices (`grade --shard I/N`, one per job of a
Slurm array or a Kubernetes Indexed Job) into the reports of one grade of the whole class.

A slice's report says how it was graded (its `run`: the grader's fingerprint, the options,
the exercises, the class's ids and the slice). The slices are joined only when they were
graded alike, of the same class, and make it up exactly; anything else is refused with what
differs, as a report joined from unlike slices would give students unlike grades.
"""

from __future__ import annotations

import json
from pathlib import Path

from grader.base.results import SubmissionResult
from labtext import _


class MergeError(Exception):
    """The slices cannot be joined; the message says why and what to do."""


def read_slice(path: Path) -> tuple[dict, list[SubmissionResult]]:
    """Return a slice's `run` and its results."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        results = [SubmissionResult.from_dict(s) for s in data["submissions"]]
    except FileNotFoundError:
        raise MergeError(_("there is no report at {path}").format(path=path)) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise MergeError(
            _("{path} is not a report of `grade --json` ({error})").format(path=path, error=error)
        ) from None
    run = data.get("run")
    if not isinstance(run, dict) or "shard" not in run:
        raise MergeError(
            _(
                "{path} does not say how it was graded: grade the slices again with this "
                "grader's `grade --shard I/N --json ...`"
            ).format(path=path)
        )
    return run, results


def merge(paths: list[Path]) -> tuple[dict, list[SubmissionResult]]:
    """Return the `run` and the results of the whole class, in the class's order, from the
    reports of its slices; raise MergeError where they cannot be joined."""
    slices = [(Path(p), *read_slice(p)) for p in paths]
    first_path, first, _results = slices[0]
    for path, run, _results in slices[1:]:
        for key, what in (
            ("grader", _("a different grader")),
            ("options", _("different options (seed, hidden checks, limits)")),
            ("exercises", _("different exercises")),
            ("class", _("a different class")),
        ):
            if run.get(key) != first.get(key):
                raise MergeError(
                    _("{path} was graded with {what} than {first}: grade every slice alike").format(
                        path=path, what=what, first=first_path
                    )
                )
    count = first["shard"][1]
    given: dict[int, Path] = {}
    for path, run, _results in slices:
        index, of = run["shard"]
        if of != count:
            raise MergeError(
                _("{path} is slice {index} of {of}, {first} one of {count}").format(
                    path=path, index=index, of=of, first=first_path, count=count
                )
            )
        if index in given:
            raise MergeError(
                _("{path} and {other} are both slice {index}").format(
                    path=path, other=given[index], index=index
                )
            )
        given[index] = path
    missing = sorted(set(range(count)) - set(given))
    if missing:
        raise MergeError(
            _(
                "slices {missing} of {count} are missing: grade them with `--shard I/{count}`"
            ).format(missing=", ".join(map(str, missing)), count=count)
        )
    by_id = {r.id: r for _path, _run, results in slices for r in results}
    absent = [i for i in first["class"] if i not in by_id]
    if absent:
        raise MergeError(
            _("the slices hold no result for {ids}: grade their slices again").format(
                ids=", ".join(absent)
            )
        )
    run = dict(first, shard=[0, 1], merged=count)
    return run, [by_id[i] for i in first["class"]]
