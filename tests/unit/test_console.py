"""`raybroker console` without Ray: the board gathered from an in-process broker's public views
(queues with their rates, dialogs, the transmission queue with why each row waits and its age,
events), the operator's actions (each recorded as an event), and the web server's token rule."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from actors import InvalidArgument, LocalBroker, Queue, Send, Service
from actors.errors import ConversationNotFound, InvalidDefinition
from actors.tools.console.board import CONSOLE_ERROR, Board, act, rates
from actors.tools.console.server import TOKEN_HEADER, Console, is_loopback
from tests.polling import wait_until


@pytest.fixture
def broker(tmp_path):
    with LocalBroker("console-unit", str(tmp_path / "b.sqlite")) as b:
        b.create(Queue("Q"))
        b.create(Service("S", "Q", ["DEFAULT"]))
        yield b


def kinds(b) -> list[str]:
    return [e["kind"] for e in b.events()]


def test_the_board_shows_queues_with_rates_dialogs_what_waits_and_why_and_events(broker):
    board = Board()
    h = broker.begin_dialog("S", "S")
    far = broker.begin_dialog("S", "Elsewhere", encryption=False)  # no route: it waits
    broker.send(far, "DEFAULT", b"stuck")
    first = board.gather({"b": broker}, now=100.0)
    broker.apply([Send(h, "DEFAULT", [b"m"] * 10)])
    [g] = broker.receive("Q", max_groups=1, top=4)
    broker.commit(g)
    second = board.gather({"b": broker}, now=102.0)["brokers"]["b"]
    q = second["queues"]["Q"]
    assert q["depth"] == 6 and q["removed"] == 4
    assert q["series"] == [{"t": 102.0, "depth": 6, "in": 5.0, "out": 2.0}]  # 10 in, 4 out, 2 s
    # two ends of h, and the waiting one: the broker counts its dialogs again once its last
    # count is old enough (actors.core.views), and the board shows them then
    wait_until(
        lambda: (
            board.gather({"b": broker}, now=103.0)["brokers"]["b"]["dialogs"] == {"CONVERSING": 3}
        ),
        timeout=10,
        what="the board to show three conversing dialogs",
    )
    [row] = second["transmission"]
    assert row["conversation_handle"] == far and row["to_service"] == "Elsewhere"
    assert "Elsewhere" in row["transmission_status"] and row["age_s"] >= 0
    assert first["brokers"]["b"]["events"] == second["events"] == []
    broker.record_event("Maintenance", "Q", "nightly check")
    third = board.gather({"b": broker}, now=104.0)["brokers"]["b"]
    assert [(e["kind"], e["detail"]) for e in third["events"]] == [("Maintenance", "nightly check")]


def test_a_broker_that_cannot_be_asked_is_shown_with_why_and_the_others_all_the_same(broker):
    class Gone:
        def info(self):
            raise TimeoutError("no answer in 5 s")

    state = Board().gather({"gone": Gone(), "b": broker}, now=1.0)["brokers"]
    assert state["gone"] == {"error": "TimeoutError: no answer in 5 s"}
    assert state["b"]["queues"]["Q"]["depth"] == 0


def test_rates_skip_a_restart_instead_of_showing_a_negative_rate():
    points = rates([(0.0, 5, 100), (1.0, 5, 110), (2.0, 0, 0), (3.0, 2, 1)])
    assert [(p["in"], p["out"]) for p in points] == [(10.0, 10.0), (0.0, 0.0), (3.0, 1.0)]


def test_each_action_is_done_and_recorded_as_an_event(broker):
    brokers = {"b": broker}
    broker.alter(Queue, "Q", enabled=False)
    assert act(brokers, {"action": "enable_queue", "broker": "b", "queue": "Q"}, "ops") == (
        "queue 'Q' enabled"
    )
    assert broker.queues()["Q"]["enabled"] and kinds(broker)[-2:] == [
        "QueueEnabled",
        "ConsoleAction",
    ]
    far = broker.begin_dialog("S", "Elsewhere", encryption=False)
    broker.send(far, "DEFAULT", b"x")
    # (parked for want of a route, not backing off: nothing to make due; a backing-off one:
    # tests/integration/test_console.py)
    done = act(brokers, {"action": "retry_transmission", "broker": "b", "handle": far}, "ops")
    assert done.endswith(": 0 message(s) made due") and kinds(broker)[-2:] == [
        "TransmissionRetried",
        "ConsoleAction",
    ]
    h = broker.begin_dialog("S", "S")
    broker.send(h, "DEFAULT", b"y")
    end = {"action": "end_dialog", "broker": "b", "handle": h, "description": "stuck order"}
    assert "ended with error" in act(brokers, end, "ops")
    errors = [m for g in broker.receive("Q", max_groups=10) for m in g.messages if m.error]
    assert [m.error for m in errors] == [(CONSOLE_ERROR, "stuck order")]
    [event] = [e for e in broker.events() if e["kind"] == "ConsoleAction" and e["subject"] == h]
    assert "stuck order, by ops" in event["detail"]


@pytest.mark.parametrize(
    "action, says",
    [
        ({"action": "drop_everything", "broker": "b"}, "unknown action"),
        ({"action": "enable_queue", "broker": "nobody", "queue": "Q"}, "no broker 'nobody'"),
        ({"action": "enable_queue", "broker": "b"}, "needs 'queue'"),
        ({"action": "end_dialog", "broker": "b", "handle": 7}, "needs 'handle'"),
    ],
)
def test_a_bad_action_is_refused_naming_what_is_wrong_and_changes_nothing(broker, action, says):
    before = broker.events()
    with pytest.raises(InvalidArgument, match=says):
        act({"b": broker}, action, "ops")
    assert broker.events() == before


def test_retry_and_record_event_refuse_bad_input(broker):
    with pytest.raises(ConversationNotFound):
        broker.retry_transmission("01a221ca-82a8-7bbb-b0ca-0e676d43dcf1")
    with pytest.raises(InvalidDefinition, match="event kind"):
        broker.record_event("not a name!", "x")
    with pytest.raises(InvalidArgument, match="detail must be text"):
        broker.record_event("Note", "x", "y" * 3000)
    assert broker.events() == []
    assert broker.retry_transmission() == 0 and kinds(broker) == ["TransmissionRetried"]


def _serve(console: Console, check) -> None:
    async def run():
        async with TestClient(TestServer(console.app())) as client:
            await console.refresh()
            await check(client)

    asyncio.run(run())


def test_the_page_and_state_are_served_and_actions_need_the_token(broker):
    console = Console(lambda: ({"b": broker}, {}), token="t" * 20)
    broker.alter(Queue, "Q", enabled=False)

    async def check(client):
        page = await (await client.get("/")).text()
        assert "raybroker console" in page and "t" * 20 in page  # on loopback: embedded
        state = await (await client.get("/api/state")).json()
        assert state["brokers"]["b"]["queues"]["Q"]["enabled"] is False
        action = {"action": "enable_queue", "broker": "b", "queue": "Q"}
        refused = await client.post("/api/action", json=action)
        assert refused.status == 403 and not broker.queues()["Q"]["enabled"]
        wrong = await client.post("/api/action", json=action, headers={TOKEN_HEADER: "x" * 20})
        assert wrong.status == 403
        done = await client.post("/api/action", json=action, headers={TOKEN_HEADER: "t" * 20})
        assert done.status == 200 and (await done.json())["done"] == "queue 'Q' enabled"
        assert broker.queues()["Q"]["enabled"]
        bad = await client.post("/api/action", json={"action": "x", "broker": "b"},
                                headers={TOKEN_HEADER: "t" * 20})  # fmt: skip
        assert bad.status == 400 and "unknown action" in (await bad.json())["error"]

    _serve(console, check)


def test_a_console_beyond_loopback_does_not_give_its_token_away(broker):
    console = Console(lambda: ({"b": broker}, {}), host="10.1.2.3")
    assert not is_loopback("10.1.2.3") and is_loopback("127.0.0.1") and is_loopback("::1")

    async def check(client):
        page = await (await client.get("/")).text()
        assert console.token not in page and 'let token = "";' in page

    _serve(console, check)
