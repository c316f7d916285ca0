"""Work out what a submission is: which notebook files hold which exercises."""

import ast
from dataclasses import dataclass, field
from pathlib import Path

import labtext
from dplab.notebook import read_code_cells
from grader.load.notebook import NotebookError, read_cells, strip_magics
from grader.manifest import Exercise, Manifest
from labtext import _


@dataclass
class Submission:
    """One student's work: an id, its notebooks by manifest name, and what to grade."""

    id: str
    path: Path
    notebooks: dict[str, Path]
    exercises: list[Exercise]
    notes: list[str] = field(default_factory=list)
    language: str = "en"  # what is said about it is said in this language (see labtext)


def submission_language(path: Path, assignment: str) -> str:
    """Return the language to speak of the submission at `path` in: that of its notebooks
    when they were released in one (the Chinese notebooks), else the run's language."""
    if path.is_file():
        candidates = [path]
    else:
        candidates = sorted(p for f in (path, path / assignment) for p in f.glob("*.ipynb"))
    for candidate in candidates:
        try:
            import json

            language = labtext.notebook_language(json.loads(candidate.read_bytes()))
        except (OSError, ValueError, AttributeError):
            continue
        if language:
            return language
    return labtext.default_language()


def defined_functions(path: Path) -> set[str]:
    """Return the names of the functions and classes (an exercise may ask for a class) that a
    notebook defines at top level (without running it)."""
    names: set[str] = set()
    try:
        cells = read_cells(path)
    except NotebookError:
        return names
    for source in cells:
        try:
            tree = ast.parse(strip_magics(source)[0])
        except SyntaxError:
            continue
        defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        names |= {n.name for n in tree.body if isinstance(n, defined)}
    return names


def best_match(path: Path, manifest: Manifest, candidates: list[str]) -> str | None:
    """Return the manifest notebook whose exercise functions `path` defines most of."""
    defined = defined_functions(path)
    shared = {
        f
        for f in (ex.function for ex in manifest.exercises)
        if sum(ex.function == f for ex in manifest.exercises) > 1
    }
    scores = {
        nb: len({ex.function for ex in manifest.in_notebook(nb)} & defined - shared)
        for nb in candidates
    }
    best = max(scores, key=scores.get, default=None)
    return best if best is not None and scores[best] > 0 else None


def submission_id(path: Path, manifest: Manifest) -> str:
    """Name a submission after its folder (skipping a folder named after the assignment)."""
    path = path.resolve()
    if path.is_file():
        return path.stem
    if path.name == manifest.assignment and path.parent.name:
        return path.parent.name
    return path.name


def find_submission(path: str | Path, manifest: Manifest) -> Submission:
    """Return the submission at `path`: a notebook file, or a folder of exercise notebooks."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            _("{path} does not exist: give a notebook or a folder of notebooks").format(path=path)
        )
    language = submission_language(path, manifest.assignment)
    sub = Submission(submission_id(path, manifest), path, {}, [], language=language)
    with labtext.speaking(language):
        return _found(sub, path, manifest)


def _found(sub: Submission, path: Path, manifest: Manifest) -> Submission:
    graded_as = _("{file} was graded as {notebook}, whose functions it defines")
    if path.is_file():
        name = (
            path.name
            if path.name in manifest.notebooks
            else best_match(path, manifest, manifest.notebooks)
        )
        if name is None:
            sub.notes.append(
                _(
                    "{file} is not one of the lab's notebooks ({notebooks}) and defines none of "
                    "their functions; it was graded against every exercise"
                ).format(file=path.name, notebooks=", ".join(manifest.notebooks))
            )
            sub.notebooks = dict.fromkeys(manifest.notebooks, path)
            sub.exercises = list(manifest.exercises)
            return sub
        if name != path.name:
            sub.notes.append(graded_as.format(file=path.name, notebook=name))
        sub.notebooks = {name: path}
        sub.exercises = manifest.in_notebook(name)
        return sub
    folders = [path, path / manifest.assignment]
    for name in manifest.notebooks:
        for folder in folders:
            if (folder / name).is_file():
                sub.notebooks[name] = folder / name
                break
    missing = [nb for nb in manifest.notebooks if nb not in sub.notebooks]
    others = sorted(
        {p for folder in folders if folder.is_dir() for p in folder.glob("*.ipynb")}
        - set(sub.notebooks.values())
    )
    for other in others:
        if missing and (name := best_match(other, manifest, missing)):
            sub.notebooks[name] = other
            missing.remove(name)
            sub.notes.append(graded_as.format(file=other.name, notebook=name))
    for name in missing:
        sub.notes.append(
            _("{notebook} is missing from {path}: its exercises score 0").format(
                notebook=name, path=path
            )
        )
    sub.exercises = list(manifest.exercises)
    return sub


def unfit_notebooks(sub: Submission, manifest: Manifest) -> list[str]:
    """Say what keeps each of the submission's files from being checked at all (see
    `unfit_by_notebook`). An empty list: every one can be checked."""
    return list(unfit_by_notebook(sub, manifest).values())


def unfit_by_notebook(sub: Submission, manifest: Manifest) -> dict[Path, str]:
    """Return, by file, what keeps each of the submission's files that cannot be checked at
    all from being checked: a file that is not a notebook, or a notebook that is not the
    lab's (none of the graded cells and none of the functions of the notebooks it stands
    for)."""
    found: dict[Path, str] = {}
    for path in dict.fromkeys(sub.notebooks.values()):
        names = [name for name, p in sub.notebooks.items() if p == path]
        try:
            cells = read_code_cells(path)
        except NotebookError as error:
            found[path] = str(error)
            continue
        functions = {ex.function for ex in sub.exercises if ex.notebook in names}
        ours = any(label.startswith(f"`{ex.id}-") for _, label in cells for ex in sub.exercises)
        if not functions or ours or functions & defined_functions(path):
            continue
        if len(names) == 1:
            said = _(
                "{file} is not the lab's notebook: it has none of {notebook}'s graded cells and "
                "defines none of its functions ({functions}); write your code in the lab's "
                "notebooks (in your work folder) and check those"
            )
        else:
            said = _(
                "{file} is not one of the lab's notebooks ({notebook}): it has none of their "
                "graded cells and defines none of their functions ({functions}); write your "
                "code in the lab's notebooks (in your work folder) and check those"
            )
        found[path] = said.format(
            file=path.name, notebook=", ".join(names), functions=", ".join(sorted(functions))
        )
    return found


# Under a class's hub, nbgrader's collect (hub/lab_exchange.py) sets a submission that one
# student's account handed in under another student's name aside in this folder of the course,
# beside `submitted/`: forged/<maker>/<assignment>/<the exchange's folder name>, which starts
# with the name it claimed. The student it named keeps their own submission. A submission that
# collect refuses (a link, a device, another's file in it: see `unsafe_entry`) is set aside
# there too, whoever it names, without what it refused.
SET_ASIDE = "forged"


def handed_in_as_another(maker: str, claimed: str, assignment: str, path: str | Path) -> str:
    """The one line that says a submission was set aside: `maker`'s account handed it in as
    `claimed`."""
    return _(
        "{maker}'s account handed in {assignment} as {claimed}: set aside in {path}, "
        "not taken as {claimed}'s"
    ).format(maker=maker, claimed=claimed, assignment=assignment, path=path)


def refused_submission(
    maker: str, claimed: str, assignment: str, why: str, path: str | Path
) -> str:
    """The one line that says collect refused a submission that `maker`'s account handed in as
    `claimed`, and `why` (see `unsafe_entry`): it is not taken as `claimed`'s, and what of it
    could be copied without following a link was set aside in `path`."""
    return _(
        "{maker}'s account handed in {assignment} as {claimed}, refused: {why}; set aside in "
        "{path}, not taken as {claimed}'s"
    ).format(maker=maker, claimed=claimed, assignment=assignment, why=why, path=path)


# What collect refuses to find in a submission (see `unsafe_entry`)
LINK, HARD_LINK, OTHERS, DEVICE, FIFO, SOCKET, NOT_A_FOLDER = (
    "link", "hard link", "others'", "device", "fifo", "socket", "not a folder",
)  # fmt: skip


def unsafe_entry(kind: str, path: str, account: str = "", target: str = "") -> str:
    """Why collect refuses a submission: `path`, in it, is a `kind` of thing (LINK to `target`,
    HARD_LINK to a file of `account`, OTHERS: owned by `account`, ...) that it never copies."""
    said = {
        LINK: _("{path} is a symbolic link (to {target})"),
        HARD_LINK: _("{path} is a hard link to a file of {account}"),
        OTHERS: _("{path} belongs to {account}, not to the account that handed it in"),
        DEVICE: _("{path} is a device file"),
        FIFO: _("{path} is a named pipe (FIFO)"),
        SOCKET: _("{path} is a socket"),
        NOT_A_FOLDER: _("{path} is not a folder"),
    }[kind]
    return said.format(path=path, account=account, target=target)


def unchecked_owners(count: int, assignment: str, accounts: list[str]) -> str:
    """The one line that says collect could not tell who made `count` submissions: their
    `accounts` are no student's lab account."""
    return _(
        "{count} submission(s) of {assignment} were made by accounts that are no student's "
        "lab account ({accounts}): who made them could not be checked"
    ).format(count=count, assignment=assignment, accounts=", ".join(accounts))


def not_your_name(name: str, given: str) -> str:
    """Why a student's lab refuses to submit under `given`: the hub knows them as `name`."""
    return _("you are {name} on this hub: a submission carries your own name, not {given}").format(
        name=name, given=given
    )


def set_aside_beside(class_folder: str | Path, assignment: str) -> list[str]:
    """Say, one line each, which submissions collect set aside beside nbgrader's `submitted/`
    folder at `class_folder` (see SET_ASIDE); none where it set none aside."""
    folder = Path(class_folder).parent / SET_ASIDE
    lines = []
    for found in sorted(folder.glob(f"*/{assignment}/*+{assignment}+*")):
        claimed = found.name.split(f"+{assignment}+")[0]
        maker = found.parent.parent.name
        if claimed == maker:  # (a submission of their own that collect refused: it said why)
            continue
        lines.append(handed_in_as_another(maker, claimed, assignment, found))
    return lines
