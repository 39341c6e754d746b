"""The environment probe on this (CPU) machine: versions, device, and what really loads for a model."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
import transformers

from worker.core.environment import Environment
from worker.engine import models
from worker.engine.probe import ENVIRONMENT_KEYS, environment_fields, probe_environment


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    folder = models.ensure_builtin_folder("builtin:tiny-qwen2", tmp_path_factory.mktemp("models"))
    return probe_environment(folder)


def test_versions_and_device_are_this_machines(probed):
    assert probed["torch_version"] == torch.__version__.split("+")[0]
    assert probed["transformers_version"] == transformers.__version__
    assert probed["device"] == "cpu" and probed["compute_capability"] is None and probed["cuda_version"] is None
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("flash-attn")
    assert probed["flash_attn_version"] is None


def test_eager_and_sdpa_load_and_run_what_they_say(probed):
    assert probed["implementations"]["eager"] == {"ok": True, "observed": "eager"}  # no SDPA call below eager
    assert probed["implementations"]["sdpa"] == {"ok": True, "observed": "sdpa", "sdpa_backend": "flash_attention",
                                                 "sdpa_backend_reason": None}  # CPU's fused flash kernel ran


def test_the_sdpa_backends_this_cpu_runs(probed):
    """On CPU, torch has the fused flash-for-CPU kernel and math; the CUDA-only backends refuse a call."""
    assert probed["sdpa_backends"] == ["flash_attention", "math"]
    checks = probed["sdpa_backend_checks"]
    assert checks["flash_attention"] == {"enabled": True, "runs": True}
    assert checks["efficient_attention"]["runs"] is False and checks["efficient_attention"]["error"].startswith("RuntimeError")
    assert probed["driver_version"] is None and probed["kernels_version"] is None


def test_flash_attention_2_fails_with_transformers_own_message(probed):
    fa2 = probed["implementations"]["flash_attention_2"]
    assert fa2["ok"] is False
    assert fa2["error"].startswith("ImportError: FlashAttention2 has been toggled on")


def test_flex_attention_forward_is_recorded_either_way(probed):
    flex = probed["implementations"]["flex_attention"]
    assert flex["ok"] in (True, False)
    assert ("observed" in flex) if flex["ok"] else flex["error"]


def test_a_probe_becomes_an_environment_for_the_resolution(probed):
    env = Environment.from_dict(environment_fields(probed, name="this-node"))
    assert env.name == "this-node" and env.device == "cpu" and not env.flash_attn_installed
    assert env.sdpa_backends == ("flash_attention", "math") and env.to_dict()["sdpa_backends"] == ["flash_attention", "math"]
    assert set(environment_fields(probed)) == {"name", *ENVIRONMENT_KEYS}


def test_without_a_folder_there_is_no_implementation_table():
    assert "implementations" not in probe_environment()


def test_an_older_probe_without_the_new_fields_still_reads():
    old = {k: v for k, v in environment_fields(probe_environment()).items()
           if k not in ("driver_version", "kernels_version", "sdpa_backends")}
    env = Environment.from_dict(old)
    assert env.sdpa_backends == () and env.driver_version is None


@pytest.mark.parametrize("bad", [["flash_attention", 3], "flash_attention", {"flash": True}])
def test_sdpa_backends_must_be_a_list_of_names(bad):
    with pytest.raises(ValueError, match=r"^environment.sdpa_backends: .* must be a list of backend names"):
        Environment.from_dict({"sdpa_backends": bad})


def test_the_probe_says_whether_the_hub_is_reachable(monkeypatch):
    """`kernels` fetches a FlashAttention kernel from the Hub when flash-attn is missing: the probe reports whether
    this node reaches it (HF_HUB_OFFLINE, else a TCP connection to HF_ENDPOINT's host)."""
    import socket

    from worker.engine.probe import hub_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        assert hub_reachable(timeout_s=2) is True
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert hub_reachable(timeout_s=2) is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # closed now
    assert hub_reachable(timeout_s=2) is False
    assert isinstance(probe_environment()["hub_reachable"], bool)
