"""raybroker: SQL Server Service Broker's dialogs, queues and conversation-group locking on Ray.

The public surface is what `__all__` names; everything else is internal.
"""

from .catalog import Activation, Contract, MessageType, Queue, Service
from .envelope import Begin, End, Message, ReceivedGroup, Send, Timer
from .errors import BrokerError
from .remote.client import Broker, connect, start_broker
from .remote.runtime import ensure_ray

__all__ = [
    "Activation",
    "Begin",
    "Broker",
    "BrokerError",
    "Contract",
    "End",
    "Message",
    "MessageType",
    "Queue",
    "ReceivedGroup",
    "Send",
    "Service",
    "Timer",
    "connect",
    "ensure_ray",
    "start_broker",
]
