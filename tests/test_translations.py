"""The Chinese edition is the English source plus i18n/zh_CN/: complete, up to date, in
Chinese, in the glossary's terms, changing only what a student reads (the training functions'
summary lines printed in Chinese included), released by nbgrader like the English one, and
graded the same."""

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

import grader.tools.translate as translate
from grader.exercises.train_ddp import checks as train_ddp
from grader.exercises.train_loop import checks as train_loop
from grader.manifest import REPO, Exercise, load_manifest

MANIFEST = load_manifest()
LANGUAGE = "zh_CN"
GLOSSARY = REPO / "i18n" / LANGUAGE / "glossary.toml"


def glossary() -> list[dict]:
    with open(GLOSSARY, "rb") as f:
        return tomllib.load(f)["term"]


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_every_markdown_cell_has_a_current_translation(notebook):
    assert translate.translation_problems(LANGUAGE, notebook) == []


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
    (found,) = translate.translation_problems(LANGUAGE, "concise.ipynb")
    assert f"[{first['id']}] translates an older text of that cell" in found
    with pytest.raises(ValueError, match="older text"):
        translate.translated(LANGUAGE, "concise.ipynb")


# --- Markdown: the translation is written in Chinese -----------------------------------------

# What a student reads as prose: a cell less its code blocks, inline code, math, link targets,
# addresses and HTML tags, whose Latin letters are code or notation whatever the language.
NOT_PROSE = re.compile(
    r"^(```|~~~).*?^\1[^\n]*$"  # a fenced code block
    r"|(`+).+?\2"  # inline code
    r"|\$\$.+?\$\$|\$[^$\n]+\$"  # math
    r"|\]\([^)]*\)|<?https?://[^\s>)]+>?"  # a link's target, an address
    r"|<[^>\n]+>",  # an HTML tag
    re.DOTALL | re.MULTILINE,
)
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z]")

# A Markdown translation is Chinese when CJK characters make at least half of its prose's
# letters (CJK characters and Latin letters). Chinese says in one character about what English
# says in two or three letters (i18n/zh_CN/ has 0.4 characters per letter of the English it
# translates), so at one half a cell may keep the names written in Latin script (PyTorch,
# ResNet-18, rank, gloo: the most Latin of today's cells is 30% letters), while a cell that
# leaves a third of its English untranslated falls below, and English filler scores 0.
MOSTLY_CHINESE = 0.5
# And it says all the English says: today's cells have 0.32 to 0.51 Chinese characters per
# letter of the English cell's prose, so one with under 0.2 has left out about half the cell.
WHOLE = 0.2


def prose_letters(markdown: str) -> tuple[int, int]:
    """Return the CJK characters and the Latin letters of `markdown`'s prose."""
    prose = NOT_PROSE.sub(" ", markdown)
    return len(CJK.findall(prose)), len(LATIN.findall(prose))


def chinese_share(markdown: str) -> float:
    """Return the share of CJK characters among the letters of `markdown`'s prose (0 if none)."""
    chinese, latin = prose_letters(markdown)
    return chinese / (chinese + latin) if chinese + latin else 0.0


def markdown_problems(language: str, notebook: str) -> list[str]:
    """Name each Markdown translation of `notebook` whose prose is not mostly Chinese, or is
    too short to say what the English cell's prose says."""
    known = translate.entries(language, notebook)
    found = []
    for cell in translate.source_cells(notebook):
        entry = known.get(cell.get("id"), {})
        english = prose_letters("".join(cell["source"]))[1]
        if cell["cell_type"] != "markdown" or "text" not in entry or not english:
            continue
        where, share = f"{notebook} [{cell['id']}]", chinese_share(entry["text"])
        if share < MOSTLY_CHINESE:
            found.append(f"{where}: {share:.0%} of its letters are Chinese")
        elif prose_letters(entry["text"])[0] < WHOLE * english:
            found.append(f"{where}: too short to translate {english} letters of English")
    return found


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_every_markdown_translation_is_mostly_chinese_and_whole(notebook):
    assert markdown_problems(LANGUAGE, notebook) == []


def first_markdown(notebook: str) -> dict:
    return next(c for c in translate.source_cells(notebook) if c["cell_type"] == "markdown")


def test_english_filler_with_a_current_digest_is_not_a_translation(monkeypatch):
    """A cell "translated" into its own English, with the right digest, passes as complete and
    current, and is named as not Chinese."""
    cell = first_markdown("concise.ipynb")
    english = "".join(cell["source"])
    filler = {"english": translate.digest(english), "text": english}
    entries = {**translate.entries(LANGUAGE, "concise.ipynb"), cell["id"]: filler}
    monkeypatch.setattr(translate, "entries", lambda language, notebook: entries)
    assert translate.translation_problems(LANGUAGE, "concise.ipynb") == []
    assert markdown_problems(LANGUAGE, "concise.ipynb") == [
        f"concise.ipynb [{cell['id']}]: 0% of its letters are Chinese"
    ]


def test_a_translation_of_the_title_alone_is_not_whole(monkeypatch):
    """A Chinese cell that translates only the first line of a long English cell is named."""
    cell = first_markdown("concise.ipynb")
    entries = translate.entries(LANGUAGE, "concise.ipynb")
    title = entries[cell["id"]]["text"].strip().splitlines()[0]
    entries[cell["id"]] = {**entries[cell["id"]], "text": title}
    monkeypatch.setattr(translate, "entries", lambda language, notebook: entries)
    assert translate.translation_problems(LANGUAGE, "concise.ipynb") == []
    (found,) = markdown_problems(LANGUAGE, "concise.ipynb")
    assert found.startswith(f"concise.ipynb [{cell['id']}]: too short to translate")


@pytest.mark.parametrize(
    "text",
    [
        "用`torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])`包装模型。",
        "见[文档](https://pytorch.org/docs/stable/distributed.html)：$\\mathbf{g} = \\sum_i g_i$。",
        "在命令行中运行：\n\n```bash\ntorchrun --nproc-per-node 2 -m dplab.train_ddp --epochs 10\n```",
        "<details><summary>提示</summary>把<b>每个</b>参数复制到设备上。</details>",
    ],
)
def test_code_math_and_addresses_do_not_count_against_chinese(text):
    assert chinese_share(text) >= MOSTLY_CHINESE


@pytest.mark.parametrize(
    "text",
    [
        "# Training\n\nWrite `train(net, num_gpus)`: it trains the network on every device.",
        "## 2. 训练\n\n编写`train`。Then time each epoch with `d2l.Timer` and print the summary line.",
        "用`nn.DataParallel`训练。The model is copied to every GPU on each forward pass, which is slow.",
    ],
)
def test_english_or_half_translated_prose_is_not_chinese(text):
    assert chinese_share(text) < MOSTLY_CHINESE


# --- Code: a translation changes comments and strings, never code ----------------------------

LITERAL = "<literal>"
FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+
FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def replacement_fields(literal: str) -> list[str]:
    """Return the replacement fields of a string literal's source (an f-string's `{...}`)."""
    return [
        ast.unparse(ast.JoinedStr([node]))
        for node in ast.walk(ast.parse(literal.strip(), mode="eval"))
        if isinstance(node, ast.FormattedValue)
    ]


def code_tokens(source: str) -> list[tuple]:
    """Return `source`'s tokens as code reads them: without comments or blank-line breaks,
    each string literal (a run of adjacent ones being one) a placeholder that keeps only its
    f-string replacement fields, sorted, as a translation may reorder them."""
    offsets = [0]
    for line in io.StringIO(source).readlines():  # the lines as tokenize reads them
        offsets.append(offsets[-1] + len(line))

    def at(position: tuple[int, int]) -> int:
        return offsets[position[0] - 1] + position[1]

    kept: list[tuple] = []
    fields: list[str] = []
    fstring_start, depth = 0, 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if depth:  # inside an f-string (3.12+): wait for its end, then read it whole
            depth += (tok.type == FSTRING_START) - (tok.type == FSTRING_END)
            if depth:
                continue
            literal = source[fstring_start : at(tok.end)]
        elif tok.type == FSTRING_START:
            fstring_start, depth = at(tok.start), 1
            continue
        elif tok.type == tokenize.STRING:
            literal = tok.string
        else:
            literal = None
        if literal is not None:
            if not kept or kept[-1][0] != LITERAL:
                fields = []
                kept.append((LITERAL, fields))
            fields.extend(replacement_fields(literal))
            fields.sort()
        elif tok.type not in (tokenize.COMMENT, tokenize.NL):
            text = "" if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER) else tok.string
            kept.append((tok.type, text))
    return [(kind, tuple(value)) if kind == LITERAL else (kind, value) for kind, value in kept]


def changed_code(english: str, chinese: str) -> list[str]:
    """Say how a translated code cell differs from its English one other than in what a student
    reads: a line's indentation, a changed line without Chinese, or its code."""
    found = []
    before, after = english.split("\n"), chinese.split("\n")
    if len(before) != len(after):
        return [f"{len(after)} lines, the English has {len(before)}"]
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if len(old) - len(old.lstrip()) != len(new) - len(new.lstrip()):
            found.append(f"indented otherwise than the English: {new!r}")
        if not CJK.search(new):
            found.append(f"changed, with no Chinese in it: {new!r}")
    if code_tokens(english) != code_tokens(chinese):
        found.append("its code is not the English cell's")
    return found


@pytest.mark.parametrize("notebook", MANIFEST.notebooks)
def test_the_translation_changes_only_what_a_student_reads(notebook):
    """Code cells keep their code: only comments, docstrings and printed text change, and
    the cell ids, grade ids and points are the source's."""
    english = json.loads((REPO / "solutions" / MANIFEST.assignment / notebook).read_text())
    chinese = translate.translated(LANGUAGE, notebook)
    assert [c.get("id") for c in chinese["cells"]] == [c.get("id") for c in english["cells"]]
    for en, zh in zip(english["cells"], chinese["cells"], strict=True):
        assert en.get("metadata") == zh.get("metadata")
        if en["cell_type"] == "code":
            assert changed_code("".join(en["source"]), "".join(zh["source"])) == [], en["id"]


@pytest.mark.parametrize(
    ("english", "chinese"),
    [
        ("x = 1  # one\n", "x = 1  # 一\n"),
        ("# Copy the parameters\nparams = get_params(w)\n", "# 复制参数\nparams = get_params(w)\n"),
        (
            'def f():\n    """Return one,\n    always."""\n    return 1\n',
            'def f():\n    """返回1，\n    总是如此。"""\n    return 1\n',
        ),
        (
            "print(f'test acc: {acc:.2f}, {t:.1f} sec/epoch '\n      f'on {n} processes')\n",
            "print(f'测试精度：{acc:.2f}，{t:.1f}秒/轮，'\n      f'在{n}个进程上')\n",
        ),
        ("print(f'{n} of {total} done')\n", "print(f'共{total}个，完成{n}个')\n"),
        ("plt.xlabel('epoch')\n", 'plt.xlabel("迭代周期")\n'),
    ],
)
def test_translating_comments_docstrings_and_strings_keeps_the_code(english, chinese):
    assert changed_code(english, chinese) == []


CODE_CHANGED = "its code is not the English cell's"


@pytest.mark.parametrize(
    ("english", "chinese", "named"),
    [
        ("total = a+b\n", "total = a-b  # 和\n", CODE_CHANGED),
        ("n = 4  # four\n", "n = '四'\n", CODE_CHANGED),
        ("print('done')\n", "print('完成'); os.remove(path)\n", CODE_CHANGED),
        ("print(f'acc {history[-1]:.2f}')\n", "print(f'精度{history[0]:.2f}')\n", CODE_CHANGED),
        ("print(f'acc {acc:.2f}')\n", "print(f'精度{acc:.1f}')\n", CODE_CHANGED),
        (
            '"""Sum."""\nx = 1\n',
            '"""求和。"""\nx = 1  # 一\nif x: pass\n',
            "lines, the English has",
        ),
        (
            "for x in xs:\n    y = f(x)\n",
            "for x in xs:\n  y = f(x)  # 应用f\n",
            "indented otherwise",
        ),
        ("y = f(x)  # apply f\n", "y = f(x)  # apply f.\n", "with no Chinese in it"),
    ],
)
def test_a_translation_that_changes_the_code_is_caught(english, chinese, named):
    """Changed code is named whatever Chinese comment or string it carries."""
    assert any(named in problem for problem in changed_code(english, chinese))


# --- The training functions' summary lines --------------------------------------------------

# What the names in a summary line stand for, to print it as a training would.
SAMPLE = {
    "history": [0.4321, 0.9134],
    "animator": SimpleNamespace(Y=[[0.4321, 0.9134]]),
    "timer": SimpleNamespace(avg=lambda: 12.34),
    "devices": ["sim:0", "sim:1"],
    "world": 2,
    "dist": SimpleNamespace(get_backend=lambda: "gloo"),
    "device": SimpleNamespace(type="cpu"),
}


def evaluate(node: ast.expr) -> str:
    expression = ast.fix_missing_locations(ast.Expression(node))
    return str(eval(compile(expression, "<cell>", "eval"), dict(SAMPLE)))


def printed(source: str, function: str) -> list[tuple[str, list[str]] | None]:
    """Return what each print call of `function` in `source` prints given SAMPLE, with the
    values of its replacement fields (None for a print SAMPLE cannot fill in)."""
    (definition,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == function
    ]
    calls = sorted(
        (
            node
            for node in ast.walk(definition)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
        ),
        key=lambda node: (node.lineno, node.col_offset),
    )
    found: list[tuple[str, list[str]] | None] = []
    for call in calls:
        fields = [n for a in call.args for n in ast.walk(a) if isinstance(n, ast.FormattedValue)]
        try:
            line = " ".join(evaluate(arg) for arg in call.args)
            values = [evaluate(ast.JoinedStr([field])) for field in fields]
        except (NameError, AttributeError):  # it prints what SAMPLE does not hold
            found.append(None)
        else:
            found.append((line, values))
    return found


def summary_problems(english: str, chinese: str, function: str) -> list[str]:
    """Say where the Chinese `function` does not print the English summary line's Chinese form:
    `测试精度：0.91，12.3秒/轮，在...`, with the same values, as the grader reads it."""
    before, after = printed(english, function), printed(chinese, function)
    if len(before) != len(after):
        return [f"{len(after)} print calls, the English has {len(before)}"]
    found = []
    for en, zh in zip(before, after, strict=True):
        if en is None or "sec/epoch" not in en[0]:
            continue
        if zh is None:
            found.append(f"the summary of {en[0]!r} cannot be printed")
            continue
        acc, seconds = en[1][:2]
        if not re.match(rf"测试精度：{re.escape(acc)}，{re.escape(seconds)}秒/轮，在\S", zh[0]):
            found.append(f"{zh[0]!r} is not {en[0]!r} in Chinese")
        if "test acc" in zh[0] or "sec/epoch" in zh[0]:
            found.append(f"{zh[0]!r} is partly English")
        if sorted(zh[1]) != sorted(en[1]):
            found.append(f"{zh[0]!r} shows {zh[1]}, the English {en[1]}")
        if not train_ddp.SUMMARY.search(zh[0]) or (
            train_loop.summary(en[0]) and train_loop.summary(zh[0]) != train_loop.summary(en[0])
        ):
            found.append(f"the grader does not read {zh[0]!r} as it reads {en[0]!r}")
    return found


def defining(cells: list[dict], function: str) -> dict:
    """Return the code cell that defines `function`."""
    (cell,) = [
        c
        for c in cells
        if c["cell_type"] == "code" and re.search(rf"^def {function}\(", "".join(c["source"]), re.M)
    ]
    return cell


TRAINING = [ex for ex in MANIFEST.exercises if ex.trains]


@pytest.mark.parametrize("exercise", TRAINING, ids=[ex.id for ex in TRAINING])
def test_the_training_functions_print_their_summary_in_chinese(exercise: Exercise):
    english = defining(translate.source_cells(exercise.notebook), exercise.function)
    chinese = defining(
        translate.translated(LANGUAGE, exercise.notebook)["cells"], exercise.function
    )
    en, zh = "".join(english["source"]), "".join(chinese["source"])
    summaries = [p for p in printed(en, exercise.function) if p and "sec/epoch" in p[0]]
    assert summaries, f"{exercise.function} in {exercise.notebook} prints no summary line"
    assert summary_problems(en, zh, exercise.function) == []


ENGLISH_TRAIN = """\
def train(history, timer, devices):
    print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
"""


NOT_CHINESE, ENGLISH_LEFT, VALUES, GRADER = "in Chinese", "partly English", "shows", "grader"


@pytest.mark.parametrize(
    ("summary", "named"),
    [
        (
            "f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}'",
            ENGLISH_LEFT,
        ),
        (
            "f'测试精度：{history[-1]:.2f}，{timer.avg():.1f} sec/epoch on {str(devices)}'",
            ENGLISH_LEFT,
        ),
        ("f'测试精度: {history[-1]:.2f}, {timer.avg():.1f}秒/轮, 在{str(devices)}'", NOT_CHINESE),
        ("f'测试精度：{history[0]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}'", NOT_CHINESE),
        ("f'测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮'", VALUES),
        ("f'测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮，在{devices[0]}'", VALUES),
        ("f'测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮，在设备{str(devices)}上'", GRADER),
        ("'测试精度：', history[-1]", NOT_CHINESE),
        ("f'测试精度：{acc:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}'", "cannot be printed"),
        (
            "f'测试精度：{history[-1]:.2f}'); print(f'{timer.avg():.1f}秒/轮，在{str(devices)}'",
            "print calls",
        ),
    ],
)
def test_a_summary_left_in_english_or_mistranslated_is_caught(summary, named):
    chinese = ENGLISH_TRAIN.replace(ENGLISH_TRAIN.splitlines()[1][10:-1], summary)
    assert any(named in problem for problem in summary_problems(ENGLISH_TRAIN, chinese, "train"))


def test_the_summary_as_the_chinese_notebooks_print_it_passes():
    chinese = ENGLISH_TRAIN.replace(
        "test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}",
        "测试精度：{history[-1]:.2f}，{timer.avg():.1f}秒/轮，在{str(devices)}",
    )
    assert summary_problems(ENGLISH_TRAIN, chinese, "train") == []


# --- Terms, release and grading --------------------------------------------------------------


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
