"""docs/kubernetes/: the class graded in slices as an Indexed Job, then merged by a second Job.

The manifests are validated against Kubernetes' own schemas (kubernetes-validate, strict: an
unknown key fails), and their commands are run here as the pods would run them, with the
class's volume a folder of this machine."""

import copy
import os
import subprocess
import sys

import pytest
import yaml

from grader.benchmarks.grade import make_class
from grader.manifest import REPO
from tests.test_docker import COMPOSE

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (make setup)"
)

FOLDER = REPO / "docs" / "kubernetes"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def validate(document: dict) -> None:
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def slices_job() -> dict:
    return next(d for d in documents("grade-slices.yaml") if d["kind"] == "Job")


def command_of(job: dict) -> str:
    return job["spec"]["template"]["spec"]["containers"][0]["command"][-1]


@pytest.mark.parametrize("name", ["grade-slices.yaml", "grade-merge.yaml"])
def test_the_manifests_are_valid_kubernetes(name):
    for document in documents(name):
        validate(document)


def test_a_misspelt_key_is_refused():
    job = copy.deepcopy(slices_job())
    job["spec"]["completionMod"] = job["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_each_pod_grades_its_own_slice_without_network_and_with_room_in_dev_shm():
    job = slices_job()
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert f'--shard "$JOB_COMPLETION_INDEX/{spec["completions"]}"' in command_of(job)
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    policy = next(d for d in documents("grade-slices.yaml") if d["kind"] == "NetworkPolicy")
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == labels
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]  # nothing allowed
    image = pod["containers"][0]["image"]
    assert image == COMPOSE["x-grader"]["image"]


@pytest.mark.slow
def test_the_pods_commands_grade_and_merge_a_class(tmp_path):
    """Each pod's command, run here for every index with the class's volume a folder, then the
    merge pod's: one report of the whole class."""
    volume = tmp_path / "class"
    make_class(volume / "submitted", 4)
    (volume / "results").mkdir()
    job = slices_job()
    env = dict(
        os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
    )
    for index in range(job["spec"]["completions"]):
        command = command_of(job).replace("/class", str(volume))
        done = subprocess.run(["sh", "-c", command], env={**env, "JOB_COMPLETION_INDEX": str(index)},
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    merge = command_of(documents("grade-merge.yaml")[0]).replace("/class", str(volume))
    done = subprocess.run(["sh", "-c", merge], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 slices joined: 4 submissions" in done.stdout
    rows = (volume / "results" / "grades.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == [f"student0{i}" for i in range(1, 5)]
    assert len(list((volume / "results" / "gradescope").iterdir())) == 4
