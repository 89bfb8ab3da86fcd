"""Errors cross Ray by pickle: every class must come back as itself, with its message and fields."""

from __future__ import annotations

import inspect
import pickle

import pytest

from actors import errors
from actors.errors import (
    AlreadyExists,
    BrokerError,
    CatalogError,
    ConversationNotFound,
    InvalidArgument,
    NotFound,
    QueueDisabled,
    UnknownContract,
    UnknownMessageType,
    UnknownQueue,
    UnknownService,
)

# One instance of every error class, built the way the broker builds it.
SAMPLES: dict[type[BrokerError], BrokerError] = {
    errors.BrokerError: errors.BrokerError("something went wrong"),
    errors.InvalidArgument: errors.InvalidArgument("top must be an int >= 1"),
    errors.CatalogError: errors.CatalogError("catalog problem"),
    errors.InvalidDefinition: errors.InvalidDefinition("bad name"),
    errors.AlreadyExists: errors.AlreadyExists("queue", "Q"),
    errors.NotFound: errors.NotFound("thing"),
    errors.UnknownMessageType: errors.UnknownMessageType("M", "contract 'C' names it"),
    errors.UnknownContract: errors.UnknownContract("C"),
    errors.UnknownQueue: errors.UnknownQueue("Q"),
    errors.UnknownService: errors.UnknownService("S"),
    errors.UnknownRoute: errors.UnknownRoute("R"),
    errors.UnknownBroker: errors.UnknownBroker("B", "start it first"),
    errors.UnknownCertificate: errors.UnknownCertificate("ShopCert", "grant 'g' names it"),
    errors.UnknownBinding: errors.UnknownBinding("OrdersBinding"),
    errors.UnknownGrant: errors.UnknownGrant("g"),
    errors.SecurityError: errors.SecurityError("certificate 'C' expired"),
    errors.InUse: errors.InUse("queue 'Q' is used by S"),
    errors.MessageError: errors.MessageError("refused"),
    errors.ContractViolation: errors.ContractViolation("the target may not send M"),
    errors.ValidationFailed: errors.ValidationFailed("not JSON"),
    errors.BodyTooLarge: errors.BodyTooLarge("too big"),
    errors.DialogError: errors.DialogError("dialog problem"),
    errors.ConversationNotFound: errors.ConversationNotFound("h-1"),
    errors.ConversationEnded: errors.ConversationEnded("ended"),
    errors.GroupLocked: errors.GroupLocked("locked"),
    errors.LockNotHeld: errors.LockNotHeld("lock x not held"),
    errors.QueueDisabled: errors.QueueDisabled("Q", "poison message"),
    errors.ReaderRetired: errors.ReaderRetired("reader r-1 is no longer wanted"),
    errors.TopologyError: errors.TopologyError("t.yaml: brokers[0]: unknown key(s)"),
    errors.BrokerUnavailable: errors.BrokerUnavailable("unreachable"),
    errors.StoreError: errors.StoreError("/data/b.sqlite", "commit", "disk I/O error"),
    errors.StoreInUse: errors.StoreInUse("/data/b.sqlite", "orders", 4242),
    errors.IngestError: errors.IngestError("the body column 'x' is not in the DataFrame"),
    errors.SparkUnavailable: errors.SparkUnavailable("Spark on Ray did not start (no java)"),
    errors.PeerUnreachable: errors.PeerUnreachable("B", "not running"),
    errors.ReaderLost: errors.ReaderLost("Q/pool-1", None, "actor died"),
    errors.MirroringError: errors.MirroringError("mirroring problem"),
    errors.NotPrincipal: errors.NotPrincipal("shop.b", "shop.a", 3),
    errors.StaleEpoch: errors.StaleEpoch("shop.a", 2, 3),
    errors.MirrorBehind: errors.MirrorBehind(10, 12),
    errors.MirrorMismatch: errors.MirrorMismatch("other broker ids"),
    errors.MirrorPlacement: errors.MirrorPlacement("shop", "node-1"),
    errors.NoFailover: errors.NoFailover("shop", "the mirror is not synchronized"),
    errors.MirrorCallerRefused: errors.MirrorCallerRefused("shop", "shop.a", "rebuild"),
}


def _round_trip(err: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(err))


def test_the_samples_cover_every_error_class_in_the_module():
    defined = {
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BrokerError) and obj.__module__ == errors.__name__
    }
    assert defined == set(SAMPLES)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_every_error_class_unpickles_to_the_same_class_and_message(cls):
    err = SAMPLES[cls]
    back = _round_trip(err)
    assert type(back) is cls
    assert str(back) == str(err)
    assert back.args == err.args


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_every_error_class_keeps_its_fields_through_pickle(cls):
    err = SAMPLES[cls]
    assert _round_trip(err).__dict__ == err.__dict__


def test_already_exists_names_the_kind_and_name_and_keeps_them_through_pickle():
    back = _round_trip(AlreadyExists("queue", "Q"))
    assert (back.kind, back.name) == ("queue", "Q")
    assert "queue 'Q' already exists" in str(back)


def test_unknown_service_says_what_is_unknown_and_keeps_the_name_through_pickle():
    back = _round_trip(UnknownService("S"))
    assert back.name == "S"
    assert str(back).startswith("unknown service 'S'")


def test_a_not_found_error_without_a_hint_says_to_create_the_object_first():
    assert str(UnknownQueue("Q")) == "unknown queue 'Q'; create the queue first"


def test_a_not_found_error_with_a_hint_shows_the_hint_instead():
    assert str(UnknownContract("C", "service 'S' names it")) == (
        "unknown contract 'C'; service 'S' names it"
    )


def test_queue_disabled_keeps_the_queue_and_tells_how_to_re_enable_it():
    back = _round_trip(QueueDisabled("Q", "poison message"))
    assert back.queue == "Q"
    assert "(poison message)" in str(back)
    assert "alter(Queue, 'Q', enabled=True)" in str(back)


def test_queue_disabled_without_a_reason_shows_no_parentheses():
    assert "()" not in str(QueueDisabled("Q"))
    assert str(QueueDisabled("Q")).startswith("queue 'Q' is disabled;")


def test_conversation_not_found_keeps_the_handle_through_pickle():
    assert _round_trip(ConversationNotFound("h-1")).handle == "h-1"


def test_invalid_argument_is_also_a_value_error_after_pickle():
    assert isinstance(_round_trip(InvalidArgument("x")), ValueError)


def test_the_unknown_errors_are_not_found_errors_of_the_catalog():
    for cls in (UnknownMessageType, UnknownContract, UnknownQueue, UnknownService):
        assert issubclass(cls, NotFound)
        assert issubclass(cls, CatalogError)


def test_an_unpickled_error_can_be_caught_by_its_own_class():
    with pytest.raises(UnknownService):
        raise _round_trip(UnknownService("S"))
