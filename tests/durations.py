"""How long each test module takes, recorded by a run and read by the next to order the
modules: longest first, so that make test's two workers (one module each at a time, see
--dist loadfile) finish together. A run given `--record-durations PATH` (make test gives
build/test-durations.json) writes each module's seconds there, merged with what the file
held; the order is read from that file where it exists, else from tests/durations.json,
the record kept in the repository (copy a full run's file there when the order drifts). A
module not in the record goes first: it may be long."""

import collections
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEPT = REPO / "tests" / "durations.json"
LOCAL = REPO / "build" / "test-durations.json"

_seconds: collections.Counter = collections.Counter()


def recorded() -> dict[str, float]:
    """Each module's seconds (by its file's stem), from the latest record there is."""
    for path in (LOCAL, KEPT):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return {}


def module_of(nodeid: str) -> str:
    return Path(nodeid.split("::", 1)[0]).stem


def add(report) -> None:
    """Count a test phase's seconds to its module (in the process that reports)."""
    _seconds[module_of(report.nodeid)] += report.duration


def write(path: str) -> None:
    """Merge this run's seconds into the record at `path`."""
    if not _seconds:
        return
    target = Path(path)
    try:
        kept = json.loads(target.read_text())
    except (OSError, ValueError):
        kept = {}
    kept.update({name: round(seconds, 1) for name, seconds in _seconds.items()})
    target.parent.mkdir(parents=True, exist_ok=True)
    ordered = dict(sorted(kept.items(), key=lambda item: -item[1]))
    target.write_text(json.dumps(ordered, indent=1) + "\n")
