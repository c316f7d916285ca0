"""Drive a class's hub from outside, as its users do: start it, log in, start and stop labs,
read their files and run code in them. `tests/test_hub.py` and `make bench-hub` use it."""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROXY = HERE / "node_modules" / ".bin" / "configurable-http-proxy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hub_lacks() -> str:
    """What this machine lacks to run a hub, or ''."""
    if not shutil.which("node") and not PROXY.exists():
        return "no Node.js here, which the hub's proxy needs (apt install nodejs npm)"
    if not PROXY.exists():
        return f"the hub's proxy is not installed: run `make {PROXY.relative_to(REPO)}`"
    try:
        import jupyterhub  # noqa: F401
        import nativeauthenticator  # noqa: F401
    except ImportError as error:
        return f"the hub's packages are missing ({error}): run `make setup`"
    return ""


def python_for_students(folder: Path) -> str:
    """A Python with the lab in it that other users may run: this one where they may, else
    (this one lies in a folder closed to them: a checkout made by `mktemp -d` as root, a
    pyenv under /root) a self-contained one made in `folder`, which must be open to them: a
    virtual environment on a system Python of the same version, holding this one's packages
    and their commands, and the files of the lab image (hub/lab_files.py) under `folder`/lab,
    so that nothing it runs reads the checkout. '' where no system Python of this version is
    there."""
    if os.geteuid() != 0 or _runs_as_nobody(sys.executable):
        return sys.executable
    base = _system_python()
    if not base:
        return ""
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours = _site_packages()
    site = folder / "lib" / version / "site-packages"
    for entry in ours.iterdir():
        if not _points_into_the_checkout(entry):
            _link_tree(entry, site / entry.name)
    for shared in ("etc", "share"):  # Jupyter's settings, extensions and kernels
        if (Path(sys.prefix) / shared).is_dir():
            _link_tree(Path(sys.prefix) / shared, folder / shared)
    lab = folder / "lab"
    for name in _lab_files():
        (lab / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, lab / name)
    (site / "lab.pth").write_text(f"{lab}\n")
    _write_commands(folder / "bin", site)
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    return python if _runs_as_nobody(python) else ""


def _write_commands(bin_folder: Path, site: Path) -> None:
    """Write into `bin_folder` the commands that the packages in `site` install (torchrun,
    jupyter, jupyter-lab, nbgrader, ...), which a virtual environment given its packages by
    links lacks: each a script that its Python runs, as pip writes them."""
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for entry in dist.entry_points.select(group="console_scripts"):
            script = bin_folder / entry.name
            if entry.attr and not script.exists():
                script.write_text(
                    f"#!{bin_folder / 'python'}\nimport sys\n"
                    f"from {entry.module} import {entry.attr.split('.')[0]}\n"
                    f"sys.exit({entry.attr}())\n"
                )
                script.chmod(0o755)


def lend_python(folder: Path) -> tuple[str, str]:
    """`python_for_students`, made once for each version of the lab and kept: (the Python,
    what was done, for the hub's log). Made in `folder`/<key>, where the key names this
    Python, its packages and the lab's files, and reused while they stay the same; older
    ones made from this checkout are removed once no process runs them. RuntimeError, with
    what to do, where no Python that other users may run can be made."""
    if os.geteuid() != 0 or _runs_as_nobody(sys.executable):
        return sys.executable, "the students' accounts may run the hub's own Python"
    _open_folders(folder)
    build = folder / _lab_key()
    python, stamp = build / "bin" / "python", build / ".made-from"
    if stamp.exists() and _runs_as_nobody(str(python)):
        how = f"reused the lab's Python for the students' accounts, made before in {build}"
    else:
        shutil.rmtree(build, ignore_errors=True)
        if not python_for_students(build):
            shutil.rmtree(build, ignore_errors=True)
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            raise RuntimeError(
                f"could not make in {folder} a Python that every account may run: it needs "
                f"a system Python {version} that every user may run (Debian, Ubuntu: apt "
                f"install python{version}), and every folder on the way to {folder} open to "
                "every user"
            )
        stamp.write_text(f"{REPO}\n")
        how = f"made the lab's Python for the students' accounts in {build}"
    for old in folder.iterdir():
        made_from = old / ".made-from"
        if old != build and made_from.exists() and made_from.read_text().strip() == str(REPO):
            if not _in_use(old):
                shutil.rmtree(old, ignore_errors=True)
    return str(python), how


def _lab_files() -> list[str]:
    """The lab image's files (hub/lab_files.py) and the compiled catalogues of messages."""
    from hub.lab_files import image_files

    return sorted(image_files("lab")) + _compiled_catalogues()


def _site_packages() -> Path:
    return Path(
        next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    )


def _lab_key() -> str:
    """Names what a lent Python is made of: this Python, the packages it has (their folders
    name their versions) and the lab's files."""
    key = hashlib.sha256(f"{sys.version}\n{REPO}\n{_system_python()}\n".encode())
    key.update("\n".join(sorted(os.listdir(_site_packages()))).encode())
    for name in _lab_files():
        key.update(f"\n{name}\n".encode() + (REPO / name).read_bytes())
    return f"python{sys.version_info.major}.{sys.version_info.minor}-{key.hexdigest()[:16]}"


def _open_folders(folder: Path) -> None:
    """Make `folder` and the folders above it that are missing, open to every user to enter
    and read (a root whose umask is 077 would make them closed)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for path in reversed(missing):
        path.mkdir()
        path.chmod(0o755)


def _in_use(folder: Path) -> bool:
    """Whether a process runs a program from `folder` (a lab, a kernel of one)."""
    inside = str(folder) + "/"
    for process in Path("/proc").iterdir():
        if process.name.isdigit():
            try:
                if inside.encode() in (process / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def _as_nobody() -> dict:
    """subprocess's arguments that run a command as `nobody`, with its own group alone."""
    entry = pwd.getpwnam("nobody")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _system_python() -> str:
    """A Python of this one's version that other users may run, or ''."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        getattr(sys, "_base_executable", ""),
        shutil.which("python3", path="/usr/bin:/usr/local/bin"),
    ):
        if not candidate:
            continue
        probe = [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
        try:
            said = subprocess.run(probe, cwd="/", capture_output=True, text=True, **_as_nobody())
        except OSError:  # a folder on the way is closed to nobody
            continue
        if said.stdout.strip() == version:
            return candidate
    return ""


def _points_into_the_checkout(entry: Path) -> bool:
    """True for the editable install of the lab (its finder, its .pth, its record), which
    would send the lent Python back into the checkout."""
    if entry.name.startswith(("__editable__", "multigpu_lab")):
        return True
    return entry.suffix == ".pth" and str(REPO) in entry.read_text(errors="ignore")


def _link_tree(source: Path, target: Path) -> None:
    """Put `source` at `target` as hard links (copies across file systems)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, copy_function=link, dirs_exist_ok=True)
    else:
        link(str(source), str(target))


def _compiled_catalogues() -> list[str]:
    """The messages' compiled catalogues (labtext/locale/), which the image compiles itself."""
    return [str(p.relative_to(REPO)) for p in (REPO / "labtext" / "locale").rglob("*.mo")]


def _runs_as_nobody(python: str) -> bool:
    try:
        probe = subprocess.run([python, "-c", "import grader, jupyterhub"], cwd="/",
                               capture_output=True, **_as_nobody())  # fmt: skip
    except OSError:
        return False
    return probe.returncode == 0


class Hub:
    """A hub started with `config` (hub/jupyterhub_config.py) and the given settings."""

    config = HERE / "jupyterhub_config.py"

    def __init__(
        self, folder: Path, students: list[str], lab: Path = REPO, **settings: str
    ) -> None:
        """`lab`: the checkout whose config the hub runs, this one unless another is named
        (a copy closed to other accounts, for a hub run by root: hub/closed.py). The hub
        imports that checkout's packages, as it would from an environment of its own: this
        Python's finds this checkout's."""
        self.config = Path(lab) / self.config.relative_to(REPO)
        own = {} if Path(lab).resolve() == REPO else {"PYTHONPATH": str(Path(lab).resolve())}
        self.folder = folder
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.state = folder / "state"
        (folder / "class.txt").write_text("name\n" + "\n".join(students) + "\n")
        self.env = dict(
            os.environ,
            HUB_PORT=str(self.port),
            HUB_API_PORT=str(free_port()),
            HUB_PROXY_API_PORT=str(free_port()),
            HUB_STATE=str(self.state),
            HUB_CLASS_LIST=str(folder / "class.txt"),
            **own,
            **settings,
        )
        self.log_path = folder / "hub.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config)],
            cwd=self.folder, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub stopped at start:\n{self.log_text()[-3000:]}")
            try:
                if requests.get(self.base + "/hub/api", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the hub did not answer in {timeout} s:\n{self.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        if getattr(self, "log", None):
            self.log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def password(self, name: str) -> str:
        with open(self.state / "passwords.csv") as f:
            return {row["name"]: row["password"] for row in csv.DictReader(f)}[name]

    def login(self, name: str, password: str | None = None) -> User:
        user = User(self, name)
        user.session.get(self.base + "/hub/login", timeout=10)
        answer = user.session.post(
            self.base + "/hub/login",
            data={"username": name, "password": password or self.password(name),
                  "_xsrf": user.cookie("_xsrf", "/hub/")},
            allow_redirects=False, timeout=30,
        )  # fmt: skip
        if answer.status_code != 302:
            raise PermissionError(f"{name} could not log in: {answer.status_code}")
        return user


class User:
    """One person's browser on the hub: its cookies, and the requests it makes."""

    def __init__(self, hub: Hub, name: str) -> None:
        self.hub, self.name = hub, name
        self.session = requests.Session()
        self.lab = f"{hub.base}/user/{name}"

    def cookie(self, name: str, path: str) -> str | None:
        return self.session.cookies.get(name, path=path)

    def hub_api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"X-XSRFToken": self.cookie("_xsrf", "/hub/") or ""}
        return self.session.request(method, f"{self.hub.base}/hub/api{path}", headers=headers,
                                    timeout=60, **kwargs)  # fmt: skip

    def lab_api(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.in_lab(method, "/api" + path, **kwargs)

    def in_lab(self, method: str, path: str, **kwargs) -> requests.Response:
        """A request to this user's lab, as its pages make them."""
        headers = {"X-XSRFToken": self.cookie("_xsrf", f"/user/{self.name}/") or ""}
        return self.session.request(method, self.lab + path, headers=headers, timeout=120,
                                    **kwargs)  # fmt: skip

    def start_lab(self, timeout: float = 120) -> float:
        """Start this user's lab and wait until its files answer; the seconds it took."""
        began = time.monotonic()
        answer = self.hub_api("POST", f"/users/{self.name}/server")
        if answer.status_code not in (201, 202, 400):
            raise RuntimeError(f"{self.name}'s lab did not start: {answer.status_code} "
                               f"{answer.text[:300]}\n{self.hub.log_text()[-3000:]}")  # fmt: skip
        while time.monotonic() - began < timeout:
            self.session.get(self.lab + "/lab", timeout=30)  # the login into the lab itself
            if self.lab_api("GET", "/contents").status_code == 200:
                return time.monotonic() - began
            time.sleep(0.5)
        raise RuntimeError(f"{self.name}'s lab did not answer in {timeout} s:\n"
                           f"{self.hub.log_text()[-3000:]}")  # fmt: skip

    def stop_lab(self, timeout: float = 60) -> None:
        self.hub_api("DELETE", f"/users/{self.name}/server")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.hub_api("GET", f"/users/{self.name}").json().get("servers"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{self.name}'s lab did not stop in {timeout} s")

    def run(self, code: str, timeout: float = 300) -> str:
        """Run `code` in a new kernel of this user's lab; what it printed and returned."""
        kernel = self.lab_api("POST", "/kernels", json={"name": "python3"}).json()["id"]
        try:
            return self.run_in(kernel, code, timeout)
        finally:
            self.lab_api("DELETE", f"/kernels/{kernel}")

    def run_in(self, kernel: str, code: str, timeout: float = 300) -> str:
        """Run `code` in the kernel `kernel` of this user's lab; what it printed and returned."""
        from tornado.httpclient import HTTPRequest
        from tornado.ioloop import IOLoop
        from tornado.websocket import websocket_connect

        cookies = "; ".join(f"{c.name}={c.value}" for c in self.session.cookies
                            if self.lab.endswith(c.path.rstrip("/")) or c.path == "/")  # fmt: skip
        url = self.lab.replace("http", "ws", 1) + f"/api/kernels/{kernel}/channels"
        msg_id = uuid.uuid4().hex
        request = {
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.name,
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }  # fmt: skip

        async def talk() -> str:
            socket_ = await websocket_connect(
                HTTPRequest(url, headers={"Cookie": cookies}, connect_timeout=30)
            )
            socket_.write_message(json.dumps(request))
            said = []
            while True:
                message = await socket_.read_message()
                if message is None:
                    raise RuntimeError("the kernel's connection closed")
                message = json.loads(message)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind == "stream":
                    said.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    said.append(content["data"].get("text/plain", ""))
                elif kind == "error":
                    said.append("\n".join(content["traceback"]))
                elif kind == "status" and content["execution_state"] == "idle":
                    socket_.close()
                    return "".join(said)

        return IOLoop.current().run_sync(talk, timeout=timeout)

    def terminal(self, command: str, timeout: float = 300) -> tuple[str, int]:
        """Type `command` into a new Terminal of this user's lab (File > New > Terminal), as
        a student does: what the Terminal showed, escapes left out, and its exit status."""
        from tornado.httpclient import HTTPRequest
        from tornado.ioloop import IOLoop
        from tornado.websocket import websocket_connect

        made = self.lab_api("POST", "/terminals")
        assert made.status_code == 200, made.text
        name = made.json()["name"]
        cookies = "; ".join(f"{c.name}={c.value}" for c in self.session.cookies
                            if self.lab.endswith(c.path.rstrip("/")) or c.path == "/")  # fmt: skip
        url = self.lab.replace("http", "ws", 1) + f"/terminals/websocket/{name}"
        marker = re.compile(r"@@exit=(\d+)@@")

        async def talk() -> tuple[str, int]:
            socket_ = await websocket_connect(
                HTTPRequest(url, headers={"Cookie": cookies}, connect_timeout=30)
            )
            socket_.write_message(json.dumps(["stdin", f'{command}; echo "@@exit=$?@@"\r']))
            shown = ""
            while not (found := marker.search(shown)):
                message = await socket_.read_message()
                if message is None:
                    raise RuntimeError(f"the Terminal closed; it showed:\n{shown}")
                kind, *content = json.loads(message)
                if kind == "stdout":
                    shown += re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "",
                                    content[0])  # fmt: skip
            socket_.close()
            return shown[: found.start()], int(found.group(1))

        try:
            return IOLoop.current().run_sync(talk, timeout=timeout)
        finally:
            self.lab_api("DELETE", f"/terminals/{name}")


def temporary_homes() -> Path:
    """A folder for the students' homes that their accounts can reach."""
    folder = Path(tempfile.mkdtemp(prefix="lab-homes-"))
    folder.chmod(0o755)
    return folder
