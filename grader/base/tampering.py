"""What the grading relies on in a process, and whether student code has changed it."""

import builtins
import sys
from types import FunctionType, ModuleType

import torch

# The torch names whose change would change what the child observes. Comparisons such as
# torch.equal are not among them: the child compares nothing, the grader does. Nor is all of
# torch: it rebinds some of its own names when parts load lazily.
TORCH_FUNCTIONS = ("device", "save")


def watched_objects() -> dict[str, object]:
    """Return what the cases rely on: the grader's modules, unittest.mock, tensors, modules,
    torch.distributed and builtins."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    watched: dict[str, object] = {
        "builtins": builtins,
        "torch.Tensor": torch.Tensor,
        "torch.nn.Module": torch.nn.Module,
        "torch.distributed": dist,  # the distributed checks record its calls and trust it
        "torch.distributed.distributed_c10d": distributed_c10d,
        "dplab.distributed": sys.modules["dplab.distributed"],  # starts the ranks
    }
    for name, module in list(sys.modules.items()):
        ours = name == "grader" or name.startswith("grader.")
        if (ours or name == "unittest.mock") and isinstance(module, ModuleType):
            watched[name] = module  # unittest.mock: the cases swap names with it
    return watched


# torch keeps answers it works out lazily in plain module variables (torch.distributed's
# `_spmd_types_available` is set when torch._dynamo is first imported, which the first
# optimizer or launch does): in torch's modules only functions, classes and objects count.
PLAIN = (type(None), bool, int, float, str)


def counted_attributes(name: str, obj: object) -> dict[str, object]:
    """Return the attributes of a watched object that count, by name (the type of each value
    is asked with type(), never isinstance: torch's deprecated `reduce_op` warns whenever its
    attributes are looked up)."""
    attributes = vars(obj)
    if name.startswith("torch.") and isinstance(obj, ModuleType):
        return {k: v for k, v in attributes.items() if not issubclass(type(v), PLAIN)}
    return dict(attributes)


class Snapshot:
    """What the watched objects (and torch's TORCH_FUNCTIONS) point to now, the objects
    themselves held; `changed()` names those that point elsewhere since (or are gone), by
    identity. Cheap: a grade takes one in every rank after every run."""

    def __init__(self, watched: dict[str, object]) -> None:
        self.watched = watched
        self.torch = {name: getattr(torch, name) for name in TORCH_FUNCTIONS}
        self.held = {name: counted_attributes(name, obj) for name, obj in watched.items()}
        self.code = [
            (name, attribute, value, value.__code__)
            for name, attributes in self.held.items()
            for attribute, value in attributes.items()
            if type(value) is FunctionType
        ]

    def changes(self) -> dict[str, int]:
        """Return, for each name that points elsewhere now, the identity of what it points to
        (of its function body, for a function whose body was swapped)."""
        missing = object()
        found = {}
        for name, value in self.torch.items():
            now = getattr(torch, name, missing)
            if now is not value:
                found[f"torch.{name}"] = id(now)
        for name, attributes in self.held.items():
            namespace = vars(self.watched[name])
            for attribute, value in attributes.items():
                now = namespace.get(attribute, missing)
                if now is not value:
                    found[f"{name}.{attribute}"] = id(now)
        for name, attribute, function, code in self.code:
            if function.__code__ is not code:
                found.setdefault(f"{name}.{attribute}", id(function.__code__))
        return found

    def changed(self) -> list[str]:
        """Return the names that point elsewhere now (or are gone), sorted."""
        return sorted(self.changes())
