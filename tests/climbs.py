"""`python -m tests.climbs ARGS...`: run `python -m grader ARGS...` in this process, watching
every call from one module of the lab's packages into another (threads included), and print
as JSON each pair of layers (tests/test_layers.py) that calls went between, with how many
calls went up a layer: into code of a layer above the caller's."""

import collections
import json
import sys
import threading

from tests.test_layers import ORDER, layer, modules

FILES = {str(path): name for name, path in modules().items()}
CALLS: collections.Counter = collections.Counter()


def watch(frame, event, arg) -> None:
    if event != "call" or frame.f_back is None:
        return
    callee = FILES.get(frame.f_code.co_filename)
    caller = FILES.get(frame.f_back.f_code.co_filename)
    if callee and caller and callee != caller:
        CALLS[(caller, frame.f_back.f_code.co_name, callee, frame.f_code.co_name)] += 1


def main(argv: list[str]) -> None:
    from grader.front import cli

    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        cli.main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    calls = [
        {
            "from": f"{caller}.{where}",
            "to": f"{callee}.{what}",
            "layers": [layer(caller), layer(callee)],
            "up": ORDER.index(layer(callee)) > ORDER.index(layer(caller)),
            "calls": n,
        }
        for (caller, where, callee, what), n in sorted(CALLS.items())
    ]
    print(json.dumps(calls))


if __name__ == "__main__":
    main(sys.argv[1:])
