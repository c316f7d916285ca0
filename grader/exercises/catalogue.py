"""The format of the catalogue of known wrong implementations, whose entries are each
exercise's private/mistakes.py (out of the students' image); those modules import this one
alone.

Each `Mistake` is the source of a wrong function, the check it must fail, words its hint
must contain, and words no hint of its exercise may show (hints of mistakes it did not
make). One mistake is one cause, and costs one check: graded on every check of its
exercise, hidden ones included, it loses points on no other check but those named in
`also`, each with the reason it is a cause of its own. Many come from real students' notes.
`tests/test_mistakes.py` grades every entry and holds the checks to it; `python -m grader
mistakes` prints the catalogue.
"""

import importlib
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Mistake:
    """A wrong implementation and how the checks must answer it."""

    source: str  # the whole wrong function, as a student would write it
    fails: str  # the check that must fail
    hint_mentions: str  # words the hint of that check must contain
    seen_in: str = ""  # where the mistake was seen
    hints_never: tuple[str, ...] = ()  # words no failed check of the exercise may hint
    also: dict[str, str] = field(default_factory=dict)  # other checks it costs, and why each
    # is a cause of its own


def variant(template: str, right: dict[str, str], **changes: str) -> str:
    """Return `template` with each `<<NAME>>` replaced by its right code, or by `changes`."""
    source = template
    for name, code in {**right, **changes}.items():
        source = source.replace(f"<<{name}>>", code)
    return source


class Catalogued(Protocol):
    """An exercise of the manifest, as far as its mistakes go."""

    mistakes: str  # the module of its catalogue


def mistakes_of(exercise: Catalogued) -> dict[str, Mistake]:
    """Return the exercise's catalogued mistakes by name."""
    module = importlib.import_module(exercise.mistakes)
    return {name: m for name, m in vars(module).items() if isinstance(m, Mistake)}
