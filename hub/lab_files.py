"""What a student's lab holds, as the lab image's Dockerfile says: the one list of the files
that students get (the runtime library, the released notebooks, the public checks, the lab's
start script), read by the image's tests and by the hub, which lends the same files to its
students' accounts outside containers (hub/running.py's `python_for_students`)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "docker" / "Dockerfile"
# Folders never read for the build context (the image's .dockerignore leaves them out too):
# walking a virtual environment's files would cost seconds.
NEVER = {".git", ".venv", "node_modules", "__pycache__", "build"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in path.read_text().splitlines():
        if line.strip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                joined.append((word.upper(), rest.strip()))
            current = ""
    return joined


def stages() -> dict[str, dict]:
    """Return each stage's parent stage, COPY instructions (sources, destination and the stage
    copied from, or None for the build context), the paths its `RUN rm -rf` removes, and its
    CMD, HEALTHCHECK and USER."""
    found: dict[str, dict] = {}
    name = ""
    for word, rest in instructions(DOCKERFILE):
        if word == "FROM":
            parts = rest.split()
            name = parts[-1] if len(parts) >= 3 and parts[-2].upper() == "AS" else parts[0]
            found[name] = {
                "parent": parts[0],
                "copies": [],
                "removes": [],
                "cmd": None,
                "health": None,
                "user": None,
            }
        elif word == "COPY":
            args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            origin = next((a.split("=", 1)[1] for a in args if a.startswith("--from=")), None)
            args = [a for a in args if not a.startswith("--")]
            found[name]["copies"].append((args[:-1], args[-1], origin))
        elif word == "RUN" and rest.startswith("rm -rf "):
            found[name]["removes"] += shlex.split(rest)[2:]
        elif word == "CMD":
            found[name]["cmd"] = rest
        elif word == "HEALTHCHECK":
            found[name]["health"] = rest
        elif word == "USER":
            found[name]["user"] = rest
    return found


def glob_regex(pattern: str) -> str:
    """Translate a Docker path pattern: `*` and `?` stay within one folder, `**` crosses them."""
    regex = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", "[^/]*")
    return regex.replace(r"\?", "[^/]").replace("\0", ".*")


def under(path: str, patterns: list[str]) -> bool:
    """Return True when one of the Docker path `patterns` (of .dockerignore, COPY or `rm -rf`)
    names `path` or a folder above it; "." names every path."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in (p.rstrip("/") for p in patterns):
        if pattern == "." or any(re.fullmatch(glob_regex(pattern), p) for p in prefixes):
            return True
    return False


def build_context() -> list[str]:
    """Return the repository files a build may copy: .dockerignore's patterns left out."""
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    context = [
        str(p.relative_to(REPO))
        for p in REPO.rglob("*")
        if p.is_file() and not NEVER & set(p.relative_to(REPO).parts)
    ]
    return [p for p in context if not under(p, patterns)]


def image_files(stage: str, workdir_only: bool = False) -> set[str]:
    """Return the repository files that the stage (with its parents) copies into the image
    (with workdir_only, those copied to relative destinations, under WORKDIR /opt/lab). A
    `COPY --from=STAGE` takes that stage's files (those under WORKDIR, where it copies them
    to the same relative paths), less what a `RUN rm -rf` of that stage removed."""
    return _image_files(stage, workdir_only, build_context(), stages())


def _image_files(stage: str, workdir_only: bool, context: list[str], all_stages: dict) -> set[str]:
    files: set[str] = set()
    while stage in all_stages:
        for sources, destination, origin in all_stages[stage]["copies"]:
            if workdir_only and destination.startswith("/") and destination != "/opt/lab":
                continue
            if origin is not None:
                there = _image_files(origin, True, context, all_stages)
                gone = all_stages[origin]["removes"]
                taken = [s.removeprefix("/opt/lab/") for s in sources]
                files |= {f for f in there if under(f, taken) and not under(f, gone)}
                continue
            files |= {path for path in context if under(path, sources)}
        stage = all_stages[stage]["parent"]
    return files
