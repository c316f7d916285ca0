"""The grader's messages in Chinese: every message has a translation that keeps its fields and
the glossary's terms, and the text the code looks up is a literal that extraction can see."""

import ast
import re
import sys
import tomllib

import pytest

import labtext
from grader.manifest import REPO
from grader.tools import messages

LANGUAGE = "zh_CN"
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def catalogue():
    return labtext.read_sources(LANGUAGE)


@pytest.fixture(scope="module")
def wanted():
    return messages.every_message()


def test_every_message_has_a_chinese_translation_with_the_same_fields():
    """The catalogue lacks nothing, has no stale entry, and keeps every `{field}`."""
    assert messages.catalogue_problems(LANGUAGE) == []


def test_the_hidden_checks_messages_stay_out_of_the_students_catalogues():
    """What only the hidden checks say is translated in i18n/zh_CN/hidden/, which the lab's
    image leaves out as it leaves out the checks; nothing public is kept there."""
    assert messages.hidden_only()
    assert messages.misplaced(LANGUAGE) == []


def test_each_message_is_translated_in_one_place():
    """Two catalogues translating the same message could say it two ways; which one is used
    would depend on the order the files are read in."""
    from babel.messages.pofile import read_po

    where: dict[str, list[str]] = {}
    for path in labtext.sources(LANGUAGE):
        with path.open("rb") as f:
            for entry in read_po(f):
                if entry.id:
                    where.setdefault(entry.id, []).append(path.name)
    assert {text: files for text, files in where.items() if len(files) > 1} == {}


def test_every_location_a_catalogue_gives_is_still_there():
    """A translator follows `#:` to the code: each names a file of the lab, or a check by
    exercise/name, that exists (`python -m grader messages locations` refreshes them)."""
    from babel.messages.pofile import read_po

    from grader.judge.registry import exercise_checks, hidden_available
    from grader.manifest import load_manifest

    checks = {
        f"{ex.id}/{c.name}"
        for ex in load_manifest().exercises
        for c in exercise_checks(ex, include_hidden=hidden_available(ex))
    }
    gone = []
    for path in labtext.sources(LANGUAGE):
        with path.open("rb") as f:
            for entry in read_po(f):
                for where, _line in entry.locations:
                    if not (REPO / where).is_file() and where not in checks:
                        gone.append(f"{path.name}: {where} ({entry.id[:40]!r})")
    assert gone == [], "\n".join(gone)


def test_refreshing_the_locations_points_them_at_the_code_and_changes_nothing_else(
    tmp_path, monkeypatch
):
    source = REPO / "i18n" / LANGUAGE / "messages" / "core.po"
    text = source.read_text(encoding="utf-8")
    stale = text.replace("#: grader/base/cases.py:", "#: grader/base/moved_away.py:", 1)
    assert stale != text
    copy = tmp_path / "core.po"
    copy.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(messages, "sources", lambda language: [copy])
    assert messages.relocate(LANGUAGE) == [copy]
    refreshed = copy.read_text(encoding="utf-8")
    assert "moved_away" not in refreshed
    changed = [
        (old, new)
        for old, new in zip(stale.splitlines(), refreshed.splitlines(), strict=True)
        if old != new
    ]
    assert changed and all(old.startswith("#:") and new.startswith("#:") for old, new in changed)


def test_the_translations_are_chinese(catalogue, wanted):
    """A translation that is the English copied over is no translation (messages that are
    all code, such as a bare `{name}`, excepted)."""
    for text in wanted:
        words = re.sub(r"`[^`]*`|\{[^}]*\}", "", text)
        if re.search(r"[A-Za-z]{3,}(\s+[A-Za-z]{2,}){2,}", words):
            assert CJK.search(catalogue.get(text).string), text


def prose(text: str) -> str:
    """Return a message's prose: without code in backticks, fields and quoted code."""
    return re.sub(r"`[^`]*`|\{[^}]*\}|'[^']*'", " ", text).lower()


def test_the_glossarys_terms_are_used(catalogue, wanted):
    """Where an English message uses a term of the glossary in its prose, the Chinese uses the
    glossary's rendering; no message uses a rendering the glossary rules out."""
    glossary = tomllib.loads((REPO / "i18n" / LANGUAGE / "glossary.toml").read_text())["term"]
    wrong = []
    for text in wanted:
        chinese = catalogue.get(text).string if catalogue.get(text) else ""
        for term in glossary:
            wrong += [
                f"{avoid} in {chinese!r}" for avoid in term.get("avoid", []) if avoid in chinese
            ]
            if re.search(rf"\b{re.escape(term['english'].lower())}(s|es)?\b", prose(text)):
                if term["chinese"] not in chinese:
                    wrong.append(f"{term['english']} -> {term['chinese']}: {text!r} -> {chinese!r}")
    assert wrong == []


def looked_up(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("_", "N_")
    ]


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "grader").rglob("*.py")),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_message_is_built_before_it_is_looked_up(path):
    """`N_()` is given one string literal, and `_()` a literal or a value holding one (a
    constant marked with `N_`, a title of the manifest): an f-string, a `+`, a `%` or a
    `.format()` inside the call would look up text that no catalogue holds (the fields are
    filled after the lookup)."""
    for call in looked_up(ast.parse(path.read_text())):
        arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
        where = f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)}"
        assert arg is not None, where
        if call.func.id == "N_":
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), where
        built = [
            node
            for node in ast.walk(arg)
            if isinstance(node, ast.JoinedStr | ast.BinOp)
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("format", "join")
            )
        ]
        assert not built, where


def test_a_message_is_looked_up_in_the_language_spoken(monkeypatch):
    """English by default, Chinese within `speaking("zh_CN")` or with LAB_LANG, and the
    notebook's own language first."""
    for name in ("LAB_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    entry = next(e for e in labtext.read_sources(LANGUAGE) if e.id and e.string)
    text, chinese = entry.id, entry.string
    assert labtext._(text) == text
    with labtext.speaking("zh_CN"):
        assert labtext._(text) == chinese
    monkeypatch.setenv("LAB_LANG", "zh_CN")
    assert labtext._(text) == chinese
    with labtext.speaking("en"):
        assert labtext._(text) == text
    monkeypatch.setenv("LAB_LANG", "")
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert labtext.default_language() == "zh_CN"
    monkeypatch.setenv("LC_ALL", "C")
    assert labtext.default_language() == "en"
    assert labtext.notebook_language({"metadata": {"lab": {"language": "zh_CN"}}}) == "zh_CN"
    assert labtext.notebook_language({"metadata": {}}) is None


def test_an_unknown_language_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="en, zh_CN"):
        labtext.choose("fr")


def test_the_compiled_catalogue_says_what_its_sources_say(tmp_path, monkeypatch):
    """`make` compiles the `.po` files into the `.mo` file that gettext reads."""
    monkeypatch.setattr(labtext, "LOCALE", tmp_path)
    labtext.compile_catalogues()
    try:
        compiled = labtext.catalogue(LANGUAGE)
        for entry in labtext.read_sources(LANGUAGE):
            if entry.id:
                assert compiled.gettext(entry.id) == entry.string
    finally:
        labtext.catalogue.cache_clear()


def test_the_po_files_read_without_babel_give_babels_translations(monkeypatch, tmp_path):
    """A checkout used without `make`, or a GPU server's own PyTorch without Babel: the
    translations come from the `.po` files as they are, the same as the compiled ones."""
    import labtext

    for language in labtext.LANGUAGES[1:]:
        babels = {m.id: m.string for m in labtext.read_sources(language) if m.id and m.string}
        ours = {}
        for path in labtext.sources(language):
            ours.update({k: v for k, v in labtext.po_messages(path).items() if v})
        assert ours == babels
    monkeypatch.setitem(sys.modules, "babel", None)  # import babel now fails
    monkeypatch.setattr(labtext, "compiled", lambda language: tmp_path / "never-compiled.mo")
    labtext.catalogue.cache_clear()
    try:
        message = next(iter(babels))
        assert labtext.translate(labtext.LANGUAGES[1], message) == babels[message] != message
    finally:
        labtext.catalogue.cache_clear()
