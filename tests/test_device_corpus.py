"""The calls of tests/device_corpus.py give on stand-ins what they give on two GPUs.

PyTorch's functional data-parallel API (torch.cuda.comm, nn.parallel's replicate, scatter,
parallel_apply, gather and data_parallel) runs on the stand-ins, with the values, devices
and errors two GPUs give; and while torch.cuda answers for the stand-ins (as the grader has it
for the notebooks that train on them), so do its probes, `cuda:i`, streams and AMP. The same corpus runs on two real GPUs in `make gpu-check`.
"""

import pytest
import torch
import torch.cuda.comm as comm
from torch import nn

from dplab import sim
from dplab.devices import num_gpus
from tests.device_corpus import ASK_CUDA, CASES, run

STAND_INS = ["sim:0", "sim:1"]  # made devices in each test: "sim" exists once registered


@pytest.mark.usefixtures("stand_ins")
@pytest.mark.parametrize("name", sorted(set(CASES) - ASK_CUDA))
def test_each_call_gives_on_stand_ins_what_a_gpu_gives(name):
    case, expected = CASES[name]
    assert run(case, [torch.device(d) for d in STAND_INS]) == expected()


@pytest.mark.usefixtures("stand_ins")
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_call_gives_the_same_while_torch_cuda_answers_for_the_stand_ins(name):
    """As the grader runs the notebooks that train on stand-ins: torch.cuda speaks of them."""
    case, expected = CASES[name]
    with sim.answering_as_gpus():
        got = run(case, [torch.device(d) for d in STAND_INS])
    assert got == expected()


@pytest.mark.usefixtures("stand_ins")
def test_torch_cuda_speaks_of_the_machine_again_after():
    with sim.answering_as_gpus():
        inside = (torch.cuda.device_count(), torch.cuda.is_available())
    assert inside == (4, True)
    assert (torch.cuda.device_count(), torch.cuda.is_available()) == (
        sim.gpu_count(),
        sim.gpus_available(),
    )
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.multigpu
@pytest.mark.skipif(num_gpus() < 2, reason="needs two CUDA GPUs")
def test_each_call_gives_the_same_on_two_gpus():
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    differ = {
        name: got
        for name, (case, expected) in sorted(CASES.items())
        if (got := run(case, devices)) != expected()
    }
    assert differ == {}


def test_torch_has_its_own_functions_back_when_the_stand_ins_go_off():
    before = (comm.broadcast, comm.scatter, nn.parallel.parallel_apply, nn.parallel.data_parallel)
    sim.enable(2)
    during = (comm.broadcast, comm.scatter, nn.parallel.parallel_apply, nn.parallel.data_parallel)
    sim.disable()
    after = (comm.broadcast, comm.scatter, nn.parallel.parallel_apply, nn.parallel.data_parallel)
    assert after == before
    assert all(a is not b for a, b in zip(during, before, strict=True))
