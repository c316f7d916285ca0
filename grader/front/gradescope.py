"""Gradescope's autograder for the lab.

`python -m grader gradescope-bundle OUT.zip` writes the zip to upload: docker/gradescope/'s
`setup.sh` and `run_autograder` at its top, with the grader, its hidden checks, the reference
solutions, dplab, the translations and the lab's lock. Inside Gradescope, `run_autograder`
calls `python -m grader gradescope-run`, which grades the files in /autograder/submission and
writes /autograder/results/results.json (Gradescope's format: a score, and a test per check).
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import labtext
from grader.manifest import REPO, load_manifest
from labtext import _

# What the autograder needs of the repository (tracked files only: no virtual environment,
# no students' work, no tests).
BUNDLED = ("grader", "dplab", "labtext", "solutions", "exercises", "i18n", "requirements/lab.txt",
           "pyproject.toml", "LICENSE")  # fmt: skip
AT_THE_TOP = ("setup.sh", "run_autograder")  # Gradescope looks for these at the zip's top


def bundled_files() -> list[str]:
    """The repository's tracked files that go into the autograder."""
    listed = subprocess.run(
        ["git", "ls-files", "--", *BUNDLED], cwd=REPO, capture_output=True, text=True
    )
    if listed.returncode != 0 or not listed.stdout.strip():
        raise FileNotFoundError(
            _("the autograder is made from a checkout of the lab's repository ({error})").format(
                error=listed.stderr.strip() or "git ls-files found none of its files"
            )
        )
    return [f for f in listed.stdout.splitlines() if (REPO / f).is_file()]


def write_bundle(out: Path) -> list[str]:
    """Write the autograder's zip to `out`; return the names in it."""
    names = []
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name in AT_THE_TOP:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16  # executable, as Gradescope runs them
            z.writestr(info, (REPO / "docker" / "gradescope" / name).read_bytes())
            names.append(name)
        for name in bundled_files():
            z.write(REPO / name, name)
            names.append(name)
    return names


def student_of(metadata: Path | None) -> str:
    """The submitter's id from Gradescope's submission_metadata.json (their email), so that each
    student's random inputs differ; 'submission' where there is none."""
    try:
        users = json.loads(Path(metadata).read_text(encoding="utf-8"))["users"]
        return str(users[0].get("email") or users[0].get("name") or users[0]["id"])
    except (TypeError, OSError, ValueError, KeyError, IndexError, AttributeError):
        return "submission"


# Folders that hold no one's work: Jupyter's autosaves, macOS's zip metadata, version control.
NOT_WORK = (".ipynb_checkpoints", "__MACOSX", ".git")


def notebook_folder(submission: Path, notebooks: list[str]) -> Path:
    """The folder under `submission` to grade: the one with the most of the lab's notebooks by
    name (nearest the top on a tie), then the nearest with any notebook. A student who zips
    `work/` rather than its notebooks is graded the same."""
    found: dict[Path, list[str]] = {}
    for path in sorted(submission.rglob("*.ipynb")):
        relative = path.relative_to(submission).parts
        if path.is_file() and not set(relative[:-1]) & set(NOT_WORK):
            found.setdefault(path.parent, []).append(path.name)
    if not found:
        return submission

    def rank(folder: Path) -> tuple[int, int]:
        named = sum(name in notebooks for name in found[folder])
        return -named, len(folder.relative_to(submission).parts)

    return min(found, key=rank)


def nothing_to_grade(message: str) -> dict:
    """results.json for a submission that holds nothing the grader can judge: one message."""
    return {"score": 0, "output": message, "stdout_visibility": "hidden", "tests": []}


def run(submission: Path, results: Path, metadata: Path | None = None, seed: int = 0) -> int:
    """Grade the files in `submission`; write Gradescope's results.json to `results`."""
    from grader.grading import GradeOptions, grade_submission
    from grader.load.submission import find_submission
    from grader.report.exports import gradescope_results
    from grader.report.paths import write_report

    manifest = load_manifest()
    submission = Path(submission)
    folder = notebook_folder(submission, list(manifest.notebooks))
    sub = find_submission(folder, manifest)
    if folder != submission and sub.notebooks:
        with labtext.speaking(sub.language):
            sub.notes.insert(
                0,
                _("The notebooks graded are those in {folder} of your upload.").format(
                    folder=folder.relative_to(submission).as_posix()
                ),
            )
    notebooks = ", ".join(manifest.notebooks)
    if not sub.notebooks:
        uploaded = sorted(
            p.relative_to(submission).as_posix() for p in submission.rglob("*") if p.is_file()
        )
        said = _(
            "This submission holds none of the lab's notebooks ({notebooks}); it has: {files}. "
            "Upload those notebooks, with the names they have in the lab."
        ).format(notebooks=notebooks, files=", ".join(uploaded) or _("no files"))
        write_report(results, json.dumps(nothing_to_grade(said), indent=2) + "\n")
        print(said)
        return 0
    sub.id = student_of(metadata)
    kills = memory_kills()
    # One notebook at a time: Gradescope's half a core gains nothing from more, and each
    # notebook's children side by side would hold their memory at once.
    result = grade_submission(sub, GradeOptions(seed=seed, hidden=True, at_once=1))
    if kills is not None and (memory_kills() or 0) > kills:
        # The kernel ended a child or a rank for the container's memory, not for the
        # student's code (the grader's own limits stop that first): the checks it cost are
        # not the student's to lose, so no score is written, as when the grader itself is
        # ended, and run_autograder has `gradescope-stopped` say why (KILLED).
        return KILLED[0]
    write_report(results, json.dumps(gradescope_results(result), indent=2) + "\n")
    print(f"{result.id}: {result.score:g}/{result.max_score:g}")
    return 0


KILLED = (137, -9)  # a shell's and Python's codes for a process ended by SIGKILL


def memory_kills() -> int | None:
    """How many processes the kernel's memory killer has ended in this process's cgroup (v1's
    memory.oom_control, v2's memory.events), None where neither says."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    groups = dict(line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    memory = next((path for names, path in groups.items() if "memory" in names.split(",")), None)
    if memory is not None:
        counted = Path(f"/sys/fs/cgroup/memory{memory}") / "memory.oom_control"
    elif "" in groups:
        counted = Path(f"/sys/fs/cgroup{groups['']}") / "memory.events"
    else:
        return None
    try:
        said = counted.read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in said if line.startswith("oom_kill ")), None)


def memory_limit() -> int | None:
    """The bytes of memory this container may use (its cgroup's limit), None where unlimited
    or unknown."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # cgroup v1 says "unlimited" with 2**63
            return int(text)
    return None


def stopped(submission: Path, results: Path, code: int, log: Path | None = None) -> str:
    """Where `gradescope-run` ended without writing results.json (killed, or crashed), write one
    that says so, why where it can tell, and what the instructor can do; return what it says.
    Results the grader did write are left alone."""
    from grader.load.submission import submission_language
    from grader.report.paths import write_report

    if results.exists():
        return ""
    manifest = load_manifest()
    folder = notebook_folder(Path(submission), list(manifest.notebooks))
    with labtext.speaking(submission_language(folder, manifest.assignment)):
        if code in KILLED:
            limit = memory_limit()
            lines = [
                _(
                    "The autograder stopped before it finished: the system ended the grader or "
                    "one of its processes, which under Gradescope most often means it ran out "
                    "of memory. Your work was not graded, and this score of 0 is not your grade."
                ),
                _("This autograder may use {memory} MB; grading needs about 2,300 MB.").format(
                    memory=f"{limit / 2**20:,.0f}"
                )
                if limit
                else _("Grading needs about 2,300 MB of memory."),
                _(
                    "Instructor: give the autograder 3 GB of memory or more in the assignment's "
                    "Autograder Settings (docs/grading.md), then regrade the submissions."
                ),
            ]
        else:
            lines = [
                _(
                    "The autograder stopped with exit code {code} before it finished. Your work "
                    "was not graded, and this score of 0 is not your grade."
                ).format(code=code)
            ]
            try:
                tail = Path(log).read_text(errors="replace").strip().splitlines()[-15:]
            except (TypeError, OSError):
                tail = []
            if tail:
                lines += [_("Its last lines:"), *tail]
            lines.append(_("Instructor: regrade the submission once the cause is mended."))
    said = "\n".join(lines)
    write_report(results, json.dumps(nothing_to_grade(said), indent=2) + "\n")
    return said
