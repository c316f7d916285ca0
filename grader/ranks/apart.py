"""Compute the judges' own training in a forked copy, so no autograd threads stay behind."""

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from labtext import _


def autograd_threads_started() -> bool:
    """Return True when autograd has started its device threads in this process (PyTorch
    names them pt_autograd_N)."""

    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("pt_autograd"):
                    return True
        except OSError:
            pass
    return False


def apart(fn: Callable[..., Any], *args: Any, wait: float = 120.0) -> Any:
    """Return `fn(*args)`, computed in a forked process of its own where that matters.

    For the judges' own training and backward passes: autograd starts threads for the GPUs
    (and the lab's stand-in devices) at a process's first backward pass, and a process with
    those threads can no longer fork ranks that run backward. The checks of a notebook run in
    its kernel, which launches ranks later, so no judge may leave such threads there. Where
    the threads are already there (the grader's own process, after other exercises), forking
    could not help, and `fn` runs here. So it does when the copy has not answered within `wait`
    seconds: a copy forked while another of the process's threads held a lock (an import's,
    say) can wait for it forever.
    """
    import pickle
    import select
    import signal

    if autograd_threads_started():
        return fn(*args)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: compute, send, and leave without running any exit handler
        os.close(read_end)
        code = 0
        try:
            try:
                torch.set_num_threads(1)  # the parent's OpenMP threads are not here
                payload = pickle.dumps(("value", fn(*args)))
            except BaseException as error:  # the judge's own error, raised again in the parent
                payload = pickle.dumps(("error", f"{type(error).__name__}: {error}"))
                code = 1
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + wait
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while select.select([source], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = source.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        else:  # no answer in time: the copy is stuck, so compute here
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return fn(*args)
    data = b"".join(chunks)
    os.waitpid(pid, 0)
    if data:
        kind, value = pickle.loads(data)
    else:
        kind, value = "error", _("the computation's process died")
    if kind == "error":
        raise RuntimeError(_("the grader's own computation failed: {error}").format(error=value))
    return value
