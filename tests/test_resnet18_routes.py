"""`resnet18` is judged by what it computes: the book's network written another way (a ReLU
called in `forward`, a stem nested in a container, blocks of the functional API or
torchvision's) gets full marks, and one with global max-pooling loses the check about its
layers, as the recorded forward pass shows them."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from grader.api import recorded_forward
from grader.manifest import load_manifest
from tests.conftest import grade_source

pytestmark = pytest.mark.resnet18

STAGES = """
    net.add_module('resnet_block1', nn.Sequential(Block(64, 64), Block(64, 64)))
    net.add_module('resnet_block2', nn.Sequential(Block(64, 128, 2), Block(128, 128)))
    net.add_module('resnet_block3', nn.Sequential(Block(128, 256, 2), Block(256, 256)))
    net.add_module('resnet_block4', nn.Sequential(Block(256, 512, 2), Block(512, 512)))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net
"""
BOOK_BLOCK = "Block = lambda i, o, s=1: d2l.Residual(i, o, use_1x1conv=s == 2, strides=s)\n"

# Right code by routes real code takes; each keeps full marks.
ROUTES = {
    # the stem's ReLU called in forward, as F.relu: the stages and head are the class's own
    "stem_relu_in_forward": """
from torch.nn import functional as F

class ResNet(nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1)
        self.bn = nn.BatchNorm2d(64)
        block = lambda i, o, s=1: d2l.Residual(i, o, use_1x1conv=s == 2, strides=s)
        self.resnet_block1 = nn.Sequential(block(64, 64), block(64, 64))
        self.resnet_block2 = nn.Sequential(block(64, 128, 2), block(128, 128))
        self.resnet_block3 = nn.Sequential(block(128, 256, 2), block(256, 256))
        self.resnet_block4 = nn.Sequential(block(256, 512, 2), block(512, 512))
        self.global_avg_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        for stage in (self.resnet_block1, self.resnet_block2, self.resnet_block3,
                      self.resnet_block4):
            x = stage(x)
        return self.fc(self.global_avg_pool(x))

def resnet18(num_classes, in_channels=1):
    return ResNet(num_classes, in_channels)
""",
    # the stem as one nn.Sequential, the first of the network's parts
    "stem_in_one_sequential": f"""
def resnet18(num_classes, in_channels=1):
    {BOOK_BLOCK}
    net = nn.Sequential()
    net.add_module('stem', nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64), nn.ReLU(inplace=True)))
{STAGES}""",
    # a block of the functional API: F.relu, an in-place sum, F.adaptive_avg_pool2d
    "functional_block": f"""
from torch.nn import functional as F

class Block(nn.Module):
    def __init__(self, i, o, s=1):
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, stride=s, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(o)
        self.conv2 = nn.Conv2d(o, o, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(o)
        self.short = nn.Conv2d(i, o, 1, stride=s) if s != 1 or i != o else None

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        y += x if self.short is None else self.short(x)
        return y.relu()

class GlobalAvgPool(nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3))

def resnet18(num_classes, in_channels=1):
    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(64), nn.ReLU())
{STAGES.replace("nn.AdaptiveAvgPool2d((1, 1))", "GlobalAvgPool()")}""",
    # torchvision's BasicBlock, with its batch-normed 1x1 shortcut, as the block
    "torchvision_basic_block": f"""
from torchvision.models.resnet import BasicBlock

def Block(i, o, s=1):
    down = None
    if s != 1:
        down = nn.Sequential(nn.Conv2d(i, o, 1, stride=s, bias=False), nn.BatchNorm2d(o))
    return BasicBlock(i, o, stride=s, downsample=down)

def resnet18(num_classes, in_channels=1):
    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(64), nn.ReLU())
{STAGES}""",
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_book_by_another_route_gets_full_marks(route):
    exercise = load_manifest().exercise("resnet18")
    result = grade_source(exercise, ROUTES[route])
    failed = {c.name: c.message for c in result.checks if not c.passed}
    assert result.score == result.max_score, failed


def test_global_max_pooling_costs_the_layers_check_alone():
    """Global max-pooling keeps the output's shape and the parameter count: only the check of
    the layers against the reference sees it, and its hint names average pooling."""
    source = ROUTES["stem_in_one_sequential"].replace(
        "nn.AdaptiveAvgPool2d((1, 1))", "nn.AdaptiveMaxPool2d(1)"
    )
    result = grade_source(load_manifest().exercise("resnet18"), source)
    failed = {c.name: c for c in result.checks if not c.passed}
    assert set(failed) == {"same_layers_as_the_reference"}, failed
    assert "AdaptiveAvgPool2d" in failed["same_layers_as_the_reference"].hint


class ReluInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        return F.relu(self.conv(x)).amax(dim=(2, 3))


def test_the_record_is_the_computation_not_the_modules():
    """nn.ReLU and F.relu, a container or none, record alike; global pooling is named by what
    it computes, here the maximum."""
    torch.manual_seed(0)
    functional = ReluInForward()
    nested = nn.Sequential(
        nn.Sequential(functional.conv, nn.ReLU()), nn.AdaptiveMaxPool2d(1), nn.Flatten()
    )
    x = torch.randn(2, 1, 8, 8)
    kinds = [[op["kind"] for op in recorded_forward(net, x)["ops"]] for net in (functional, nested)]
    assert kinds[0] == ["Conv2d", "ReLU", "AdaptiveMaxPool2d"]
    assert kinds[1] == [*kinds[0], "flatten"]
    run = recorded_forward(nested, x)
    assert run["finished"] and run["ops"][0]["params"] == [0, 1]
    assert run["sizes"] == [4 * 9, 4]
