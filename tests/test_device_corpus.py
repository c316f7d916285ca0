"""The calls of tests/device_corpus.py give on stand-ins what they give on two GPUs.

PyTorch's functional data-parallel API (torch.cuda.comm, nn.parallel's replicate, scatter,
parallel_apply, gather and data_parallel) runs on the stand-ins, with the values, devices
and errors two GPUs give. The same corpus runs on two real GPUs in `make gpu-check`.
"""

import pytest
import torch
import torch.cuda.comm as comm
from torch import nn

from dplab import sim
from dplab.devices import num_gpus
from tests.device_corpus import CASES, run


@pytest.mark.usefixtures("stand_ins")
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_call_gives_on_stand_ins_what_a_gpu_gives(name):
    case, expected = CASES[name]
    assert run(case, [torch.device("sim", 0), torch.device("sim", 1)]) == expected()


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
