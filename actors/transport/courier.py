"""The courier: carries batches to other brokers over `Peers`. It fails over from one next hop
to the next, relays what this broker forwards (holding it in memory, bounded, until the next hop
answers) and merges the answers. Plain async Python: the Ray layer gives it its `Peers`, unit
tests give it in-process brokers."""

from __future__ import annotations

import logging

from actors.errors import NotPrincipal, PeerUnreachable, SecurityError
from actors.mirroring.choice import Claim, MirrorRoutes, pairs
from actors.model.hops import Hop
from actors.transport.inbound import Arrival, Drops, Receiver
from actors.transport.outbound import Dispatcher, Outbound
from actors.transport.port import Peers, Work
from actors.transport.wire import Bundle, merge_replies, pack_bundles, pack_reply, refuses_all

log = logging.getLogger("raybroker")


class Courier:
    def __init__(self, dispatcher: Dispatcher, receiver: Receiver, peers: Peers) -> None:
        self.dispatcher = dispatcher
        self.receiver = receiver
        self.peers = peers
        self.port = dispatcher.port
        self.relaying = 0  # messages held in memory while being relayed
        # mirror pairs (seed 001): peers that can ask a partner its role send to the principal
        self.ask = getattr(peers, "role", None)
        self.mirrors = MirrorRoutes()

    async def send(self, out: Outbound) -> bool:
        """Try the batch's next hops in order: a hop that is unreachable, or that answers
        refusing the whole batch, passes it to the next (failover). True if a hop answered."""
        limits = self.port.limits
        try:
            blob = out.blob()
            why = "no next hop"
            groups = pairs(out.hops) if self.ask is not None else [[h] for h in out.hops]
            for n, group in enumerate(groups):
                try:
                    hop, reply = await self._try(group, blob, limits.send_timeout_s)
                except PeerUnreachable as exc:
                    why = f"{group[0].address}: {exc.reason}"
                    continue
                except NotPrincipal as exc:  # a mirror partner on a plain route
                    why = f"{group[0].address}: {exc}"
                    continue
                if n + 1 < len(groups) and refuses_all(reply):
                    why = f"{hop.address} refused it"
                    continue
                self.dispatcher.acknowledged(out, reply, hop.address)
                return True
            self.dispatcher.failed(out, why)
        except Exception:
            log.exception("broker %s: sending a batch failed; it is retried", self.port.name)
            self.dispatcher.release(out)
        except BaseException:  # cancelled: its rows stay queued, its dialogs and hops free
            self.dispatcher.release(out)
            raise
        return False

    async def _call(self, broker: str, blob: bytes, timeout: float) -> bytes:
        """One call to another broker, signed by this broker's identity if it has one."""
        return await self.peers.deliver(broker, self.port.sign_call(blob, broker), timeout)

    async def _try(self, group: list[Hop], blob: bytes, timeout: float) -> tuple[Hop, bytes]:
        """One next hop, or a mirror pair (sent to its principal only; see actors.mirroring)."""
        if len(group) == 1:
            return group[0], await self._call(group[0].broker or "", blob, timeout)
        by_name = {h.broker or "": h for h in group}
        sent_to: list[str] = []

        async def ask(partner: str) -> Claim | None:
            assert self.ask is not None
            return await self.ask(partner, timeout)

        async def send(partner: str) -> bytes:
            sent_to.append(partner)
            return await self._call(partner, blob, timeout)

        a, b = (h.broker or "" for h in group)
        reply = await self.mirrors.send(a, b, ask, send)
        return by_name[sent_to[-1]], reply

    async def deliver(self, blob: bytes) -> bytes:
        """Bundles from another broker: deliver here, relay onward, answer for all of them. A
        call this broker does not take from its sender (transport security) is refused whole."""
        try:
            blob = self.port.open_call(blob)
        except SecurityError as exc:
            self._refused_call(str(exc))
            return _refused(f"{self.port.name} refused the call: {exc}")
        arrival = self.receiver.arrive(blob)
        replies = [pack_reply(arrival.acks, arrival.refused)]
        for hops, bundles in arrival.forwards:
            replies.append(await self.relay(hops, bundles))
        return merge_replies(replies)

    async def relay(self, hops: list[Hop], bundles: list[Bundle]) -> bytes:
        """Relay bundles, holding them in memory (bounded) until the next hop answers; the
        answer carries the owning broker's acknowledgements back to the sender."""
        port = self.port
        n = sum(len(b.seqs) for b in bundles)
        # The buffer bounds what is held at once; one call alone always passes (it is already
        # in memory, and refusing it would refuse it forever: a sender's batch does not shrink).
        if self.relaying and self.relaying + n > port.limits.forward_buffer:
            why = f"{port.name}: forwarding buffer full"
            self._dropped(bundles, why)
            return _refused(why)
        self.relaying += n
        try:
            blob = pack_bundles(bundles)
            why = "no next hop"
            for hop in hops:
                try:
                    return await self._call(hop.broker or "", blob, port.limits.send_timeout_s)
                except (PeerUnreachable, NotPrincipal) as exc:
                    said = exc.reason if isinstance(exc, PeerUnreachable) else str(exc)
                    why = f"{port.name} could not forward to {hop.address}: {said}"
            self._dropped(bundles, why)
            return _refused(why)
        finally:
            self.relaying -= n

    def _refused_call(self, why: str) -> None:
        """Record a call refused by transport security (the sender keeps its messages)."""
        try:
            self.port.transaction(
                lambda w: self.port.record_event(w, "TransportRefused", self.port.name, why)
            )
        except Exception:  # an event is not worth failing the answer for
            log.exception("broker %s: recording a refused call failed", self.port.name)

    def _dropped(self, bundles: list[Bundle], why: str) -> None:
        """Record that bundles this broker was to relay were dropped (the sender retries)."""
        drops = Drops(self.port.name)
        for b in bundles:
            drops.add("Dropped", b.to_service, b.from_broker, len(b.seqs), why, b.conversation_id)

        def record(w: Work) -> None:
            for kind, subject, detail in drops.events():
                self.port.record_event(w, kind, subject, detail)

        try:
            self.port.transaction(record)
        except Exception:  # an event is not worth failing the answer for
            log.exception("broker %s: recording dropped relays failed", self.port.name)


def _refused(why: str) -> bytes:
    return pack_reply([], [why])


__all__ = ["Arrival", "Courier"]
