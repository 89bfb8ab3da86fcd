"""Hostile and malformed input at the verbs: bodies and schemas, error descriptions, call sizes,
operations off the wire, names, broker ids and wrong types. Each refusal is a typed `BrokerError`
naming what was wrong, and leaves every view as it was. No Ray: `BrokerCore` over an in-memory
store, and a real `LocalBroker` for what the client checks."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import msgpack
import pytest

from actors import LocalBroker
from actors.calls.envelope import Begin, End, Send, Timer, pack_ops, unpack_ops
from actors.core import Limits
from actors.errors import (
    BrokerError,
    InvalidArgument,
    InvalidDefinition,
    ValidationFailed,
)
from actors.model import bodies
from actors.model.bodies import (
    MAX_BODY_DEPTH,
    MAX_SCHEMA_BODY_BYTES,
    BodyValidator,
    regex_refusal,
)
from actors.model.catalog import Contract, MessageType, Queue, Service, check_name, from_record
from actors.model.dialogs import MAX_ERROR_DESCRIPTION, error_body, parse_error_body
from actors.model.routing import Route
from actors.store.database import Store
from tests.unit.conftest import define_core_catalog


def refused(core, snapshot, error, call, match: str | None = None):
    before = snapshot(core)
    with pytest.raises(error, match=match):
        call()
    assert snapshot(core) == before


def refused_body(core, open_dialog, snapshot, message_type, body, match):
    """On a new dialog, SEND of this body is refused as invalid and changes nothing."""
    d = open_dialog(core)
    refused(
        core,
        snapshot,
        ValidationFailed,
        lambda: core.apply([Send(d.init, message_type, body)]),
        match=match,
    )
    return d


def refused_schema(core, snapshot, schema, match=None):
    """CREATE MESSAGE TYPE with this schema is refused and changes nothing."""
    refused(
        core,
        snapshot,
        InvalidDefinition,
        lambda: core.create(MessageType("Refused", "json_schema", schema)),
        match=match,
    )


def nested(depth: int, kind: str = "list"):
    """`depth` lists (or {"not": ...} dicts) inside each other, built without recursion."""
    value: object = [] if kind == "list" else {}
    for _ in range(depth - 1):
        value = [value] if kind == "list" else {"not": value}
    return value


def json_nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# --- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_BODY_DEPTH + 1, 5_000, 200_000])
@pytest.mark.parametrize("message_type", ["Json", "Shaped"])
def test_a_json_body_nested_deeper_than_the_limit_fails_validation_naming_its_type(
    core, open_dialog, snapshot, depth, message_type
):
    refused_body(
        core,
        open_dialog,
        snapshot,
        message_type,
        json_nested(depth),
        f"{message_type!r} nests arrays/objects more than {MAX_BODY_DEPTH} deep",
    )


def test_a_json_body_nested_exactly_to_the_limit_is_accepted(core, open_dialog):
    d = open_dialog(core)
    core.apply([Send(d.init, "Json", json_nested(MAX_BODY_DEPTH))])
    assert core.queue_view("TargetQ")[-1]["message_type"] == "Json"


@pytest.mark.parametrize("body", [b"NaN", b"[Infinity]", b'{"n": -Infinity}'])
@pytest.mark.parametrize("message_type", ["Json", "Shaped"])
def test_nan_or_infinity_in_a_json_body_fails_validation(
    core, open_dialog, snapshot, body, message_type
):
    refused_body(core, open_dialog, snapshot, message_type, body, "is not a JSON value")


def test_a_body_over_the_schema_bound_fails_validation_and_a_json_type_takes_it(
    core, open_dialog, snapshot
):
    d = open_dialog(core)
    big = b'{"n": 1, "pad": "' + b"x" * MAX_SCHEMA_BODY_BYTES + b'"}'
    refused(
        core,
        snapshot,
        ValidationFailed,
        lambda: core.apply([Send(d.init, "Shaped", big)]),
        match="may be at most",
    )
    core.apply([Send(d.init, "Json", big)])


def test_a_failure_of_the_schema_library_while_checking_a_body_is_validation_failed(
    core, open_dialog, snapshot
):
    # jsonschema's multipleOf divides by a float: a 400-digit integer overflows inside it
    core.create(MessageType("Half", "json_schema", {"multipleOf": 0.5}))
    core.create(Contract("H", {"Half": "any"}))
    core.create(Service("HalfTarget", "TargetQ", ("H",)))
    op = Begin("Init", "HalfTarget", "H")
    core.apply([op, Send(op.handle, "Half", b"1.5")])
    refused(
        core,
        snapshot,
        ValidationFailed,
        lambda: core.apply([Send(op.handle, "Half", b"1" + b"0" * 400)]),
        match="'Half' could not be checked against its JSON schema",
    )


# --- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/missing"},
        {"properties": {"a": {"$ref": "#/definitions/nope"}}, "definitions": {"yes": {}}},
        {"$ref": "#no-such-anchor"},
        {"$ref": "https://example.com/elsewhere.json"},
        {"$ref": "other.json"},
    ],
    ids=["pointer", "nested-pointer", "anchor", "remote", "relative"],
)
def test_a_schema_whose_ref_cannot_be_resolved_is_refused_at_create(core, snapshot, schema):
    refused_schema(
        core,
        snapshot,
        schema,
        match="'Refused' has an invalid JSON schema: a \\$ref cannot be resolved",
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "default": b"bytes"},
        {"type": "integer", "enum": {1, 2}},
        {"type": "string", "pattern": b"^a"},
        {"type": "object", "properties": {1: {"type": "string"}}},
        {"type": "number", "const": float("nan")},
        {"type": "number", "maximum": float("inf")},
        {"type": "object", "default": object()},
        {"type": "object", "required": ("n",)},
    ],
    ids=["bytes", "set", "bytes-pattern", "int-key", "nan", "infinity", "object", "tuple"],
)
def test_a_schema_that_is_not_json_data_is_refused_at_create(core, snapshot, schema):
    refused_schema(
        core, snapshot, schema, match="'Refused' has an invalid JSON schema: it is not JSON"
    )


def test_a_schema_whose_refs_resolve_within_it_is_accepted_and_checks_bodies(core, open_dialog):
    schema = {
        "$defs": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {
            "n": {"$ref": "#/$defs/n"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
    }
    core.create(MessageType("Tree", "json_schema", schema))
    core.create(Contract("T", {"Tree": "any"}))
    core.create(Service("TreeTarget", "TargetQ", ("T",)))
    op = Begin("Init", "TreeTarget", "T")
    core.apply([op, Send(op.handle, "Tree", b'{"n": 1, "kids": [{"n": 2, "kids": []}]}')])
    with pytest.raises(ValidationFailed, match="at kids/0/n"):
        core.apply([Send(op.handle, "Tree", b'{"kids": [{"n": "x"}]}')])


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}])
def test_a_schema_that_refers_to_itself_without_end_is_refused_at_create(core, snapshot, schema):
    refused_schema(core, snapshot, schema, match="refers to itself without end")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "(unclosed"},
        {"patternProperties": {"[z-a]": {}}},
        {"properties": {"s": {"pattern": "*"}}},
    ],
)
def test_a_schema_with_a_regex_that_does_not_compile_is_refused_at_create(core, snapshot, schema):
    refused_schema(core, snapshot, schema)


CATASTROPHIC = [  # each backtracks exponentially, or polynomially, in Python's `re`
    "^(a+)+$",
    "(a*)*$",
    "(a|a)*$",
    "(a|aa)+b",
    "^(\\d+\\.?)+$",
    "((ab)*c?)+$",
    "(?:x+y*)+$",
    "(a+){20}$",
    "[a-z]+[a-z0-9]*@",  # quadratic: 3.6 s on 2 KB, about an hour on 20 KB
]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
@pytest.mark.parametrize("where", ["pattern", "patternProperties", "nested"])
def test_a_regex_that_would_backtrack_runs_in_linear_time_on_any_body(core, pattern, where):
    # RE2 takes time linear in the text, so a megabyte-sized body made to trip a backtracking
    # engine is checked as fast as any other: this test would not finish on Python's `re`
    schema = {
        "pattern": {"type": "string", "pattern": pattern},
        "patternProperties": {"type": "object", "patternProperties": {pattern: {"type": "null"}}},
        "nested": {"items": {"properties": {"s": {"anyOf": [{"pattern": pattern}]}}}},
    }[where]
    core.create(MessageType("Re", "json_schema", schema=schema))  # no longer refused
    evil = "a" * 200_000 + "!"  # most of the 1 MiB a schema-checked body may be, once quoted
    body = {
        "pattern": json.dumps(evil),
        "patternProperties": json.dumps({evil: 1}),
        "nested": json.dumps([{"s": evil}]),
    }[where].encode()
    # whether the regex matches such a text, from a short one Python's `re` still manages
    matches = re.search(pattern, "a" * 12 + "!") is not None
    # a key that matches is held to {"type": "null"}; a string that does not match is refused
    refused = matches if where == "patternProperties" else not matches
    check = BodyValidator(MessageType("Re", "json_schema", schema=schema)).check
    if refused:
        with pytest.raises(ValidationFailed, match="does not match its JSON schema"):
            check(body)
    else:
        check(body)


@pytest.mark.parametrize(
    "pattern, feature",
    [
        ("(a)\\1", "backreference"),
        ("foo(?=bar)", "lookahead"),
        ("(?<!x)y", "lookbehind"),
        ("(?>a+)b", "atomic group"),
        ("a++b", "possessive repeat"),
    ],
)
@pytest.mark.parametrize("where", ["pattern", "patternProperties"])
def test_a_regex_re2_cannot_run_in_linear_time_is_refused_at_create(
    core, snapshot, pattern, feature, where
):
    schema = {
        "pattern": {"type": "string", "pattern": pattern},
        "patternProperties": {"type": "object", "patternProperties": {pattern: {}}},
    }[where]
    refused_schema(core, snapshot, schema, match="cannot run in linear time")


@pytest.mark.parametrize(
    "pattern",
    ["^[a-z]+$", "^\\d{3}-\\d{4}$", "(foo|bar)+", "(a|b)*c", "([a-z]+)?", "(ab){2}", "[(a+)+]",
     "\\(a+\\)+", "^[A-Z]{2}-\\d+$"],
)  # fmt: skip
def test_ordinary_regexes_are_accepted_and_match_as_before(pattern):
    assert regex_refusal(pattern) is None
    for text in ("abc", "123-4567", "foobar", "abababc", "(aa)", "EU-12"):
        assert (re.search(pattern, text) is not None) == bodies._search(pattern, text)


def test_unevaluated_properties_beside_pattern_properties_is_refused(core, snapshot):
    schema = {"patternProperties": {"^x": {}}, "unevaluatedProperties": False}
    refused_schema(core, snapshot, schema, match="unevaluatedProperties beside patternProperties")


def test_additional_properties_are_told_from_pattern_properties_on_re2(core):
    schema = {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
              "additionalProperties": False}  # fmt: skip
    core.create(MessageType("Ext", "json_schema", schema=schema))
    check = BodyValidator(MessageType("Ext", "json_schema", schema=schema)).check
    check(b'{"x-a": 1, "x-b": 2}')
    with pytest.raises(ValidationFailed, match="'y' unexpected"):
        check(b'{"x-a": 1, "y": 2}')
    with pytest.raises(ValidationFailed, match="is not of type 'integer'"):
        check(b'{"x-a": "one"}')


def test_a_catastrophic_regex_is_harmless_as_data_where_it_is_no_regex(core):
    # `const` holds data, and a property may be named "pattern": neither is a regex
    core.create(
        MessageType(
            "Data",
            "json_schema",
            {"const": {"pattern": "(a+)+"}, "properties": {"pattern": {"type": "string"}}},
        )
    )


def test_a_pattern_in_a_schema_still_checks_bodies(core, open_dialog):
    core.create(MessageType("Code", "json_schema", {"type": "string", "pattern": "^[A-Z]{3}$"}))
    core.create(Contract("K", {"Code": "any"}))
    core.create(Service("CodeTarget", "TargetQ", ("K",)))
    op = Begin("Init", "CodeTarget", "K")
    core.apply([op, Send(op.handle, "Code", b'"ABC"')])
    with pytest.raises(ValidationFailed, match="does not match"):
        core.apply([Send(op.handle, "Code", b'"abcd"')])


# --- definitions: nesting, types -------------------------------------------------------------


def _cycle() -> dict:
    d: dict = {}
    d["again"] = d
    return d


@pytest.mark.parametrize(
    "defn",
    [
        MessageType("Deep", "json_schema", nested(5_000, "dict")),
        MessageType("Deep", "json_schema", nested(65, "dict")),
        MessageType("Deep", "json_schema", _cycle()),
        Contract("Deep", {"Req": nested(5_000)}),
        Queue(nested(5_000)),
        Service("Deep", nested(5_000)),
    ],
    ids=["schema", "schema-65", "schema-cycle", "contract", "queue-name", "service-queue"],
)
def test_definitions_nested_beyond_the_limit_are_refused_without_recursion(core, snapshot, defn):
    refused(core, snapshot, InvalidDefinition, lambda: core.create(defn))


def test_a_stored_record_nested_beyond_the_limit_is_refused_without_recursion():
    with pytest.raises(InvalidDefinition, match="nested at most"):
        from_record("contract", {"name": "C", "messages": nested(100_000)})
    with pytest.raises(InvalidDefinition, match="unknown definition kind"):
        from_record(["queue"], {"name": "Q"})  # type: ignore[arg-type]


def test_altering_with_changes_nested_beyond_the_limit_is_refused(core, snapshot):
    refused(
        core,
        snapshot,
        InvalidDefinition,
        lambda: core.alter("queue", "TargetQ", {"enabled": nested(5_000)}),
        match="nested at most",
    )


# --- local broker: what the client checks, and the broker again ------------------------------


@pytest.fixture
def local():
    with LocalBroker("hard", max_call_bytes=1_000) as b:
        define_core_catalog(b)
        yield b


def local_snapshot(b: LocalBroker) -> dict:
    return {
        "endpoints": sorted(b.endpoints(), key=lambda e: e["conversation_handle"]),
        "queues": b.queues(),
        "rows": {q: b.queue(q) for q in ("InitQ", "TargetQ", "RetainQ", "PoisonQ")},
        "groups": sorted(b.groups(), key=lambda g: g["conversation_group_id"]),
        "transmission": b.transmission_queue(),
        "definitions": b.definitions(),
    }


@pytest.fixture
def dialog(local):
    op = Begin("Init", "Target", "C")
    local.apply([op, Send(op.handle, "Req", b"hello")])
    return op.handle


def at_broker(b: LocalBroker, blob: bytes) -> None:
    """What another client (or any caller) could send: operations packed past the client."""
    b._call("apply", blob, uuid.uuid4().hex)


def over_call_limit(local, call, match: str = "max_call_bytes") -> None:
    refused(local, local_snapshot, InvalidArgument, call, match=match)


def test_a_call_whose_bodies_sum_over_max_call_bytes_is_refused_by_the_client(local, dialog):
    ops = [Send(dialog, "Req", [b"x" * 400, b"x" * 400]), Send(dialog, "Req", b"x" * 201)]
    over_call_limit(local, lambda: local.apply(ops))
    over_call_limit(local, lambda: local.settle(ops=ops), match="max_call_bytes is 1,000")
    over_call_limit(local, lambda: asyncio.run(local.aio.apply(ops)))
    assert local.apply(ops[:1])["sent"] == 2  # 800 bytes: within the limit


def test_a_call_over_max_call_bytes_the_client_let_through_is_refused_by_the_broker(local, dialog):
    local.max_call_bytes = 10**9  # a client that believes the limit is higher
    ops = [Send(dialog, "Req", b"x" * 600), Send(dialog, "Req", b"x" * 600)]
    over_call_limit(local, lambda: local.apply(ops))
    over_call_limit(local, lambda: at_broker(local, pack_ops(ops)))


def test_a_commit_with_ops_over_max_call_bytes_changes_nothing_and_keeps_its_lock(
    make_core, snapshot, open_dialog
):
    core = make_core(limits=Limits(max_call_bytes=100))
    d = open_dialog(core)
    (group,) = core.receive("TargetQ")
    reply = [Send(d.target, "Reply", b"r" * 101)]
    refused(
        core,
        snapshot,
        InvalidArgument,
        lambda: core.settle(commit=[group.lock_id], ops=reply),
        match="max_call_bytes",
    )
    assert (
        core.settle(commit=[group.lock_id], ops=[Send(d.target, "Reply", b"ok")])["committed"] == 1
    )


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "64", None, 2**64])
def test_a_bad_max_call_bytes_is_refused_naming_the_limit(value):
    with pytest.raises(InvalidArgument, match="max_call_bytes"):
        Limits(max_call_bytes=value)


def test_a_long_error_description_is_refused_at_the_client_and_at_the_broker(local, dialog):
    too_long = "x" * (MAX_ERROR_DESCRIPTION + 1)
    refused(
        local,
        local_snapshot,
        InvalidArgument,
        lambda: local.end_conversation(dialog, error=50001, description=too_long),
        match="at most 3,000",
    )
    blob = msgpack.packb([[2, dialog, 50001, too_long, False]], use_bin_type=True)
    refused(local, local_snapshot, InvalidArgument, lambda: at_broker(local, blob))
    local.end_conversation(dialog, error=50001, description="y" * MAX_ERROR_DESCRIPTION)
    (group,) = local.receive("TargetQ")
    assert group.messages[-1].error == (50001, "y" * MAX_ERROR_DESCRIPTION)


@pytest.mark.parametrize(
    "error, description",
    [(0, "d"), (-5, "d"), (2**31, "d"), (True, "d"), ("5", "d"), (5, ""), (5, None), (None, 7)],
)
def test_a_bad_error_code_or_description_is_refused_when_the_end_is_made(error, description):
    with pytest.raises(InvalidArgument, match="error"):
        End("h", error, description)


def test_an_end_with_both_error_and_cleanup_is_refused():
    with pytest.raises(InvalidArgument, match="not both"):
        End("h", 5, "d", cleanup=True)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"code": "5", "description": "d"}',
        b'{"code": 5, "description": 7}',
        b'{"code": true, "description": "d"}',
        b'{"code": 99999999999, "description": "d"}',
        b"[" * 100_000,
        error_body(5, "d").replace(b'"d"', b'"' + b"d" * (MAX_ERROR_DESCRIPTION + 1) + b'"'),
    ],
)
def test_a_malformed_error_body_is_an_invalid_argument_not_a_raw_exception(body):
    with pytest.raises(InvalidArgument, match="an Error body must be JSON"):
        parse_error_body(body)


def test_the_brokers_own_error_descriptions_are_cut_to_the_limit():
    assert parse_error_body(error_body(-8460, "z" * 10_000)) == (
        -8460,
        "z" * MAX_ERROR_DESCRIPTION,
    )


# --- operations off the wire -----------------------------------------------------------------


@pytest.mark.parametrize(
    "recs",
    [
        [[9, "h"]],
        [[-1]],
        [[]],
        [["1", ["h"], "Req", [b"x"]]],
        [[True, "h", 1.0]],
        [[1]],
        [[1, ["h"], "Req"]],
        [[3, "h", 1.0, "extra"]],
        [[0, "Init", "Target"]],
        [[1, 5, "Req", [b"x"]]],
        [[1, ["h"], ["Req"], [b"x"]]],
        [[1, ["h"], "Req", [None]]],
        [[2, "h", 5, "d", "yes"]],
        [[3, None, 1.0]],
        [[0, "Init", "Target", "C", "h", "not-a-broker-id", None, None, None]],
        [[0, "Init", "Target\n", "C", "h", None, None, None, None]],
        5,
        {"ops": []},
        "ops",
        [5],
    ],
)
def test_malformed_operations_from_the_wire_are_invalid_argument(recs):
    with pytest.raises(InvalidArgument):
        unpack_ops(msgpack.packb(recs, use_bin_type=True))


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x91", msgpack.packb([[3, "h", 1.0]]) + b"\x00"])
def test_operations_that_are_not_msgpack_are_invalid_argument(blob):
    with pytest.raises(InvalidArgument, match="could not be decoded"):
        unpack_ops(blob)


def test_malformed_operations_sent_to_a_broker_are_refused_and_change_nothing(local, dialog):
    for recs in ([[9, dialog]], [[1, [dialog], "Req"]], [[2, dialog, 5, 6, False]]):
        blob = msgpack.packb(recs, use_bin_type=True)
        refused(local, local_snapshot, InvalidArgument, lambda b=blob: at_broker(local, b))


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["TQ\n", "TQ\r\n", "T Q", " TQ", "TQ ", "TQ\t", "TQ\x00", "TQ\u00a0", "\nTQ", ""]
)
def test_a_name_with_whitespace_anywhere_or_a_trailing_newline_is_refused(core, snapshot, name):
    with pytest.raises(InvalidDefinition, match="not valid"):
        check_name("queue", name)
    refused(core, snapshot, InvalidDefinition, lambda: core.create(Queue(name)))
    with pytest.raises(InvalidArgument, match="not valid"):
        Route(name)
    with pytest.raises(InvalidArgument, match="not valid"):
        Route("R", service_name=name)
    with pytest.raises(InvalidArgument, match="to_service"):
        Begin("Init", name)
    with pytest.raises(InvalidArgument, match="message type"):
        Send("h", name, b"")


def test_lookups_by_a_name_with_a_trailing_newline_are_refused_not_matched(core, snapshot):
    refused(core, snapshot, InvalidDefinition, lambda: core.drop("queue", "TargetQ\n"))
    refused(
        core,
        snapshot,
        InvalidDefinition,
        lambda: core.alter("queue", "InitQ\n", {"enabled": False}),
    )


# --- to_broker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["garbage", "", "ray://B2", "12345", 5, ["x"], b"id"])
def test_a_to_broker_that_is_not_a_broker_id_is_refused_at_the_client_and_the_broker(
    local, dialog, bad
):
    refused(
        local,
        local_snapshot,
        InvalidArgument,
        lambda: local.begin_dialog("Init", "Target", "C", to_broker=bad),
        match="to_broker",
    )
    blob = msgpack.packb(
        [[0, "Init", "Target", "C", "h-new", bad, None, None, None]], use_bin_type=True
    )
    refused(local, local_snapshot, InvalidArgument, lambda: at_broker(local, blob))


def test_to_broker_is_normalised_like_a_routes_broker_instance():
    raw = uuid.uuid4()
    for written in (str(raw).upper(), raw.hex, f"{{{raw}}}", f"urn:uuid:{raw}"):
        assert Begin("A", "B", to_broker=written).to_broker == str(raw)
        assert Route("R", "B", broker_instance=written).broker_instance == str(raw)


def test_a_dialog_to_this_brokers_id_in_upper_case_is_delivered_here(core):
    op = Begin("Init", "Target", "C", to_broker=core.broker_id.upper())
    core.apply([op, Send(op.handle, "Req", b"up")])
    # unnormalised, it waited in the transmission queue for a broker that is this one
    assert [(r["message_type"], r["body_size"]) for r in core.queue_view("TargetQ")] == [("Req", 2)]
    assert core.transmission_view() == []


# --- wrong types at the verbs ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda b, h: b.create(Queue(["x"])), "queue name"),
        (lambda b, h: b.create(Service("S", ["TargetQ"])), "queue"),
        (lambda b, h: b.create(Service("S", "TargetQ", 5)), "contracts"),
        (lambda b, h: b.create(Contract("C2", {"Req": ["any"]})), "sides"),
        (lambda b, h: b.create(Contract("C2", ["Req", "Reply"])), "must map"),
        (lambda b, h: b.create(MessageType("M", "json_schema", [1])), "schema"),
        (lambda b, h: b.create(MessageType("M", ["json"])), "validation"),
        (lambda b, h: b.alter("queue", [], enabled=False), "queue name"),
        (lambda b, h: b.alter(Queue, "TargetQ", poison_limit=2**70 * -1), "poison_limit"),
        (lambda b, h: b.drop("queue", {}), "queue name"),
        (lambda b, h: b.send(h, {}, b"x"), "message type"),
        (lambda b, h: b.send(h, "Req", None), "body"),
        (lambda b, h: b.send([["x"]], "Req", b"x"), "conversation handle"),
        (lambda b, h: b.send([], "Req", b"x"), "at least one"),
        (lambda b, h: b.begin_dialog({}, "Target"), "from_service"),
        (lambda b, h: b.begin_dialog("Init", "Target", None), "contract"),
        (lambda b, h: b.apply([Begin("Init", "Target", "C", handle=2**70)]), "handle"),
        (lambda b, h: b.begin_dialog("Init", "Target", "C", related_group=5), "related_group"),
        (lambda b, h: b.begin_dialog("Init", "Target", "C", related_conversation=[]), "related"),
        (lambda b, h: b.begin_dialog("Init", "Target", "C", lifetime=2**100), "lifetime"),
        (lambda b, h: b.end_conversation([]), "conversation handle"),
        (lambda b, h: b.end_conversation(h, error=2**100, description="d"), "error code"),
        (lambda b, h: b.begin_conversation_timer(h, 2**100), "timer timeout"),
        (lambda b, h: b.begin_conversation_timer(None, 1), "conversation handle"),
        (lambda b, h: b.begin_conversation_timer(h, 10**400), "timer timeout"),
        (lambda b, h: b.begin_conversation_timer(h, -(10**5000)), "timer timeout"),
        (lambda b, h: b.end_conversation(h, error=10**5000, description="d"), "error code"),
        (lambda b, h: b.begin_dialog("Init", "Target", "C", lifetime=10**400), "lifetime"),
        (lambda b, h: b.apply([Begin("Init", "Target", "C", handle=10**5000)]), "handle"),
        (lambda b, h: b.apply([Timer(h, 1), "not an op"]), "not an operation"),
        (lambda b, h: b.apply(5), "ops"),
    ],
)
def test_wrong_types_at_the_verbs_are_typed_errors_naming_the_argument(local, dialog, call, named):
    before = local_snapshot(local)
    with pytest.raises(BrokerError, match=named) as caught:
        call(local, dialog)
    assert not isinstance(caught.value, TypeError)
    assert local_snapshot(local) == before


# --- stores written before these checks --------------------------------------------------------


def test_a_stored_schema_these_checks_would_refuse_still_loads_and_its_change_is_checked(
    make_core, tmp_path
):
    """A broker before these checks may have stored such a schema: its restart must not fail."""
    path = str(tmp_path / "old.sqlite")
    make_core(path).store.close()
    # a backreference: Python's `re` compiled it, RE2 cannot run it
    legacy = {"name": "Old", "validation": "json_schema", "schema": {"pattern": "(a)\\1"}}
    store = Store(path)
    with store.tx():
        store.put_definition("message_type", "Old", legacy)
    store.close()
    core = make_core(path, catalog=False)
    assert ("message_type", legacy) in core.definitions()
    with pytest.raises(InvalidDefinition, match="cannot run in linear time"):
        core.alter("message_type", "Old", {"validation": "json_schema"})  # a change is checked
    with pytest.raises(ValidationFailed, match="could not be checked against its JSON schema"):
        BodyValidator(MessageType(**legacy), strict=False).check(b'"aa"')
