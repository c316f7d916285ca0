"""Right code by the routes real code takes gets full marks, on every exercise.

Each exercise's reference is one way to do what its cell asks. Real code takes others: the
functional data-parallel API, `F.relu` for `nn.ReLU`, nested containers, `tensor_split` for
`chunk` where both are allowed, `dist.batch_isend_irecv` for `isend`/`irecv` or `send`/`recv`,
partitions by parameter for flat ones, padding as libraries pad, in-place updates for
out-of-place ones, comprehensions for loops, `torch.no_grad` for `.data`, `zero_grad` for
`grad = None`. The checks judge what the code computes, so each of these keeps full marks.
A route that a grader bug still charges is marked `xfail(strict=True)` with the check it
loses and why, so that the fix shows here.
"""

import functools
import tempfile
from pathlib import Path

import pytest

from grader.base.results import ExerciseResult
from grader.exercises.catalogue import variant
from grader.exercises.train_dataparallel.private import mistakes as train_dataparallel
from grader.grading import grade_path
from grader.load.notebook import read_cells
from grader.manifest import load_manifest
from tests.conftest import SOLUTIONS, grade_source, write_notebook

# from_scratch.ipynb

TRY_GPU = {
    # the book's own test, on the count of devices
    "device_count_at_least": """
def try_gpu(i=0):
    if torch.cuda.device_count() >= i + 1:
        return torch.device('cuda', i)
    return torch.device('cpu')
""",
    # is_available first, then a one-line conditional on the name
    "is_available_then_name": """
def try_gpu(i=0):
    usable = torch.cuda.is_available() and i < torch.cuda.device_count()
    return torch.device(f'cuda:{i}' if usable else 'cpu')
""",
    # a list of every GPU, indexed
    "indexes_the_list_of_gpus": """
def try_gpu(i=0):
    gpus = [torch.device(f'cuda:{k}') for k in range(torch.cuda.device_count())]
    return gpus[i] if i < len(gpus) else torch.device('cpu')
""",
}

TRY_ALL_GPUS = {
    # a loop that appends, then `or` for the empty list
    "loop_then_or": """
def try_all_gpus():
    devices = []
    for i in range(torch.cuda.device_count()):
        devices.append(torch.device('cuda', i))
    return devices or [torch.device('cpu')]
""",
    # is_available first, as tutorials test it
    "is_available_first": """
def try_all_gpus():
    if not torch.cuda.is_available():
        return [torch.device('cpu')]
    return [torch.device(f'cuda:{i}') for i in range(torch.cuda.device_count())]
""",
    # built on the student's own try_gpu
    "through_try_gpu": """
def try_all_gpus():
    n = torch.cuda.device_count()
    return [try_gpu(i) for i in range(n)] if n > 0 else [try_gpu(n)]
""",
}

GET_PARAMS = {
    # clone first, then detach and move
    "clone_detach_to": """
def get_params(params, device):
    return [p.clone().detach().to(device).requires_grad_(True) for p in params]
""",
    # a loop that sets the attribute
    "loop_sets_requires_grad": """
def get_params(params, device):
    copies = []
    for p in params:
        q = p.to(device).clone().detach()
        q.requires_grad = True
        copies.append(q)
    return copies
""",
    # fresh storage on the device, filled in place under no_grad
    "empty_like_then_copy": """
def get_params(params, device):
    with torch.no_grad():
        copies = [torch.empty_like(p, device=device).copy_(p) for p in params]
    return [c.requires_grad_() for c in copies]
""",
}

ALLREDUCE = {
    # the book's own code: slices assigned in place
    "the_books_slices": """
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
""",
    # PyTorch's functional API: reduce_add, then copied into each tensor
    "cuda_comm_reduce_add_and_broadcast": """
def allreduce(data):
    total = torch.cuda.comm.reduce_add(data, destination=data[0].device.index)
    copies = torch.cuda.comm.broadcast(total, [t.device.index for t in data])
    for t, c in zip(data, copies):
        t.copy_(c)
""",
    # out of place: a stacked sum, then written back with an ellipsis
    "stacked_sum_out_of_place": """
def allreduce(data):
    total = torch.stack([t.to(data[0].device) for t in data]).sum(dim=0)
    for t in data:
        t[...] = total.to(t.device)
""",
}

SPLIT_BATCH = {
    # the book's own code: nn.parallel.scatter
    "nn_parallel_scatter": """
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0], 'X and y must have the same number of examples'
    return (nn.parallel.scatter(X, devices), nn.parallel.scatter(y, devices))
""",
    # balanced shards, one per device, as tensor_split gives them
    "tensor_split": """
def split_batch(X, y, devices):
    if len(X) != len(y):
        raise ValueError(f'{len(X)} examples but {len(y)} labels')
    n = len(devices)
    return ([x.to(d) for x, d in zip(X.tensor_split(n), devices)],
            [t.to(d) for t, d in zip(y.tensor_split(n), devices)])
""",
    # chunk's sizes by hand, in a loop over slices
    "slices_in_a_loop": """
import math

def split_batch(X, y, devices):
    if X.shape[0] != y.shape[0]:
        raise ValueError('X and y have different numbers of rows')
    size = math.ceil(X.shape[0] / len(devices))
    X_shards, y_shards = [], []
    for i, d in enumerate(devices):
        if i * size >= X.shape[0]:
            break
        X_shards.append(X[i * size:(i + 1) * size].to(d))
        y_shards.append(y[i * size:(i + 1) * size].to(d))
    return X_shards, y_shards
""",
    # PyTorch's functional API: torch.cuda.comm.scatter, chunk's sizes, onto device indices
    "cuda_comm_scatter": """
def split_batch(X, y, devices):
    if X.size(0) != y.size(0):
        raise ValueError(f'{X.size(0)} rows in X, {y.size(0)} in y')
    ids = [d.index for d in devices]
    return torch.cuda.comm.scatter(X, ids), torch.cuda.comm.scatter(y, ids)
""",
}

TRAIN_BATCH = {
    # the book's own code: the losses in a comprehension, then each backward
    "the_books_comprehension": """
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, device_W), y_shard).sum()
          for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
    for l in ls:
        l.backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])
""",
    # a summed F.cross_entropy, an in-place sub_ on .data, gradients zeroed by hand
    "functional_loss_and_data": """
def train_batch(X, y, device_params, devices, lr):
    for X_s, y_s, ps in zip(*split_batch(X, y, devices), device_params):
        F.cross_entropy(lenet(X_s, ps), y_s, reduction='sum').backward()
    for copies in zip(*device_params):
        allreduce([p.grad.data for p in copies])
    for ps in device_params:
        for p in ps:
            p.data.sub_(lr / X.shape[0] * p.grad.data)
            p.grad.data.zero_()
""",
    # torch.optim.SGD per replica; zero_grad sets the gradients to None
    "optimizer_per_replica": """
def train_batch(X, y, device_params, devices, lr):
    optimizers = [torch.optim.SGD(ps, lr=lr / X.shape[0]) for ps in device_params]
    X_shards, y_shards = split_batch(X, y, devices)
    for X_s, y_s, ps in zip(X_shards, y_shards, device_params):
        loss(lenet(X_s, ps), y_s).sum().backward()
    with torch.no_grad():
        for copies in zip(*device_params):
            allreduce([p.grad for p in copies])
    for opt in optimizers:
        opt.step()
        opt.zero_grad()
""",
    # the gradients summed by torch.cuda.comm.reduce_add and sent back by broadcast
    "cuda_comm_gradients": """
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_s, y_s, ps in zip(X_shards, y_shards, device_params):
        loss(lenet(X_s, ps), y_s).sum().backward()
    ids = [d.index for d in devices]
    with torch.no_grad():
        for copies in zip(*device_params):
            total = torch.cuda.comm.reduce_add([p.grad for p in copies], destination=ids[0])
            for p, g in zip(copies, torch.cuda.comm.broadcast(total, ids)):
                p.grad.copy_(g)
    for ps in device_params:
        d2l.sgd(ps, lr, X.shape[0])
""",
    # the gradients of torch.func.grad, handed to .grad, then the book's all-reduce and step
    "torch_func_grad": """
def train_batch(X, y, device_params, devices, lr):
    def shard_loss(ps, X_s, y_s):
        return loss(lenet(X_s, ps), y_s).sum()

    for X_s, y_s, ps in zip(*split_batch(X, y, devices), device_params):
        grads = torch.func.grad(shard_loss)(list(ps), X_s, y_s)
        for p, g in zip(ps, grads):
            p.grad = g if p.grad is None else p.grad + g
    with torch.no_grad():
        for copies in zip(*device_params):
            allreduce([p.grad for p in copies])
    for ps in device_params:
        d2l.sgd(ps, lr, X.shape[0])
""",
}

TRAIN_LOOP = {
    # the book's torch.cuda.synchronize, the history read back from the animator
    "cuda_synchronize": """
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
            torch.cuda.synchronize()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0]),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
""",
    # the replicas in a loop, a history of its own, functools.partial for the lambda
    "own_history_and_partial": """
import functools

def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = []
    for device in devices:
        device_params.append(get_params(params, device))
    timer, history = d2l.Timer(), []
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    first = functools.partial(lenet, params=device_params[0])
    for epoch in range(1, num_epochs + 1):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        d2l.synchronize(devices)
        timer.stop()
        history.append(d2l.evaluate_accuracy_gpu(first, test_iter, devices[0]))
        animator.add(epoch, (history[-1],))
    print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch on {devices}')
    return history
""",
    # the clock read with time.perf_counter, as scripts time an epoch
    "perf_counter": """
import time

def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    seconds = []
    for epoch in range(num_epochs):
        start = time.perf_counter()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        d2l.synchronize(devices)
        seconds.append(time.perf_counter() - start)
        acc = d2l.evaluate_accuracy_gpu(lambda X: lenet(X, device_params[0]), test_iter,
                                        devices[0])
        animator.add(epoch + 1, (acc,))
    print(f'test acc: {acc:.2f}, {sum(seconds) / len(seconds):.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
""",  # the replicas copied afresh from the first at each epoch's start, as a loop that guards
    # against drift does: they are equal, so the training is the same
    "resyncs_every_epoch": """
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    timer = d2l.Timer()
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        device_params = [get_params(device_params[0], d) for d in devices]
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        d2l.synchronize(devices)
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda X: lenet(X, device_params[0]), test_iter, devices[0]),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
""",
}

# concise.ipynb

RESNET18 = {
    # the network from an OrderedDict under the book's names, the ReLU in place
    "ordered_dict": """
from collections import OrderedDict

def resnet18(num_classes, in_channels=1):
    def stage(i, o, first=False):
        return nn.Sequential(d2l.Residual(i, o, use_1x1conv=not first, strides=1 if first else 2),
                             d2l.Residual(o, o))
    return nn.Sequential(OrderedDict([
        ('conv', nn.Conv2d(in_channels, 64, kernel_size=3, padding=1)),
        ('bn', nn.BatchNorm2d(64)),
        ('relu', nn.ReLU(inplace=True)),
        ('resnet_block1', stage(64, 64, first=True)),
        ('resnet_block2', stage(64, 128)),
        ('resnet_block3', stage(128, 256)),
        ('resnet_block4', stage(256, 512)),
        ('global_avg_pool', nn.AdaptiveAvgPool2d(1)),
        ('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes))),
    ]))
""",
    # a residual block of its own: F.relu, an out-of-place sum, a 1x1 shortcut in a Sequential
    "own_block_out_of_place": """
from torch.nn import functional as F

class Block(nn.Module):
    def __init__(self, i, o, stride=1):
        super().__init__()
        self.c1 = nn.Conv2d(i, o, 3, stride=stride, padding=1)
        self.b1 = nn.BatchNorm2d(o)
        self.c2 = nn.Conv2d(o, o, 3, padding=1)
        self.b2 = nn.BatchNorm2d(o)
        self.shortcut = (nn.Sequential(nn.Conv2d(i, o, 1, stride=stride))
                         if stride != 1 else nn.Identity())

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(torch.add(y, self.shortcut(x)))

def resnet18(num_classes, in_channels=1):
    net = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU())
    plan = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
    for k, (i, o, s) in enumerate(plan, start=1):
        net.add_module(f'resnet_block{k}', nn.Sequential(Block(i, o, s), Block(o, o)))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net
""",
    # a class: the stem's ReLU called in forward, the stages by getattr, torch.flatten
    "class_with_functional_calls": """
from torch.nn import functional as F

class ResNet18(nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 64, 3, padding=1)
        self.bn = nn.BatchNorm2d(64)
        plan = [(64, 64, False), (64, 128, True), (128, 256, True), (256, 512, True)]
        for k, (i, o, down) in enumerate(plan, start=1):
            setattr(self, f'resnet_block{k}', nn.Sequential(
                d2l.Residual(i, o, use_1x1conv=down, strides=2 if down else 1),
                d2l.Residual(o, o)))
        self.global_avg_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        for k in range(1, 5):
            x = getattr(self, f'resnet_block{k}')(x)
        return self.fc(torch.flatten(self.global_avg_pool(x), 1))

def resnet18(num_classes, in_channels=1):
    return ResNet18(num_classes, in_channels)
""",
}

TRAIN_DATAPARALLEL = {
    # wrapped first and then moved, as PyTorch's tutorial does
    "wrap_then_move": variant(
        train_dataparallel.BOOK, train_dataparallel.RIGHT, MOVED="net"
    ).replace("device_ids=devices)", "device_ids=devices).to(devices[0])"),
    # weights drawn in place under no_grad over modules(); zero_grad(set_to_none=False)
    "modules_loop_and_zero_grad": variant(
        train_dataparallel.BOOK,
        train_dataparallel.RIGHT,
        INIT="""with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.normal_(0.0, 0.01)""",
        ZERO="trainer.zero_grad(set_to_none=False)",
    ),
    # device indices and output_device, the loss of the functional API
    "indices_and_functional_loss": variant(
        train_dataparallel.BOOK,
        train_dataparallel.RIGHT,
        DEVICE_IDS="[d.index for d in devices], output_device=devices[0]",
        FORWARD="net(X).float()",
    ).replace("loss = nn.CrossEntropyLoss()", "loss = nn.functional.cross_entropy"),
    # nn.DataParallel wrapped only when there is more than one device, as tutorials do
    "wrapped_when_several_devices": variant(
        train_dataparallel.BOOK, train_dataparallel.RIGHT, MOVED="net"
    ).replace(
        "    net = nn.DataParallel(net, device_ids=devices)",
        """    net = net.to(devices[0])
    if len(devices) > 1:
        net = nn.DataParallel(net, device_ids=devices)""",
    ),
    # a model class of its own holds the network, and the class is what gets wrapped
    "holder_module_wrapped": """
class Classifier(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, X):
        return self.body(X)

def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    for m in net.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=0.01)
    model = nn.DataParallel(Classifier(net).to(devices[0]), device_ids=devices)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    timer = d2l.Timer()
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    for epoch in range(num_epochs):
        model.train()
        timer.start()
        for X, y in train_iter:
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(model(X.to(devices[0])), y.to(devices[0])).backward()
            optimizer.step()
        d2l.synchronize(devices)
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(model, test_iter),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
""",
}

# distributed.ipynb

RING_ALLREDUCE = {
    # each step one batch of a send and a receive
    "batch_isend_irecv": """
def ring_allreduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    chunks = flat.tensor_split(world)
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(send, receive):
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, right))
        if receive.numel():
            ops.append(dist.P2POp(dist.irecv, receive, left))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()

    for step in range(world - 1):
        i = (rank - step - 1) % world
        incoming = torch.empty_like(chunks[i])
        exchange(chunks[(rank - step) % world].clone(), incoming)
        chunks[i].add_(incoming)
    for step in range(world - 1):
        exchange(chunks[(rank + 1 - step) % world].clone(), chunks[(rank - step) % world])
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor
""",
    # blocking send and recv, the even ranks sending first so that no one waits forever
    "even_odd_send_recv": """
def ring_allreduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    work = tensor.detach().flatten().clone()
    chunks = list(work.tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(send, receive):
        if rank % 2 == 0:
            if send.numel():
                dist.send(send, right)
            if receive.numel():
                dist.recv(receive, left)
        else:
            if receive.numel():
                dist.recv(receive, left)
            if send.numel():
                dist.send(send, right)

    for s in range(world - 1):
        incoming = torch.zeros_like(chunks[(rank - s - 1) % world])
        exchange(chunks[(rank - s) % world], incoming)
        chunks[(rank - s - 1) % world] += incoming
    for s in range(world - 1):
        exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])
    with torch.no_grad():
        tensor.copy_(work.view(tensor.shape))
    return tensor
""",
    # isend and irecv both posted, then waited on; the sums out of place in a list
    "isend_irecv_out_of_place": """
def ring_allreduce(tensor):
    world = dist.get_world_size()
    rank = dist.get_rank()
    sizes = [c.numel() for c in torch.empty(tensor.numel()).tensor_split(world)]
    chunks = list(tensor.reshape(-1).split(sizes))
    chunks = [c.clone() for c in chunks]
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world

    def exchange(send, recv_size):
        got = torch.empty(recv_size, dtype=tensor.dtype)
        reqs = []
        if send.numel():
            reqs.append(dist.isend(send, nxt))
        if recv_size:
            reqs.append(dist.irecv(got, prv))
        for r in reqs:
            r.wait()
        return got

    for s in range(world - 1):
        i = (rank - s - 1) % world
        chunks[i] = chunks[i] + exchange(chunks[(rank - s) % world], sizes[i])
    for s in range(world - 1):
        i = (rank - s) % world
        chunks[i] = exchange(chunks[(rank + 1 - s) % world], sizes[i])
    tensor.copy_(torch.cat(chunks).view_as(tensor))
    return tensor
""",
}

AVERAGE_GRADIENTS = {
    # the mean asked of the all-reduce itself
    "reduce_op_avg": """
def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
""",
    # divided first, summed after, on .data
    "divide_then_sum": """
def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        if param.requires_grad and param.grad is not None:
            param.grad.data /= size
            dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
""",
    # every all-reduce started at once, then waited on, then divided out of place
    "async_handles": """
def average_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    handles = [dist.all_reduce(g, async_op=True) for g in grads]
    for h in handles:
        h.wait()
    with torch.no_grad():
        for g in grads:
            g.copy_(g / dist.get_world_size())
""",
}

AVERAGE_GRADIENTS_BUCKETED = {
    # the flatten helpers older DDP and apex use
    "flatten_dense_tensors": """
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

def average_gradients_bucketed(model, bucket_mb=25):
    limit = bucket_mb * 1024 * 1024
    buckets, current, used = [], [], 0
    for p in reversed(list(model.parameters())):
        if p.grad is None:
            continue
        size = p.grad.numel() * p.grad.element_size()
        if current and (used + size > limit or p.grad.dtype != current[0].dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(p.grad)
        used += size
    if current:
        buckets.append(current)
    for bucket in buckets:
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(synced)
""",
    # bucket boundaries first, the mean from the all-reduce, the slices from split
    "avg_and_split": """
def average_gradients_bucketed(model, bucket_mb=25):
    grads = [p.grad for p in model.parameters() if p.grad is not None][::-1]
    cap = bucket_mb * 2**20
    starts, total = [0], 0
    for k, g in enumerate(grads):
        nbytes = g.numel() * g.element_size()
        if k > starts[-1] and (total + nbytes > cap or g.dtype != grads[starts[-1]].dtype):
            starts.append(k)
            total = 0
        total += nbytes
    for a, b in zip(starts, starts[1:] + [len(grads)]):
        bucket = grads[a:b]
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.AVG)
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))
""",
    # a generator of buckets, the mean out of place, written back under no_grad
    "generator_out_of_place": """
def buckets_of(grads, limit):
    bucket, size = [], 0
    for g in grads:
        n = g.numel() * g.element_size()
        if bucket and (size + n > limit or g.dtype != bucket[-1].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += n
    if bucket:
        yield bucket

def average_gradients_bucketed(model, bucket_mb=25):
    params = [p for p in model.parameters() if p.grad is not None]
    for bucket in buckets_of([p.grad for p in reversed(params)], bucket_mb * 2**20):
        flat = torch.cat([g.flatten() for g in bucket])
        dist.all_reduce(flat)
        mean = flat / dist.get_world_size()
        offset = 0
        with torch.no_grad():
            for g in bucket:
                g[...] = mean[offset:offset + g.numel()].reshape(g.shape)
                offset += g.numel()
""",
}

EVALUATE_ACCURACY_DISTRIBUTED = {
    # counts in Python, then one tensor for the all-reduce
    "python_counts": """
def evaluate_accuracy_distributed(net, test_iter, device):
    if isinstance(net, nn.Module):
        net.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for X, y in test_iter:
            y_hat = net(X.to(device))
            correct += (y_hat.argmax(dim=1) == y.to(device)).sum().item()
            seen += y.numel()
    counts = torch.tensor([correct, seen], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()
""",
    # the book's Accumulator, inference_mode
    "accumulator": """
def evaluate_accuracy_distributed(net, test_iter, device):
    if hasattr(net, 'eval'):
        net.eval()
    metric = d2l.Accumulator(2)
    with torch.inference_mode():
        for X, y in test_iter:
            X, y = X.to(device), y.to(device)
            metric.add(d2l.accuracy(net(X), y), y.numel())
    totals = torch.tensor(metric.data, device=device, dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return float(totals[0]) / float(totals[1])
""",
    # integer counts, added in place into one int64 tensor
    "int64_counts": """
def evaluate_accuracy_distributed(net, test_iter, device):
    if isinstance(net, nn.Module):
        net.eval()
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for X, y in test_iter:
            y = y.to(device)
            counts += torch.stack([(net(X.to(device)).argmax(1) == y).sum(),
                                   torch.tensor(len(y), device=device)])
    dist.all_reduce(counts)
    correct, total = counts.tolist()
    return correct / total
""",
}

TRAIN_DDP_HEAD = """
def train_ddp(net, num_epochs, batch_size, lr, data=None, device=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = data if data is not None else d2l.fashion_mnist_datasets()
    device = device if device is not None else d2l.local_device()
"""
TRAIN_DDP = {
    # weights drawn in place under no_grad, F.cross_entropy, zero_grad(set_to_none=True)
    "in_place_init_and_functional_loss": TRAIN_DDP_HEAD
    + """
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.normal_(0, 0.01)
    net = net.to(device)
    model = DDP(net, device_ids=[device.index] if device.type == 'cuda' else None)
    sampler = DistributedSampler(train_set, shuffle=True)
    train_iter = DataLoader(train_set, batch_size=batch_size // world, sampler=sampler)
    test_iter = DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        model.train()
        timer.start()
        for X, y in train_iter:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(X.to(device)), y.to(device)).backward()
            optimizer.step()
        timer.stop()
        history.append(evaluate_accuracy_distributed(model.module, test_iter, device))
    if rank == 0:
        print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch '
              f'on {world} processes ({dist.get_backend()}, {device.type})')
    return history
""",
    # contiguous test shards (tensor_split's), the optimizer over the inner net's parameters
    "contiguous_test_shards": TRAIN_DDP_HEAD
    + """
    def init_weights(m):
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)

    net.apply(init_weights)
    net.to(device)
    model = DDP(net)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_iter = DataLoader(train_set, batch_size // world, sampler=sampler, drop_last=False)
    mine = torch.arange(len(test_set)).tensor_split(world)[rank].tolist()
    test_iter = DataLoader(Subset(test_set, mine), batch_size=batch_size)
    trainer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs]) if rank == 0 else None
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        model.train()
        sampler.set_epoch(epoch)
        timer.start()
        for X, y in train_iter:
            X, y = X.to(device), y.to(device)
            l = loss(model(X), y)
            trainer.zero_grad()
            l.backward()
            trainer.step()
        timer.stop()
        acc = evaluate_accuracy_distributed(net, test_iter, device)
        history.append(acc)
        if rank == 0:
            animator.add(epoch + 1, (acc,))
    if rank == 0:
        print(f'test acc: {acc:.2f}, {timer.avg():.1f} sec/epoch '
              f'on {world} processes ({dist.get_backend()}, {device.type})')
    return history
""",
    # grads cleared by hand (grad = None), the per-rank batch from the global one by ceil
    "grads_to_none": TRAIN_DDP_HEAD
    + """
    for m in net.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, mean=0.0, std=0.01)
    model = DDP(net.to(device), device_ids=[device] if device.type == 'cuda' else None)
    sampler = DistributedSampler(train_set)
    loaders = (DataLoader(train_set, batch_size // world, sampler=sampler),
               DataLoader(Subset(test_set, list(range(len(test_set)))[rank::world]),
                          batch_size))
    optimizer = torch.optim.SGD(model.parameters(), lr)
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        model.train()
        timer.start()
        for X, y in loaders[0]:
            for p in model.parameters():
                p.grad = None
            out = model(X.to(device))
            nn.CrossEntropyLoss()(out, y.to(device)).backward()
            optimizer.step()
        timer.stop()
        history.append(evaluate_accuracy_distributed(net, loaders[1], device))
    if rank == 0:
        print(f'test acc: {history[-1]:.2f}, {timer.avg():.1f} sec/epoch '
              f'on {world} processes ({dist.get_backend()}, {device.type})')
    return history
""",
}

# sharded.ipynb

MEMORY_PER_RANK = {
    # math.ceil, K counted per parameter, a table by stage
    "table_by_stage": """
import math

def memory_per_rank(model, optimizer, stage, world_size):
    table = {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 1, 1), 3: (1, 1, 1)}
    if stage not in table:
        raise ValueError(f'unknown stage {stage}: use 0, 1, 2 or 3')
    params = [p for p in model.parameters() if p.requires_grad]
    P = sum(p.numel() for p in params)
    K = 0
    for p in params:
        for v in optimizer.state[p].values() if p in optimizer.state else []:
            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                K += v.numel()
    K //= P
    chunk = math.ceil(P / world_size)
    sharded_w, sharded_g, sharded_s = table[stage]
    values = ((chunk if sharded_w else P) + (chunk if sharded_g else P)
              + K * (chunk if sharded_s else P))
    return values * params[0].element_size()
""",
    # rank 0's chunk read off tensor_split itself, bytes summed per parameter
    "tensor_split_chunk": """
def memory_per_rank(model, optimizer, stage, world_size):
    if stage not in range(4):
        raise ValueError('stage must be one of 0, 1, 2, 3')
    params = [p for p in model.parameters() if p.requires_grad]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    state = sum(t.numel() * t.element_size() for p in params
                for t in optimizer.state.get(p, {}).values()
                if torch.is_tensor(t) and t.shape == p.shape)
    P = sum(p.numel() for p in params)
    share = torch.empty(P).tensor_split(world_size)[0].numel() / P
    weights = nbytes * share if stage == 3 else nbytes
    grads = nbytes * share if stage >= 2 else nbytes
    opt = state * share if stage >= 1 else state
    return round(weights + grads + opt)
""",
    # ceil by integer division, one branch per stage
    "branch_per_stage": """
def memory_per_rank(model, optimizer, stage, world_size):
    trained = [p for p in model.parameters() if p.requires_grad]
    P = sum(p.numel() for p in trained)
    size = trained[0].element_size()
    K = sum(s.numel() for p in trained for s in optimizer.state.get(p, {}).values()
            if torch.is_tensor(s) and s.dim() > 0 and s.shape == p.shape) // P
    c = (P + world_size - 1) // world_size
    if stage == 0:
        return (2 + K) * P * size
    elif stage == 1:
        return (2 * P + K * c) * size
    elif stage == 2:
        return (P + c + K * c) * size
    elif stage == 3:
        return (2 + K) * c * size
    raise ValueError(f'stage {stage} does not exist: 0 (DDP), 1, 2 or 3')
""",
}

REDUCE_SCATTER = {
    # each step one batch of a send and a receive
    "batch_isend_irecv": """
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in tensor.flatten().tensor_split(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send = chunks[(rank - step - 1) % world]
        keep = chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(keep)
        ops = [dist.P2POp(dist.isend, send, right)] if send.numel() else []
        if incoming.numel():
            ops.append(dist.P2POp(dist.irecv, incoming, left))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        keep.add_(incoming)
    return chunks[rank]
""",
    # blocking send and recv, even ranks first
    "even_odd_send_recv": """
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in tensor.reshape(-1).tensor_split(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for s in range(world - 1):
        out = chunks[(rank - s - 1) % world]
        into = (rank - s - 2) % world
        got = torch.zeros_like(chunks[into])
        order = ['send', 'recv'] if rank % 2 == 0 else ['recv', 'send']
        for what in order:
            if what == 'send' and out.numel():
                dist.send(out, right)
            elif what == 'recv' and got.numel():
                dist.recv(got, left)
        chunks[into] += got
    return chunks[rank]
""",
    # isend and irecv both posted; the sums out of place, in a list
    "isend_irecv_out_of_place": """
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.reshape(-1).tensor_split(world))
    for s in range(world - 1):
        send_i, recv_i = (rank - s - 1) % world, (rank - s - 2) % world
        buf = torch.empty(chunks[recv_i].shape, dtype=tensor.dtype)
        requests = []
        if chunks[send_i].numel():
            requests.append(dist.isend(chunks[send_i].contiguous(), (rank + 1) % world))
        if buf.numel():
            requests.append(dist.irecv(buf, (rank - 1) % world))
        for r in requests:
            r.wait()
        chunks[recv_i] = chunks[recv_i] + buf
    return chunks[rank].clone()
""",
}

ALL_GATHER = {
    # each step one batch of a send and a receive, into views of the output
    "batch_isend_irecv": """
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(numel, dtype=shard.dtype)
    views = out.tensor_split(world)
    views[rank].copy_(shard.flatten())
    for step in range(world - 1):
        send, receive = views[(rank - step) % world], views[(rank - step - 1) % world]
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send.clone(), (rank + 1) % world))
        if receive.numel():
            ops.append(dist.P2POp(dist.irecv, receive, (rank - 1) % world))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()
    return out
""",
    # blocking send and recv, even ranks first, the pieces in a list
    "even_odd_send_recv": """
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [len(c) for c in torch.arange(numel).tensor_split(world)]
    pieces = [torch.empty(n, dtype=shard.dtype) for n in sizes]
    pieces[rank] = shard.reshape(-1).clone()
    for s in range(world - 1):
        out, into = pieces[(rank - s) % world], pieces[(rank - s - 1) % world]
        if rank % 2 == 0:
            if out.numel():
                dist.send(out, (rank + 1) % world)
            if into.numel():
                dist.recv(into, (rank - 1) % world)
        else:
            if into.numel():
                dist.recv(into, (rank - 1) % world)
            if out.numel():
                dist.send(out, (rank + 1) % world)
    return torch.cat(pieces)
""",
    # chunk sizes by arithmetic, isend and irecv both posted
    "sizes_by_arithmetic": """
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(numel, world)
    sizes = [base + 1 if r < extra else base for r in range(world)]
    received = [None] * world
    received[rank] = shard.reshape(-1)
    for s in range(world - 1):
        send_i, recv_i = (rank - s) % world, (rank - s - 1) % world
        buf = torch.empty(sizes[recv_i], dtype=shard.dtype)
        reqs = []
        if sizes[send_i]:
            reqs.append(dist.isend(received[send_i].contiguous(), (rank + 1) % world))
        if sizes[recv_i]:
            reqs.append(dist.irecv(buf, (rank - 1) % world))
        for r in reqs:
            r.wait()
        received[recv_i] = buf
    return torch.cat(received)
""",
}

SHARDED_OPTIMIZER = {
    # whole parameters per rank, balanced by size, as ZeroRedundancyOptimizer partitions;
    # each owner broadcasts its updated parameters; gradients zeroed in place
    "parameter_partition": """
class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        rank, world = dist.get_rank(), dist.get_world_size()
        loads = [0] * world
        self.owner = []
        for p in self.params:
            r = loads.index(min(loads))
            self.owner.append(r)
            loads[r] += p.numel()
        self.mine = [p for p, r in zip(self.params, self.owner) if r == rank]
        flat = [p.detach().reshape(-1) for p in self.mine]
        self.shard = (torch.cat(flat) if flat else torch.zeros(0)).clone().requires_grad_()
        self.optimizer = optimizer_cls([self.shard], **kwargs)

    def gradient_chunk(self):
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.mine]
        return torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)

    def step(self):
        self.shard.grad = self.gradient_chunk()
        self.optimizer.step()
        with torch.no_grad():
            values = self.shard.split([p.numel() for p in self.mine])
            for p, v in zip(self.mine, values):
                p.copy_(v.view_as(p))
            for p, r in zip(self.params, self.owner):
                dist.broadcast(p.data, src=r)

    def zero_grad(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()
""",
    # every parameter padded to a multiple of N and cut in N pieces, as ColossalAI does
    "per_parameter_padding": """
class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.piece = [-(-p.numel() // self.world) for p in self.params]
        self.shard = self._mine([p.detach() for p in self.params]).requires_grad_()
        self.optimizer = optimizer_cls([self.shard], **kwargs)

    def _mine(self, tensors):
        out = []
        for t, n in zip(tensors, self.piece):
            padded = torch.zeros(n * self.world, dtype=t.dtype)
            padded[:t.numel()] = t.reshape(-1)
            out.append(padded[self.rank * n:(self.rank + 1) * n])
        return torch.cat(out).clone()

    def gradient_chunk(self):
        return self._mine([torch.zeros_like(p) if p.grad is None else p.grad
                           for p in self.params])

    def step(self):
        self.shard.grad = self.gradient_chunk()
        self.optimizer.step()
        width = self.shard.numel()
        rows = all_gather(self.shard.detach(), width * self.world).view(self.world, width)
        with torch.no_grad():
            for p, part in zip(self.params, rows.split(self.piece, dim=1)):
                p.copy_(part.reshape(-1)[:p.numel()].view_as(p))

    def zero_grad(self):
        for p in self.params:
            p.grad = None
""",
    # the flat vector padded to a multiple of N, equal chunks, as FSDP pads; .data writes
    "flat_padding": """
class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        world, rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = -(-self.numel // world)
        self.shard = self._chunk_of(torch.cat([p.data.flatten() for p in self.params]))
        self.shard.requires_grad_(True)
        self.optimizer = optimizer_cls([self.shard], **kwargs)

    def _chunk_of(self, flat):
        rank, world = dist.get_rank(), dist.get_world_size()
        padded = torch.nn.functional.pad(flat, (0, self.chunk * world - flat.numel()))
        return padded[rank * self.chunk:(rank + 1) * self.chunk].clone()

    def gradient_chunk(self):
        return self._chunk_of(torch.cat([
            (p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
            for p in self.params]))

    def step(self):
        self.shard.grad = self.gradient_chunk()
        self.optimizer.step()
        world = dist.get_world_size()
        flat = all_gather(self.shard.data, self.chunk * world)[:self.numel]
        offset = 0
        for p in self.params:
            p.data.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
""",
}

ROUTES: dict[str, dict[str, str]] = {
    "try_gpu": TRY_GPU,
    "try_all_gpus": TRY_ALL_GPUS,
    "get_params": GET_PARAMS,
    "allreduce": ALLREDUCE,
    "split_batch": SPLIT_BATCH,
    "train_batch": TRAIN_BATCH,
    "train_loop": TRAIN_LOOP,
    "resnet18": RESNET18,
    "train_dataparallel": TRAIN_DATAPARALLEL,
    "ring_allreduce": RING_ALLREDUCE,
    "average_gradients": AVERAGE_GRADIENTS,
    "average_gradients_bucketed": AVERAGE_GRADIENTS_BUCKETED,
    "evaluate_accuracy_distributed": EVALUATE_ACCURACY_DISTRIBUTED,
    "train_ddp": TRAIN_DDP,
    "memory_per_rank": MEMORY_PER_RANK,
    "reduce_scatter": REDUCE_SCATTER,
    "all_gather": ALL_GATHER,
    "sharded_optimizer": SHARDED_OPTIMIZER,
}

# Routes a grader bug still charges, each with the check it loses and why: the owner of the
# exercise fixes the check, and the strict xfail then tells to lift the mark.
KNOWN_CHARGES: dict[tuple[str, str], str] = {
    ("train_batch", "torch_func_grad"): "each_device_runs_its_replica_on_its_shard: the "
    "forwards read ['cpu', 4, -1]: grader/base/inputs.py's which_replica matches a replica "
    "by object identity, and torch.func.grad hands lenet wrappers of the replica's tensors; "
    "and a stand-in tensor inside torch.func.grad says its device is 'cpu' (dplab/sim), where "
    "a GPU's says cuda:i",
}


def _params() -> list:
    """Return one test case per route, marked with its exercise (slow where it starts
    process groups, xfail where a known grader bug charges it)."""
    manifest = load_manifest()
    params = []
    for exercise_id, routes in ROUTES.items():
        exercise = manifest.exercise(exercise_id)
        for route in routes:
            marks = [getattr(pytest.mark, exercise_id)]
            if exercise.distributed:
                marks.append(pytest.mark.slow)
            if (exercise_id, route) in KNOWN_CHARGES:
                reason = KNOWN_CHARGES[exercise_id, route]
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            params.append(
                pytest.param(exercise_id, route, id=f"{exercise_id}::{route}", marks=marks)
            )
    return params


@functools.cache
def graded_together(notebook: str, index: int) -> dict[str, ExerciseResult]:
    """Grade, in one submission, the `index`-th route of every exercise of `notebook` whose
    cases start process groups, and return the results by exercise: one grading per route
    index instead of one per route, as the grader grades a class (each exercise is judged
    alone; the routes in one notebook are all right, so none leans on a wrong one)."""
    manifest = load_manifest()
    ids = [e.id for e in manifest.exercises if e.notebook == notebook and e.distributed]
    sources = [list(ROUTES[i].values())[index] for i in ids if index < len(ROUTES[i])]
    chosen = [i for i in ids if index < len(ROUTES[i])]
    with tempfile.TemporaryDirectory(prefix="routes-") as tmp:
        folder = Path(tmp) / "routes" / manifest.assignment
        write_notebook(folder / notebook, *read_cells(SOLUTIONS / notebook), *sources)
        result = grade_path(folder, chosen)
    return {e.name: e for e in result.exercises}


def graded(exercise_id: str, route: str) -> ExerciseResult:
    """Grade one route of an exercise: in this process, or, for an exercise whose cases
    start process groups, with the same-numbered routes of its notebook's others."""
    exercise = load_manifest().exercise(exercise_id)
    if not exercise.distributed:
        return grade_source(exercise, ROUTES[exercise_id][route])
    return graded_together(exercise.notebook, list(ROUTES[exercise_id]).index(route))[exercise_id]


def test_every_exercise_has_three_routes():
    """Every exercise of the manifest is tried by at least three routes."""
    for exercise in load_manifest().exercises:
        assert len(ROUTES.get(exercise.id, {})) >= 3, f"{exercise.id} has too few routes"


@pytest.mark.parametrize(("exercise_id", "route"), _params())
def test_right_code_by_a_route_real_code_takes_gets_full_marks(exercise_id, route):
    """The route keeps every point of the exercise, public and hidden checks alike."""
    result = graded(exercise_id, route)
    failed = {c.name: c.message for c in result.checks if not c.passed}
    assert result.score == result.max_score, failed


@pytest.mark.train_dataparallel
@pytest.mark.parametrize("forward", ["functional", "building_blocks"])
def test_data_parallel_without_the_wrapper_costs_the_wrapping_check_alone(forward):
    """nn.parallel.data_parallel, or replicate, parallel_apply and gather, compute what
    nn.DataParallel computes, but the exercise asks for the wrapper: the wrapping check
    charges that, and the checks of the training judge the training it did."""
    calls = {
        "functional": "l = loss(nn.parallel.data_parallel(net, X, device_ids=devices), y)",
        "building_blocks": (
            "replicas = nn.parallel.replicate(net, devices)\n"
            "            shards = nn.parallel.scatter(X, devices)\n"
            "            outputs = nn.parallel.parallel_apply(replicas[: len(shards)], shards)\n"
            "            l = loss(nn.parallel.gather(outputs, devices[0]), y)"
        ),
    }
    source = variant(train_dataparallel.BOOK, train_dataparallel.RIGHT, FORWARD="net(X)").replace(
        "net = nn.DataParallel(net.to(devices[0]), device_ids=devices)", "net.to(devices[0])"
    )
    assert "nn.DataParallel(" not in source
    source = source.replace("l = loss(net(X), y)", calls[forward])
    result = grade_source(load_manifest().exercise("train_dataparallel"), source)
    failed = {c.name: c.message for c in result.checks if not c.passed}
    assert set(failed) == {"wraps_the_net_in_data_parallel_on_the_given_devices"}, failed
    assert "never wrapped in nn.DataParallel" in failed[next(iter(failed))]
