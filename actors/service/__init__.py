"""The running broker, without Ray: `BrokerService` (broker) on an asyncio event loop, group
commit, the entry points of clients' calls (calls), the route and view verbs, the replies kept
for clients, the lock holders outside the broker and the metrics sink's shape.
"""
