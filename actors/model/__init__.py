"""What users define and what a dialog is: message types, contracts, queues and services (catalog),
code named by configuration (code_names), the name rule, body validation, argument checks,
limits, routes and the routing decision, and conversation endpoints with their rules. Plain
Python: no Ray, no store.
"""
