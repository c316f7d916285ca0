"""The lab's texts: its messages in the reader's language, through gettext, for the grader and
for the lab's own library (dplab) alike. It imports neither of them, and both import it.

Every message a student or an instructor reads is written in English in the code and looked up
here: `_("...")` where it is made, `N_("...")` where a constant is defined (looked up where it
is shown), and the checks' docstrings and hints, which are looked up where they are shown.
Messages with values use named fields, filled after the lookup: `_("got {got}").format(got=x)`,
never an f-string, so that the text looked up is the same whatever the values.

The translations are `i18n/<language>/messages/*.po` (one file per part of the lab); `make`
compiles them into `labtext/locale/<language>/LC_MESSAGES/lab.mo`. The language:

- a notebook's own (`metadata.lab.language`, which the translated notebooks carry) for what is
  said about that notebook, and in the kernel that runs it;
- otherwise `--lang` of the command line, else `LAB_LANG`, else the locale (`LC_ALL`,
  `LC_MESSAGES`, `LANG`): Chinese for `zh*`, English for anything else.
"""

import contextlib
import functools
import gettext
import json
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from labtext import settings

DOMAIN = "lab"
LANGUAGES = ("en", "zh_CN")  # English is the source; the others have catalogues
PACKAGE = Path(__file__).resolve().parent
LOCALE = PACKAGE / "locale"  # the compiled catalogues
SOURCES = PACKAGE.parent / "i18n"  # i18n/<language>/messages/*.po, in a checkout
PACKAGES = ("dplab", "grader", "labtext")  # the code whose messages the catalogues hold

_chosen: str | None = None  # --lang, for the whole run
_speaking: ContextVar[str | None] = ContextVar("lab_language", default=None)


def known(language: str | None) -> str | None:
    """Return the lab's name for `language` (zh_CN for zh, zh-CN, zh_CN.UTF-8...), or None."""
    if not language:
        return None
    name = language.split(".")[0].split("@")[0].replace("-", "_")
    if name.lower() in ("c", "posix"):
        return "en"
    if name.lower().startswith("zh"):
        return "zh_CN"
    if name.lower().startswith("en"):
        return "en"
    return None


def choose(language: str | None) -> None:
    """Set the language of the whole run (the command line's --lang); None forgets it.

    Raise ValueError for a language the lab does not have, naming those it has."""
    global _chosen
    if language is not None and known(language) is None:
        raise ValueError(
            _("no language called {name}: the lab speaks {languages}").format(
                name=repr(language), languages=", ".join(LANGUAGES)
            )
        )
    _chosen = known(language)


def kernel_notebook() -> Path | None:
    """Return the notebook that this Jupyter kernel runs, where Jupyter says it (`__session__`,
    which ipykernel sets from JPY_SESSION_NAME, else JPY_SESSION_NAME itself); None outside
    a kernel."""
    ipython = sys.modules.get("IPython")  # (never imported here: a kernel has it already)
    shell = ipython.get_ipython() if ipython is not None else None
    session = shell.user_ns.get("__session__") if shell is not None else None
    session = session or settings.SESSION.get()
    if not isinstance(session, str) or not session:
        return None
    path = Path(session)
    for candidate in (path, Path.cwd() / path.name):  # (a kernel runs in its notebook's folder)
        if candidate.suffix == ".ipynb" and candidate.is_file():
            return candidate
    return None


@functools.cache
def file_language(path: Path) -> str | None:
    """Return the language the notebook at `path` was released in, if any (read once)."""
    try:
        return notebook_language(json.loads(path.read_bytes()))
    except (OSError, ValueError, AttributeError):
        return None


def kernel_language() -> str | None:
    """Return the language of the notebook this kernel runs, if it was released in one."""
    path = kernel_notebook()
    return file_language(path) if path is not None else None


def default_language() -> str:
    """Return the run's language: --lang, else that of the notebook this kernel runs, else
    LAB_LANG, else the locale's, else English."""
    if _chosen:
        return _chosen
    in_kernel = kernel_language()
    if in_kernel:
        return in_kernel
    lab = settings.LANGUAGE.get()
    if lab:
        return known(lab) or "en"
    for locale in settings.LOCALE:
        value = locale.get()
        if value:
            return known(value) or "en"
    return "en"


def current() -> str:
    """Return the language messages are made in here and now."""
    return _speaking.get() or default_language()


@contextlib.contextmanager
def speaking(language: str | None) -> Iterator[None]:
    """Make messages in `language` within the block (None: the run's language)."""
    token = _speaking.set(known(language) if language else None)
    try:
        yield
    finally:
        _speaking.reset(token)


def notebook_language(notebook: dict) -> str | None:
    """Return the language a notebook was released in (its `metadata.lab.language`), if any."""
    lab = (notebook.get("metadata") or {}).get("lab") or {}
    language = lab.get("language") if isinstance(lab, dict) else None
    return known(language) if isinstance(language, str) else None


def compiled(language: str) -> Path:
    return LOCALE / language / "LC_MESSAGES" / f"{DOMAIN}.mo"


def sources(language: str) -> list[Path]:
    """Return the `.po` files of `language`, in a checkout (none in an installed copy): those
    of i18n/<language>/messages/, and of i18n/<language>/hidden/ where the hidden checks are
    (their messages stay out of the students' image, as the checks do)."""
    folder = SOURCES / language
    return sorted(folder.glob("messages/*.po")) + sorted(folder.glob("hidden/*.po"))


def read_sources(language: str):
    """Return one Babel catalogue holding every message of `language`'s `.po` files."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    merged = Catalog(locale=language, domain=DOMAIN)
    for path in sources(language):
        with path.open("rb") as f:
            for message in read_po(f, locale=language):
                if message.id:
                    merged[message.id] = message
    return merged


def compile_catalogues() -> list[Path]:
    """Compile each language's `.po` files into one `.mo` file; return the files written."""
    from babel.messages.mofile import write_mo

    written = []
    for language in LANGUAGES[1:]:
        target = compiled(language)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as f:
            write_mo(f, read_sources(language))
        written.append(target)
    catalogue.cache_clear()
    return written


@functools.cache
def catalogue(language: str) -> gettext.NullTranslations:
    """Return `language`'s translations: the compiled file, or, where it was never compiled
    or is older than its sources (a checkout used without `make`), the `.po` files read
    directly."""
    if language == "en":
        return gettext.NullTranslations()
    path = compiled(language)
    newest = max((p.stat().st_mtime for p in sources(language)), default=0.0)
    if path.exists() and path.stat().st_mtime >= newest:
        with path.open("rb") as f:
            return gettext.GNUTranslations(f)
    if sources(language):
        return _Table(
            {k: v for path in sources(language) for k, v in po_messages(path).items() if v}
        )
    return gettext.NullTranslations()


class _Table(gettext.NullTranslations):
    """Translations from a table, as read from `.po` files."""

    def __init__(self, table: dict[str, str]) -> None:
        super().__init__()
        self._table = table

    def gettext(self, message: str) -> str:
        return self._table.get(message, message)


def po_messages(path: Path) -> dict[str, str]:
    """Return a `.po` file's translations, msgid to msgstr, read without Babel (which the
    lab's Python may lack, as on a GPU server's own PyTorch). The lab's catalogues have no
    plurals and no contexts; their strings use C's escapes, which Python's literals share."""
    import ast

    table: dict[str, str] = {}
    entry: dict[str, list[str]] = {}
    field = None

    def flush() -> None:
        if "msgid" in entry and "msgstr" in entry and "".join(entry["msgid"]):  # not the header
            table["".join(entry["msgid"])] = "".join(entry["msgstr"])
        entry.clear()

    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            if entry.get("msgstr") is not None and not line:
                flush()
            continue
        if line.startswith(("msgid ", "msgstr ")):
            field, _, line = line.partition(" ")
            if field == "msgid" and "msgstr" in entry:
                flush()
            entry[field] = []
        if field and line.startswith('"'):
            entry[field].append(ast.literal_eval(line))
    flush()
    return table


def _(message: str) -> str:
    """Return `message` in the current language (itself where there is no translation)."""
    if not message:
        return message
    language = current()
    if language == "en":
        return message
    return catalogue(language).gettext(message)


def N_(message: str) -> str:
    """Mark a message to be translated where it is shown; return it unchanged."""
    return message


def translate(language: str | None, message: str) -> str:
    """Return `message` in `language` (None: the current one)."""
    with speaking(language):
        return _(message)
