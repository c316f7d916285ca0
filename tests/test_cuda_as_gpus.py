"""Code that asks torch.cuda about the machine gets, on stand-ins, the grade it gets on GPUs.

While the grader runs the cases of the notebooks that train on stand-ins, torch.cuda answers
for them (dplab.sim.gpus): PyTorch's tutorial idiom, which wraps only where there is more
than one GPU, wraps, and mixed precision (autocast, GradScaler) trains, as on a GPU server.
"""

from grader.manifest import load_manifest
from tests.conftest import grade_source

CONCISE = load_manifest().exercise("train_dataparallel")

# The book's concise `train`, with the network wrapped as PyTorch's tutorial does and, in
# AMP, each step in mixed precision: <<wrap>> and <<step>> are filled in per test.
TRAIN = """
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]

    def init_weights(module):
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=0.01)

    net.apply(init_weights)
<<wrap>>
    optimizer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda")
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        net.train()
        timer.start()
        for X, y in train_iter:
            X, y = X.to(devices[0]), y.to(devices[0])
            optimizer.zero_grad()
<<step>>
        torch.cuda.synchronize()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(net, test_iter),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
"""
TUTORIAL_WRAP = """\
    if torch.cuda.device_count() > 1:
        print("Let's use", torch.cuda.device_count(), "GPUs!")
        net = nn.DataParallel(net, device_ids=devices)
    net.to(devices[0])"""
PLAIN_STEP = """\
            loss(net(X), y).backward()
            optimizer.step()"""
AMP_STEP = """\
            with torch.autocast("cuda"):
                l = loss(net(X), y)
            scaler.scale(l).backward()
            scaler.step(optimizer)
            scaler.update()"""


def train_source(wrap: str, step: str) -> str:
    """Return the concise `train` with its wrapping and its step filled in."""
    return TRAIN.replace("<<wrap>>", wrap).replace("<<step>>", step)


def failed_checks(source: str) -> list[str]:
    """Return the checks of the concise train that `source` fails, on stand-ins."""
    result = grade_source(CONCISE, source)
    return [c.name for c in result.checks if not c.passed]


def test_the_tutorial_idiom_wraps_on_stand_ins_and_gets_full_marks():
    """`if torch.cuda.device_count() > 1: net = nn.DataParallel(net, ...)` wraps, as on a
    server with two GPUs, so nothing is lost for a wrapping that never happened."""
    assert failed_checks(train_source(TUTORIAL_WRAP, PLAIN_STEP)) == []


def test_a_mixed_precision_loop_trains_on_stand_ins():
    """autocast("cuda") and GradScaler("cuda") in the tutorial's loop train on stand-ins as
    on GPUs: every check passes but the one that holds the steps to float32 SGD's within
    1e-3, which float16's rounding misses on GPUs too (the exercise's cell asks for full
    precision, and says why)."""
    assert failed_checks(train_source(TUTORIAL_WRAP, AMP_STEP)) == ["training_matches_plain_sgd"]
