"""A class graded in slices (`grade --shard I/N`, one job each) and joined (`merge`): the same
report as one grade of the whole class, and a refusal, saying why, for slices that do not
belong together."""

import json
import subprocess

import pytest

from grader.benchmarks.grade import make_class
from tests.conftest import python

pytestmark = pytest.mark.slow


def grader(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python(), "-m", "grader", *args], capture_output=True, text=True, timeout=900, cwd=cwd
    )


def checks(report) -> dict[str, list[tuple[str, str, bool, float]]]:
    """Every check's verdict and points, per student."""
    data = json.loads(report.read_text())
    return {
        s["id"]: [
            (e["name"], c["name"], c["passed"], c["points"])
            for e in s["exercises"]
            for c in e["checks"]
        ]
        for s in data["submissions"]
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class of 4 graded whole, and in slices 0/3, 1/3 and 2/3 (one slice of 2)."""
    root = tmp_path_factory.mktemp("shards")
    make_class(root / "submitted", 4)
    only = ["-e", "allreduce", "-e", "split_batch", "-e", "train_batch"]
    done = grader("grade", "submitted", "--json", "whole.json", "--jobs", "2", *only, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    for i in range(3):
        done = grader("grade", "submitted", "--shard", f"{i}/3", "--json", f"slice{i}.json",
                      *only, cwd=root)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    return root


def test_the_slices_split_the_class_evenly_and_stably(graded):
    held = [list(checks(graded / f"slice{i}.json")) for i in range(3)]
    assert sorted(len(ids) for ids in held) == [1, 1, 2]
    assert sorted(sum(held, [])) == sorted(checks(graded / "whole.json"))
    assert held[0] == ["student01", "student04"]  # the sorted ids, every third from the first


def test_the_joined_slices_equal_one_grade_of_the_class_check_by_check(graded):
    reports = [f"slice{i}.json" for i in (2, 0, 1)]  # in any order
    joined = grader("merge", *reports, "--json", "merged.json", "--csv", "merged.csv",
                    "--gradescope", "gradescope", cwd=graded)  # fmt: skip
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "3 slices joined: 4 submissions" in joined.stdout
    merged, whole = checks(graded / "merged.json"), checks(graded / "whole.json")
    assert list(merged) == list(whole)  # the class's order
    assert merged == whole
    rows = (graded / "merged.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[1].startswith("student01,")
    assert sorted(p.name for p in (graded / "gradescope").iterdir()) == sorted(whole)


def test_the_joined_report_goes_to_standard_output_with_dash(graded):
    joined = grader("merge", "slice0.json", "slice1.json", "slice2.json", "--json", "-",
                    cwd=graded)  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    report = json.loads(joined.stdout)  # the report alone: what is said goes to stderr
    assert [s["id"] for s in report["submissions"]] == list(checks(graded / "whole.json"))
    assert "3 slices joined: 4 submissions" in joined.stderr
    assert not (graded / "-").exists()


def refused(done: subprocess.CompletedProcess, message: str) -> None:
    """`done` ended as a refusal does: exit code 2, and `message` said on standard error,
    nothing on standard output."""
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert f"error: {message}" in done.stderr, done.stderr


def test_a_missing_slice_is_named(graded):
    done = grader("merge", "slice0.json", "slice2.json", "--json", "x.json", cwd=graded)
    refused(done, "slices 1 of 3 are missing: grade them with `--shard I/3`")
    assert not (graded / "x.json").exists()


def test_slices_graded_with_another_seed_are_refused(graded, tmp_path):
    other = json.loads((graded / "slice1.json").read_text())
    other["run"]["options"]["seed"] = 7
    (tmp_path / "slice1.json").write_text(json.dumps(other))
    done = grader("merge", str(graded / "slice0.json"), str(tmp_path / "slice1.json"),
                  str(graded / "slice2.json"), "--json", str(tmp_path / "x.json"))  # fmt: skip
    refused(done, f"{tmp_path / 'slice1.json'} was graded with different options (seed, hidden "
                  f"checks, limits) than {graded / 'slice0.json'}: grade every slice alike")  # fmt: skip
    assert not (tmp_path / "x.json").exists()


def test_a_slice_graded_by_another_grader_or_given_twice_is_refused(graded, tmp_path):
    other = json.loads((graded / "slice1.json").read_text())
    other["run"]["grader"] = "0" * 64
    (tmp_path / "slice1.json").write_text(json.dumps(other))
    done = grader("merge", str(graded / "slice0.json"), str(tmp_path / "slice1.json"),
                  "--json", str(tmp_path / "x.json"))  # fmt: skip
    refused(done, f"{tmp_path / 'slice1.json'} was graded with a different grader than "
                  f"{graded / 'slice0.json'}: grade every slice alike")  # fmt: skip
    twice = grader("merge", "slice0.json", "slice0.json", "slice1.json",
                   "--json", str(tmp_path / "y.json"), cwd=graded)  # fmt: skip
    refused(twice, "slice0.json and slice0.json are both slice 0")
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


def test_a_report_without_slices_and_a_bad_shard_say_what_to_do(graded, tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"submissions": []}))
    done = grader("merge", str(plain), "--json", str(tmp_path / "x.json"))
    refused(done, f"{plain} does not say how it was graded: grade the slices again")
    assert not (tmp_path / "x.json").exists()
    bad = grader("grade", "submitted", "--shard", "3/3", cwd=graded)
    assert (bad.returncode, bad.stdout) == (2, ""), bad.stdout + bad.stderr  # argparse's refusal
    assert "3/3: say which slice of how many, as I/N with 0 <= I < N, such as 0/4" in bad.stderr
