"""Data-dependent routing (Service Broker's routing service, seed 000): a router classifies the
first message of a dialog and forwards the dialog to the target service it names (or, in
redirect mode, tells the initiator which service to talk to). Plain Python: the handler runs as
a queue's activation on any broker; `actors.remote.routers` deploys replicated router brokers."""

from actors.ddr.client import begin_redirected
from actors.ddr.router import REDIRECT_TYPE, RouterConfig, route_messages, router_contracts

__all__ = [
    "REDIRECT_TYPE",
    "RouterConfig",
    "begin_redirected",
    "route_messages",
    "router_contracts",
]
