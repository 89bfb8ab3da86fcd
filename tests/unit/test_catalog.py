"""Definitions, the catalog's checks (a refused one changes nothing), validation, may_send."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from actors.errors import (
    AlreadyExists,
    InUse,
    InvalidDefinition,
    UnknownContract,
    UnknownMessageType,
    UnknownQueue,
    UnknownService,
    ValidationFailed,
)
from actors.model.catalog import (
    DEFAULT,
    DIALOG_TIMER,
    ECHO,
    ECHO_CONTRACT,
    END_DIALOG,
    ERROR,
    REDIRECT,
    SYSTEM_TYPES,
    BodyValidator,
    Catalog,
    Contract,
    MessageType,
    Queue,
    Service,
    check_name,
    from_record,
    kind_of,
    may_send,
    to_record,
)

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"qty": {"type": "integer", "minimum": 1}},
    "required": ["qty"],
}


def _snapshot(cat: Catalog) -> tuple[dict[str, Any], ...]:
    return (
        dict(cat.message_types),
        dict(cat.contracts),
        dict(cat.queues),
        dict(cat.services),
        dict(cat._validators),
    )


def _create(cat: Catalog, *defns) -> None:
    for defn in defns:
        cat.check_new(defn)
        cat.add(defn)


@pytest.fixture
def cat() -> Catalog:
    """A catalog with one of everything: Ask/Answer types, an Order contract, queue Q, service S."""
    c = Catalog()
    _create(
        c,
        MessageType("Ask", "json"),
        MessageType("Answer"),
        Contract("Order", {"Ask": "initiator", "Answer": "target"}),
        Queue("Q"),
        Service("S", "Q", ("Order",)),
    )
    return c


def _refused(cat: Catalog, error: type[Exception], check, *args) -> None:
    """`check(*args)` raises exactly `error` and leaves the catalog as it was."""
    before = _snapshot(cat)
    with pytest.raises(error) as info:
        check(*args)
    assert type(info.value) is error
    assert _snapshot(cat) == before


# --- names and records -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Q", "orders", "a.b:c/d-e_f", "0day", "_x", "x" * 128])
def test_a_valid_name_is_accepted_as_is(name):
    assert check_name("queue", name) == name


@pytest.mark.parametrize("name", ["", "-q", ".q", "/q", "has space", "é", "x" * 129, None, 7])
def test_an_invalid_name_is_an_invalid_definition(name):
    with pytest.raises(InvalidDefinition, match="queue name"):
        check_name("queue", name)


@pytest.mark.parametrize(
    "defn",
    [
        MessageType("M", "json_schema", ORDER_SCHEMA),
        MessageType("M"),
        Contract("C", {"A": "initiator", "B": "any"}),
        Queue("Q", enabled=False, retention=True, poison_limit=0),
        Service("S", "Q", ("C", "D")),
    ],
    ids=lambda d: type(d).__name__,
)
def test_a_definition_survives_a_json_round_trip_of_its_record(defn):
    rec = json.loads(json.dumps(to_record(defn)))
    assert from_record(kind_of(defn), rec) == defn


def test_kind_of_names_each_definition_class():
    assert [
        kind_of(d) for d in (MessageType("M"), Contract("C"), Queue("Q"), Service("S", "Q"))
    ] == [
        "message_type",
        "contract",
        "queue",
        "service",
    ]


def test_a_record_of_an_unknown_kind_is_an_invalid_definition():
    with pytest.raises(InvalidDefinition, match="unknown definition kind"):
        from_record("topic", {"name": "T"})


def test_a_record_with_an_unknown_field_is_an_invalid_definition():
    with pytest.raises(InvalidDefinition, match="bad queue definition"):
        from_record("queue", {"name": "Q", "colour": "red"})


# --- built-ins -------------------------------------------------------------------------------


def test_a_new_catalog_has_the_built_in_default_echo_and_redirect_types_and_contracts():
    c = Catalog()
    assert c.message_types == {
        DEFAULT: MessageType(DEFAULT),
        ECHO: MessageType(ECHO),
        REDIRECT: MessageType(REDIRECT, "json"),
    }
    assert c.contracts == {
        DEFAULT: Contract(DEFAULT, {DEFAULT: "any"}),
        ECHO_CONTRACT: Contract(ECHO_CONTRACT, {ECHO: "any"}),
    }
    assert c.queues == {} and c.services == {}


def test_a_new_catalog_has_no_user_definitions():
    assert Catalog().user_definitions() == []


def test_built_in_types_accept_any_body():
    c = Catalog()
    c.validator(DEFAULT).check(b"\x00\xff not json")
    c.validator(ECHO).check(b"")


@pytest.mark.parametrize(
    ("kind", "name"),
    [("message_type", DEFAULT), ("message_type", ECHO), ("contract", DEFAULT), ("contract", ECHO)],
)
def test_a_built_in_cannot_be_dropped(kind, name):
    c = Catalog()
    _refused(c, InvalidDefinition, c.check_drop, kind, name)


@pytest.mark.parametrize(("kind", "name"), [("message_type", DEFAULT), ("message_type", ECHO)])
def test_a_built_in_message_type_cannot_be_altered(kind, name):
    c = Catalog()
    _refused(c, InvalidDefinition, c.check_alter, kind, name, {"validation": "json"})


@pytest.mark.parametrize(
    "defn", [MessageType(DEFAULT), MessageType(ECHO), Contract(DEFAULT, {DEFAULT: "any"})]
)
def test_a_built_in_name_cannot_be_created_again(defn):
    c = Catalog()
    _refused(c, AlreadyExists, c.check_new, defn)


# --- check_new: message types ----------------------------------------------------------------


def test_a_new_message_type_passes_its_checks_and_changes_nothing(cat):
    before = _snapshot(cat)
    cat.check_new(MessageType("Cancel", "empty"))
    assert _snapshot(cat) == before


def test_a_message_type_name_in_use_already_exists(cat):
    _refused(cat, AlreadyExists, cat.check_new, MessageType("Ask"))


def test_already_exists_names_the_kind_in_words(cat):
    with pytest.raises(AlreadyExists, match="message type 'Ask' already exists"):
        cat.check_new(MessageType("Ask"))


@pytest.mark.parametrize("name", sorted(SYSTEM_TYPES))
def test_a_system_message_type_name_is_reserved(cat, name):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType(name))


def test_the_system_types_are_end_dialog_error_and_dialog_timer():
    assert (
        {END_DIALOG, ERROR, DIALOG_TIMER} == SYSTEM_TYPES == {"EndDialog", "Error", "DialogTimer"}
    )


def test_a_message_type_with_a_bad_name_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("no spaces"))


def test_an_unknown_validation_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("M", "xml"))


def test_json_schema_validation_without_a_schema_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("M", "json_schema"))


@pytest.mark.parametrize("validation", ["none", "json", "empty", "msgpack"])
def test_a_schema_without_json_schema_validation_is_an_invalid_definition(cat, validation):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("M", validation, ORDER_SCHEMA))


@pytest.mark.parametrize("schema", [{"type": "no-such-type"}, {"minimum": "one"}, [1], "text"])
def test_an_invalid_json_schema_is_an_invalid_definition(cat, schema):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("M", "json_schema", schema))


def test_a_number_as_json_schema_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, MessageType("M", "json_schema", 5))


# --- check_new: contracts --------------------------------------------------------------------


def test_a_new_contract_over_known_types_passes_its_checks(cat):
    cat.check_new(Contract("Chat", {"Ask": "any", "Answer": "any"}))


def test_a_contract_with_no_message_types_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, Contract("Empty", {}))


def test_a_contract_whose_messages_are_not_a_mapping_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, Contract("C", ["Ask", "Answer"]))


@pytest.mark.parametrize("name", sorted(SYSTEM_TYPES))
def test_a_contract_naming_a_system_type_is_an_invalid_definition(cat, name):
    _refused(cat, InvalidDefinition, cat.check_new, Contract("C", {"Ask": "any", name: "any"}))


def test_a_contract_naming_an_unknown_message_type_is_refused(cat):
    _refused(cat, UnknownMessageType, cat.check_new, Contract("C", {"Nope": "any"}))


@pytest.mark.parametrize("side", ["both", "Initiator", None])
def test_a_contract_with_an_unknown_side_is_an_invalid_definition(cat, side):
    _refused(cat, InvalidDefinition, cat.check_new, Contract("C", {"Ask": side}))


def test_a_contract_name_in_use_already_exists(cat):
    _refused(cat, AlreadyExists, cat.check_new, Contract("Order", {"Ask": "any"}))


# --- check_new: queues and services ----------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 1, 100])
def test_a_queue_with_a_poison_limit_of_zero_or_more_passes_its_checks(cat, limit):
    cat.check_new(Queue("Q2", poison_limit=limit))


@pytest.mark.parametrize("limit", [-1, 2.5, "5", None])
def test_a_queue_whose_poison_limit_is_not_an_int_of_zero_or_more_is_invalid(cat, limit):
    _refused(cat, InvalidDefinition, cat.check_new, Queue("Q2", poison_limit=limit))


@pytest.mark.parametrize("flag", ["enabled", "retention"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_queue_flag_that_is_not_a_bool_is_an_invalid_definition(cat, flag, value):
    _refused(cat, InvalidDefinition, cat.check_new, Queue("Q2", **{flag: value}))


def test_a_queue_name_in_use_already_exists(cat):
    _refused(cat, AlreadyExists, cat.check_new, Queue("Q"))


def test_a_new_service_on_a_known_queue_with_known_contracts_passes_its_checks(cat):
    cat.check_new(Service("S2", "Q", ("Order", DEFAULT)))
    cat.check_new(Service("S3", "Q"))


def test_a_service_on_an_unknown_queue_is_refused(cat):
    _refused(cat, UnknownQueue, cat.check_new, Service("S2", "Nope"))


def test_a_service_with_an_unknown_contract_is_refused(cat):
    _refused(cat, UnknownContract, cat.check_new, Service("S2", "Q", ("Order", "Nope")))


def test_a_service_whose_contracts_are_a_string_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_new, Service("S2", "Q", "Order"))


def test_a_service_name_in_use_already_exists(cat):
    _refused(cat, AlreadyExists, cat.check_new, Service("S", "Q"))


# --- check_alter -----------------------------------------------------------------------------


def test_altering_a_queue_returns_the_new_definition_and_changes_nothing(cat):
    before = _snapshot(cat)
    new = cat.check_alter("queue", "Q", {"enabled": False, "poison_limit": 0})
    assert new == Queue("Q", enabled=False, retention=False, poison_limit=0)
    assert _snapshot(cat) == before


def test_altering_a_queue_to_a_negative_poison_limit_is_refused(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "queue", "Q", {"poison_limit": -1})


def test_altering_a_message_types_validation_is_checked_like_a_new_one(cat):
    assert cat.check_alter("message_type", "Answer", {"validation": "msgpack"}) == MessageType(
        "Answer", "msgpack"
    )
    _refused(cat, InvalidDefinition, cat.check_alter, "message_type", "Answer", {"validation": "x"})


def test_altering_a_name_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "queue", "Q", {"name": "Q2"})


def test_altering_an_unknown_field_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "queue", "Q", {"colour": "red"})


def test_a_contract_cannot_be_altered(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "contract", "Order", {"messages": {}})


def test_altering_a_service_takes_its_contracts_as_a_tuple(cat):
    new = cat.check_alter("service", "S", {"contracts": ["Order", DEFAULT]})
    assert new.contracts == ("Order", DEFAULT)


def test_altering_a_service_onto_an_unknown_queue_is_refused(cat):
    _refused(cat, UnknownQueue, cat.check_alter, "service", "S", {"queue": "Nope"})


def test_altering_a_service_to_an_unknown_contract_is_refused(cat):
    _refused(cat, UnknownContract, cat.check_alter, "service", "S", {"contracts": ["Nope"]})


def test_altering_a_services_contracts_to_a_string_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "service", "S", {"contracts": DEFAULT})


def test_altering_something_unknown_is_refused_with_its_unknown_error(cat):
    _refused(cat, UnknownQueue, cat.check_alter, "queue", "Nope", {"enabled": False})
    _refused(cat, UnknownService, cat.check_alter, "service", "Nope", {"queue": "Q"})


def test_altering_an_unknown_kind_is_an_invalid_definition(cat):
    _refused(cat, InvalidDefinition, cat.check_alter, "topic", "Q", {})


# --- check_drop ------------------------------------------------------------------------------


def test_a_message_type_named_by_a_contract_is_in_use(cat):
    _refused(cat, InUse, cat.check_drop, "message_type", "Ask")


def test_a_contract_named_by_a_service_is_in_use(cat):
    _refused(cat, InUse, cat.check_drop, "contract", "Order")


def test_a_queue_named_by_a_service_is_in_use(cat):
    _refused(cat, InUse, cat.check_drop, "queue", "Q")


def test_in_use_lists_every_user_in_name_order(cat):
    _create(cat, Service("B", "Q"), Service("A", "Q"))
    with pytest.raises(InUse, match="queue 'Q' is used by A, B, S;"):
        cat.check_drop("queue", "Q")


def test_unused_definitions_may_be_dropped_in_reverse_order_of_creation(cat):
    for kind, name in [("service", "S"), ("queue", "Q"), ("contract", "Order")]:
        cat.check_drop(kind, name)
        cat.remove(kind, name)
    cat.check_drop("message_type", "Ask")


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("message_type", UnknownMessageType),
        ("contract", UnknownContract),
        ("queue", UnknownQueue),
        ("service", UnknownService),
    ],
)
def test_dropping_something_unknown_is_refused_with_its_unknown_error(cat, kind, error):
    _refused(cat, error, cat.check_drop, kind, "Nope")


# --- add, remove, lookups --------------------------------------------------------------------


def test_lookups_return_the_definitions_added(cat):
    assert cat.service("S") == Service("S", "Q", ("Order",))
    assert cat.queue("Q") == Queue("Q")
    assert cat.contract("Order").messages == {"Ask": "initiator", "Answer": "target"}
    assert cat.get("message_type", "Ask") == MessageType("Ask", "json")


@pytest.mark.parametrize(
    ("lookup", "error"),
    [
        ("service", UnknownService),
        ("queue", UnknownQueue),
        ("contract", UnknownContract),
        ("validator", UnknownMessageType),
    ],
)
def test_looking_up_an_unknown_name_raises_its_unknown_error(cat, lookup, error):
    with pytest.raises(error):
        getattr(cat, lookup)("Nope")


def test_a_removed_message_type_has_no_validator_any_more(cat):
    cat.remove("contract", "Order")
    cat.remove("message_type", "Ask")
    assert "Ask" not in cat.message_types
    with pytest.raises(UnknownMessageType):
        cat.validator("Ask")


def test_user_definitions_come_in_an_order_that_re_creates_the_catalog(cat):
    defs = cat.user_definitions()
    assert [kind_of(d) for d in defs] == [
        "message_type",
        "message_type",
        "contract",
        "queue",
        "service",
    ]
    fresh = Catalog()
    _create(fresh, *defs)
    assert _snapshot(fresh)[:4] == _snapshot(cat)[:4]


# --- BodyValidator ---------------------------------------------------------------------------


def _check(validation: str, body: bytes, schema=None) -> None:
    BodyValidator(MessageType("M", validation, schema)).check(body)


@pytest.mark.parametrize("body", [b"", b"anything", b"\x00\xff"])
def test_validation_none_accepts_any_body(body):
    _check("none", body)


def test_validation_empty_accepts_only_an_empty_body():
    _check("empty", b"")
    with pytest.raises(ValidationFailed, match="must be empty, got 1 bytes"):
        _check("empty", b"x")


@pytest.mark.parametrize(
    "body", [b"{}", b"[1, 2]", b'"text"', b"3.5", b"null", '{"é": 1}'.encode()]
)
def test_validation_json_accepts_well_formed_json(body):
    _check("json", body)


@pytest.mark.parametrize(
    "text", ['{"a": [1, "é"]}', "7", '"x"'], ids=["object", "number", "string"]
)
@pytest.mark.parametrize(
    "encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"]
)
def test_validation_json_accepts_the_encodings_json_detects(text, encoding):
    # most bodies are UTF-8 without a BOM and skip json.detect_encoding: the others must not
    if encoding.endswith(("-le", "-be")) and len(text.encode(encoding)) < 2:
        pytest.skip("too short to tell")
    _check("json", text.encode(encoding))


@pytest.mark.parametrize("body", [b"", b"{", b"{'a': 1}", b"\xff\xfe", b"[1] [2]"])
def test_validation_json_refuses_anything_else(body):
    with pytest.raises(ValidationFailed, match="not well-formed JSON"):
        _check("json", body)


@pytest.mark.parametrize("value", [{"a": [1, 2]}, {1: b"bin"}, "text", None, 3])
def test_validation_msgpack_accepts_well_formed_msgpack(value):
    _check("msgpack", msgpack.packb(value, use_bin_type=True))


@pytest.mark.parametrize(
    "body", [b"", b"\xc1", msgpack.packb([1, 2, 3])[:-1], msgpack.packb(1) + b"\x01"]
)
def test_validation_msgpack_refuses_malformed_truncated_or_trailing_bytes(body):
    with pytest.raises(ValidationFailed, match="not well-formed msgpack"):
        _check("msgpack", body)


def test_validation_json_schema_accepts_a_matching_document():
    _check("json_schema", b'{"qty": 3}', ORDER_SCHEMA)


def test_validation_json_schema_refuses_a_mismatch_and_says_where():
    with pytest.raises(ValidationFailed, match="at qty:"):
        _check("json_schema", b'{"qty": 0}', ORDER_SCHEMA)
    with pytest.raises(ValidationFailed, match=r"at \(root\):"):
        _check("json_schema", b"{}", ORDER_SCHEMA)


def test_validation_json_schema_refuses_a_body_that_is_not_json():
    with pytest.raises(ValidationFailed, match="not well-formed JSON"):
        _check("json_schema", b"qty=3", ORDER_SCHEMA)


def test_a_validation_failure_names_the_message_type():
    with pytest.raises(ValidationFailed, match="body of message type 'M'"):
        _check("json", b"{")


def test_the_catalog_validates_each_type_by_its_own_validation(cat):
    cat.validator("Answer").check(b"not json")
    with pytest.raises(ValidationFailed):
        cat.validator("Ask").check(b"not json")


# --- may_send --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("side", "initiator_may", "target_may"),
    [("initiator", True, False), ("target", False, True), ("any", True, True)],
)
def test_may_send_follows_the_side_the_contract_gives_a_type(side, initiator_may, target_may):
    contract = Contract("C", {"M": side})
    assert may_send(contract, "M", is_initiator=True) is initiator_may
    assert may_send(contract, "M", is_initiator=False) is target_may


@pytest.mark.parametrize("is_initiator", [True, False])
def test_neither_side_may_send_a_type_the_contract_does_not_name(is_initiator):
    assert may_send(Contract("C", {"M": "any"}), "Other", is_initiator) is False


@pytest.mark.parametrize("message_type", sorted(SYSTEM_TYPES))
@pytest.mark.parametrize("is_initiator", [True, False])
def test_either_side_may_send_a_system_type_whatever_the_contract(message_type, is_initiator):
    assert may_send(Contract("C", {"M": "initiator"}), message_type, is_initiator) is True
