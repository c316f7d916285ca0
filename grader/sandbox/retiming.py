"""Cases stopped for processor time, timed against the reference solution on this machine.

A case stopped at its processor-time limit may be slow code, or a slow machine. The
reference solution runs the same case here (instructor side): if the reference too needs
more than a tenth of the limit, the machine is the slow one, and the case runs again with
MARGIN times the reference's time; otherwise the message gives both times.
"""

from dataclasses import replace

from grader.api import Check
from grader.base.limits import Limits
from grader.base.protocol import CaseOutcome
from grader.load.reference import available
from grader.load.submission import Submission
from grader.manifest import solutions_dir
from grader.sandbox.collected import Collected
from grader.sandbox.speedups import PLAIN, Speedups
from grader.sandbox.supervisor import run_isolated
from grader.sandbox.watching import PROCESSOR_TIME

MARGIN = 10  # a case may use this many times the reference's processor time


def stopped_for_processor_time(outcome: CaseOutcome) -> bool:
    """Return True for a case stopped because it used up its processor time."""
    timed_out = outcome.error is not None and outcome.error.type == "TimeLimit"
    return timed_out or outcome.limit == PROCESSOR_TIME


def time_against_the_reference(
    sub: Submission,
    checks: dict[str, list[Check]],
    collected: Collected,
    seed: int,
    limits: Limits,
    threads: int,
    speedups: Speedups = PLAIN,
) -> None:
    """Time the reference on each case stopped for processor time, and rerun or annotate it
    (its children started as `speedups` allows)."""
    for ex in sub.exercises:
        for case_name, outcome in list(collected.outcomes.get(ex.id, {}).items()):
            if not stopped_for_processor_time(outcome) or not available(ex.notebook):
                continue
            on_case = [c for c in checks[ex.id] if c.case.name == case_name]
            solutions = solutions_dir() / ex.notebook
            ref = Submission("reference", solutions, {ex.notebook: solutions}, [ex])
            unlimited = replace(limits, check_seconds=0)
            timed = run_isolated(ref, {ex.id: on_case}, seed, unlimited, threads, speedups=speedups)
            ref_outcome = timed.outcomes.get(ex.id, {}).get(case_name)
            if ref_outcome is None or ref_outcome.cpu_seconds is None or ref_outcome.raised:
                continue
            needed = ref_outcome.cpu_seconds
            if limits.check_seconds * threads < MARGIN * needed:  # the machine is the slow one
                again = run_isolated(
                    sub,
                    {ex.id: on_case},
                    seed,
                    replace(limits, check_seconds=MARGIN * needed / threads),
                    threads,
                    speedups=speedups,
                )
                outcome = again.outcomes.get(ex.id, {}).get(case_name, outcome)
            if stopped_for_processor_time(outcome):
                outcome = replace(outcome, reference_cpu=needed)
            collected.outcomes[ex.id][case_name] = outcome
