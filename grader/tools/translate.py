"""A language's edition of the notebooks: the English source plus `i18n/<language>/`.

`solutions/<assignment>/*.ipynb` are the one source of every notebook. A translation file,
`i18n/<language>/<notebook stem>.toml`, holds an entry per cell (by the cell's id) with the
digest of the English text it translates: a Markdown cell's whole `text`, or a code cell's
`lines` (English line, translated line), its comments, docstrings and what it prints.
`translated` builds a notebook from them; `problems` lists what is missing or stale.
`python -m grader translate LANGUAGE FOLDER` writes the translated reference notebooks,
which `make exercises` hands to nbgrader for that language's release. i18n/README.md says
more.
"""

import copy
import hashlib
import json
import tomllib
from pathlib import Path

from grader.manifest import REPO, load_manifest, solutions_dir
from labtext import _

LANGUAGES = ("zh_CN",)


def digest(source: str) -> str:
    """Return the digest a translation records of the English text it translates."""
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def translation_file(language: str, notebook: str) -> Path:
    return REPO / "i18n" / language / f"{Path(notebook).stem}.toml"


def entries(language: str, notebook: str) -> dict[str, dict]:
    """Return the translation entries of `notebook` by cell id ({} if it has no file)."""
    path = translation_file(language, notebook)
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        return tomllib.load(f)


def source_cells(notebook: str) -> list[dict]:
    """Return the English source notebook's cells."""
    return json.loads((solutions_dir() / notebook).read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def translation_problems(language: str, notebook: str) -> list[str]:
    """Say what keeps `notebook` from being translated whole and up to date."""
    found = []
    where = translation_file(language, notebook).relative_to(REPO)
    known = entries(language, notebook)
    cells = {c.get("id"): c for c in source_cells(notebook)}
    for cell_id in known:
        if cell_id not in cells:
            found.append(
                _("{file}: [{cell}] is not a cell of {notebook}").format(
                    file=where, cell=cell_id, notebook=notebook
                )
            )
    for cell_id, cell in cells.items():
        entry = known.get(cell_id)
        if entry is None:
            if cell["cell_type"] == "markdown":
                found.append(
                    _("{file}: Markdown cell {cell} of {notebook} is not translated").format(
                        file=where, cell=cell_id, notebook=notebook
                    )
                )
            continue
        if entry.get("english") != digest(_text(cell)):
            found.append(
                _(
                    "{file}: [{cell}] translates an older text of that cell: translate it "
                    'again and set english = "{digest}"'
                ).format(file=where, cell=cell_id, digest=digest(_text(cell)))
            )
        if cell["cell_type"] == "markdown" and not str(entry.get("text", "")).strip():
            found.append(
                _("{file}: [{cell}] is a Markdown cell and has no text").format(
                    file=where, cell=cell_id
                )
            )
        lines = _text(cell).splitlines()
        for pair in entry.get("lines", []):
            if len(pair) != 2 or pair[0] not in lines:
                found.append(
                    _("{file}: [{cell}] has no line {line}").format(
                        file=where, cell=cell_id, line=repr(pair[0])
                    )
                )
    return found


def translated(language: str, notebook: str) -> dict:
    """Return the source notebook in `language` (raise ValueError if `problems` finds any)."""
    wrong = translation_problems(language, notebook)
    if wrong:
        raise ValueError("\n".join(wrong))
    nb = json.loads((solutions_dir() / notebook).read_text(encoding="utf-8"))
    known = entries(language, notebook)
    for cell in nb["cells"]:
        entry = known.get(cell.get("id"))
        if entry is None:
            continue
        if "text" in entry:
            text = entry["text"].strip("\n")
        else:
            replace = dict(entry.get("lines", []))
            text = "\n".join(replace.get(line, line) for line in _text(cell).split("\n"))
        cell["source"] = text.splitlines(keepends=True)
    nb["metadata"] = copy.deepcopy(nb.get("metadata", {}))
    nb["metadata"].setdefault("lab", {})["language"] = language
    return nb


def write_edition(language: str, folder: Path) -> list[Path]:
    """Write the translated reference notebooks into `folder`/<assignment>/; return them."""
    manifest = load_manifest()
    target = folder / manifest.assignment
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in manifest.notebooks:
        path = target / notebook
        nb = translated(language, notebook)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written
