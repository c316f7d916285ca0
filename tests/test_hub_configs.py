"""The class's hub configurations are valid for the tools that read them.

docs/hub/kubernetes-values.yaml is validated against the values schema of Zero to JupyterHub's
Helm chart: tests/schemas/z2jh-values.schema.json is jupyterhub/values.schema.yaml of
jupyterhub/zero-to-jupyterhub-k8s (commit 48ea50e3, chart app version 5.5.0) as JSON, with its
prose descriptions and its lists of required keys left out (Helm validates the chart's own
defaults merged with these values, and the defaults hold those keys). BSD-3-Clause:
tests/schemas/z2jh-LICENSE. The schema forbids unknown keys at every level, so a misspelt
setting fails here rather than in a class.
"""

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from grader.manifest import REPO
from hub import lab_gpus

VALUES = REPO / "docs" / "hub" / "kubernetes-values.yaml"
SCHEMA = REPO / "tests" / "schemas" / "z2jh-values.schema.json"
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft7Validator(schema)


def problems(validator, values) -> list[str]:
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(values)]


def test_the_kubernetes_values_are_valid_for_the_chart(validator, values):
    assert problems(validator, values) == []


def test_a_misspelt_setting_is_refused(validator, values):
    """The validation can fail: the schema knows every key of the chart."""
    wrong = copy.deepcopy(values)
    wrong["singleuser"]["memory"]["limt"] = wrong["singleuser"]["memory"].pop("limit")
    assert any("limt" in p for p in problems(validator, wrong))


def test_each_student_gets_the_lab_image_and_their_own_work_folder(values):
    user = values["singleuser"]
    image = COMPOSE["x-lab-image"]["image"]
    assert f"{user['image']['name']}:{user['image']['tag']}" == image
    assert user["storage"]["type"] == "dynamic"
    assert user["storage"]["homeMountPath"] == "/home/student/work"
    assert user["uid"] == 1000  # the image's student (docker/Dockerfile)
    # The image's own start, which copies the notebooks in and serves the hub's single-user
    # server (tests/test_hub.py and tests/test_images.py run it under a real hub).
    assert user["cmd"] == "start-lab"


def test_gpu_profiles_ask_for_whole_gpus_and_dataloaders_get_shared_memory(values):
    user = values["singleuser"]
    gpus = [
        p["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpu"]
        for p in user["profileList"]
        if "kubespawner_override" in p
    ]
    assert gpus == ["1", "2"]
    assert [p for p in user["profileList"] if p.get("default")], "no default profile"
    shm = next(v for v in user["storage"]["extraVolumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in user["storage"]["extraVolumeMounts"]


def test_idle_labs_are_culled_and_students_are_authorized(values):
    assert values["cull"]["enabled"] is True and values["cull"]["timeout"] > 0
    hub = values["hub"]["config"]
    assert hub["JupyterHub"]["authenticator_class"].startswith("nativeauthenticator.")
    assert hub["NativeAuthenticator"]["open_signup"] is False
    # JupyterHub 5 lets in only allowed_users unless allow_all: the students the instructor
    # authorizes in NativeAuthenticator would all be turned away (make hub sets it too).
    assert hub["Authenticator"]["allow_all"] is True
    assert "c.Authenticator.allow_all = True" in (REPO / "hub" / "jupyterhub_config.py").read_text()


# ---- hub/jupyterhub_config.py's pieces ----------------------------------------------------


def lab_hub():
    from hub import lab_hub

    return lab_hub


class StandInSpawner:
    """What DockerSpawner hands a callable `extra_host_config`: itself, with its user."""

    def __init__(self, name: str) -> None:
        self.user = type("User", (), {"name": name})()


def test_one_gpu_each_goes_round_the_gpus_and_stays_with_its_student(tmp_path):
    host_config = lab_gpus.lab_host_config("each", ["0", "1"], tmp_path)
    given = {n: host_config(StandInSpawner(n))["device_requests"] for n in ("ann", "bo", "cy")}
    assert {n: r[0]["DeviceIDs"] for n, r in given.items()} == {
        "ann": ["0"], "bo": ["1"], "cy": ["0"]
    }  # fmt: skip
    assert "Count" not in given["ann"][0]  # count=1 would put everyone on the first GPU
    again = lab_gpus.lab_host_config("each", ["0", "1"], tmp_path)  # the hub restarted
    assert again(StandInSpawner("bo"))["device_requests"][0]["DeviceIDs"] == ["1"]


def test_every_gpu_for_every_lab_and_room_in_dev_shm(tmp_path):
    every = lab_gpus.lab_host_config("all", [], tmp_path)
    assert every["device_requests"] == [
        {"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}
    ]
    assert every["shm_size"] == lab_gpus.lab_host_config("none", [], tmp_path)["shm_size"]


def test_a_gpu_setting_that_cannot_work_says_what_to_write(tmp_path):
    with pytest.raises(SystemExit, match="HUB_GPU_IDS=0,1,2,3"):
        lab_gpus.lab_host_config("each", [], tmp_path)
    with pytest.raises(SystemExit, match="say all, each or none"):
        lab_gpus.lab_host_config("one", ["0"], tmp_path)


def test_a_class_list_reads_names_and_refuses_one_nobody_could_log_in_with(tmp_path):
    good = tmp_path / "class.csv"
    good.write_text("name,email\nAnn,ann@example.org\n# late\nbo\n\n")
    assert lab_hub().read_class_list(good) == ["ann", "bo"]
    bad = tmp_path / "bad.txt"
    bad.write_text("ann\nbo smith\n")
    with pytest.raises(SystemExit, match=r"line 2: 'bo smith' is not a name"):
        lab_hub().read_class_list(bad)


def test_the_compose_hub_reaches_the_engine_and_keeps_the_class_on_the_host():
    hub = COMPOSE["services"]["hub"]
    assert hub["build"]["target"] == "hub"
    volumes = {v.rsplit(":", 1)[1]: v.rsplit(":", 1)[0] for v in hub["volumes"]}
    assert volumes["/var/run/docker.sock"].startswith("${HUB_SOCKET")
    assert volumes["/srv/hub"].startswith("${HUB_FOLDER")
    assert hub["environment"]["HUB_IMAGE"] == COMPOSE["services"]["lab"]["image"]
    assert hub["environment"]["HUB_NETWORK"] == COMPOSE["networks"]["hub"]["name"]


def test_the_systemd_unit_sets_only_the_hubs_own_settings_and_starts_its_config():
    """docs/hub/multigpu-lab-hub.service: each setting it gives is one the hub's config lists,
    and it starts the checkout's jupyterhub on the checkout's config."""
    unit = (REPO / "docs" / "hub" / "multigpu-lab-hub.service").read_text()
    header = (REPO / "hub" / "jupyterhub_config.py").read_text().split("\nimport ")[0]
    fields = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0].isupper()
    )
    names = [line.split("=", 1)[1].split("=")[0] for line in unit.splitlines()
             if line.startswith("Environment=")]  # fmt: skip
    assert names and all(name.startswith("HUB_") and name in header for name in names), names
    root = fields["WorkingDirectory"]
    assert fields["ExecStart"] == (
        f"{root}/.venv/bin/jupyterhub -f {root}/hub/jupyterhub_config.py"
    )
    assert (REPO / "hub" / "jupyterhub_config.py").exists()
    assert {"Unit", "Service", "Install"} <= set(re.findall(r"^\[(\w+)\]", unit, re.MULTILINE))
    # docs/hub.md's steps 3 and 4: the state folder outside the clone, the class list in it,
    # and the exchange that the walk-through and grading use
    settings = dict(line.split("=", 2)[1:] for line in unit.splitlines()
                    if line.startswith("Environment="))  # fmt: skip
    state = Path(settings["HUB_STATE"])
    assert not state.is_relative_to(root), "the state folder, with the passwords, in the clone"
    assert Path(settings["HUB_CLASS_LIST"]) == state / "class.txt"
    assert settings["HUB_EXCHANGE"] == "/srv/nbgrader/exchange"
