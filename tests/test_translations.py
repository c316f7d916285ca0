"""The Chinese edition is the English source plus i18n/zh_CN/: complete, up to date, in the
glossary's terms, released by nbgrader like the English one, and graded the same."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import grader.translate as translate
from grader.manifest import REPO, load_manifest

MANIFEST = load_manifest()
LANGUAGE = "zh_CN"
GLOSSARY = REPO / "i18n" / LANGUAGE / "glossary.toml"


def glossary() -> list[dict]:
    with open(GLOSSARY, "rb") as f:
        return tomllib.load(f)["term"]


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_every_markdown_cell_has_a_current_translation(notebook):
    assert translate.problems(LANGUAGE, notebook) == []


def test_a_changed_english_cell_makes_its_translation_stale(tmp_path, monkeypatch):
    """Edit one Markdown cell of a copy of the source: its translation is named as older than
    the cell, and the notebook is not built until it is translated again."""
    shutil.copytree(REPO / "solutions" / MANIFEST.assignment, tmp_path / "src")
    path = tmp_path / "src" / "concise.ipynb"
    nb = json.loads(path.read_text())
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    first["source"] = ["# A new title\n"]
    path.write_text(json.dumps(nb))
    monkeypatch.setattr(translate, "solutions_dir", lambda: tmp_path / "src")
    (found,) = translate.problems(LANGUAGE, "concise.ipynb")
    assert f"[{first['id']}] translates an older text of that cell" in found
    with pytest.raises(ValueError, match="older text"):
        translate.translated(LANGUAGE, "concise.ipynb")


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_the_translation_changes_only_what_a_student_reads(notebook):
    """Code cells keep their code: only comments, docstrings and printed text change, and
    the cell ids, grade ids and points are the source's."""
    english = json.loads((REPO / "solutions" / MANIFEST.assignment / notebook).read_text())
    chinese = translate.translated(LANGUAGE, notebook)
    assert [c.get("id") for c in chinese["cells"]] == [c.get("id") for c in english["cells"]]
    for en, zh in zip(english["cells"], chinese["cells"], strict=True):
        assert en.get("metadata") == zh.get("metadata")
        if en["cell_type"] != "code":
            continue
        before, after = "".join(en["source"]).split("\n"), "".join(zh["source"]).split("\n")
        assert len(before) == len(after), en["id"]
        for old, new in zip(before, after, strict=True):
            if old != new:  # a changed line keeps its indentation and its code
                assert len(old) - len(old.lstrip()) == len(new) - len(new.lstrip()), new
                assert re.search(r"[\u4e00-\u9fff]", new), f"{en['id']}: {new!r}"


def chinese_text(notebook: str) -> str:
    cells = translate.translated(LANGUAGE, notebook)["cells"]
    return "\n".join("".join(c["source"]) for c in cells)


def english_prose(notebook: str) -> str:
    """Return the English notebook's Markdown cells (its code names things in English)."""
    cells = translate.source_cells(notebook)
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_the_glossarys_terms_are_used(notebook):
    """Where the English notebook's prose uses a term of the glossary, the Chinese one uses
    the glossary's rendering, and never one the glossary rules out."""
    english, chinese = english_prose(notebook).lower(), chinese_text(notebook)
    for term in glossary():
        for avoided in term.get("avoid", []):
            assert avoided not in chinese, f"{notebook} says {avoided}, not {term['chinese']}"
        if re.search(rf"\b{re.escape(term['english'].lower())}s?\b", english):
            assert term["chinese"] in chinese, f"{notebook}: {term['english']} never rendered"


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """The Chinese release as `make exercises` makes it, in a folder of its own."""
    root = tmp_path_factory.mktemp("zh")
    translate.write_edition(LANGUAGE, root / "solutions")
    nbgrader = Path(sys.executable).with_name("nbgrader")
    proc = subprocess.run(
        [
            str(nbgrader), "generate_assignment", MANIFEST.assignment, "--force", "--no-db",
            f"--CourseDirectory.source_directory={root / 'solutions'}",
            f"--CourseDirectory.release_directory={root / 'release'}",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "LAB_RELEASE_LANGUAGE": LANGUAGE},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return root / "release" / MANIFEST.assignment


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_the_chinese_release_is_what_nbgrader_makes_of_the_translation(released, notebook):
    """exercises/zh_CN/ is made, never edited: the translated source through nbgrader, with
    the stub in Chinese."""
    committed = REPO / "exercises" / LANGUAGE / MANIFEST.assignment / notebook
    assert json.loads(committed.read_text()) == json.loads((released / notebook).read_text()), (
        f"{committed.relative_to(REPO)} is out of date: run `make exercises`"
    )
    assert "写好这个函数，然后运行它的检查" in committed.read_text()


@pytest.mark.slow
def test_the_chinese_reference_is_graded_as_the_english_one(tmp_path):
    """The same code in the Chinese notebooks gets the same verdict on every check (the
    reference: full marks), its summary lines printed in Chinese included."""
    from grader.grading import grade_path

    translate.write_edition(LANGUAGE, tmp_path)
    result = grade_path(tmp_path / MANIFEST.assignment)
    failed = [
        (e.name, c.name, c.message) for e in result.exercises for c in e.checks if not c.passed
    ]
    assert failed == []
    assert result.score == result.max_score
