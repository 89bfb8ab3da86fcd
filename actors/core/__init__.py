"""The broker's core: state, the unit of work, the verbs by what they do, and the `BrokerCore`
facade that wires them. Plain Python: no Ray."""

from ..limits import Limits
from .facade import BrokerCore

__all__ = ["BrokerCore", "Limits"]
