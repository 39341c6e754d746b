"""docker-compose.yml is valid (Debian's ``docker-compose config``) and its services run the commands and
settings this repository documents and tests: ``ray start --head`` with the options the app's own head
uses, ``attnboard serve``, and only ``ATTNBOARD_*`` names that are settings in README.md."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app.core.config import ENV_PREFIX, Settings
from app.services.ray_runtime import head_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")


@pytest.fixture(scope="module")
def config() -> dict:
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed (./scripts/setup.sh --test installs it)")
    proc = subprocess.run([COMPOSE, "-f", "docker-compose.yml", "config"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RAY_AUTH_TOKEN": "x" * 32}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _argv(command) -> list[str]:
    return command if isinstance(command, list) else shlex.split(command)


def _options(argv: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def test_compose_needs_the_ray_token():
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed")
    proc = subprocess.run([COMPOSE, "-f", "docker-compose.yml", "config"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode != 0 and "RAY_AUTH_TOKEN" in proc.stderr


def test_services(config):
    assert {"postgres", "ray-head", "ray-worker", "ray-worker-gpu", "app"} <= set(config["services"])


def test_the_ray_head_runs_what_the_app_runs_for_its_own_head(config):
    argv = _argv(config["services"]["ray-head"]["command"])
    assert argv[:3] == ["ray", "start", "--head"]
    ours = _options(head_command("ray", port=1, agent_port=2, temp_dir="/tmp/x", num_cpus=1))
    assert _options(argv) <= ours, _options(argv) - ours


def test_every_ray_service_uses_token_auth(config):
    for name, service in config["services"].items():
        if name.startswith("ray") or name == "app":
            assert service["environment"]["RAY_AUTH_MODE"] == "token", name
            assert service["environment"]["RAY_AUTH_TOKEN"], name


def test_the_app_serves_with_documented_settings(config):
    app = config["services"]["app"]
    assert _argv(app["command"])[:2] == ["attnboard", "serve"]
    env = app["environment"]
    assert env["ATTNBOARD_DATABASE_URL"].startswith("postgresql://")
    assert env["ATTNBOARD_RAY_ADDRESS"] == "ray-head:6379"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for service in config["services"].values():
        for key in service.get("environment", {}):
            if key.startswith(ENV_PREFIX):
                assert key[len(ENV_PREFIX):] in Settings.model_fields, f"{key} is not a setting"
                assert f"`{key}`" in readme, f"{key} is not in README.md's settings table"


def test_every_ray_node_and_the_app_share_the_checkpoint_folder(config):
    """Ranks write checkpoints on whatever node they run; a restart on another node and the app's listing read them."""
    folder = config["services"]["app"]["environment"]["ATTNBOARD_CHECKPOINT_DIR"]
    for name, service in config["services"].items():
        if name.startswith("ray") or name == "app":
            mounts = {(v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2])
                      for v in service["volumes"]}
            assert ("checkpoints", folder) in mounts, name


def test_the_gpu_worker_reserves_gpus(config):
    gpu = config["services"]["ray-worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "--num-gpus" in _options(_argv(gpu["command"]))


def test_readme_names_the_commands_the_services_run():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for text in ("ray start --head", "attnboard serve", "ATTNBOARD_DATABASE_URL", "ATTNBOARD_RAY_ADDRESS",
                 "RAY_AUTH_TOKEN"):
        assert text in readme, text


def test_the_dockerfile_runs_the_source_tree_with_its_migrations():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"COPY migrations \./migrations", dockerfile)
    assert "PYTHONPATH=/srv/attnboard" in dockerfile, "app.db finds migrations/ beside app/ only in the source tree"
