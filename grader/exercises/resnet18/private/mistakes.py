"""Known wrong versions of `resnet18`: the book's with one part changed, or reorganised."""

from grader.exercises.catalogue import Mistake, variant

BOOK = """
def resnet18(num_classes, in_channels=1):
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if <<SHORTCUT_WHEN>>:
                blk.append(d2l.Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(d2l.Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(<<STEM>>)
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, <<LAST_BLOCKS>>))
    net.add_module("global_avg_pool", <<POOL>>)
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net
"""
RIGHT = {
    "LAST_BLOCKS": "2",
    "POOL": "nn.AdaptiveAvgPool2d((1, 1))",
    "SHORTCUT_WHEN": "i == 0 and not first_block",
    "STEM": "nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),\n"
    "                        nn.BatchNorm2d(64), nn.ReLU()",
}

original_imagenet_stem = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        STEM="nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3),\n"
        "                        nn.BatchNorm2d(64), nn.ReLU(),\n"
        "                        nn.MaxPool2d(kernel_size=3, stride=2, padding=1)",
    ),
    fails="stem_is_3x3_stride_1_without_max_pooling",
    hint_mentions="for 224x224 images",
    seen_in="seed notes: the ImageNet ResNet-18 stem copied into the multi-GPU section",
)

shortcut_in_the_first_stage = Mistake(
    source=variant(BOOK, RIGHT, SHORTCUT_WHEN="i == 0"),
    fails="shortcuts_only_where_the_shape_changes",
    hint_mentions="Only the first block of stages 2 to 4",
)

unnamed_stages = Mistake(
    source="""
def resnet18(num_classes, in_channels=1):
    def stage(i, o, first=False):
        return nn.Sequential(d2l.Residual(i, o) if first else
                             d2l.Residual(i, o, use_1x1conv=True, strides=2), d2l.Residual(o, o))
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(64),
        nn.ReLU(), stage(64, 64, True), stage(64, 128), stage(128, 256), stage(256, 512),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
""",
    fails="names_its_stages_like_the_book",
    hint_mentions="add_module('resnet_block1'",
)

three_blocks_in_the_last_stage = Mistake(
    source=variant(BOOK, RIGHT, LAST_BLOCKS="3"),
    fails="stages_and_classifier_have_the_books_parameter_count",
    hint_mentions="four stages of two residual blocks",
    seen_in="a stage given one residual block more, as ResNet-34's stages have: it still "
    "classifies, with 4.7 million parameters too many",
)

global_max_pooling = Mistake(
    source=variant(BOOK, RIGHT, POOL="nn.AdaptiveMaxPool2d((1, 1))"),
    fails="same_layers_as_the_reference",
    hint_mentions="AdaptiveAvgPool2d",
    seen_in="issue 56: a ResNet pooled by its maximum kept full marks; the output has the "
    "right shape and the parameters the right count, so only the layers' kinds show it",
)
