"""Every error raybroker raises, in one tree.

Each class carries a message that says what was wrong and what to do about it. Errors raised inside
the broker actor cross Ray (or a direct channel) unchanged (they are plain picklable exceptions)
and the client re-raises them as themselves, so `except UnknownService:` works in driver scripts.
(`actors.client.channel.ChannelBroken` is not here: it never reaches a caller, whose call then goes
through Ray.)
"""

from __future__ import annotations

import reprlib


def rebuild_error(cls: type, message: str, attrs: dict) -> BrokerError:
    """An error as pickled: its class, message and attributes, without its own __init__."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(attrs)
    return err


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80


def shown(value: object) -> str:
    """A repr for error messages that stays short and shallow whatever the value (a huge string
    or a deeply nested list is not repr'd whole, so it can neither flood a log nor recurse)."""
    try:
        return _short.repr(value)
    except Exception:  # an int past Python's digit limit, a __repr__ that fails ...
        return f"<{type(value).__name__}>"


class BrokerError(Exception):
    """Base of every raybroker error."""

    def __reduce__(self):  # errors cross Ray by pickle; keep subclasses' own __init__ out of it
        return rebuild_error, (type(self), str(self), dict(self.__dict__))


class InvalidArgument(BrokerError, ValueError):
    """An argument to a verb is malformed (wrong type, out of range)."""


# --- definitions (catalog) -------------------------------------------------------------------


class CatalogError(BrokerError):
    """A message type, contract, queue or service definition problem."""


class InvalidDefinition(CatalogError):
    """A definition is malformed (bad name, bad option value, inconsistent references)."""


class AlreadyExists(CatalogError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(
            f"{kind} {name!r} already exists; alter or drop it, or choose another name"
        )
        self.kind, self.name = kind, name


class NotFound(CatalogError):
    """Base of the 'unknown X' errors."""

    kind = "object"

    def __init__(self, name: str, hint: str = "") -> None:
        msg = f"unknown {self.kind} {name!r}"
        super().__init__(msg + (f"; {hint}" if hint else f"; create the {self.kind} first"))
        self.name = name


class UnknownMessageType(NotFound):
    kind = "message type"


class UnknownContract(NotFound):
    kind = "contract"


class UnknownQueue(NotFound):
    kind = "queue"


class UnknownService(NotFound):
    kind = "service"


class UnknownRoute(NotFound):
    kind = "route"


class UnknownBroker(NotFound):
    kind = "broker"


class UnknownCertificate(NotFound):
    kind = "certificate"


class UnknownBinding(NotFound):
    kind = "remote service binding"


class UnknownGrant(NotFound):
    kind = "grant"


class InUse(CatalogError):
    """A definition cannot be dropped or changed because something still refers to it."""


# --- messages and dialogs ----------------------------------------------------------------------


class MessageError(BrokerError):
    """A message was refused."""


class ContractViolation(MessageError):
    """The dialog's contract does not let this side send this message type."""


class ValidationFailed(MessageError):
    """A body does not pass its message type's validation."""


class BodyTooLarge(MessageError):
    """A body is larger than the broker's `max_body_bytes`."""


class DialogError(BrokerError):
    """A conversation handle cannot be used for what was asked."""


class ConversationNotFound(DialogError):
    """The handle does not name a conversation endpoint on this broker."""

    def __init__(self, handle: str) -> None:
        super().__init__(
            f"conversation handle {handle!r} is not an endpoint on this broker; use a handle "
            "returned by begin_dialog or found on a received message of this broker"
        )
        self.handle = handle


class ConversationEnded(DialogError):
    """The endpoint has ended, errored or been closed; nothing more may be sent on it."""


class GroupLocked(DialogError):
    """A conversation group is locked by another reader."""


# --- receive / commit ----------------------------------------------------------------------------


class LockNotHeld(BrokerError):
    """A commit or rollback names a lock the caller does not hold (expired, released, or lost in a
    broker restart). Nothing was applied; receive again."""


class QueueDisabled(BrokerError):
    """The queue is disabled (by an operator or by poison-message detection)."""

    def __init__(self, queue: str, reason: str = "") -> None:
        super().__init__(
            f"queue {queue!r} is disabled{f' ({reason})' if reason else ''}; fix the cause, then "
            f"re-enable it with alter(Queue, {queue!r}, enabled=True)"
        )
        self.queue = queue


class ReaderRetired(BrokerError):
    """The broker no longer wants this activated reader (activation was turned off or changed)."""


# --- the runtime -------------------------------------------------------------------------------


class BrokerUnavailable(BrokerError):
    """The broker actor could not be reached within the client's retry deadline."""


class TopologyError(BrokerError):
    """A topology file is malformed or inconsistent; the message says where."""


class StoreError(BrokerError):
    """The broker's store could not be opened, read or written: a read-only or full disk, a file
    size limit, an I/O error, a damaged file or one that is not a store. `path` is the store file,
    `operation` what was being done ("open", "read", "write", "commit", ...), `reason` what SQLite
    or the OS said. A verb that fails so changed nothing; the broker carries on and the same call
    succeeds once the fault is cleared."""

    def __init__(self, path: str, operation: str, reason: str, hint: str = "") -> None:
        if not hint:
            hint = (
                "fix the file or the disk, then start the broker again"
                if operation == "open"
                else "nothing of this call was applied; retry it once the fault is cleared"
            )
        super().__init__(f"store {path!r}: cannot {operation}: {reason}; {hint}")
        self.path, self.operation, self.reason = path, operation, reason


class StoreInUse(StoreError):
    """Another broker (this process or another) has the store file open: one store file belongs
    to one broker. `holder` and `pid` name that broker when it could be told (else None)."""

    def __init__(self, path: str, holder: str | None = None, pid: int | None = None) -> None:
        who = "another broker" if holder is None else f"broker {holder!r}"
        if pid is not None:
            who += f" (pid {pid})"
        super().__init__(
            path,
            "open",
            f"it is in use by {who}, and a store file belongs to one broker",
            "stop that broker first, or give this one its own path",
        )
        self.holder, self.pid = holder, pid


class PeerUnreachable(BrokerError):
    """Another broker could not be called (not running, restarting, too slow); `reason` says
    which, in words fit for a transmission status."""

    def __init__(self, broker: str, reason: str) -> None:
        super().__init__(f"broker {broker!r} unreachable: {reason}")
        self.broker, self.reason = broker, reason

    # The reasons, worded once for every `Peers` (Ray's and the tests' in-process one).

    @classmethod
    def not_running(cls, broker: str) -> PeerUnreachable:
        return cls(broker, f"broker {broker!r} is not running; its messages wait until it starts")

    @classmethod
    def no_answer(cls, broker: str, timeout: float) -> PeerUnreachable:
        return cls(
            broker,
            f"broker {broker!r} did not answer within {timeout:g} s (busy, or too slow: see "
            "the send_timeout_s limit)",
        )

    @classmethod
    def stopped(cls, broker: str) -> PeerUnreachable:
        return cls(broker, f"broker {broker!r} stopped or is restarting")

    @classmethod
    def failed(cls, broker: str, detail: str = "") -> PeerUnreachable:
        why = f": {detail}" if detail else "; see the brokers' logs"
        return cls(broker, f"the call to broker {broker!r} failed{why}")


class ReaderLost(BrokerError):
    """A pool reader's process died; the locks it held under `owner` (None: it held none yet)
    are released and its groups come back."""

    def __init__(self, reader: str, owner: str | None, reason: str) -> None:
        super().__init__(f"reader {reader} died: {reason}")
        self.reader, self.owner, self.reason = reader, owner, reason


class IngestError(InvalidArgument):
    """A DataFrame cannot be ingested as it is (a column missing or of the wrong type, a null
    key, no rows): nothing was sent. The message names the column and what it needs."""


class SparkUnavailable(BrokerError):
    """Spark on Ray could not start (RayDP, Java or the Python workers); the message says why."""


# --- security (actors.security) ------------------------------------------------------------------


class SecurityError(BrokerError):
    """Dialog or transport security cannot do what was asked: no master key to seal or open a
    private key, a certificate that is expired or not valid yet, a key offer or a message that
    does not verify. The message names the certificate, service or dialog and what to do."""


# --- mirroring (actors.mirroring) ----------------------------------------------------------------


class MirroringError(BrokerError):
    """Base of the errors of a mirrored broker (a principal and its mirror)."""


class NotPrincipal(MirroringError):
    """A write (any verb but the views of roles) was sent to a partner that is not the principal.
    `principal` names the partner that is (None: none is known now, e.g. during a failover)."""

    def __init__(self, partner: str, principal: str | None, epoch: int = 0) -> None:
        where = (
            f"send it to {principal!r}, the principal"
            if principal
            else "no principal is known now; retry shortly"
        )
        super().__init__(f"partner {partner!r} is not the principal and takes no writes; {where}")
        self.partner, self.principal, self.epoch = partner, principal, epoch


class StaleEpoch(MirroringError):
    """A partner acted on an old role assignment (`epoch`) after the witness moved on
    (`current`): an old principal's writes are refused, so there is never a split brain."""

    def __init__(self, partner: str, epoch: int, current: int) -> None:
        super().__init__(
            f"partner {partner!r} acted as of role epoch {epoch}, but the witness is at epoch "
            f"{current}; it is no longer the principal and rejoins as mirror"
        )
        self.partner, self.epoch, self.current = partner, epoch, current


class MirrorBehind(MirroringError):
    """The mirror holds transactions up to `held` and was sent `got`, which does not follow:
    it must be rebuilt from the principal (the principal does so by itself)."""

    def __init__(self, held: int, got: int) -> None:
        super().__init__(
            f"the mirror holds transactions up to {held} and was sent {got}; it is rebuilt "
            "from the principal"
        )
        self.held, self.got = held, got


class MirrorMismatch(MirroringError):
    """Two stores that are not copies of one broker (other broker ids, other catalogs) were
    asked to be one mirrored broker's partners."""


class MirrorPlacement(MirroringError):
    """The mirror would run on the principal's node: one node's loss would take both."""

    def __init__(self, broker: str, node: str) -> None:
        super().__init__(
            f"mirrored broker {broker!r}: principal and mirror would both run on node {node}, so "
            "losing it loses both; place them on different nodes (or pass force=True)"
        )
        self.broker, self.node = broker, node


class NoFailover(MirroringError):
    """A failover was refused: the mirror is not synchronized (it may lack committed
    transactions), or the principal still answers; `reason` says which."""

    def __init__(self, broker: str, reason: str) -> None:
        super().__init__(f"mirrored broker {broker!r}: no failover: {reason}")
        self.broker, self.reason = broker, reason


class MirrorCallerRefused(MirroringError):
    """A call that only a mirrored broker's partners and witness make to each other (ship to the
    mirror, rebuild it, mark it synchronized, promote) came from a caller that did not prove it
    is one of them: it holds another start's key, or none. Nothing was changed."""

    def __init__(self, broker: str, caller: str, method: str) -> None:
        super().__init__(
            f"mirrored broker {broker!r}: {method} refused: the caller (claiming to be "
            f"{caller!r}) did not prove it is a partner of this start of the mirrored broker. "
            "Only the partners and the witness that start_mirrored_broker started together "
            "make this call; an operator fails over with failover(), and a partner left from "
            "another start is stopped (stop_mirrored_broker) and the pair started again"
        )
        self.broker, self.caller, self.method = broker, caller, method
