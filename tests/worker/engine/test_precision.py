"""Mixed precision as verl runs it: weights and optimizer state in ``model_dtype``, forward and backward in
``dtype`` (FSDP's ``param_dtype``; gradients reduced in fp32), the rollout in ``rollout.dtype``, every
log-prob, value and loss in fp32. On CPU, in this process, over a gloo world of one rank."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from worker.core.environment import PROFILES
from worker.engine import compute, models
from worker.engine.rank import LoadPlan, RankWorker, RolePlan, _first_forward

BF16 = torch.bfloat16


def tiny_lm(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=64)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).to(dtype)


def plan(**overrides) -> RolePlan:
    values = {"role": "actor", "loader": "causal_lm", "folder": "unused", "override_config": {}, "candidates": ["sdpa"],
                  "requested": "sdpa", "forced": False, "reasons": [], "strategy": "fsdp2", "sp": 1, "trained": True, "lr": 1e-3,
                  "weight_decay": 0.0, "compute_dtype": "bfloat16", "master_dtype": "float32"}
    return RolePlan(**{**values, **overrides})


IDS = torch.tensor([[5, 9, 2, 33, 7, 1, 60, 12], [3, 3, 8, 41, 19, 22, 4, 50]])  # (2, 8)


@pytest.mark.parametrize(("trained", "compute_dtype", "master_dtype", "held"), [
    (True, "bfloat16", "float32", "float32"),  # the actor and critic: fp32 masters for the optimizer
    (False, "bfloat16", "float32", "bfloat16"),  # the reference: frozen, held as it computes
    (True, "float32", "float32", "float32"),
    (False, "float16", "float32", "float16"),
])
def test_the_weights_are_held_in_the_master_dtype_unless_frozen(trained, compute_dtype, master_dtype, held):
    assert plan(trained=trained, compute_dtype=compute_dtype, master_dtype=master_dtype).weights_dtype == held


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_a_world_of_one_computes_in_bf16_exactly_as_fsdp_casts_the_weights(world_of_one, strategy):
    """World 1 with bf16 compute over fp32 masters is wrapped, so FSDP's own param_dtype cast runs: the same
    numbers as every weight cast to bf16 (what the first forward does before wrapping), and not the numbers
    of autocast alone over fp32 weights (norms, embedding and residual stream would stay fp32 there)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    wrapped, optimizer = RankWorker(rank=0, world=1, run_id="unit")._shard(tiny_lm(), plan(strategy=strategy))
    assert any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in wrapped.modules())
    seen: list[torch.dtype] = []
    first_layer = next(m for m in wrapped.modules() if isinstance(m, LlamaDecoderLayer))
    first_layer.input_layernorm.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    with compute.autocast("cpu", "bfloat16"):
        logits = wrapped(input_ids=IDS).logits  # (2, 8, V)
    assert seen == [BF16] and logits.dtype == BF16

    reference = tiny_lm()
    with compute.autocast("cpu", "bfloat16"), torch.no_grad():
        cast = torch.func.functional_call(reference, {n: p.to(BF16) for n, p in reference.named_parameters()},
                                          args=(), kwargs={"input_ids": IDS}).logits
        autocast_only = reference(input_ids=IDS).logits
    torch.testing.assert_close(logits.detach(), cast, rtol=0, atol=0)
    assert not torch.equal(autocast_only, cast)

    logits.float().sum().backward()
    optimizer.step()
    assert {p.dtype for p in wrapped.parameters()} == {torch.float32}  # masters stay fp32
    assert {p.grad.dtype for p in wrapped.parameters() if p.grad is not None} == {torch.float32}
    states = [s for s in optimizer.state.values() if s]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_a_frozen_reference_in_its_compute_dtype_is_left_unwrapped_at_world_one(strategy):
    model = tiny_lm(BF16)
    wrapped, optimizer = RankWorker(rank=0, world=1, run_id="unit")._shard(
        model, plan(role="reference", trained=False, strategy=strategy))
    assert wrapped is model and optimizer is None and {p.dtype for p in model.parameters()} == {BF16}


def test_the_first_forward_runs_in_the_compute_dtype_and_leaves_the_masters_alone():
    model = tiny_lm()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = _first_forward(model, 64, trained=True, implementation="sdpa", compute_dtype="bfloat16")
    assert seen["observed"] == "sdpa" and seen["sdpa_backend"] == "flash_attention"
    assert seen["sdpa"][0]["inputs"].startswith("bfloat16 cpu")  # the attention saw bf16, as FSDP will give it
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is None and torch.equal(p, before[name]), name


def test_log_probs_values_and_losses_are_fp32_whatever_the_compute_dtype():
    model = tiny_lm(BF16)
    prompt, response = IDS[:, :5], IDS[:, 5:]  # (2, 5), (2, 3)
    mask = torch.ones_like(response)
    batch = {**compute.assemble(prompt, torch.ones_like(prompt), response, mask), "responses": response,
             "response_mask": mask, "old_log_probs": torch.full((2, 3), -4.0), "advantages": torch.ones(2, 3)}
    log_probs, entropy = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=True,
                                                compute_dtype="bfloat16")
    settings = compute.ActorSettings(ppo_epochs=1, mini_batch=2, micro_batch=2, clip_ratio=0.2, entropy_coeff=0.01,
                                     use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="kl", grad_clip=1.0,
                                     temperature=1.0)
    loss, _ = compute.actor_loss(model, batch, compute.NO_SP, settings, compute_dtype="bfloat16")
    assert log_probs.dtype == entropy.dtype == loss.dtype == torch.float32


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_fp16_compute_scales_the_loss_as_verl_does(world_of_one, strategy):
    """fp16 (not bf16) needs loss scaling against underflow: a sharded grad scaler, the optimizer stepping
    through it on unscaled, clipped gradients."""
    assert compute.grad_scaler("bfloat16", "cpu") is None and compute.grad_scaler("float32", "cpu") is None
    scaler = compute.grad_scaler("float16", "cpu")
    wrapped, optimizer = RankWorker(rank=0, world=1, run_id="unit")._shard(
        tiny_lm(), plan(strategy=strategy, compute_dtype="float16"))
    before = [p.detach().clone() for p in wrapped.parameters()]
    prompt, response = IDS[:, :5], IDS[:, 5:]
    mask = torch.ones_like(response)
    batch = {**compute.assemble(prompt, torch.ones_like(prompt), response, mask), "responses": response,
             "response_mask": mask, "old_log_probs": torch.full((2, 3), -4.0), "advantages": torch.randn(2, 3)}
    settings = compute.ActorSettings(ppo_epochs=1, mini_batch=2, micro_batch=1, clip_ratio=0.2, entropy_coeff=0.0,
                                     use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="kl", grad_clip=1.0,
                                     temperature=1.0)
    metrics = compute.update_actor(wrapped, optimizer, batch, compute.NO_SP, settings, compute_dtype="float16",
                                   scaler=scaler)
    assert 0 < metrics["actor/grad_norm"] < 1e3  # unscaled before clipping: not 65536 times the true norm
    assert any(not torch.equal(p, b) for p, b in zip(wrapped.parameters(), before, strict=True))  # it stepped


def _gen_settings(dtype: str) -> dict:
    return {"max_new_tokens": 4, "eos_token_id": None, "pad_token_id": 0, "temperature": 1.0, "top_p": 1.0,
            "do_sample": False, "seed": 0, "dtype": dtype}


def test_a_rollout_dtype_other_than_the_actors_generates_from_the_actors_current_weights(world_of_one, tmp_path):
    """verl syncs the actor's weights into its rollout engine, which runs in rollout.dtype: with an fp32
    rollout over a bf16-compute actor, the rollout is an fp32 copy of the current masters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    folder = models.ensure_builtin_folder("builtin:tiny-llama", tmp_path)
    worker = RankWorker(rank=0, world=1, run_id="unit")
    [report] = worker.load(LoadPlan(roles=[plan(folder=str(folder), lr=1e-2)], policy="strict",
                                    env=PROFILES["cpu"].to_dict(), seed=0))
    assert (report["compute_dtype"], report["weights_dtype"]) == ("bfloat16", "float32")
    assert worker._rollout_model("bfloat16") is worker.roles["actor"].module  # same dtype: the actor itself
    prompt = {"prompt_ids": IDS[:, :5], "prompt_mask": torch.ones(2, 5, dtype=torch.long)}

    def masters() -> dict[str, torch.Tensor]:
        return get_model_state_dict(worker.roles["actor"].module, options=StateDictOptions(full_state_dict=True))

    out = worker.generate(prompt, _gen_settings("float32"))
    assert (worker.rollout_report["compute_dtype"], worker.rollout_report["weights_dtype"]) == ("float32", "float32")
    plain = models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa"))
    plain.load_state_dict(masters())
    expected = compute.generate(plain, prompt["prompt_ids"], prompt["prompt_mask"], generator=None,
                                **{k: v for k, v in _gen_settings("float32").items() if k not in ("seed", "dtype")})
    assert torch.equal(out["responses"], expected["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], expected["rollout_log_probs"])

    batch = {**compute.assemble(prompt["prompt_ids"], prompt["prompt_mask"], out["responses"], out["response_mask"]),
             "responses": out["responses"], "response_mask": out["response_mask"],
             "old_log_probs": out["rollout_log_probs"], "advantages": torch.ones(2, 4)}
    worker.update_actor(batch, compute.ActorSettings(ppo_epochs=1, mini_batch=2, micro_batch=2, clip_ratio=0.2,
                                                     entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0,
                                                     kl_loss_type="kl", grad_clip=1.0, temperature=1.0))
    worker.generate(prompt, _gen_settings("float32"))  # the next rollout sees the updated weights
    now = masters()
    for name, tensor in worker.rollout_copy.state_dict().items():
        assert torch.equal(tensor, now[name]), name
