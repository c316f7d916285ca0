"""The grader's messages to translate, found in its code, and what each language still lacks.

    python -m grader messages missing [--language zh_CN]   messages with no translation yet
    python -m grader messages compile                      i18n/*/messages/*.po -> labtext/locale/
    python -m grader messages locations [--language zh_CN] point each `#:` at where the code
                                                           says the message now

A message is a string given to `_()` or `N_()` in the grader's code, a check's docstring,
hint or gate's reason, or an exercise's title in the manifest. `tests/test_messages.py` fails
on any message without a translation, on a translation whose `{fields}` differ from the
English, and on a translation left for a message the code no longer has.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from labtext import LANGUAGES, PACKAGE, PACKAGES, read_sources, sources

ROOT = PACKAGE.parent

FIELD = re.compile(r"\{(\w*)[^{}]*\}")


@dataclass(frozen=True)
class Message:
    text: str
    where: str  # file:line, or exercise/check for a check's docstring or hint


def in_code() -> list[Message]:
    """Return the strings given to `_()` or `N_()` in the lab's code (grader/ and dplab/)."""
    from babel.messages.extract import extract_from_dir

    found = []
    for package in PACKAGES:
        for filename, lineno, text, _comments, _context in extract_from_dir(
            str(ROOT / package),
            method_map=[("**.py", "python")],
            keywords={"_": None, "N_": None},
            comment_tags=(),
        ):
            if isinstance(text, str) and text:
                found.append(Message(text, f"{package}/{filename}:{lineno}"))
    return found


def of_checks() -> list[Message]:
    """Return every check's docstring and hint, public and hidden (where installed), and the
    exercises' titles in the manifest."""
    from grader.judge.registry import exercise_checks, hidden_available
    from grader.manifest import load_manifest

    found = [Message(ex.title, f"grader/manifest.toml:{ex.id}") for ex in load_manifest().exercises]
    for ex in load_manifest().exercises:
        for check in exercise_checks(ex, include_hidden=hidden_available(ex)):
            where = f"{ex.id}/{check.name}"
            found += [Message(t, where) for t in (check.doc, check.hint, check.because) if t]
    return found


def hidden_only() -> set[str]:
    """Return the messages that only the hidden checks say (their code in
    grader/exercises/*/private/, and their docstrings and hints): their translations stay
    with them, out of the students' image (i18n/<language>/hidden/)."""
    from grader.judge.registry import hidden_available, hidden_checks
    from grader.manifest import load_manifest

    said_in_hidden = {m.text for m in in_code() if "/private/" in m.where}
    for ex in load_manifest().exercises:
        if hidden_available(ex):
            said_in_hidden |= {
                t for c in hidden_checks(ex) for t in (c.doc, c.hint, c.because) if t
            }
    public = {m.text for m in in_code() if "/private/" not in m.where}
    public |= {m.text for m in of_checks() if m.text not in said_in_hidden}
    return said_in_hidden - public


def misplaced(language: str) -> list[str]:
    """Return the translations kept on the wrong side: a hidden check's message among the
    public catalogues (which students' copies hold), or a public one among the hidden."""
    from babel.messages.pofile import read_po

    private = hidden_only()
    found = []
    for path in sources(language):
        hidden_file = path.parent.name == "hidden"
        with path.open("rb") as f:
            for entry in read_po(f):
                if entry.id and (entry.id in private) != hidden_file:
                    side = "i18n/<language>/hidden/" if entry.id in private else "messages/"
                    found.append(f"{path.relative_to(ROOT)}: {entry.id!r} belongs in {side}")
    return found


def every_message() -> dict[str, str]:
    """Return each message with the first place it comes from."""
    messages: dict[str, str] = {}
    for m in in_code() + of_checks():
        messages.setdefault(m.text, m.where)
    return messages


def fields(text: str) -> list[str]:
    """Return the names of a message's `{fields}`, sorted (`{{` is a brace, not a field)."""
    return sorted(FIELD.findall(text.replace("{{", "").replace("}}", "")))


def catalogue_problems(language: str) -> list[str]:
    """Return what `language`'s catalogue lacks or gets wrong, one line each."""
    wanted = every_message()
    have = read_sources(language)
    found = []
    for text, where in wanted.items():
        entry = have.get(text)
        if entry is None or not entry.string or entry.fuzzy:
            found.append(f"{where}: no {language} translation of {text!r}")
        elif fields(entry.string) != fields(text):
            found.append(
                f"{where}: the {language} translation of {text!r} has the fields "
                f"{fields(entry.string)}, not {fields(text)}"
            )
    for entry in have:
        if entry.id and entry.id not in wanted:
            found.append(f"i18n/{language}: a translation of {entry.id!r}, which no code says")
    return found


def missing(language: str) -> list[Message]:
    """Return the messages that `language` has no translation of, in the code's order."""
    have = read_sources(language)
    return [
        Message(text, where)
        for text, where in every_message().items()
        if not (have.get(text) and have.get(text).string)
    ]


def as_po(messages: list[Message]) -> str:
    """Return `messages` as `.po` entries with empty translations, to fill in."""
    from io import BytesIO

    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog()
    for m in messages:
        path, _, line = m.where.partition(":")
        catalog.add(m.text, locations=[(path, int(line) if line.isdigit() else None)])
    out = BytesIO()
    write_po(out, catalog, omit_header=True, width=100)
    return out.getvalue().decode()


def relocate(language: str) -> list[Path]:
    """Rewrite the `#:` lines of `language`'s catalogues to where the code says each message
    now (a check's docstring or hint keeps its exercise/check); return the files changed.
    Nothing else in the files changes."""
    places: dict[str, list[str]] = {}
    for m in in_code():
        places.setdefault(m.text, []).append(m.where)
    changed = []
    for path in sources(language):
        text = path.read_text(encoding="utf-8")
        blocks = [_relocated(block, places) for block in text.split("\n\n")]
        if "\n\n".join(blocks) != text:
            path.write_text("\n\n".join(blocks), encoding="utf-8")
            changed.append(path)
    return changed


def _relocated(block: str, places: dict[str, list[str]]) -> str:
    """Return one `.po` entry with its `#:` lines naming `places` of its message, if any."""
    from io import BytesIO

    from babel.messages.pofile import read_po

    ids = [m.id for m in read_po(BytesIO(block.encode())) if m.id]
    if len(ids) != 1 or ids[0] not in places:
        return block
    lines = [line for line in block.split("\n") if not line.startswith("#:")]
    at = next(i for i, line in enumerate(lines) if line.startswith(("#,", "#|", "msgid")))
    wrapped: list[str] = []
    for where in places[ids[0]]:  # as Babel writes them: as many as fit in 100 characters
        if wrapped and len(wrapped[-1]) + 1 + len(where) <= 100:
            wrapped[-1] += " " + where
        else:
            wrapped.append("#: " + where)
    return "\n".join(lines[:at] + wrapped + lines[at:])


def main(command: str, language: str = "zh_CN", under: str | None = None) -> int:
    if command == "compile":
        from labtext import compile_catalogues

        for path in compile_catalogues():
            print(f"wrote {Path(path).relative_to(ROOT)}")
        return 0
    if language not in LANGUAGES[1:]:
        print(f"error: no catalogue for {language!r}; the lab has {', '.join(LANGUAGES[1:])}")
        return 2
    if command == "locations":
        for path in relocate(language):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    todo = [m for m in missing(language) if under is None or m.where.startswith(under)]
    print(as_po(todo), end="")
    return 1 if todo else 0
