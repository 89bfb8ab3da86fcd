"""The key a mirrored broker's start shares among its witness and partners: a call proves its
caller with it, and anything else (another start's key, another name, another method, no proof)
is refused. No Ray."""

from __future__ import annotations

import pickle

import pytest

from actors.errors import MirrorCallerRefused
from actors.mirroring.pairkey import KEY_BYTES, PairKey, new_key

MEMBERS = ("shop.a", "shop.b")


def test_a_partner_holding_the_starts_key_is_admitted_for_the_method_it_proved():
    key = PairKey("shop", new_key(), MEMBERS)
    held_elsewhere = pickle.loads(pickle.dumps(key))  # as the witness and partners receive it
    for caller in MEMBERS:
        for method in ("apply", "rebuild", "set_synchronized", "promote"):
            held_elsewhere.check(caller, method, key.prove(caller, method))


@pytest.mark.parametrize(
    "case", ["another start's key", "another caller's proof", "another method's proof",
             "not a partner", "no proof", "not bytes", "a name that is not text"],
)  # fmt: skip
def test_a_call_that_does_not_prove_its_caller_is_refused_naming_the_caller_and_method(case):
    key = PairKey("shop", new_key(), MEMBERS)
    caller, method, proof = "shop.a", "rebuild", key.prove("shop.a", "rebuild")
    if case == "another start's key":
        proof = PairKey("shop", new_key(), MEMBERS).prove("shop.a", "rebuild")
    elif case == "another caller's proof":
        caller = "shop.b"
    elif case == "another method's proof":
        method = "apply"
    elif case == "not a partner":
        caller, proof = "intruder", key.prove("intruder", "rebuild")
    elif case == "no proof":
        proof = b""
    elif case == "not bytes":
        proof = proof.hex()
    else:
        caller = ["shop.a"]
    with pytest.raises(MirrorCallerRefused, match=r"'shop': \w+ refused: the caller") as err:
        key.check(caller, method, proof)
    assert err.value.method == method and err.value.broker == "shop"


def test_the_key_is_random_of_its_size_and_never_shown():
    a, b = new_key(), new_key()
    assert len(a) == len(b) == KEY_BYTES and a != b
    key = PairKey("shop", a, MEMBERS)
    assert a.hex() not in repr(key) and str(a) not in repr(key)
    with pytest.raises(ValueError, match="random bytes"):
        PairKey("shop", b"short", MEMBERS)
