"""Every setting the lab reads from the environment is declared in one module per package
(dplab/settings.py, grader/settings.py), read nowhere else, and listed in docs/settings.md."""

import re
from pathlib import Path

import dplab.settings
import grader.settings

REPO = Path(__file__).resolve().parent.parent
SETTINGS = (*dplab.settings.ALL, *grader.settings.ALL)
READS = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["'](DPLAB|GRADER)_""")


def test_the_settings_modules_declare_every_variable_once():
    names = [s.name for s in SETTINGS]
    assert len(names) >= 14 and len(set(names)) == len(names), names
    assert all(s.help for s in SETTINGS)


def test_no_other_module_reads_a_setting_from_the_environment():
    readers = [
        f"{path.relative_to(REPO)}:{n}"
        for package in ("dplab", "grader")
        for path in (REPO / package).rglob("*.py")
        if path.name != "settings.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if READS.search(line)
    ]
    assert not readers, "read the environment through dplab.settings or grader.settings: " + str(
        readers
    )


def test_docs_list_every_setting_with_its_default():
    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    missing = [s.name for s in SETTINGS if f"`{s.name}`" not in text]
    assert not missing, f"docs/settings.md does not list {missing}"
