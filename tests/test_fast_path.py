"""The fast path changes no verdict: the same classes graded with it (the default) and without it
(GRADER_FAST=off: children started afresh, no warm server, no helper children, no extra child
on idle cores) get the same verdict and points on every check.

The classes (tests/corpora.py, each graded both ways once in a run of the tests): the whole
mistake catalogue (the k-th catalogued mistake of every exercise in student k's notebooks,
the reference everywhere else), the hostile class of tests/test_hostile.py, and the seed notes
moved into the notebooks (tests/test_seeds.py), where they are here."""

import pytest

from tests import corpora

pytestmark = pytest.mark.slow


def verdicts(graded: corpora.Graded) -> dict[str, dict[tuple[str, str], tuple[bool, float]]]:
    """Each student's verdict and points on every check: {student: {(exercise, check): ...}}."""
    return {
        student: {
            (e["name"], c["name"]): (c["passed"], c["points"])
            for e in sub["exercises"]
            for c in e["checks"]
        }
        for student, sub in graded.report.items()
    }


def differences(fast: dict, plain: dict) -> list[str]:
    """Every check whose verdict or points differ, said in a line."""
    said = [f"{s}: graded one way only" for s in sorted(set(fast) ^ set(plain))]
    for student in sorted(set(fast) & set(plain)):
        for key in sorted(set(fast[student]) | set(plain[student])):
            one, other = fast[student].get(key), plain[student].get(key)
            if one != other:
                said.append(f"{student} {key[0]}/{key[1]}: fast {one}, plain {other}")
    return said


def both_ways(tmp_path_factory, corpus: str) -> tuple[corpora.Graded, dict, dict]:
    fast = corpora.graded(tmp_path_factory, corpus, fast=True)
    plain = corpora.graded(tmp_path_factory, corpus, fast=False)
    return fast, verdicts(fast), verdicts(plain)


def test_the_catalogue_gets_the_same_verdicts_both_ways(tmp_path_factory):
    graded, fast, plain = both_ways(tmp_path_factory, "catalogue")
    assert len(fast) == graded.extra["rounds"], sorted(fast)  # (so that an empty class fails)
    assert sum(not passed for checks in fast.values() for passed, _ in checks.values()) > 100
    assert not differences(fast, plain), "\n".join(differences(fast, plain))


def test_the_hostile_class_gets_the_same_verdicts_both_ways(tmp_path_factory):
    graded, fast, plain = both_ways(tmp_path_factory, "hostile")
    assert set(fast) == set(graded.extra["students"])
    assert not differences(fast, plain), "\n".join(differences(fast, plain))


def test_the_seeds_get_the_same_verdicts_both_ways(tmp_path_factory):
    _, fast, plain = both_ways(tmp_path_factory, "seeds")
    assert fast and not differences(fast, plain), "\n".join(differences(fast, plain))
