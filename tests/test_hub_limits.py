"""Limits per student with labs as processes, on a real hub run by root: each lab runs in a
control group of its own with the hub's memory and CPU limits, and sees no GPU unless given
one; one student's runaway cell (busy loops and a memory hog) is held and stopped by their own
lab's limits while another student's check finishes; stopping the hub leaves no process of any
lab, warm servers and detached loops included; and `make hub-clear` then leaves no file of the
removed accounts anywhere on the machine."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hub.clear import places
from hub.lab_gpus import visible_gpus
from hub.lab_groups import FIX_LIMITS, LabGroups
from tests.test_hub import STUDENTS, started_hub

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root's hub makes accounts and groups")
MEMORY = 1536 * 2**20  # 1536M: room for an idle lab, a kernel and a check from the Terminal
CPUS = 1
CHECK = "python -m grader check multigpu/from_scratch.ipynb --exercise allreduce"
# Run in a kernel of one lab: three busy loops and a process that takes memory until it is
# stopped, each detached from the kernel (as a student's stray processes may be).
RUNAWAY = """
import subprocess, sys
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(3)]
hog = subprocess.Popen([sys.executable, "-c", "chunks = []\\nwhile True:\\n"
                        "    chunks.append(bytearray(b'x' * (64 << 20)))\\n"],
                       start_new_session=True)
print("started")
"""

# Run in a kernel: a process that sleeps on, detached from the kernel.
LINGERER = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                 start_new_session=True)
print("started")
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from started_hub(
        tmp_path_factory, HUB_MEM_LIMIT="1536M", HUB_CPU_LIMIT=str(CPUS), HUB_GPUS="none"
    )


@pytest.fixture(scope="module")
def labs(hub):
    users = {name: hub.login(name) for name in STUDENTS}
    for user in users.values():
        user.start_lab()
    return users


def account(hub, name: str) -> str:
    return hub.env["HUB_USER_PREFIX"] + name


def processes(account: str) -> dict[int, str]:
    """The processes of `account` that run (not those ended and not yet reaped): their
    command lines, whole (without -ww, ps cuts them at 80 columns)."""
    listed = subprocess.run(["ps", "-ww", "-u", account, "-o", "pid=,stat=,args="],
                            capture_output=True, text=True)  # fmt: skip
    found = {}
    for line in listed.stdout.splitlines():
        pid, stat, args = line.split(None, 2)
        if not stat.startswith("Z"):
            found[int(pid)] = args
    return found


def groups_of(pid: int) -> dict[str, Path]:
    """The control groups of process `pid`, as folders: by controller (memory, cpu), or
    under "" with cgroup v2."""
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in ("memory", "cpu") and Path(f"/sys/fs/cgroup/{controller}").is_dir():
                found[controller] = Path(f"/sys/fs/cgroup/{controller}{group}")
            elif not controllers and not Path("/sys/fs/cgroup/memory").is_dir():
                found[""] = Path(f"/sys/fs/cgroup{group}")
    return found


def lab_groups(hub, name: str) -> tuple[Path, Path]:
    """The (memory, cpu) control group folders of `name`'s lab, the same for each of its
    processes."""
    seen = {tuple(sorted(groups_of(pid).items())) for pid in processes(account(hub, name))}
    assert len(seen) == 1, seen  # every process of the lab is in the same groups
    groups = dict(seen.pop())
    return groups.get("memory", groups.get("")), groups.get("cpu", groups.get(""))


def counter(path: Path, name: str) -> int:
    """A count in a control group's file of `name value` lines (cpu.stat, memory.events)."""
    found = re.search(rf"^{name} (\d+)$", path.read_text(), re.MULTILINE)
    return int(found.group(1)) if found else 0


@pytest.mark.slow
@as_root
def test_each_lab_runs_in_a_group_of_its_own_with_the_hubs_limits(hub, labs):
    seen = set()
    for name in STUDENTS:
        memory, cpu = lab_groups(hub, name)
        assert memory.name == cpu.name == account(hub, name)
        seen.add(memory)
        if (memory / "memory.limit_in_bytes").exists():  # cgroup v1
            assert int((memory / "memory.limit_in_bytes").read_text()) == MEMORY
            quota = int((cpu / "cpu.cfs_quota_us").read_text())
            period = int((cpu / "cpu.cfs_period_us").read_text())
        else:
            assert int((memory / "memory.max").read_text()) == MEMORY
            quota, period = map(int, (cpu / "cpu.max").read_text().split())
        assert quota / period == CPUS
    assert len(seen) == len(STUDENTS)


@pytest.mark.slow
@as_root
def test_hub_gpus_none_hides_the_gpus_and_the_stand_ins_still_work(labs):
    said = labs["ann"].run(
        "import os, torch\nfrom dplab.devices import lab_devices\n"
        "devices = lab_devices(2)\nx = torch.ones(2, device=devices[0])\n"
        "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), torch.cuda.device_count(), devices,"
        " (x + x).to(devices[1]).tolist())\n"
    )
    assert "'' 0 [device(type='sim', index=0), device(type='sim', index=1)] [2.0, 2.0]" in said


@pytest.mark.slow
@as_root
def test_a_runaway_cell_is_held_by_its_own_labs_limits_while_another_check_finishes(hub, labs):
    ann, bo = labs["ann"], labs["bo"]
    kernel = ann.lab_api("POST", "/kernels", json={"name": "python3"}).json()["id"]
    assert "started" in ann.run_in(kernel, RUNAWAY)
    shown, status = bo.terminal(CHECK)
    assert status == 1, shown  # the stub is not written yet: the check ran, and said so
    assert "✗ book_demo_gives_threes_on_both_devices  0/2" in shown, shown
    said = ann.run_in(kernel, "print('hog ended:', hog.wait(300))\n")
    assert "hog ended: -9" in said, said  # killed (SIGKILL) when it reached the lab's limit
    memory, _ = lab_groups(hub, "ann")  # by the out-of-memory killer of ann's lab's group
    if (memory / "memory.oom_control").exists():
        assert counter(memory / "memory.oom_control", "oom_kill") >= 1
    else:
        assert counter(memory / "memory.events", "oom_kill") >= 1
    assert ann.lab_api("GET", "/contents").status_code == 200  # ann's lab itself lives on
    busy = [args for args in processes(account(hub, "ann")).values() if "while True" in args]
    assert len(busy) == 3  # left running, for the next test: stopping the hub stops them


@pytest.mark.slow
@as_root
def test_no_process_of_a_lab_outlives_the_hub_and_no_file_outlives_hub_clear(hub, labs):
    names = {name: account(hub, name) for name in STUDENTS}
    uids = {name: int(subprocess.check_output(["id", "-u", names[name]])) for name in STUDENTS}
    groups = {g for name in STUDENTS for g in lab_groups(hub, name)}
    # What would outlive the labs: a warm server (bo checked from the Terminal) and a
    # process that ann's kernel started and detached.
    if not any("warm_commands" in args for args in processes(names["bo"]).values()):
        labs["bo"].terminal(CHECK)
    assert any("grader.front.warm_commands" in a for a in processes(names["bo"]).values())
    assert "started" in labs["ann"].run(LINGERER)
    assert any("while True" in a for a in processes(names["ann"]).values())
    # The lab's own temporary files (its Terminal's, its warm server's) are in its home...
    home_tmp = Path(hub.env["HUB_HOMES"]) / names["bo"] / ".tmp"
    assert (home_tmp / f"grader-warm-{uids['bo']}").is_dir()
    assert list(home_tmp.glob("lab-terminal.*"))
    started = hub.log_path.stat().st_ctime
    for name in STUDENTS:
        made = [f.name for f in Path("/tmp").iterdir()
                if f.lstat().st_uid == uids[name] and f.lstat().st_mtime >= started]  # fmt: skip
        assert made == [], made
    # ... and what a student's program puts elsewhere goes with hub-clear.
    shown, status = labs["ann"].terminal(
        "touch /tmp/$USER-left /dev/shm/$USER-left && mkdir /var/tmp/$USER-cache"
    )
    assert status == 0, shown

    labs["ann"].stop_lab()  # stopping one lab stops all of it, and only it
    assert processes(names["ann"]) == {}
    assert processes(names["bo"])
    hub.stop()  # stopping the hub stops every lab
    for name in STUDENTS:
        assert processes(names[name]) == {}, name
    assert not [g for g in groups if g.exists()]

    cleared = subprocess.run(
        [sys.executable, "-m", "hub.clear", "--state", str(hub.state), "--yes"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert re.search(r"removing their \d+ files outside their homes", cleared.stdout)
    owners = [arg for uid in uids.values() for arg in ("-o", "-uid", str(uid))][1:]
    found = subprocess.run(["find", *places(), "-xdev", "(", *owners, ")"],
                           capture_output=True, text=True)  # fmt: skip
    assert found.stdout.split() == []
    homes = Path(hub.env["HUB_HOMES"])
    assert not [n for n in names.values() if (homes / n).exists()]


# ---- the control groups' files, on a made-up machine ----------------------------------------


def made_up_machine(folder: Path, mounts: str, groups: str) -> Path:
    """A /proc/self of a machine whose cgroup file systems are `mounts` (mountinfo's lines)
    and whose process is in `groups` (/proc/self/cgroup's lines)."""
    proc = folder / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mounts)
    (proc / "cgroup").write_text(groups)
    return proc


def test_cgroup_v2_groups_go_under_the_hubs_own_with_its_limits(tmp_path):
    """Under systemd with Delegate=yes, say: the labs' groups beside the hub's service's
    processes, with the cpu and memory controllers handed down, and the lab's limits."""
    service = tmp_path / "cg" / "system.slice" / "hub.service"
    service.mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    proc = made_up_machine(
        tmp_path,
        f"30 25 0:26 / {tmp_path / 'cg'} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        "0::/system.slice/hub.service\n",
    )
    groups = LabGroups(proc)
    assert (groups.version, groups.why) == (2, "")
    assert groups.parents == [service / "multigpu-labs"]
    assert (service / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (service / "multigpu-labs" / "cgroup.subtree_control").read_text() == "+cpu +memory"
    joins = groups.make("lab-ann", 3 * 2**30, 1.5)
    lab = service / "multigpu-labs" / "lab-ann"
    assert joins == [lab / "cgroup.procs"]
    assert (lab / "memory.max").read_text() == str(3 * 2**30)
    assert (lab / "cpu.max").read_text() == "150000 100000"


def test_cgroup_v1_groups_go_in_the_memory_and_cpu_hierarchies(tmp_path):
    memory, cpu = tmp_path / "memory" / "box", tmp_path / "cpu,cpuacct"
    for folder in (memory, cpu):
        folder.mkdir(parents=True)
    proc = made_up_machine(
        tmp_path,
        f"35 31 0:32 / {tmp_path / 'memory'} rw - cgroup cgroup rw,memory\n"
        f"32 31 0:29 / {cpu} rw - cgroup cgroup rw,cpu,cpuacct\n",
        "4:memory:/box\n1:cpu,cpuacct:/\n",
    )
    groups = LabGroups(proc)
    assert groups.version == 1
    labs = [memory / "multigpu-labs", cpu / "multigpu-labs"]
    assert groups.parents == labs
    for folder, name in zip(labs, ("memory.limit_in_bytes", "cpu.cfs_quota_us"), strict=True):
        (folder / "lab-ann").mkdir(parents=True)  # (a made-up group has no files of its own)
        (folder / "lab-ann" / name).write_text("-1")
    (labs[1] / "lab-ann" / "cpu.cfs_period_us").write_text("100000")
    groups.make("lab-ann", 2**30, 0.5)
    assert (labs[0] / "lab-ann" / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (labs[1] / "lab-ann" / "cpu.cfs_quota_us").read_text() == "50000"


def test_a_machine_without_control_groups_is_told_and_told_what_to_do(tmp_path):
    proc = made_up_machine(tmp_path, "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "0::/\n")
    groups = LabGroups(proc)
    assert groups.version == 0 and groups.parents == []
    assert "neither cgroup v2 with the cpu and memory controllers nor cgroup v1" in groups.why
    assert "Delegate=yes" in FIX_LIMITS and "HUB_SPAWNER=docker" in FIX_LIMITS


def test_hub_gpus_as_cuda_visible_devices(tmp_path):
    turns = tmp_path / "gpus.json"
    assert visible_gpus("none", [], turns, "ann") == ""  # none: stand-ins on the CPU
    assert visible_gpus("all", ["0", "1"], turns, "ann") is None  # every GPU
    each = {name: visible_gpus("each", ["2", "3"], turns, name) for name in ("ann", "bo", "cy")}
    assert each == {"ann": "2", "bo": "3", "cy": "2"}
    assert visible_gpus("each", ["2", "3"], turns, "bo") == "3"  # kept across restarts
