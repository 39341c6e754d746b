"""Ulysses sequence parallelism for real: 2 ranks, gloo, FSDP2. SP=2 must give SP=1's loss and gradients
on the same batch and weights; FSDP-Turbo with SP=2 runs forced eager and says so."""

from __future__ import annotations

import pytest
import ray
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine import compute, models, run_spec, ulysses
from worker.engine.dispatch import Mesh
from worker.engine.group import WorkerGroup
from worker.engine.rank import LoadPlan, RankWorker, RolePlan

# --------------------------------------------------------------------------------------------
# Pure helpers


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 13), sp=st.sampled_from([1, 2, 4]))
def test_pad_then_shard_covers_the_sequence_once(b, t, sp):
    x = torch.arange(b * t).reshape(b, t)
    padded = ulysses.pad_to_multiple(x, sp, -1)
    assert padded.shape[1] % sp == 0 and padded.shape[1] - t < sp
    shards = [ulysses.shard_sequence(padded, r, sp) for r in range(sp)]
    assert torch.equal(torch.cat(shards, dim=1)[:, :t], x)
    assert (torch.cat(shards, dim=1)[:, t:] == -1).all()


def test_global_bias_is_the_causal_padding_mask_eager_attention_uses():
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # (B, T): a left pad and a right pad
    bias = ulysses.global_attention_bias(mask, torch.float32)  # (B, 1, T, T)
    visible = bias[:, 0] == 0  # (B, T, T)
    expected = torch.tril(torch.ones(5, 5, dtype=torch.bool))[None] & mask.bool()[:, None, :]
    assert torch.equal(visible, expected)
    # A query with no visible key (row 0, position 0) gets a finite, uniform softmax, not NaN.
    assert torch.isfinite(torch.softmax(bias[0, 0, 0], dim=-1)).all()


# --------------------------------------------------------------------------------------------
# On Ray: 2 ranks, gloo


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return models.ensure_builtin_folder("builtin:tiny-llama", tmp_path_factory.mktemp("models"))


def parity_batch() -> dict[str, torch.Tensor]:
    """2 sequences, P = 5 (left padding differs), R = 4 with 3 response tokens each, so each sequence's
    token-mean loss weighs the same in the SP=1 data-parallel mean and in the SP=2 whole-batch mean.
    L = 9 is odd: SP=2 pads it to 10."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(4, 40, (2, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    prompt = prompt * prompt_mask
    responses = torch.randint(4, 40, (2, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    responses = responses * response_mask
    batch = {**compute.assemble(prompt, prompt_mask, responses, response_mask),
             "responses": responses, "response_mask": response_mask}
    batch["old_log_probs"] = -torch.rand(2, 4, generator=g) * 4 - 2  # (N, R)
    batch["ref_log_prob"] = batch["old_log_probs"] + 0.1
    batch["advantages"] = torch.randn(2, 4, generator=g)
    return batch


SETTINGS = compute.ActorSettings(ppo_epochs=1, mini_batch=2, micro_batch=2, clip_ratio=0.2, entropy_coeff=0.01,
                                 use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl", grad_clip=1.0,
                                 temperature=1.0)


def actor_plan(folder, impl: str, sp: int, strategy: str) -> LoadPlan:
    role = RolePlan(role="actor", loader="causal_lm", folder=str(folder), override_config={}, candidates=[impl],
                    requested=impl, forced=False, reasons=[], strategy=strategy, sp=sp, trained=True)
    return LoadPlan(roles=[role], policy="strict", env={"device": "cpu"}, seed=0)


@pytest.fixture(scope="module")
def ranks(local_ray):
    """Two rank actors in one gloo process group with SP groups of 1 and 2, shared by the parity tests."""
    handles = [ray.remote(RankWorker).options(num_cpus=1).remote(r, 2, "parity", "cpu") for r in range(2)]
    addr, port = ray.get(handles[0].address.remote())
    ray.get([h.init_process_group.remote(addr, port, [1, 2]) for h in handles])
    yield handles
    for h in handles:
        ray.kill(h)


@pytest.mark.ray
@pytest.mark.parametrize("strategy,impl", [("fsdp2", "sdpa"), ("fsdp2", "eager"), ("fsdp", "sdpa")])
def test_sp2_matches_sp1_loss_and_gradients(ranks, folder, strategy, impl):
    batch = parity_batch()
    results = {}
    for sp in (1, 2):  # the same initial weights: each load reads the folder afresh
        group = WorkerGroup(ranks, {"actor": Mesh(2, sp)}, lambda: False)
        reports = group.call("load", actor_plan(folder, impl, sp, strategy))
        assert all(r[0]["observed"] == impl for r in reports)
        results[sp] = group.call("policy_loss_and_grads", SETTINGS, batch=batch)
    assert len(results[1]) == 2 and len(results[2]) == 1  # SP=1: 2 data-parallel shards; SP=2: one
    loss_sp1 = sum(r["loss"] for r in results[1]) / 2
    loss_sp2 = results[2][0]["loss"]
    assert loss_sp2 == pytest.approx(loss_sp1, abs=1e-5)
    grads_sp1, grads_sp2 = results[1][0]["grads"], results[2][0]["grads"]
    assert grads_sp1.keys() == grads_sp2.keys() and len(grads_sp1) > 10
    for name in grads_sp1:
        assert torch.allclose(grads_sp2[name], grads_sp1[name], atol=1e-5), (
            f"{name}: max diff {(grads_sp2[name] - grads_sp1[name]).abs().max():.3g}")
    assert any(g.abs().max() > 1e-4 for g in grads_sp1.values())  # a real gradient, not zeros


@pytest.mark.ray
def test_fsdp_turbo_with_sp2_runs_forced_eager(local_ray, tmp_path):
    spec = {
        "actor_rollout_ref": {"model": {"path": "builtin:tiny-llama",
                                        "override_config": {"attn_implementation": "sdpa"}},
                              "actor": {"strategy": "fsdp_turbo", "ppo_mini_batch_size": 4,
                                        "fsdp_config": {"ulysses_sequence_parallel_size": 2}},
                              "rollout": {"name": "hf", "n": 2}},
        "algorithm": {"adv_estimator": "grpo"},
        "data": {"train_files": "builtin:count", "train_batch_size": 4, "max_prompt_length": 32,
                 "max_response_length": 6},
        "trainer": {"device": "cpu", "n_gpus_per_node": 2, "total_training_steps": 1},
    }
    events = []
    state = run_spec(spec, run_id="turbo", on_event=events.append, cache_dir=tmp_path)
    assert state == "succeeded", [e["payload"] for e in events if e["kind"] in ("error", "status")]
    attention = [e["payload"] for e in events if e["kind"] == "attention"]
    trained = [a for a in attention if a["role"] in ("actor", "reference")]
    assert {(a["role"], a["rank"]) for a in trained} == {(r, k) for r in ("actor", "reference") for k in (0, 1)}
    for a in trained:
        assert a["requested"] == "sdpa" and a["effective"] == "eager" and a["forced"] and a["status"] == "forced"
        assert a["observed"] == "eager" and a["config_attn_implementation"] == "ulysses_eager"
        assert any(r["rule"] == "forced-eager-fsdp-turbo-ulysses" for r in a["reasons"])
    assert not [e for e in events if e["kind"] == "attention_mismatch"]
    assert [e["payload"]["step"] for e in events if e["kind"] == "metric"] == [1]
