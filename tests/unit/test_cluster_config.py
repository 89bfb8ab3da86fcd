"""cluster.yaml (for `ray up`) and its local variant (scripts/cluster_local.yaml, brought up by
scripts/ray_up_local.sh): both pass the checks `ray up` itself runs before touching a node
(Ray's preparation of the config, then Ray's validation against its shipped schema), and carry
what the project needs: token authentication, Java 17, the project and ray[default] installed,
the resources and labels topologies place brokers by, and a shared store path.

Nothing here starts Ray or opens a connection; Ray's config helpers are imported inside the
tests (they are plain Python)."""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster.yaml"
LOCAL = ROOT / "scripts" / "cluster_local.yaml"
SCRIPT = ROOT / "scripts" / "ray_up_local.sh"
# what ray_up_local.sh puts in for the local variant's placeholders
LOCAL_VALUES = {"@VENV@": "/work/main/.venv"}


def ray_schema() -> dict[str, Any]:
    """The schema `ray up` validates against, found without importing Ray."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "ray is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "autoscaler" / "ray-schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


def load(path: Path, values: dict[str, str] | None = None) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    for placeholder, value in (values or {}).items():
        text = text.replace(placeholder, value)
    return yaml.safe_load(text)


def prepared(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does first (`commands._bootstrap_config`): Ray's preparation (defaults filled,
    the local provider's single node type made, setup commands merged), then Ray's validation
    (the shipped schema plus its own consistency checks). Offline for the local provider."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    out = prepare_config(copy.deepcopy(config))
    validate_config(out)
    return out


def start_flags(commands: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """The custom resources and labels that a node's start commands give `ray start`."""
    from ray._private.label_utils import parse_node_labels_string

    text = " ".join(commands)
    [resources] = re.findall(r"--resources='(\{[^']*\})'", text)
    [labels] = re.findall(r"--labels='([^']*)'", text)
    return json.loads(resources), parse_node_labels_string(labels)


def setup_text(config: dict[str, Any], role: str) -> str:
    return "\n".join(config.get("setup_commands", []) + config.get(f"{role}_setup_commands", []))


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return load(CLUSTER)


@pytest.fixture(scope="module")
def local() -> dict[str, Any]:
    return load(LOCAL, LOCAL_VALUES)


# --- both pass what `ray up` checks -------------------------------------------------------------


@pytest.mark.parametrize("path", [CLUSTER, LOCAL], ids=["cluster", "local"])
def test_config_passes_ray_preparation_and_its_schema(path: Path) -> None:
    config = load(path, LOCAL_VALUES)
    out = prepared(config)
    jsonschema.validate(out, ray_schema())
    # the local provider's one node type: every worker_ips entry started, none beyond
    [node_type] = out["available_node_types"].values()
    workers = len(config["provider"]["worker_ips"])
    assert node_type["min_workers"] == node_type["max_workers"] == workers
    # the raw file is valid too (no top-level min_workers, which only preparation accepts)
    jsonschema.validate(config, ray_schema())


def test_the_validation_refuses_a_bad_config(cluster: dict[str, Any]) -> None:
    """The same checks fail on what `ray up` refuses: an SSH port (there is no such setting) and
    a provider without its head address."""
    bad = copy.deepcopy(cluster)
    bad["auth"]["ssh_port"] = 2222
    with pytest.raises(jsonschema.ValidationError, match="ssh_port"):
        prepared(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, ray_schema())
    headless = copy.deepcopy(cluster)
    del headless["provider"]["head_ip"]
    with pytest.raises(click.ClickException, match="head_ip"):  # Ray's cli_logger.abort
        prepared(headless)


# --- cluster.yaml carries what the project needs ------------------------------------------------


def test_token_authentication_is_on(cluster: dict[str, Any]) -> None:
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # exported in ~/.bashrc, which Ray sources before every command it runs on a node
    setup = setup_text(cluster, "head")
    assert "'export RAY_AUTH_MODE=token'" in setup and ">> ~/.bashrc" in setup
    assert setup == setup_text(cluster, "worker")


def test_java_and_the_project_are_installed(cluster: dict[str, Any]) -> None:
    setup = setup_text(cluster, "worker")
    assert re.search(r"apt-get install -y -q\s+openjdk-17-jre-headless", setup)
    assert cluster["file_mounts"]["~/raybroker"] == "."
    ray_version = importlib.metadata.version("ray")
    assert f'pip install -q "ray[default]=={ray_version}" -e ~/raybroker' in setup
    # the virtualenv holding them comes first on PATH for the start commands
    assert "'export PATH=\"$HOME/raybroker-venv/bin:$PATH\"'" in setup
    assert {".git", ".venv"} <= set(cluster["rsync_exclude"])
    assert cluster["rsync_filter"] == [".gitignore"]


def test_nodes_get_the_resources_and_labels_topologies_place_by(cluster: dict[str, Any]) -> None:
    head = start_flags(cluster["head_start_ray_commands"])
    worker = start_flags(cluster["worker_start_ray_commands"])
    assert head == ({"broker_host": 4}, {"raybroker-role": "head"})
    assert worker == ({"broker_host": 4, "spark_host": 1}, {"raybroker-role": "worker"})
    assert "--head" in " ".join(cluster["head_start_ray_commands"])
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(cluster["worker_start_ray_commands"])


def test_broker_stores_go_to_a_shared_filesystem(cluster: dict[str, Any]) -> None:
    assert "mountpoint -q /mnt/raybroker-stores" in setup_text(cluster, "head")
    text = CLUSTER.read_text(encoding="utf-8")
    assert "--data-dir /mnt/raybroker-stores" in text
    assert "Plain local disks do not give that" in text


# --- the local variant is cluster.yaml on loopback ----------------------------------------------


def test_local_variant_matches_cluster_yaml(cluster: dict[str, Any], local: dict[str, Any]) -> None:
    assert local["provider"] == {
        "type": "local",
        "head_ip": "127.0.0.2",
        "worker_ips": ["127.0.0.3"],
    }
    assert local["file_mounts"] == cluster["file_mounts"]
    assert (local["rsync_exclude"], local["rsync_filter"]) == (
        cluster["rsync_exclude"],
        cluster["rsync_filter"],
    )
    for role in ("head", "worker"):
        commands = local[f"{role}_start_ray_commands"]
        assert start_flags(commands) == start_flags(cluster[f"{role}_start_ray_commands"])
        # one host: every node names its own address, and no `ray stop` (it would kill the head)
        assert not any(re.search(r"\bray stop\b", c) for c in commands)
        ip = local["provider"]["head_ip" if role == "head" else "worker_ips"]
        assert f"--node-ip-address={ip if role == 'head' else ip[0]}" in " ".join(commands)
        assert f"{LOCAL_VALUES['@VENV@']}/bin/ray start" in " ".join(commands)
    assert "'export RAY_AUTH_MODE=token'" in setup_text(local, "worker")
    assert "--dashboard-agent-listen-port=52366" in " ".join(local["worker_start_ray_commands"])


def test_the_script_fills_every_placeholder_of_the_local_variant() -> None:
    used = set(re.findall(r"@[A-Z]+@", LOCAL.read_text(encoding="utf-8")))
    filled = set(re.findall(r"s\|(@[A-Z]+@)\|", SCRIPT.read_text(encoding="utf-8")))
    assert used == filled == set(LOCAL_VALUES)
