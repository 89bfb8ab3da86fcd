"""The broker's core: state, the unit of work, the verbs by what they do, and the `BrokerCore`
facade that wires them. Plain Python: no Ray."""

from actors.core.facade import BrokerCore
from actors.model.limits import Limits

__all__ = ["BrokerCore", "Limits"]
