"""The initiator's side of redirect mode: ask a router which service a first message belongs to,
then talk to that service directly (end-to-end identity is kept: the target sees the
initiator, not the router)."""

from __future__ import annotations

import json
import time
from typing import Any

from actors.errors import BrokerUnavailable, ConversationEnded
from actors.model.catalog import END_DIALOG, ERROR, REDIRECT


def begin_redirected(
    broker: Any,
    from_service: str,
    queue: str,
    router_service: str,
    contract: str,
    message_type: str,
    body: bytes,
    *,
    timeout: float = 30.0,
    encryption: bool = True,
) -> tuple[str, str]:
    """Send `body` to the router, wait for its `Redirect`, then begin the dialog with the
    service it names and send `body` there. Returns (handle, service). `queue` is
    `from_service`'s queue, where the router's answer arrives. `encryption`: both dialogs' (see
    `Begin`)."""
    ask = broker.begin_dialog(from_service, router_service, contract, encryption=encryption)
    broker.send(ask, message_type, body)
    deadline = time.monotonic() + timeout
    service = None
    while service is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrokerUnavailable(f"router {router_service!r} did not answer within {timeout}s")
        for group in broker.receive(queue, handle=ask, wait=min(left, 1.0)):
            broker.commit(group)
            for m in group.messages:
                if m.message_type == REDIRECT:
                    service = json.loads(m.body)["service"]
                elif m.message_type == ERROR:
                    code, text = m.error
                    raise ConversationEnded(f"router {router_service!r} refused: [{code}] {text}")
                elif m.message_type == END_DIALOG and service is None:
                    raise ConversationEnded(f"router {router_service!r} ended without an answer")
    broker.end_conversation(ask)
    handle = broker.begin_dialog(from_service, service, contract, encryption=encryption)
    broker.send(handle, message_type, body)
    return handle, service
