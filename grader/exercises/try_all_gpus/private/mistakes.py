"""Known wrong versions of `try_all_gpus`."""

from grader.exercises.catalogue import Mistake

empty_list_without_gpus = Mistake(
    source="""
def try_all_gpus():
    return [torch.device(f'cuda:{i}') for i in range(torch.cuda.device_count())]
""",
    fails="gives_the_cpu_when_there_is_no_gpu",
    hint_mentions="[torch.device('cpu')]",
    seen_in="the English edition of the book, which returns [] without GPUs",
)

only_the_first_gpu = Mistake(
    source="""
def try_all_gpus():
    return [torch.device('cuda:0')] if torch.cuda.is_available() else [torch.device('cpu')]
""",
    fails="lists_every_gpu",
    hint_mentions="range(torch.cuda.device_count())",
)
