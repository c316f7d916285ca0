"""Known wrong versions of `try_gpu`."""

from grader.exercises.catalogue import Mistake

never_falls_back = Mistake(
    source="""
def try_gpu(i=0):
    return torch.device(f'cuda:{i}')
""",
    fails="returns_cpu_when_gpu_i_is_missing",
    hint_mentions="torch.device('cpu')",
)

off_by_one = Mistake(
    source="""
def try_gpu(i=0):
    if torch.cuda.device_count() > i + 1:
        return torch.device(f'cuda:{i}')
    return torch.device('cpu')
""",
    fails="returns_gpu_i_when_it_exists",
    hint_mentions="i < torch.cuda.device_count()",
)
