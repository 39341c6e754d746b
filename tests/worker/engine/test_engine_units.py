"""The engine's pure parts: load plans, attention events, dispatch, resources, events, sampling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from worker.attention.resolution import Reason, RoleResolution
from worker.engine import compute
from worker.engine import plan as planning
from worker.engine.dispatch import (
    Dispatch,
    Mesh,
    ResourceError,
    check_resources,
    concat_batches,
    dispatch_of,
    register,
    split_batch,
)
from worker.engine.events import TERMINAL, EventLog
from worker.engine.rank import RankWorker

# --------------------------------------------------------------------------------------------
# Which implementations a rank tries


def role(requested: str, effective: str | None, status: str) -> RoleResolution:
    return RoleResolution("actor", requested, "override", effective, status, (Reason("override", "x"),))


@pytest.mark.parametrize(
    "resolution,policy,expected",
    [
        (role("flash_attention_2", "sdpa", "fallback"), "fallback", ["flash_attention_2", "sdpa", "eager"]),
        (role("flash_attention_2", None, "error"), "strict", ["flash_attention_2"]),
        (role("sdpa", "sdpa", "ok"), "fallback", ["sdpa", "eager"]),
        (role("sdpa", "sdpa", "ok"), "strict", ["sdpa"]),
        (role("eager", "eager", "ok"), "fallback", ["eager"]),
        (role("flex_attention", "flex_attention", "ok"), "fallback",
         ["flex_attention", "flash_attention_2", "sdpa", "eager"]),  # the preview's chain (test_candidates.py)
        (role("flash_attention_3", None, "error"), "fallback",
         ["flash_attention_3", "flash_attention_2", "sdpa", "eager"]),
        (role("paged|sdpa", "paged|sdpa", "ok"), "fallback", ["paged|sdpa", "eager"]),
        (role("flash_attention_2", "eager", "forced"), "strict", ["eager"]),
        (role("sdpa", "eager", "forced"), "fallback", ["eager"]),
    ],
)
def test_candidates(resolution, policy, expected):
    assert planning.candidates(resolution, policy) == expected


def report(**overrides):
    base = {"role": "actor", "rank": 1, "requested": "flash_attention_2", "effective": "sdpa",
            "config_attn_implementation": "sdpa", "observed": "sdpa", "calls": {"sdpa": 2}, "wrappers": {},
            "forced": False, "fallback": True, "reasons": [], "strategy": "fsdp2", "sp": 1,
            "attempts": [{"implementation": "flash_attention_2", "ok": False, "error": "ImportError: no flash",
                          "diagnosis": {"category": "not_installed"}},
                         {"implementation": "sdpa", "ok": True}]}
    return {**base, **overrides}


def test_fallback_events_carry_the_original_error():
    assert planning.fallback_payloads(report()) == [
        {"role": "actor", "rank": 1, "from": "flash_attention_2", "to": "sdpa", "error": "ImportError: no flash",
         "diagnosis": {"category": "not_installed"}}]
    assert planning.fallback_payloads(report(attempts=[{"implementation": "sdpa", "ok": True}])) == []
    refused = {"implementation": "flash_attention_2", "ok": False, "error": "ImportError: no flash",
               "diagnosis": {"category": "flash_attn_not_installed"}, "refused_by": "flash-attn-not-installed"}
    assert planning.fallback_payloads(report(attempts=[refused, {"implementation": "sdpa", "ok": True}]))[0][
        "refused_by"] == "flash-attn-not-installed"


@pytest.mark.parametrize(
    "predicted,effective,observed,expected_whats",
    [
        ("sdpa", "sdpa", "sdpa", []),
        ("sdpa", "sdpa", "ulysses_sdpa", []),
        ("sdpa", "eager", "eager", ["resolution-vs-loaded"]),
        ("sdpa", "sdpa", "eager", ["loaded-vs-observed"]),
        ("sdpa", "sdpa", None, ["loaded-vs-observed"]),
        ("flash_attention_2", "sdpa", "eager", ["resolution-vs-loaded", "loaded-vs-observed"]),
    ],
)
def test_mismatches(predicted, effective, observed, expected_whats):
    payload = planning.attention_payload(report(effective=effective, observed=observed),
                                         role("flash_attention_2", predicted, "ok"))
    found = planning.mismatches(payload)
    assert [m["what"] for m in found] == expected_whats
    for m in found:
        assert "rank 1" in m["message"] and "[actor]" in m["message"]


def test_attention_payload_status_badges():
    predicted = role("flash_attention_2", "sdpa", "fallback")
    assert planning.attention_payload(report(), predicted)["status"] == "fallback"
    assert planning.attention_payload(report(forced=True, fallback=False), predicted)["status"] == "forced"
    assert planning.attention_payload(report(fallback=False), predicted)["status"] == "ok"


# --------------------------------------------------------------------------------------------
# Dispatch


def test_every_rank_method_the_controller_calls_declares_its_fan_out():
    calls = ["init_process_group", "load", "generate", "rollout_attention", "compute_log_prob",
             "compute_ref_log_prob", "compute_values", "update_actor", "update_actor_on_policy", "update_critic",
             "policy_loss_and_grads",
             "peak_memory_mb", "save_actor", "probe", "shutdown"]
    modes = {name: dispatch_of(RankWorker, name).mode for name in calls}
    assert modes["load"] == Dispatch.ONE_TO_ALL and modes["update_actor"] == Dispatch.DP_COMPUTE
    assert dispatch_of(RankWorker, "update_actor_on_policy").mesh == "actor"
    assert dispatch_of(RankWorker, "update_critic").mesh == "critic"
    with pytest.raises(AttributeError, match="no @register"):
        dispatch_of(RankWorker, "address")
    with pytest.raises(ValueError, match="needs mesh"):
        register(Dispatch.DP_COMPUTE)


@pytest.mark.parametrize(
    "world,sp,dp_ranks,sp_ranks,groups",
    [
        (2, 1, [0, 1], [0, 0], [[0], [1]]),
        (2, 2, [0, 0], [0, 1], [[0, 1]]),
        (4, 2, [0, 0, 1, 1], [0, 1, 0, 1], [[0, 1], [2, 3]]),
    ],
)
def test_mesh(world, sp, dp_ranks, sp_ranks, groups):
    mesh = Mesh(world, sp)
    assert [mesh.dp_rank(r) for r in range(world)] == dp_ranks
    assert [mesh.sp_rank(r) for r in range(world)] == sp_ranks
    assert mesh.sp_groups() == groups


def test_mesh_refuses_a_size_that_does_not_divide():
    with pytest.raises(ValueError, match=r"sequence-parallel size \(3\) must divide the world size \(4\)"):
        Mesh(4, 3)


@settings(max_examples=30, deadline=None)
@given(parts=st.integers(1, 4), per=st.integers(1, 3), width=st.integers(1, 5))
def test_split_then_concat_is_identity(parts, per, width):
    n = parts * per
    batch = {"x": torch.arange(n * width).reshape(n, width), "uid": list(range(n)), "note": "kept"}
    pieces = split_batch(batch, parts)
    assert len(pieces) == parts and all(len(p["uid"]) == per for p in pieces)
    back = concat_batches(pieces)
    assert torch.equal(back["x"], batch["x"]) and back["uid"] == batch["uid"] and back["note"] == "kept"


def test_split_refuses_uneven_batches():
    with pytest.raises(ValueError, match="a batch of 5 rows cannot be split evenly across 2"):
        split_batch({"x": torch.zeros(5, 1)}, 2)


@pytest.mark.parametrize(
    "device,world,available,message",
    [
        ("cpu", 4, {"CPU": 2.0}, "Total available CPUs 2 is less than total desired CPUs 4"),
        ("cuda", 8, {"CPU": 64.0, "GPU": 4.0}, "Total available GPUs 4 is less than total desired GPUs 8"),
        ("cuda", 1, {"CPU": 64.0}, "Total available GPUs 0 is less than total desired GPUs 1"),
    ],
)
def test_check_resources_names_both_numbers(device, world, available, message):
    with pytest.raises(ResourceError, match=message):
        check_resources(device=device, world=world, available=available)


def test_check_resources_passes_when_it_fits():
    check_resources(device="cpu", world=2, available={"CPU": 2.0})


# --------------------------------------------------------------------------------------------
# Events


@settings(max_examples=25, deadline=None)
@given(kinds=st.lists(st.sampled_from(["log", "metric", "attention", "fallback"]), max_size=30),
       after=st.integers(0, 35), limit=st.integers(1, 10))
def test_event_seqs_are_contiguous_and_paged(kinds, after, limit):
    seen = []
    log = EventLog("r1", seen.append)
    for kind in kinds:
        log.emit(kind, {})
    assert [e["seq"] for e in seen] == list(range(1, len(kinds) + 1))
    page = log.since(after, limit)
    assert [e["seq"] for e in page] == list(range(after + 1, min(after + limit, len(kinds)) + 1))


def test_status_events_drive_the_state():
    log = EventLog("r1")
    log.status("queued")
    assert not log.terminal
    log.status("failed", "rank 1 died")
    assert log.state == "failed" and log.terminal and "failed" in TERMINAL
    with pytest.raises(ValueError):
        log.status("exploded")


# --------------------------------------------------------------------------------------------
# Sampling and generation


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    drawn = {int(compute.sample_next(logits, temperature=1.0, top_p=0.7, do_sample=True, generator=gen)[0])
             for _ in range(200)}
    assert drawn == {0, 1}


def test_greedy_and_its_log_prob():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    token, logp = compute.sample_next(logits, temperature=1.0, top_p=1.0, do_sample=False, generator=None)
    assert int(token) == 1
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1)[:, 1])


def tiny_lm() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=64)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


def test_generate_with_cache_matches_a_full_forward_and_stops_at_eos():
    model = tiny_lm()
    prompt = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])  # (2, 5), row 0 left-padded
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    greedy = compute.generate(model, prompt, prompt_mask, max_new_tokens=6, eos_token_id=None, pad_token_id=0,
                              temperature=1.0, top_p=1.0, do_sample=False, generator=None)
    # Re-score the whole sequences in one forward: the cached log-probs must agree.
    seqs = compute.assemble(prompt, prompt_mask, greedy["responses"], greedy["response_mask"])
    batch = {**seqs, "responses": greedy["responses"]}
    log_probs, _ = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=False)
    torch.testing.assert_close(log_probs, greedy["rollout_log_probs"], atol=1e-5, rtol=1e-5)

    eos = int(greedy["responses"][1, 2])  # make row 1's third token the EOS
    stopped = compute.generate(model, prompt, prompt_mask, max_new_tokens=6, eos_token_id=eos, pad_token_id=0,
                               temperature=1.0, top_p=1.0, do_sample=False, generator=None)
    row = stopped["response_mask"][1].tolist()
    first_eos = stopped["responses"][1].tolist().index(eos)
    assert row == [1] * (first_eos + 1) + [0] * (6 - first_eos - 1)  # EOS kept, padding after
    assert all(t == 0 for t in stopped["responses"][1, first_eos + 1:].tolist())


def test_response_slice_reads_one_position_early():
    x = torch.arange(10).reshape(1, 10)  # P + R = 10, R = 4
    assert compute.response_slice(x, 4).tolist() == [[5, 6, 7, 8]]


@pytest.mark.parametrize(
    "actor_ckpt,actor_sp,expected_keys",
    [
        (True, 1, []),
        (False, 2, []),
        (True, 2, ["actor_rollout_ref.model.enable_gradient_checkpointing"]),
    ],
)
def test_gradient_checkpointing_is_skipped_out_loud_under_ulysses(actor_ckpt, actor_sp, expected_keys):
    from worker.spec.presets import tiny_cpu_spec

    spec = tiny_cpu_spec(**{"algorithm.adv_estimator": "grpo",
                            "actor_rollout_ref.model.enable_gradient_checkpointing": actor_ckpt,
                            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": actor_sp})
    note = planning.checkpointing_note(spec)
    assert (note is None) == (not expected_keys)
    for key in expected_keys:
        assert f"{key}=true is not applied" in note
    assert planning.checkpointing_applies(actor_ckpt, actor_sp) == (actor_ckpt and actor_sp == 1)


def fsdp2(module: torch.nn.Module) -> torch.nn.Module:
    """``RankWorker._shard``'s FSDP2 layout (each decoder layer, then the root) over a world of one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    for layer in module.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def test_rollout_gathers_fsdp2_units_once_and_reshards_after(world_of_one):
    from torch.distributed.tensor import DTensor

    plain, wrapped = tiny_lm(), fsdp2(tiny_lm())
    sharded_at_entry: list[bool] = []  # per layer forward: were its parameters still sharded before FSDP's hook?
    for layer in wrapped.model.layers:
        layer.register_forward_pre_hook(lambda module, args: sharded_at_entry.append(
            isinstance(module.mlp.up_proj.weight, DTensor)), prepend=True)
    prompt = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])  # (2, 5)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    kwargs = {"max_new_tokens": 6, "eos_token_id": None, "pad_token_id": 0, "temperature": 1.0, "top_p": 1.0,
              "do_sample": False, "generator": None}
    expected = compute.generate(plain, prompt, prompt_mask, **kwargs)
    got = compute.generate(wrapped, prompt, prompt_mask, **kwargs)
    assert torch.equal(got["responses"], expected["responses"])
    torch.testing.assert_close(got["rollout_log_probs"], expected["rollout_log_probs"])
    assert sharded_at_entry == [False] * (2 * 6)  # two layers x six decode steps, none had to gather again
    assert all(isinstance(p, DTensor) for p in wrapped.parameters())  # resharded on exit

    sharded_at_entry.clear()
    compute.policy_forward(wrapped, {**compute.assemble(prompt, prompt_mask, got["responses"], got["response_mask"]),
                                     "responses": got["responses"]}, compute.NO_SP, temperature=1.0,
                           with_entropy=False)
    assert sharded_at_entry == [True, True]  # outside a rollout, FSDP2's defaults are back


def test_gradient_sync_reduces_fsdp2_gradients_once_per_mini_batch(world_of_one):
    plain, wrapped = tiny_lm().train(), fsdp2(tiny_lm()).train()
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15], [3, 5, 7, 9, 11]])  # (4, 5)
    plain(input_ids=ids).logits.sum().backward()  # the whole mini-batch at once
    for micro, last in ((ids[:2], False), (ids[2:], True)):
        with compute.gradient_sync(wrapped, last):
            wrapped(input_ids=micro).logits.sum().backward()
        if not last:  # accumulated unreduced: nothing has reached the sharded gradients yet
            assert all(p.grad is None for p in wrapped.parameters())
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(q.grad.full_tensor(), p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2", "fsdp_turbo"])
def test_a_world_of_one_rank_is_left_unwrapped(strategy):
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    from worker.engine.rank import RolePlan

    plan = RolePlan(role="actor", loader="causal_lm", folder="unused", override_config={}, candidates=["sdpa"],
                    requested="sdpa", forced=False, reasons=[], strategy=strategy, sp=1, trained=True)
    model = tiny_lm()
    wrapped, optimizer = RankWorker(rank=0, world=1, run_id="unit")._shard(model, plan)
    assert wrapped is model
    assert not any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in wrapped.modules())
    assert optimizer.param_groups[0]["params"] == list(model.parameters())


@pytest.mark.parametrize(("target", "device", "message"), [
    (-1, "cpu", "warm ranks: -1 is negative; valid: 0 (no pool) or more"),
    (1, "tpu", "warm rank device: 'tpu' is not valid; valid: cpu, cuda"),
])
def test_pool_settings_name_the_bad_value(target, device, message):
    from worker.engine.ranks import PoolSettings

    with pytest.raises(ValueError) as info:
        PoolSettings(target, device)
    assert str(info.value) == message


def test_each_rank_asks_ray_for_its_cpus_and_one_gpu_off_cpu():
    from worker.core.devices import actor_options, rank_resources, run_resources

    assert actor_options("cpu") == {"num_cpus": 1}
    assert actor_options("cpu", 2) == {"num_cpus": 2}
    assert actor_options("cuda") == {"num_cpus": 1, "num_gpus": 1}
    assert rank_resources("cpu") == {"CPU": 1} and rank_resources("cuda") == {"CPU": 1, "GPU": 1}
    assert run_resources("cuda", 4) == {"CPU": 4, "GPU": 4}
    assert run_resources("cpu", 2, 2) == {"CPU": 4}


@pytest.mark.parametrize("device,cpus,preset,expected", [
    ("cpu", 1, None, {}), ("cuda", 4, None, {}), ("cpu", 2, None, {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("cpu", 2, "ACTIVE", {"OMP_WAIT_POLICY": "ACTIVE"}),  # the environment's own choice wins
])
def test_a_rank_of_several_threads_waits_passively(monkeypatch, device, cpus, preset, expected):
    from worker.engine.ranks import rank_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if preset:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)
    assert rank_env(device, cpus) == expected


@pytest.mark.parametrize("target,setting,device,expected", [
    (1, 0, "cpu", 4), (2, 0, "cpu", 4), (4, 0, "cpu", 2), (0, 0, "cpu", 4), (1, 0, "cuda", 1), (1, 2, "cpu", 2),
    (2, 3, "cuda", 3),
])
def test_warm_ranks_hold_what_each_rank_of_a_run_of_target_ranks_derives(target, setting, device, expected):
    from worker.core.devices import Cluster
    from worker.engine.ranks import PoolSettings

    assert PoolSettings(target, device, setting).rank_cpus(Cluster(total_cpus=8, node_cpus=4)) == expected


def _tiny_llama(impl: str) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    config._attn_implementation = impl
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("trained", [False, True])
def test_a_first_forward_asking_for_attention_weights_fails_on_sdpa_with_transformers_words(trained):
    """transformers 5.x logs the sdpa warning and returns no weights instead of falling back: the first
    forward turns that into an error carrying the warning, which the classifier knows."""
    from worker.engine.rank import AttentionWeightsMissing, _first_forward
    from worker.troubleshoot.classify import Category, ErrorInfo, classify

    with pytest.raises(AttentionWeightsMissing) as info:
        _first_forward(_tiny_llama("sdpa"), 64, trained, output_attentions=True, implementation="sdpa")
    assert str(info.value).startswith("`sdpa` attention does not support `output_attentions=True`")
    assert classify(ErrorInfo.from_exception(info.value)).category == Category.output_attentions_unsupported
    seen = _first_forward(_tiny_llama("eager"), 64, trained, output_attentions=True, implementation="eager")
    assert seen["observed"] == "eager"
    assert _first_forward(_tiny_llama("sdpa"), 64, trained)["observed"] == "sdpa"  # not asked: sdpa is fine


def test_a_rank_drives_the_gpu_ray_gave_it(monkeypatch):
    """Ray sets CUDA_VISIBLE_DEVICES to the rank's one GPU (device 0 then); told not to, it is Ray's GPU id."""
    import ray

    from worker.engine.rank import cuda_index

    monkeypatch.delenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_index() == 0
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ["3"])
    assert cuda_index() == 3


def test_a_first_forward_forced_onto_math_reaches_the_attention_event_with_its_reason():
    """From the rank's first forward to the ``attention`` payload: the backend below sdpa and why it was math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from worker.engine.rank import _first_forward

    with sdpa_kernel(SDPBackend.MATH):
        seen = _first_forward(_tiny_llama("sdpa"), 64, trained=True, implementation="sdpa")
    payload = planning.attention_payload(report(effective="sdpa", **seen, compute_dtype="float32",
                                                weights_dtype="float32"), role("sdpa", "sdpa", "ok"))
    assert payload["observed"] == "sdpa" and payload["sdpa_backend"] == "math"
    assert payload["sdpa_backend_reason"].startswith("flash_attention (CPU): the flash backend is switched off")
    assert payload["sdpa"][0]["op"] == "aten::_scaled_dot_product_attention_math"
    assert planning.mismatches(payload) == []  # the implementation is what was loaded: math is below it
    unforced = _first_forward(_tiny_llama("sdpa"), 64, trained=True, implementation="sdpa")
    assert (unforced["sdpa_backend"], unforced["sdpa_backend_reason"]) == ("flash_attention", None)


def test_the_rollout_gives_each_layer_back_its_own_reshard_after_forward(world_of_one):
    """On CPU the engine's layers keep their gathered parameters from forward to backward
    (``reshard_after_forward=False``, one all-gather per micro-batch); a rollout must not turn that off."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = tiny_lm()
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    layers = list(model.model.layers)
    assert [compute._reshards_after_forward(layer) for layer in layers] == [False, False]
    prompt = torch.tensor([[3, 4, 5]])
    compute.generate(model, prompt, torch.ones_like(prompt), max_new_tokens=2, eos_token_id=None, pad_token_id=0,
                     temperature=1.0, top_p=1.0, do_sample=False, generator=None)
    assert [compute._reshards_after_forward(layer) for layer in layers] == [False, False]


@pytest.mark.parametrize("device,trained,sp,replicated", [
    ("cpu", False, 1, True), ("cpu", True, 1, False), ("cpu", False, 2, False), ("cuda", False, 1, False),
])
def test_a_frozen_role_on_cpu_is_held_whole_on_every_rank(device, trained, sp, replicated):
    """Over gloo the reference's all-gather on every forward costs more than a copy of its frozen weights."""
    from worker.engine.rank import RolePlan

    plan = RolePlan(role="reference", loader="causal_lm", folder="unused", override_config={}, candidates=["sdpa"],
                    requested="sdpa", forced=False, reasons=[], strategy="fsdp2", sp=sp, trained=trained)
    rank = RankWorker(rank=0, world=2, run_id="unit", device=device)
    assert rank.replicated(plan) is replicated
    if replicated:
        model = tiny_lm()
        wrapped, optimizer = rank._shard(model, plan)
        assert wrapped is model and optimizer is None and not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("wrap,world,expected", [("none", 2, False), ("fsdp2", 2, False), ("fsdp1", 2, True),
                                                 ("fsdp1", 1, False)])
def test_only_fsdp1_ranks_decode_in_lockstep(world_of_one, wrap, world, expected):
    """FSDP2 rollouts gather once (``unsharded``): no all-reduce per generated token; FSDP1 gathers in every
    forward, so its ranks must agree on every token."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = tiny_lm()
    if wrap == "fsdp2":
        model = fsdp2(model)
    elif wrap == "fsdp1":
        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    assert compute.decodes_in_lockstep(model, world) is expected
