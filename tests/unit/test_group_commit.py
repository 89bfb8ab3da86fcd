"""Group commit: concurrent callers' changes share one store transaction, and each caller gets
its own answer. A caller with bad input fails alone; a commit that fails fails the whole group and
changes nothing. Real SQLite files, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors.calls.envelope import Send
from actors.errors import ContractViolation, ConversationNotFound, LockNotHeld, StoreError
from actors.service.group_commit import GroupCommit
from tests.unit.test_store_faults import disk_full


@pytest.fixture
def dialogs(make_core, tmp_path, open_dialog):
    core = make_core(str(tmp_path / "group.sqlite"))
    return core, [open_dialog(core, bodies=[b"first"]) for _ in range(20)]


@pytest.fixture(params=[False, True], ids=["each-alone", "sharing-a-unit"])
def sharing(request) -> bool:
    """Whether the callers' changes may share one unit of work (sends and commits may)."""
    return request.param


def _run(core, changes, sharing=False):
    """Submit every change at once (as concurrent callers on one event loop do) and return
    each caller's outcome: its result, or the error it raised."""
    commits = GroupCommit(core.uow, lambda: None)

    async def all_at_once():
        return await asyncio.gather(
            *(commits.enqueue(c, shares=sharing) for c in changes), return_exceptions=True
        )

    return commits, asyncio.run(all_at_once())


def _waiting(core, d) -> list[bytes]:
    groups = core.receive("TargetQ", handle=d.target)
    core.settle([g.lock_id for g in groups], [], [], {}, None)
    return [m.body for g in groups for m in g.messages]


def test_concurrent_sends_commit_in_one_transaction_each_answered_with_its_own_result(
    dialogs, sharing
):
    core, ds = dialogs
    commits, outcomes = _run(
        core,
        [lambda d=d: core.apply([Send(d.init, "Req", [b"second"])], None) for d in ds],
        sharing,
    )
    assert (commits.groups, commits.changes) == (1, len(ds))
    assert all(isinstance(o, dict) for o in outcomes)
    assert all(_waiting(core, d) == [b"first", b"second"] for d in ds)


def test_a_caller_with_bad_input_fails_alone_and_the_others_commit(dialogs, snapshot, sharing):
    core, ds = dialogs
    # each bad caller sends one good message first, undone with the bad one
    bad = {3: Send(ds[3].init, "Reply", [b"not the initiator's"]), 7: Send("no-such", "Req", [])}

    def change(i, d):
        return lambda: core.apply(
            [Send(d.init, "Req", [b"second"]), *([bad[i]] if i in bad else [])], None
        )

    changes = [change(i, d) for i, d in enumerate(ds)]
    commits, outcomes = _run(core, changes, sharing)
    assert isinstance(outcomes[3], ContractViolation) and isinstance(
        outcomes[7], ConversationNotFound
    )
    assert [i for i, o in enumerate(outcomes) if isinstance(o, Exception)] == [3, 7]
    assert (commits.groups, commits.changes) == (1, len(ds) - 2)
    for i, d in enumerate(ds):  # the failed callers' first sends were undone with them
        assert _waiting(core, d) == ([b"first"] if i in bad else [b"first", b"second"])
    # and their dialogs carry on from where they were: the next send takes the next number
    core.apply([Send(ds[3].init, "Req", [b"again"])], None)
    (g,) = core.receive("TargetQ", handle=ds[3].target)
    assert [(m.sequence_number, m.body) for m in g.messages] == [(1, b"again")]


def test_a_commit_that_fails_fails_every_caller_of_the_group_and_changes_nothing(
    dialogs, snapshot, sharing
):
    core, ds = dialogs
    before = snapshot(core)
    with disk_full():
        commits, outcomes = _run(
            core,
            [
                lambda d=d: core.apply([Send(d.init, "Req", [b"x" * 5000])], f"r-{d.init}")
                for d in ds
            ],
            sharing,
        )
    assert all(isinstance(o, StoreError) for o in outcomes)
    assert commits.groups == 0 and not core.store.db.in_transaction
    assert snapshot(core) == before
    # the same calls, retried once the fault clears, go through (their request ids unused)
    commits, outcomes = _run(
        core,
        [lambda d=d: core.apply([Send(d.init, "Req", [b"x" * 5000])], f"r-{d.init}") for d in ds],
        sharing,
    )
    assert commits.groups == 1 and all(isinstance(o, dict) for o in outcomes)


def test_two_callers_committing_one_lock_in_one_group_commit_it_once(dialogs, sharing):
    core, ds = dialogs
    (g,) = core.receive("TargetQ", handle=ds[0].target)

    def settle():
        return core.settle([g.lock_id], [], [], {}, None)

    commits, outcomes = _run(core, [settle, settle], sharing)
    assert outcomes[0]["committed"] == 1 and isinstance(outcomes[1], LockNotHeld)
    assert core.queue_view("TargetQ") and all(
        r["conversation_handle"] != ds[0].target for r in core.queue_view("TargetQ")
    )


def test_a_retry_in_the_same_group_answers_as_the_first_and_applies_once(dialogs, sharing):
    core, ds = dialogs

    def send():
        return core.apply([Send(ds[0].init, "Req", [b"once"])], "same-request")

    commits, outcomes = _run(core, [send, send], sharing)
    assert outcomes[0] == outcomes[1]
    assert _waiting(core, ds[0]) == [b"first", b"once"]


def test_retries_in_a_later_group_looked_up_together_answer_as_before_and_apply_once(dialogs):
    core, ds = dialogs
    commits = GroupCommit(core.uow, lambda: None)

    def send(i):
        return lambda: core.apply([Send(ds[i].init, "Req", [b"once"])], f"request-{i}")

    async def group(indices):
        return await asyncio.gather(
            *(commits.enqueue(send(i), request_id=f"request-{i}") for i in indices)
        )

    first = asyncio.run(group(range(5)))
    # the first five again (their ids looked up as the group begins) and five new ones
    again = asyncio.run(group(range(10)))
    assert commits.groups == 2 and again[:5] == first
    assert all(_waiting(core, d) == [b"first", b"once"] for d in ds[:10])


def test_a_take_follows_its_own_change_and_sees_what_the_group_committed(dialogs):
    core, ds = dialogs
    commits = GroupCommit(core.uow, lambda: None)

    async def send_then_take():
        sent = commits.submit(lambda: core.apply([Send(ds[0].init, "Req", [b"second"])], None))
        took = commits.submit(None, lambda: core.receive("TargetQ", handle=ds[0].target))
        return await asyncio.gather(sent, took)

    _, groups = asyncio.run(send_then_take())
    assert [m.body for g in groups for m in g.messages] == [b"first", b"second"]


def test_a_caller_that_stopped_waiting_gets_its_change_committed_and_nothing_taken(dialogs):
    core, ds = dialogs
    commits = GroupCommit(core.uow, lambda: None)
    took: list = []

    async def cancelled_while_queued():
        call = commits.enqueue(
            lambda: core.apply([Send(ds[0].init, "Req", [b"second"])], None),
            lambda: took.append(core.receive("TargetQ", handle=ds[0].target)),
        )
        call.cancel()  # its caller left (a timeout around the call, say) before the group ran
        await commits.submit(None)  # the group after it: this one has run by then

    asyncio.run(cancelled_while_queued())
    assert took == []  # nothing locked for a caller who is gone
    assert _waiting(core, ds[0]) == [b"first", b"second"]  # and its send committed


def test_a_commit_that_fails_after_writing_is_undone_alone_and_its_messages_stay(
    dialogs, snapshot, sharing
):
    """The commit's own writes (removing the received messages) come before its bad output is
    found: they are undone (held writes dropped, or its savepoint rolled back) while the
    group's other callers commit."""
    core, ds = dialogs
    (g,) = core.receive("TargetQ", handle=ds[0].target)
    before = core.queue_view("TargetQ")
    bad_output = [Send(ds[0].target, "Req", [b"the target may not send Req"])]
    commits, outcomes = _run(
        core,
        [
            lambda: core.settle([g.lock_id], [], bad_output, {}, None),
            lambda: core.apply([Send(ds[1].init, "Req", [b"second"])], None),
        ],
        sharing,
    )
    assert isinstance(outcomes[0], ContractViolation) and isinstance(outcomes[1], dict)
    after = [r for r in core.queue_view("TargetQ") if r["conversation_handle"] != ds[1].target]
    assert after == [r for r in before if r["conversation_handle"] != ds[1].target]
    core.settle([], [g.lock_id], [], {}, None)  # still held: roll it back, and it comes again
    assert _waiting(core, ds[0]) == [b"first"]


def test_a_shared_unit_applies_all_its_calls_or_none_and_forgets_the_undone_request_ids(
    dialogs, snapshot
):
    core, ds = dialogs

    def send(i, message_type="Req"):
        return lambda: core.apply([Send(ds[i].init, message_type, [b"x"])], f"shared-{i}")

    before = snapshot(core)
    with core.uow.group():  # one bad call among them: none applied, none recorded
        assert core.uow.shared([send(0), send(1, "Reply"), send(2)]) is None
    assert snapshot(core) == before
    with core.uow.group():
        results = core.uow.shared([send(0), send(1), send(2)])
    assert results == [{"handles": [], "sent": 1}] * 3
    assert [_waiting(core, ds[i]) for i in range(3)] == [[b"first", b"x"]] * 3


def test_many_callers_sends_and_commits_go_as_one_shared_unit(dialogs, monkeypatch):
    core, ds = dialogs
    groups = [core.receive("TargetQ", handle=d.target)[0] for d in ds[:10]]
    shared_runs: list[int | None] = []
    run_shared = core.uow.shared

    def spy(changes):
        results = run_shared(changes)
        shared_runs.append(None if results is None else len(results))
        return results

    monkeypatch.setattr(core.uow, "shared", spy)
    sends = [lambda d=d: core.apply([Send(d.init, "Req", [b"second"])], None) for d in ds]
    settles = [lambda g=g: core.settle([g.lock_id], [], [], {}, None) for g in groups]
    _, outcomes = _run(core, sends + settles, sharing=True)
    assert shared_runs == [len(ds) + len(groups)]
    assert [o["committed"] for o in outcomes[len(ds) :]] == [1] * len(groups)
    assert all(_waiting(core, d) == [b"second"] for d in ds[:10])


def test_a_shared_unit_interrupted_midway_undoes_what_ran_and_ends_the_group(dialogs, snapshot):
    core, ds = dialogs

    def interrupted():
        raise KeyboardInterrupt

    before = snapshot(core)
    sent = lambda: core.apply([Send(ds[0].init, "Req", [b"x"])], "interrupted")  # noqa: E731
    with pytest.raises(KeyboardInterrupt), core.uow.group():
        core.uow.shared([sent, interrupted])
    assert snapshot(core) == before
    core.apply([Send(ds[0].init, "Req", [b"y"])], "interrupted")  # its request id is unused
    assert _waiting(core, ds[0]) == [b"first", b"y"]
