"""Judge the records of a case's groups: which ranks finished, and what went wrong."""

from typing import NamedTuple

from grader.base.outcomes import Crash, Fail, Raised, Stopped, ended_at, raised_in
from labtext import N_, _

PEER_LOST = ("Connection closed by peer", "Connection reset by peer")
# What gloo says, as it aborts the process, when ranks make different collective calls at the
# same point (a call one rank skips, met by the others' next one): a deadlock by other means.
MISMATCH = "collective mismatch"
MISMATCH_HINT = N_(
    "The ranks made different collective calls at the same point, so gloo stopped: every rank "
    "must make the same collective calls in the same order (a call made on rank 0 alone, say "
    "an evaluation, meets the others' next call instead)."
)
# gloo says the same of a send and a receive of different sizes, so such a stop is judged as
# an error of this type: the exercise's error hints name what its code does, MISMATCH_HINT
# where none does (`mismatch_hint`).
MISMATCHED = "CallsMismatched"
DEADLOCK_HINT = N_(
    "Every rank must make the same calls in the same order: a blocking send on every rank "
    "at once waits forever (post the send with dist.isend, then recv, then wait), and so "
    "does a collective that some ranks skip."
)


def mismatch_hint(raised: Raised) -> str | None:
    """Return the hint for ranks that gloo stopped for calls that did not match, where no
    hint of the exercise named the cause."""
    return MISMATCH_HINT if raised.type == MISMATCHED else None


def expect_ranks_finished(group: dict, what: str = "") -> list[dict]:
    """Return each rank's record of a group that finished; fail, naming the rank, if the
    group deadlocked or ran out of time; raise Crash with the first error if the student's
    code raised on a rank."""
    n = group.get("world_size", "?")
    if what:
        label = _("with {n} processes, {what}").format(n=n, what=what)
    else:
        label = _("with {n} processes").format(n=n)
    if "failed" in group:
        kind = group.get("kind")
        said = _("{label}: {failed}").format(label=label, failed=group["failed"])
        cause = f"{n}: {group['cause']}" if group.get("cause") else ""
        if kind == "hung" and group.get("finished"):
            raise Stopped(said, cause=cause)  # the check's own hint names the call
        if kind == "hung":
            raise Stopped(said, DEADLOCK_HINT, cause=cause)
        if kind in ("limit", "stopped"):
            raise Stopped(said)
        if kind == "mismatch":
            raise Crash(
                Raised(
                    MISMATCHED,
                    _("{failed} ({label})").format(failed=group["failed"], label=label),
                    "",
                    "",
                )
            )
        # A rank's process died (a crash inside torch, os._exit): judged as an error, so the
        # exercise's error hints can name the mistake behind it.
        failed = _("{failed} ({label})").format(failed=group["failed"], label=label)
        raise Crash(Raised("RankFailed", failed, "", ""))
    ranks = group["ranks"]
    crashed = [(r, raised_in(o)) for r, o in enumerate(ranks) if raised_in(o) is not None]
    crashed = [(r, raised) for r, raised in crashed if not raised.stub]
    lost = [r for r, raised in crashed if any(p in raised.message for p in PEER_LOST)]
    if crashed and len(lost) == len(crashed) and len(crashed) < len(ranks):
        # Only "peer gone" errors: a rank returned while the others still waited for it.
        left = [r for r in range(len(ranks)) if r not in lost]
        raise Stopped(
            _(
                "{label}: rank(s) {returned} returned while rank(s) {waiting} still waited for "
                "them in a call to torch.distributed (which then failed: the connection was "
                "closed)"
            ).format(
                label=label,
                returned=", ".join(map(str, left)),
                waiting=", ".join(map(str, lost)),
            )
        )
    if crashed:
        rank, raised = min(crashed, key=lambda item: ended_at(ranks[item[0]]))
        message = _("{message} (on rank {rank}, {label})").format(
            message=raised.message, rank=rank, label=label
        )
        raise Crash(Raised(raised.type, message, raised.where, ""))
    return ranks


def groups_finished(groups: list[dict], what: str = "") -> list[tuple[int, list[dict]]]:
    """Return (world size, ranks) for every group, failing as `expect_ranks_finished` does
    for the first group that did not finish; where the code raised in every group, the
    check saw no call finish (Crash's `every_call`), and fails without charging."""
    finished, failures = [], []
    for g in groups:
        try:
            finished.append((g["world_size"], expect_ranks_finished(g, what)))
        except (Crash, Fail) as failure:
            failures.append(failure)
    if failures:
        first = failures[0]
        crashed_everywhere = all(isinstance(f, Crash) for f in failures) and not finished
        if crashed_everywhere and isinstance(first, Crash):
            first.every_call, first.calls = True, len(failures)
        raise first
    return finished


def ranks_that_returned(
    groups: list[dict], see: str, what: str = ""
) -> list[tuple[int, dict[int, dict]]]:
    """For a check about something other than the collectives (a mode, a sampler, a line
    printed): return (world size, {rank: record}) for every group, with every rank where the
    group finished and, where it deadlocked, the ranks that had returned before it was
    stopped (the larger groups stopped after it decided nothing). The deadlock is charged by
    the check `see`, which judges the collectives: where no rank is left to judge, this check
    fails naming it, and so keeps its points (grader.api.Fail). Calls that did not match
    (gloo stops such a group) count as a deadlock. A rank that raised, or a limit, fails as in
    `groups_finished`."""
    judged = []
    deadlocked = False
    for g in groups:
        if g.get("kind") in ("hung", "mismatch", "stopped"):
            deadlocked = deadlocked or g["kind"] != "stopped"
            ranks = {r: rec for r, rec in enumerate(g.get("partial") or []) if rec is not None}
            if ranks:
                judged.append((g["world_size"], ranks))
            continue
        judged.append((g["world_size"], dict(enumerate(expect_ranks_finished(g, what)))))
    if not judged:
        if deadlocked:
            raise Fail(
                _("could not be judged: the ranks deadlocked before any of them returned"),
                see=see,
            )
        expect_ranks_finished(groups[0], what)  # a failure of another kind: say which
    return judged


class GroupSeen(NamedTuple):
    """One group of a case, as a check judges it: its size and the records of its ranks."""

    n: int  # how many processes the group had
    ranks: dict[int, dict]  # each judged rank's record, by rank

    @property
    def label(self) -> str:
        return _("with {n} processes").format(n=self.n)

    def each_rank(self) -> list["RankSeen"]:
        """Return the group's judged ranks, in order."""
        return [RankSeen(self.n, rank, record, self.ranks) for rank, record in self.ranks.items()]

    def expect(self, condition: bool, message: str, hint: str | None = None) -> None:
        """Fail with "with N processes, MESSAGE" unless `condition` holds."""
        if not condition:
            raise Fail(_("{label}, {message}").format(label=self.label, message=message), hint)


class RankSeen(NamedTuple):
    """One rank of a group, as a check judges it."""

    n: int  # how many processes its group had
    rank: int
    record: dict  # what the rank's case returned
    group: dict[int, dict]  # every judged rank's record of the group, by rank

    @property
    def label(self) -> str:
        return _("with {n} processes, rank {rank}").format(n=self.n, rank=self.rank)

    def expect(self, condition: bool, message: str, hint: str | None = None) -> None:
        """Fail with "with N processes, rank R MESSAGE" unless `condition` holds (no space
        before a message that starts with an apostrophe: "rank 1's weights ...")."""
        if not condition:
            gap = "" if message.startswith("'") else " "  # (the label is the sentence's subject)
            raise Fail(f"{self.label}{gap}{message}", hint)


def every_group(groups: list[dict], see: str | None = None, what: str = "") -> list[GroupSeen]:
    """Return every group of a case, smallest first, with the records of its ranks.

    Without `see`: every group must have finished, as `groups_finished` demands. With `see`
    (the check that judges the collectives), a check about something else judges the ranks
    that returned, where a group deadlocked, as `ranks_that_returned` explains."""
    if see is None:
        return [GroupSeen(n, dict(enumerate(ranks))) for n, ranks in groups_finished(groups, what)]
    return [GroupSeen(n, ranks) for n, ranks in ranks_that_returned(groups, see, what)]


def every_rank(groups: list[dict], see: str | None = None, what: str = "") -> list[RankSeen]:
    """Return every rank of every group (see `every_group`), smallest group first; each
    fails with its own "with N processes, rank R" prefix (`RankSeen.expect`)."""
    return [r for g in every_group(groups, see, what) for r in g.each_rank()]
