"""The GPUs a class's hub hands its labs: every GPU to every lab, one each in turn, or none
(HUB_GPUS), for labs as processes (CUDA_VISIBLE_DEVICES) and as containers (DockerSpawner's
device requests)."""

from __future__ import annotations

import json
import os
from pathlib import Path


class GpuRoundRobin:
    """Hands each student one GPU of `gpus` in the order they first start a lab, and
    remembers it in a file, so a student keeps the same GPU across restarts."""

    def __init__(self, gpus: list[str], path: str | os.PathLike) -> None:
        self.gpus = gpus
        self.path = Path(path)

    def gpu_for(self, name: str) -> str:
        given = json.loads(self.path.read_text()) if self.path.exists() else {}
        if name not in given:
            given[name] = self.gpus[len(given) % len(self.gpus)]
            self.path.write_text(json.dumps(given, indent=1) + "\n")
        return given[name]


def gpu_mode(mode: str, gpus: list[str]) -> str:
    """HUB_GPUS, checked: every GPU for every lab (`all`), one of `gpus` each in turn
    (`each`), or none (`none`)."""
    if mode not in ("all", "each", "none"):
        raise SystemExit(f"hub: HUB_GPUS={mode!r}: say all, each or none")
    if mode == "each" and not gpus:
        raise SystemExit("hub: HUB_GPUS=each needs the GPUs to share, as HUB_GPU_IDS=0,1,2,3")
    return mode


def visible_gpus(mode: str, gpus: list[str], turns: str | os.PathLike, name: str) -> str | None:
    """CUDA_VISIBLE_DEVICES for `name`'s lab as process, as HUB_GPUS `mode` says: None (left
    unset: every GPU), one of `gpus` in turn (remembered in `turns`), or '' (none: the lab's
    stand-in devices then compute on the CPU)."""
    if mode == "none":
        return ""
    if mode == "each":
        return GpuRoundRobin(gpus, turns).gpu_for(name)
    return None


def lab_host_config(mode: str, gpus: list[str], state: Path, shm: str = "4g"):
    """DockerSpawner's `extra_host_config`: a /dev/shm of `shm` and every GPU for every lab
    (`all`), one each in turn (`each`), or none (`none`). One each needs `device_ids`: a
    request of `count=1` would put every student on the same GPU."""
    base = {"shm_size": shm}
    if gpu_mode(mode, gpus) == "none":
        return base
    if mode == "all":
        request = {"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}
        return base | {"device_requests": [request]}
    turns = GpuRoundRobin(gpus, state / "gpus.json")

    def host_config(spawner) -> dict:
        gpu = turns.gpu_for(spawner.user.name)
        request = {"Driver": "nvidia", "DeviceIDs": [gpu], "Capabilities": [["gpu"]]}
        return base | {"device_requests": [request]}

    return host_config
