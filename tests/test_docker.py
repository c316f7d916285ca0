"""The container files, checked without a Docker engine: schema, lint, and what each image holds."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grader.manifest import REPO, load_manifest
from grader.tools.authoring import hidden_parts
from hub.lab_files import DOCKERFILE, image_files, stages
from tests.test_lab import TOKEN, Lab, free_port

BIN = Path(sys.executable).parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


# ---- the lab image ------------------------------------------------------------------------


def private_folders() -> list[str]:
    """Return what students must never have, as folders relative to the repository."""
    manifest = load_manifest()
    packages = [manifest.package_folder(p) for p in manifest.private_packages]
    return ["solutions/", ".git/"] + [f"{p.relative_to(REPO)}/" for p in packages]


def test_the_lab_image_has_no_solution_hidden_check_or_mistake():
    files = image_files("lab")
    assert "grader/exercises/allreduce/private/" in private_folders()  # read from the manifest
    for private in private_folders():
        assert not [f for f in files if f.startswith(private)], private


def test_the_lab_image_has_the_public_translations_of_messages_alone():
    """Of i18n/, students get the catalogues of the messages they may read: not the hidden
    checks' (i18n/<language>/hidden/), not the notebooks' translations (which translate the
    solutions' comments too)."""
    files = image_files("lab")
    translations = [f for f in files if f.startswith("i18n/")]
    assert "i18n/zh_CN/messages/core.po" in translations
    assert all(re.fullmatch(r"i18n/\w+/messages/[^/]+\.po", f) for f in translations), translations
    for folder in (REPO / "i18n").glob("*/messages"):  # a new language gets its COPY line
        assert f"{folder.relative_to(REPO)}/core.po" in files


def test_the_lab_image_has_every_public_module_of_the_grader():
    """A new package under grader/ that the Dockerfile forgets fails here, not in a class."""
    files = image_files("lab")
    private = tuple(private_folders())
    modules = [str(p.relative_to(REPO)) for p in (REPO / "grader").rglob("*.py")]
    missing = [m for m in modules if not m.startswith(private) and m not in files]
    assert not missing, f"the lab image lacks {missing}: add them to docker/Dockerfile"


def test_the_lab_image_has_what_a_student_needs():
    files = image_files("lab")
    for notebook in load_manifest().notebooks:
        assert f"exercises/{load_manifest().assignment}/{notebook}" in files
    for needed in (
        "dplab/devices.py",
        "grader/manifest.toml",
        "grader/exercises/allreduce/checks.py",
        "grader/front/kernel.py",
        "docker/start-lab",
        "docker/lab-health",
        "dplab/fashion_mnist_sample/train-images-idx3-ubyte.gz",
    ):
        assert needed in files, needed


def test_nothing_in_the_lab_image_reproduces_a_reference_solution():
    text = "\n".join((REPO / f).read_text(errors="ignore") for f in image_files("lab"))
    for notebook in load_manifest().notebooks:
        for grade_id, answer in hidden_parts(notebook).items():
            lines = [x.strip() for x in answer.splitlines() if len(x.strip()) > 25]
            shown = [x for x in lines if x in text]
            assert len(shown) <= len(lines) // 3, f"{grade_id}: the lab image shows {shown}"


def test_the_grader_image_has_everything():
    files = image_files("grader")
    assert "solutions/multigpu/from_scratch.ipynb" in files
    assert "grader/exercises/allreduce/private/hidden.py" in files
    assert ".venv" not in {f.split("/")[0] for f in files}


def test_the_hub_image_holds_every_hub_module_its_config_imports():
    """The hub image copies hub/ file by file: the package's __init__ and each module of hub/
    that the config, or a module it imports, imports at load time must be among them (closed.py
    and lab_groups.py were not, and the compose hub stopped at start)."""
    import ast

    held = image_files("hub")
    local = {p.stem for p in (REPO / "hub").glob("*.py")}

    def of_hub(node: ast.stmt) -> list[str]:
        """The modules of hub/ that an import at the top level names."""
        if isinstance(node, ast.ImportFrom) and node.module == "hub":
            return [a.name for a in node.names if a.name in local]
        named = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        named += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        return [n.split(".")[1] for n in named if n.startswith("hub.")]

    todo, needed = ["jupyterhub_config"], {"__init__"}
    while todo:
        module = todo.pop()
        needed.add(module)
        tree = ast.parse((REPO / "hub" / f"{module}.py").read_text())
        for node in tree.body:  # at load time: the module's own top level, not its functions
            todo += [m for m in of_hub(node) if m not in needed]
    assert {"closed", "lab_groups", "lab_hub"} <= needed  # (so that a blind walk fails)
    assert {f"hub/{m}.py" for m in needed} <= held, sorted({f"hub/{m}.py" for m in needed} - held)


def test_the_images_run_as_a_user_with_a_health_check_and_the_lab_start_command():
    found = stages()
    assert found["lab"]["user"] == found["grader"]["user"] == "1000"
    assert found["lab"]["cmd"] == '["start-lab"]'
    assert "lab-health" in found["lab"]["health"]
    assert "start-lab" in (REPO / "Makefile").read_text()  # make lab starts the same command


def test_the_dockerfile_passes_hadolint():
    proc = subprocess.run([str(BIN / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_an_unpinned_install(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([str(BIN / "hadolint"), str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


# ---- compose ------------------------------------------------------------------------------


def check_compose(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
    )


def test_the_compose_file_follows_the_compose_specification(tmp_path):
    assert check_compose(REPO / "docker-compose.yml").returncode == 0
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (REPO / "docker-compose.yml")
        .read_text()
        .replace("shm_size: 8gb  # room", "shm_size: [8gb]  # room")
    )
    assert check_compose(broken).returncode != 0  # the check can fail


def gpus(service: dict) -> list[dict]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


@pytest.mark.parametrize("name", ["lab", "grade", "test"])
def test_the_gpu_services_reserve_every_gpu(name):
    assert gpus(COMPOSE["services"][name]) == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    ]
    assert gpus(COMPOSE["services"][f"{name}-cpu"]) == []


def test_the_lab_service_is_local_keeps_its_token_and_its_work():
    lab = COMPOSE["services"]["lab"]
    assert lab["build"]["target"] == "lab"
    assert all(p.startswith("127.0.0.1:") for p in lab["ports"])
    assert lab["environment"]["JUPYTER_TOKEN"] == "${JUPYTER_TOKEN:-}"
    assert "lab-work:/home/student/work" in lab["volumes"] and "lab-work" in COMPOSE["volumes"]
    assert lab.get("shm_size") or lab.get("ipc") == "host"


def test_the_grade_service_grades_submissions_into_results_without_network():
    grade = COMPOSE["services"]["grade"]
    assert grade["build"]["target"] == "grader"
    assert grade["network_mode"] == "none"
    assert grade["command"][:5] == ["python", "-m", "grader", "grade", "/submissions"]
    assert any(v.endswith(":/results") for v in grade["volumes"])
    assert COMPOSE["services"]["test"]["command"][:3] == ["python", "-m", "pytest"]


# ---- the container's start command and healthcheck, run natively --------------------------


@pytest.mark.slow
def test_the_healthcheck_passes_with_the_token_the_lab_made(tmp_path, monkeypatch):
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    login = tmp_path / "login"
    port = free_port()
    env = dict(
        os.environ,
        LAB_PYTHON=sys.executable,
        LAB_EXERCISES=str(REPO / "exercises"),
        LAB_WORK=str(tmp_path / "work"),
        LAB_PORT=str(port),
        LAB_LOGIN_FILE=str(login),
    )
    env.pop("JUPYTER_TOKEN", None)
    proc = subprocess.Popen(
        [str(REPO / "docker" / "start-lab")],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    health = [sys.executable, str(REPO / "docker" / "lab-health")]
    try:
        for _ in range(180):
            if login.exists() and subprocess.run(health, env=env).returncode == 0:
                break
            import time

            time.sleep(0.5)
        token = login.read_text().strip()
        assert len(token) >= 32 and oct(login.stat().st_mode)[-3:] == "600"
        assert subprocess.run(health, env=env).returncode == 0
        wrong = dict(env, JUPYTER_TOKEN="wrong")
        assert subprocess.run(health, env=wrong, capture_output=True).returncode == 1
    finally:
        os.killpg(proc.pid, 15)
        out, _ = proc.communicate(timeout=30)
    assert f"/lab?token={token}" in out


@pytest.mark.slow
def test_the_healthcheck_uses_a_given_token(tmp_path):
    lab = Lab(tmp_path / "work", free_port())
    try:
        env = dict(os.environ, JUPYTER_TOKEN=TOKEN, LAB_PORT=str(lab.port))
        assert (
            subprocess.run(
                [sys.executable, str(REPO / "docker" / "lab-health")], env=env
            ).returncode
            == 0
        )
    finally:
        lab.stop()


def test_every_compose_command_in_the_readme_names_a_real_service():
    readme = (REPO / "README.md").read_text()
    named = re.findall(r"docker compose (?:up|run --rm|cp) ([a-z-]+)", readme)
    assert {"lab", "lab-cpu", "grade", "grade-cpu", "test", "test-cpu"} <= set(named)
    assert set(named) <= set(COMPOSE["services"])
    assert "start-lab: open http://127.0.0.1:8888/lab?token=" in readme


def test_the_printed_address_names_the_hosts_port(tmp_path):
    """Behind a published port (LAB_PORT=8899 docker compose up lab), the address printed
    names the host's port, not the container's 8888."""
    env = dict(
        os.environ,
        LAB_PYTHON="echo",  # stands in for the Python that would start JupyterLab
        LAB_EXERCISES=str(REPO / "exercises"),
        LAB_WORK=str(tmp_path / "work"),
        LAB_PORT="8888",
        LAB_HOST_PORT="8899",
        JUPYTER_TOKEN="t0k3n",
    )
    proc = subprocess.run(
        [str(REPO / "docker" / "start-lab")], env=env, capture_output=True, text=True
    )
    assert "start-lab: open http://127.0.0.1:8899/lab?token=t0k3n" in proc.stdout
    assert "--port=8888" in proc.stdout  # the server itself listens on the container's port
    lab = COMPOSE["services"]["lab"]
    assert lab["environment"]["LAB_HOST_PORT"] == "${LAB_PORT:-8888}"
    assert lab["ports"] == ["127.0.0.1:${LAB_PORT:-8888}:8888"]


def test_compose_passes_the_labs_language_to_the_container():
    """`LAB_LANG=zh_CN docker compose up lab` reaches start-lab (and the kernels) inside."""
    for name in ("lab", "lab-cpu"):
        assert COMPOSE["services"][name]["environment"]["LAB_LANG"] == "${LAB_LANG:-}"


def test_check_python_names_what_to_install(tmp_path):
    old = tmp_path / "python3"  # answers as a Python 3.10.13 would
    old.write_text(
        "#!/bin/sh\n"
        'case "$2" in *version_info\\ \\<*) exit 1;; *venv*) exit 0;; esac\n'
        "echo 3.10.13\n"
    )
    old.chmod(0o755)
    proc = subprocess.run(
        [str(REPO / "docker" / "check-python"), str(old)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "is Python 3.10.13; the lab needs 3.11 or newer" in proc.stderr
    assert "apt install python3 python3-venv" in proc.stderr
    missing = subprocess.run(
        [str(REPO / "docker" / "check-python"), "python-not-here"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no 'python-not-here' on this machine" in missing.stderr
    ok = subprocess.run(
        [str(REPO / "docker" / "check-python"), sys.executable], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "check-python: Python 3." in ok.stdout
