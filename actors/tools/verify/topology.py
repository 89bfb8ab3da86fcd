"""What `raybroker verify` deploys, as a topology document (`topologies.loader.parse`), and the
paths its workload takes through it. Plain data.

    vf-shop --ToDirect-----------------------------> vf-store   Direct   (pool readers)
            --ToRelayedA|B --> vf-gw-a | vf-gw-b --> vf-store   Relayed  (forwarded, HA)
            --ToSecuredA|B --> vf-gw-a | vf-gw-b --> vf-store   Secured  (dialog security:
                                                                sealed through the gateways)
            --ToBalanced1|2 ----------> vf-lb-1 | vf-lb-2       Balanced (load-balanced)
            --> vf-routers-0|1 (router set, DDR) --> vf-lb-1 PartA | vf-lb-2 PartB
    Spark's executors --> vf-shop --> vf-store Direct

Every receiving queue is activated with `actors.tools.verify.handlers:echo_id`, which answers each
message with its id in the same commit. vf-store is placed by the `vf_store` resource, which two
nodes offer, so it can move when its node is removed; the other brokers by `vf_head`, which only
the head offers. The shop refuses bodies over 64 KiB. The shop's Shop and the store's Secured
have certificates of their own (made by their brokers under the run's master key); the run makes
them trust each other once deployed (`actors.remote.trust`), and the secured path's dialogs begin
with encryption on.
"""

from __future__ import annotations

from typing import Any

HANDLER = "actors.tools.verify.handlers:echo_id"
HANDLER_MODULE = HANDLER.partition(":")[0]  # allowed on the brokers whose readers run it
STORE_RESOURCE = "vf_store"
HEAD_RESOURCE = "vf_head"  # only the head offers it: what must not move stays there
ON_HEAD = {"resources": {HEAD_RESOURCE: 1}}
MAX_BODY = 64 * 1024
SHOP, SHOP_SERVICE, SHOP_QUEUE = "vf-shop", "Shop", "ShopQ"
CONTRACT, REQUEST, REPLY = "VerifyContract", "VReq", "VReply"
ROUTERS, ROUTER_SERVICE = "vf-routers", "VRouter"

# path -> the service its dialogs begin with
PATHS = {
    "direct": "Direct",
    "forwarded": "Relayed",
    "secured": "Secured",
    "balanced": "Balanced",
    "routed": ROUTER_SERVICE,
}
SPARK_SERVICE = "Direct"  # the Spark ingest's rows go to the pool readers too
ALL = (*PATHS, "spark")

# What each fault kind may act on, and which paths that touches (their recovery is measured).
TARGETS = {
    "broker_killed": ("vf-shop", "vf-store", "vf-lb-1", "vf-lb-2"),
    "reader_killed": ("vf-store/DirectQ",),
    "router_killed": (f"{ROUTERS}-0", f"{ROUTERS}-1"),
    "forwarder_removed": ("vf-gw-a", "vf-gw-b"),
    "route_recreated": (f"{SHOP}/ToDirect", f"{SHOP}/ToBalanced1", f"{SHOP}/ToBalanced2"),
    "node_removed": ("vf-store",),
}
AFFECTS = {
    "vf-shop": ALL,
    "vf-store": ("direct", "forwarded", "secured", "spark"),
    "vf-lb-1": ("balanced", "routed"),
    "vf-lb-2": ("balanced", "routed"),
    "vf-store/DirectQ": ("direct", "spark"),
    f"{ROUTERS}-0": ("routed",),
    f"{ROUTERS}-1": ("routed",),
    "vf-gw-a": ("forwarded", "secured"),
    "vf-gw-b": ("forwarded", "secured"),
    f"{SHOP}/ToDirect": ("direct", "spark"),
    f"{SHOP}/ToBalanced1": ("balanced",),
    f"{SHOP}/ToBalanced2": ("balanced",),
}
# Receiving queues, for what the handlers saw: (broker, queue).
RECEIVERS = (
    ("vf-store", "DirectQ"),
    ("vf-store", "RelayedQ"),
    ("vf-store", "SecuredQ"),
    ("vf-lb-1", "BalancedQ"),
    ("vf-lb-1", "PartQ"),
    ("vf-lb-2", "BalancedQ"),
    ("vf-lb-2", "PartQ"),
)


def _catalog() -> dict[str, Any]:
    return {
        "message_types": [
            {"name": REQUEST, "validation": "json"},
            {"name": REPLY, "validation": "json"},
        ],
        "contracts": [{"name": CONTRACT, "messages": {REQUEST: "initiator", REPLY: "target"}}],
    }


def _queue(name: str, placement: str = "internal") -> dict[str, Any]:
    activation = {"handler": HANDLER, "max_readers": 2, "placement": placement}
    return {"name": name, "activation": {**activation, "idle_timeout": 30.0}}


def _route(name: str, service: str, broker: str, via: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "service_name": service,
        "broker_instance": broker,
        "address": f"ray://{via or broker}",
    }


def _gateway(name: str) -> dict[str, Any]:
    routes = [{**_route(f"To{svc}", svc, "vf-store"), "table": "instance"}
              for svc in ("Relayed", "Secured")]  # fmt: skip
    return {
        "name": name,
        "storage": f"{name}.sqlite",
        "placement": ON_HEAD,
        "forwarding": True,
        "limits": {"forward_buffer": 50_000},
        "routes": routes,
    }


def _target(name: str, part: str) -> dict[str, Any]:
    return {
        "name": name,
        "storage": f"{name}.sqlite",
        "placement": ON_HEAD,
        "limits": {"code_modules": [HANDLER_MODULE]},  # its readers' handler
        **_catalog(),
        "queues": [_queue("BalancedQ"), _queue("PartQ")],
        "services": [
            {"name": "Balanced", "queue": "BalancedQ", "contracts": [CONTRACT]},
            {"name": f"Part{part}", "queue": "PartQ", "contracts": [CONTRACT]},
        ],
        "routes": [_route("ToShop", SHOP_SERVICE, SHOP)],
    }


def document(master_key_file: str) -> dict[str, Any]:
    """The topology, for `topologies.loader.parse`; `master_key_file`: the run's master key,
    which the shop and the store seal their certificates' private keys under."""
    shop = {
        "name": SHOP,
        "storage": f"{SHOP}.sqlite",
        "placement": ON_HEAD,
        "limits": {"max_body_bytes": MAX_BODY, "master_key_file": master_key_file},
        **_catalog(),
        "queues": [{"name": SHOP_QUEUE}],
        "services": [{"name": SHOP_SERVICE, "queue": SHOP_QUEUE}],
        "certificates": [{"name": "ShopCert", "owner": SHOP_SERVICE}],
        "routes": [
            _route("ToDirect", "Direct", "vf-store"),
            _route("ToRelayedA", "Relayed", "vf-store", via="vf-gw-a"),
            _route("ToRelayedB", "Relayed", "vf-store", via="vf-gw-b"),
            _route("ToSecuredA", "Secured", "vf-store", via="vf-gw-a"),
            _route("ToSecuredB", "Secured", "vf-store", via="vf-gw-b"),
            _route("ToBalanced1", "Balanced", "vf-lb-1"),
            _route("ToBalanced2", "Balanced", "vf-lb-2"),
        ],
    }
    store = {
        "name": "vf-store",
        "storage": "vf-store.sqlite",
        "placement": {"resources": {STORE_RESOURCE: 1}},
        # its readers' handler; the master key its Secured certificate is sealed under
        "limits": {"code_modules": [HANDLER_MODULE], "master_key_file": master_key_file},
        **_catalog(),
        "queues": [_queue("DirectQ", placement="pool"), _queue("RelayedQ"), _queue("SecuredQ")],
        "services": [
            {"name": "Direct", "queue": "DirectQ", "contracts": [CONTRACT]},
            {"name": "Relayed", "queue": "RelayedQ", "contracts": [CONTRACT]},
            {"name": "Secured", "queue": "SecuredQ", "contracts": [CONTRACT]},
        ],
        "certificates": [{"name": "SecuredCert", "owner": "Secured"}],
        "routes": [_route("ToShop", SHOP_SERVICE, SHOP)],
    }
    routers = {
        "name": ROUTERS,
        "service": ROUTER_SERVICE,
        "classifier": "actors.ddr.classifiers:field",
        "classifier_options": {"field": "part", "template": "Part{value}"},
        "targets": {"PartA": "vf-lb-1", "PartB": "vf-lb-2"},
        "mode": "forward",
        "replicas": 2,
        "initiators": [SHOP],
        "initiator_services": [SHOP_SERVICE],
    }
    brokers = [shop, store, _gateway("vf-gw-a"), _gateway("vf-gw-b")]
    return {
        "brokers": [*brokers, _target("vf-lb-1", "A"), _target("vf-lb-2", "B")],
        "router_sets": [routers],
    }
