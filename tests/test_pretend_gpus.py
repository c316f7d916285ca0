"""Where the grader pretends a number of GPUs, code can use them as on a real machine.

`try_gpu` and `try_all_gpus` are checked with pretended GPU counts (grader.base.inputs.
pretend_gpus). Code from the book's first edition finds GPUs by placing a tensor on each
`cuda:i` until that fails; other code asks torch.cuda for names and memory. Each must find
exactly the pretended GPUs, on a laptop as on a GPU server.
"""

import pytest
import torch

from grader.base.inputs import pretend_gpus
from grader.manifest import load_manifest
from tests.conftest import grade_source


def probing_try_all_gpus() -> list[torch.device]:
    """The first edition's try_all_gpus, ported: a one-element tensor on each GPU in turn."""
    found = []
    try:
        for i in range(16):
            device = torch.device(f"cuda:{i}")
            torch.tensor([0], device=device)
            found.append(device)
    except RuntimeError:
        pass
    return found or [torch.device("cpu")]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_placing_a_tensor_finds_exactly_the_pretended_gpus(n):
    with pretend_gpus(n):
        found = probing_try_all_gpus()
    wanted = [torch.device("cuda", i) for i in range(n)] or [torch.device("cpu")]
    assert found == wanted


def test_every_pretended_gpu_takes_tensors_and_answers_probes():
    with pretend_gpus(2):
        for i in range(2):
            assert torch.empty(1, device=f"cuda:{i}").shape == (1,)
            assert torch.zeros(2).to(torch.device("cuda", i)).tolist() == [0.0, 0.0]
            assert torch.zeros(1).cuda(i).shape == (1,)
            assert torch.cuda.get_device_name(i)
            free, total = torch.cuda.mem_get_info(i)
            assert 0 < free <= total
            assert torch.cuda.get_device_properties(i).total_memory == total
            with torch.cuda.device(i):
                pass
        assert torch.zeros(1).cuda().shape == (1,)
        assert torch.device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize(
    ("probe", "error", "said"),
    [
        (lambda: torch.empty(1, device="cuda:2"), RuntimeError, "invalid device ordinal"),
        (lambda: torch.zeros(1).to("cuda:5"), RuntimeError, "invalid device ordinal"),
        (lambda: torch.zeros(1).cuda(2), RuntimeError, "invalid device ordinal"),
        (lambda: torch.cuda.mem_get_info(2), RuntimeError, "invalid device ordinal"),
        (lambda: torch.cuda.get_device_name(2), AssertionError, "Invalid device id"),
        (lambda: torch.cuda.set_device(3), RuntimeError, "invalid device ordinal"),
    ],
)
def test_a_gpu_that_is_not_there_fails_as_cuda_does(probe, error, said):
    with pretend_gpus(2), pytest.raises(error, match=said):
        probe()


def test_without_gpus_nothing_can_be_placed_on_one():
    with pretend_gpus(0), pytest.raises(RuntimeError, match="no CUDA-capable device"):
        torch.ones(1, device="cuda")


def test_torch_cuda_is_itself_again_after_the_block():
    before = (torch.cuda.device_count(), torch.cuda.get_device_name, torch.cuda.mem_get_info)
    with pretend_gpus(3):
        pass
    after = (torch.cuda.device_count(), torch.cuda.get_device_name, torch.cuda.mem_get_info)
    assert after == before
    if torch.cuda.device_count() == 0:
        with pytest.raises(RuntimeError):
            torch.ones(1, device="cuda:0")


def test_the_first_editions_probing_try_all_gpus_gets_full_marks():
    source = """
def try_all_gpus():
    devices = []
    try:
        for i in range(16):
            device = torch.device(f'cuda:{i}')
            _ = torch.tensor([0], device=device)
            devices.append(device)
    except RuntimeError:
        pass
    if not devices:
        devices = [torch.device('cpu')]
    return devices
"""
    result = grade_source(load_manifest().exercise("try_all_gpus"), source)
    assert result.score == result.max_score, [(c.name, c.message) for c in result.checks]


def test_a_try_gpu_that_probes_with_cuda_calls_gets_full_marks():
    source = """
def try_gpu(i=0):
    try:
        torch.cuda.get_device_name(i)
        torch.cuda.mem_get_info(i)
    except (AssertionError, RuntimeError):
        return torch.device('cpu')
    return torch.device(f'cuda:{i}')
"""
    result = grade_source(load_manifest().exercise("try_gpu"), source)
    assert result.score == result.max_score, [(c.name, c.message) for c in result.checks]
