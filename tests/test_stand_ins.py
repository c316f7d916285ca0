"""Stand-in devices: the book's multi-GPU code runs, fails and computes as on separate GPUs."""

import io
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import dplab
from dplab import sim
from dplab.devices import num_gpus
from tests.conftest import fresh_solution

pytestmark = pytest.mark.usefixtures("stand_ins")
sim.register()  # the `sim` device type, so that torch.device("sim", i) exists at import
D0, D1, D2 = (torch.device("sim", i) for i in range(3))
SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


def test_stand_ins_are_distinct_devices_that_say_what_they_are():
    a, b = torch.ones(2, device=D0), torch.ones(2, device="sim:1")
    assert (a.device, b.device) == (D0, D1) and a.device != b.device
    assert repr(b) == "tensor([1., 1.], device='sim:1')"
    assert str(torch.device("sim:1")) == "sim:1"


def test_the_books_allreduce_demo_gives_threes_on_both():
    data = [torch.ones((1, 2), device=torch.device("sim", i)) * (i + 1) for i in range(2)]
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
    assert [t.device for t in data] == [D0, D1]
    assert all(torch.equal(t.cpu(), torch.tensor([[3.0, 3.0]])) for t in data)


def test_mixing_two_stand_ins_fails_as_on_gpus():
    with pytest.raises(RuntimeError, match=f"{SAME_DEVICE}, sim:0 and sim:1"):
        torch.ones(2, device=D0) + torch.ones(2, device=D1)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.ones(2, 2, device=D0) @ torch.ones(2, 2, device=D1)
    with pytest.raises(RuntimeError, match=f"{SAME_DEVICE}, sim:0 and cpu"):
        torch.ones(2, device=D0) + torch.ones(2)


def test_a_misspelt_method_fails_with_a_gpu_tensors_message():
    """`w.require_grad_()` (the seeds' typo) says what it says on a GPU, so the error a
    student reads and the hint keyed to it are the same on stand-ins."""
    for tensor in (torch.ones(2), torch.ones(2, device=D1)):
        with pytest.raises(AttributeError) as raised:
            tensor.require_grad_()
        assert str(raised.value) == "'Tensor' object has no attribute 'require_grad_'"
        assert (raised.value.name, raised.value.obj) == ("require_grad_", tensor)
    assert not hasattr(torch.ones(2, device=D1), "devices")


def test_a_conv2d_across_stand_ins_fails_and_on_one_works():
    X = torch.randn(2, 1, 28, 28)
    W = torch.randn(20, 1, 3, 3)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        F.conv2d(X.to(D0), W.to(D1))
    assert torch.allclose(F.conv2d(X.to(D1), W.to(D1)).cpu(), F.conv2d(X, W), atol=1e-6)


def test_mixing_in_backward_fails_too():
    class WrongDevice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            return torch.ones(grad.shape, device=D1)

    w = torch.randn(3).to(D0).requires_grad_()
    (w * 2).sum().backward()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        WrongDevice.apply(w).sum().backward()


def test_assigning_data_shares_memory_as_on_a_gpu(stand_ins):
    """`t.data = other` makes `t` share `other`'s memory and device, as it does on GPUs (it
    used to change nothing on stand-ins); `p.data -= ...` updates in place."""
    a = torch.ones(2, device=stand_ins[0])
    total = torch.full((2,), 3.0, device=stand_ins[0])
    a.data = total.to(stand_ins[0])
    total.add_(1)
    assert a.tolist() == [4.0, 4.0] and a.device == stand_ins[0]
    b = torch.zeros(2, device=stand_ins[1])
    b.data = total.to(stand_ins[1])
    assert b.tolist() == [4.0, 4.0] and b.device == stand_ins[1]
    p = torch.zeros(3, device=stand_ins[1], requires_grad=True)
    (p * 2).sum().backward()
    p.data -= 0.5 * p.grad
    assert p.tolist() == [-1.0, -1.0, -1.0] and p.requires_grad
    with pytest.raises(RuntimeError, match="copy the values instead"):
        a.data = torch.zeros(5, device=stand_ins[0])


def test_to_is_a_real_copy_between_stand_ins_and_a_no_op_onto_the_same_one():
    x = torch.arange(4.0).to(D1)
    assert x.to(D1) is x and x.to("sim:1") is x
    y = x.to(D0)
    assert y.device == D0 and y is not x
    y.add_(1)
    assert torch.equal(x.cpu(), torch.arange(4.0))


def test_factories_cpu_item_tolist_and_printing():
    assert torch.zeros(3, device=D2).device == D2
    assert torch.tensor([1, 2], device=D1).tolist() == [1, 2]
    assert torch.arange(5, device=D1).sum().item() == 10
    assert f"{torch.tensor(2.5, device=D0):.1f}" == "2.5"
    assert type(torch.ones(2, device=D1).cpu()) is torch.Tensor
    with pytest.raises(TypeError, match="can't convert sim:1 device type tensor to numpy"):
        torch.ones(2, device=D1).numpy()


def test_constructors_and_cpu_indices_work_as_on_a_gpu():
    assert torch.asarray([1, 2], device=D1).device == D1
    assert torch.as_tensor([1.0], device=D2).device == D2
    picked = torch.arange(5.0, device=D1)[torch.tensor([0, 3])]  # CPU indices are allowed
    assert picked.device == D1 and picked.tolist() == [0.0, 3.0]


def test_gradients_land_on_the_device_of_their_tensor():
    p = torch.randn(3, requires_grad=True)
    (p.to(D1) ** 2).sum().backward()
    assert p.grad.device == torch.device("cpu")
    assert torch.allclose(p.grad, 2 * p.detach())
    q = torch.randn(3).to(D0).requires_grad_()
    (q.to(D1) * 3).sum().backward()
    assert q.grad.device == D0 and torch.allclose(q.grad.cpu(), torch.full((3,), 3.0))


def test_in_place_sgd_under_no_grad():
    w = torch.randn(4).to(D1).requires_grad_()
    (w * w).sum().backward()
    before = w.detach().cpu()
    dplab.sgd([w], lr=0.5, batch_size=2)
    assert w.is_leaf and w.device == D1
    assert torch.allclose(w.detach().cpu(), before - 0.5 * 2 * before / 2)
    assert torch.equal(w.grad.cpu(), torch.zeros(4))


def test_the_books_scatter_splits_onto_stand_ins():
    shards = nn.parallel.scatter(torch.arange(20).reshape(4, 5), [D0, D1])
    assert [s.device for s in shards] == [D0, D1]
    assert torch.equal(shards[1].cpu(), torch.arange(10, 20).reshape(2, 5))


def test_data_parallel_on_stand_ins_trains_as_one_device_does():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    twin = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    twin.load_state_dict(net.state_dict())
    X, y = torch.randn(6, 1, 28, 28), torch.randint(0, 10, (6,))
    parallel = nn.DataParallel(net.to(D0), device_ids=[D0, D1, D2])
    F.cross_entropy(parallel(X.to(D0)), y.to(D0)).backward()
    F.cross_entropy(twin(X), y).backward()
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        assert p.device == D0 and p.grad.device == D0
        assert torch.allclose(p.grad.cpu(), q.grad, atol=1e-6)


def test_data_parallel_without_device_ids_takes_every_stand_in(stand_ins):
    """As it takes every GPU on a machine with GPUs."""
    net = nn.Linear(3, 2).to(stand_ins[0])
    wrapped = nn.DataParallel(net)
    assert wrapped.device_ids == stand_ins
    seen = []
    net.register_forward_pre_hook(lambda m, inputs: seen.append(str(inputs[0].device)))
    out = wrapped(torch.ones(8, 3, device=stand_ins[0]))
    assert seen == [str(d) for d in stand_ins]  # a part of the batch on each stand-in
    assert out.shape == (8, 2) and out.device == stand_ins[0]


def test_data_parallel_wants_the_module_on_the_first_device():
    parallel = nn.DataParallel(nn.Linear(2, 2), device_ids=[D0, D1])
    with pytest.raises(
        RuntimeError, match="module must have its parameters and buffers on device sim:0"
    ):
        parallel(torch.ones(4, 2).to(D0))


def test_a_data_parallel_train_batch_step_equals_the_plain_step():
    ns = fresh_solution("from_scratch.ipynb")
    params = dplab.lenet_params(scale=0.1, seed=3)
    X, y = torch.randn(7, 1, 28, 28), torch.randint(0, 10, (7,))
    devices = [D0, D1]
    replicas = [[p.to(d).requires_grad_() for p in params] for d in devices]
    ns["train_batch"](X, y, replicas, devices, 0.1)
    plain = [p.clone().requires_grad_() for p in params]
    ns["loss"](dplab.lenet(X, plain), y).sum().backward()
    dplab.sgd(plain, 0.1, 7)
    for replica, device in zip(replicas, devices, strict=True):
        for a, b in zip(replica, plain, strict=True):
            assert a.device == device
            assert torch.allclose(a.detach().cpu(), b.detach(), atol=1e-6)


def test_synchronize_and_saving():
    dplab.synchronize([D0, D1])
    buffer = io.BytesIO()
    torch.save(torch.arange(3).to(D1), buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer), torch.arange(3))  # saved as a CPU tensor


def test_stand_ins_compute_on_the_backing_device():
    wanted = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    assert sim.backing_device() == wanted
    assert sim.backing(torch.ones(2, device=D1)).device == wanted


@pytest.mark.parametrize(
    ("mode", "wanted"), [("real", "cpu cpu"), ("cpu", "cpu cpu"), ("stand-in", "sim:0 sim:1")]
)
def test_a_user_can_force_real_devices_or_the_cpu(mode, wanted):
    if num_gpus() >= 1 and mode == "real":
        pytest.skip("with a GPU, real devices are GPUs")
    proc = run_with_devices("import dplab; print(*dplab.lab_devices(2))", mode)
    assert proc.stdout.strip().splitlines()[-1] == wanted, proc.stderr


def run_with_devices(code: str, mode: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python with DPLAB_DEVICES=`mode`."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"DPLAB_DEVICES": mode, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


# A loop of PyTorch's examples: batches in pinned memory, copied without blocking.
PINNED_LOADER = """
import warnings
import torch
import dplab
from torch.utils.data import DataLoader, TensorDataset
device = dplab.try_gpu(1)
loader = DataLoader(TensorDataset(torch.arange(10.0), torch.arange(10)), batch_size=4,
                    pin_memory=True)
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    rows = [X.to(device, non_blocking=True).cpu().tolist() for X, _ in loader]
print(device, rows, any("pin_memory" in str(w.message) for w in said))
"""


@pytest.mark.parametrize("mode", ["stand-in", "cpu"])
def test_pin_memory_loads_as_on_a_machine_without_a_gpu(mode):
    """`pin_memory=True` loads every batch, with PyTorch's own warning that nothing can be
    pinned, where the lab's devices are stand-ins (which cannot pin memory) or the CPU."""
    if num_gpus() >= 1:
        pytest.skip("with a GPU, memory is really pinned")
    proc = run_with_devices(PINNED_LOADER, mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    device = "sim:1" if mode == "stand-in" else "cpu"
    rows = [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    assert proc.stdout.strip().splitlines()[-1] == f"{device} {rows} True"


def test_fork_rng_saves_and_restores_the_stand_ins_random_state():
    with torch.random.fork_rng(devices=[D0]):
        drawn = torch.rand(3)
    assert torch.equal(torch.rand(3), drawn)


def test_the_stand_ins_switch_on_when_the_lab_hands_one_out_and_say_so():
    """Importing the lab changes nothing in torch; the first stand-in handed out (try_gpu)
    switches them on through `use_stand_ins`, which prints a line saying so."""
    code = (
        "import torch, dplab\n"
        "from dplab import sim\n"
        "before = (sim.enabled(), torch.tensor is torch._C._VariableFunctions.tensor)\n"
        "print('before', *before)\n"
        "print('device', dplab.try_gpu(1))\n"
        "print('after', sim.enabled(), torch.tensor is torch._C._VariableFunctions.tensor)\n"
    )
    proc = run_with_devices(code, "stand-in")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "before False True"
    assert lines[1].startswith("dplab: this machine has") and "stand-in devices" in lines[1]
    assert lines[2:] == ["device sim:1", "after True False"]
