"""verl's ``use_remove_padding`` in the engine's forward (``worker.engine.compute``): a micro-batch packed
into one row with ``position_ids`` and no attention mask gives the log-probs, entropy, values and gradients
of the padded batch (fp32 tolerance) on eager and sdpa, over mixed prompt and response lengths; the output
layer sees only the response positions; at an entropy coefficient of 0 nothing flows back through the
entropy."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

from worker.engine import compute

TOL = {"atol": 2e-5, "rtol": 2e-5}  # fp32: one op order against another (packed rows, masks)


def _config(impl: str, **extra) -> LlamaConfig:
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, **extra)
    config._attn_implementation = impl
    return config


def _lm(impl: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(_config(impl)).eval()


def mixed_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """4 rows, P = 6 left-padded (prompts of 6, 2, 4, 1 tokens), R = 5 right-padded (responses of 5, 1, 3, 0)."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths, response_lengths, p, r = [6, 2, 4, 1], [5, 1, 3, 0], 6, 5
    prompt = torch.randint(1, 64, (4, p), generator=g)
    responses = torch.randint(1, 64, (4, r), generator=g)
    prompt_mask = torch.tensor([[0] * (p - n) + [1] * n for n in prompt_lengths])
    response_mask = torch.tensor([[1] * n + [0] * (r - n) for n in response_lengths])
    prompt, responses = prompt * prompt_mask, responses * response_mask  # padding is token 0
    return {**compute.assemble(prompt, prompt_mask, responses, response_mask), "responses": responses,
            "response_mask": response_mask}


def alone(model, batch, row: int) -> torch.Tensor:
    """Row ``row``'s response log-probs from a forward over its real tokens only (no padding, no packing)."""
    mask = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][mask][None]
    logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]  # (T, V)
    n = int(batch["response_mask"][row].sum())
    t = ids.shape[1]
    return logp[t - n - 1: t - 1].gather(-1, ids[0, t - n:, None]).squeeze(-1)  # (n,)


def test_packed_rows_hold_the_real_tokens_with_positions_restarting_per_sequence():
    batch = mixed_batch()
    packed = compute.Packed.of(batch)
    lengths = batch["attention_mask"].sum(1).tolist()  # [11, 3, 7, 1]
    assert packed.input_ids.shape == (1, sum(lengths))
    assert packed.position_ids[0].tolist() == [i for n in lengths for i in range(n)]
    assert packed.input_ids[0].tolist() == batch["input_ids"][batch["attention_mask"].bool()].tolist()
    assert (packed.index >= 0).equal(batch["attention_mask"].bool())
    assert packed.index[batch["attention_mask"].bool()].tolist() == list(range(sum(lengths)))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_packed_and_padded_log_probs_and_entropy_agree_on_mixed_lengths(impl):
    model, batch = _lm(impl), mixed_batch()
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        padded = compute.policy_forward(model, batch, compute.NO_SP, temperature=0.7, with_entropy=True)
        packed = compute.policy_forward(model, batch, compute.NO_SP, temperature=0.7, with_entropy=True,
                                        remove_padding=True)
        plain = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=False,
                                       remove_padding=True)[0]
        for row in range(4):  # and both are the model's log-probs of each sequence alone
            torch.testing.assert_close(plain[row][mask[row]], alone(model, batch, row), **TOL)
    for a, b in zip(padded, packed, strict=True):
        torch.testing.assert_close(a[mask], b[mask], **TOL)
        assert (b[~batch["attention_mask"][:, -6:-1].bool()] == 0).all()  # no real token read: 0


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_packed_and_padded_updates_have_the_same_loss_and_gradients(impl):
    batch = mixed_batch()
    n, r = batch["responses"].shape
    g = torch.Generator().manual_seed(3)
    batch.update(old_log_probs=-torch.rand(n, r, generator=g) * 4, advantages=torch.randn(n, r, generator=g))
    settings = compute.ActorSettings(ppo_epochs=1, mini_batch=n, micro_batch=n, clip_ratio=0.2, entropy_coeff=0.01,
                                     use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl", grad_clip=1.0,
                                     temperature=1.0)
    results = []
    for remove_padding in (False, True):
        model = _lm(impl).train()
        loss, metrics = compute.actor_loss(model, batch, compute.NO_SP, settings, remove_padding=remove_padding)
        loss.backward()
        results.append((loss.detach(), metrics, {k: p.grad for k, p in model.named_parameters()}))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, **TOL)
    assert metrics_a.keys() == metrics_b.keys()
    for key in metrics_a:
        assert metrics_a[key] == pytest.approx(metrics_b[key], abs=2e-5), key
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_packed_and_padded_values_agree(impl):
    torch.manual_seed(0)
    config = _config(impl, num_labels=1)
    critic, batch = LlamaForTokenClassification(config).eval(), mixed_batch()
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        padded = compute.value_forward(critic, batch, compute.NO_SP)
        packed = compute.value_forward(critic, batch, compute.NO_SP, remove_padding=True)
    assert padded.shape == packed.shape == batch["responses"].shape
    torch.testing.assert_close(padded[mask], packed[mask], **TOL)


@pytest.mark.parametrize("remove_padding,positions", [(False, 4 * 5), (True, 5 + 2 + 4 + 1)])
def test_the_output_layer_runs_over_the_response_positions_only(remove_padding, positions):
    """Padded: R positions per row; packed: only the reads that are real tokens (each response's tokens,
    plus the read after its last one when the row is not full)."""
    model, batch = _lm("sdpa"), mixed_batch()
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[:-1].numel()))
    try:
        with torch.no_grad():
            compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=True,
                                   remove_padding=remove_padding)
    finally:
        hook.remove()
    assert seen == [positions]


def test_at_entropy_coefficient_zero_no_backward_runs_through_the_entropy():
    model, batch = _lm("sdpa").train(), mixed_batch()
    _, with_grad = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=True)
    _, without = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=True,
                                        entropy_grad=False)
    assert with_grad.requires_grad and not without.requires_grad
    torch.testing.assert_close(with_grad.detach(), without)

    n, r = batch["responses"].shape
    batch.update(old_log_probs=torch.zeros(n, r) - 1.0, advantages=torch.ones(n, r))
    settings = compute.ActorSettings(ppo_epochs=1, mini_batch=n, micro_batch=n, clip_ratio=0.2, entropy_coeff=0.0,
                                     use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl", grad_clip=1.0,
                                     temperature=1.0)
    loss, metrics = compute.actor_loss(model, batch, compute.NO_SP, settings)
    assert metrics["actor/entropy"] > 0  # still measured
    assert loss.item() == pytest.approx(metrics["actor/pg_loss"], abs=1e-6)


# ---- the n samples of a prompt share its prefill


@pytest.mark.parametrize("rows,unique,expand", [
    ([[1, 2], [1, 2], [3, 4], [3, 4]], [0, 2], [0, 0, 1, 1]),
    ([[1, 2], [3, 4], [1, 2]], [0, 1, 2], [0, 1, 2]),  # only consecutive rows are one group
    ([[5, 5]], [0], [0]),
])
def test_prompt_groups(rows, unique, expand):
    ids = torch.tensor(rows)
    got_unique, got_expand = compute.prompt_groups(ids, torch.ones_like(ids))
    assert (got_unique.tolist(), got_expand.tolist()) == (unique, expand)
    assert ids[got_unique][got_expand].equal(ids)


def test_left_padding_tells_prompts_apart():
    ids = torch.tensor([[0, 7], [0, 7]])
    unique, _ = compute.prompt_groups(ids, torch.tensor([[0, 1], [1, 1]]))  # token 0 real in the second row
    assert unique.tolist() == [0, 1]


def test_samples_of_a_prompt_sharing_its_prefill_generate_as_rows_of_their_own():
    """Greedy: 3 samples per prompt from one prefill give each prompt's own greedy response and log-probs;
    the prefill forward sees each prompt once."""
    model = _lm("sdpa")
    prompts = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])  # (2, 5), row 0 left-padded
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    settings = {"max_new_tokens": 6, "eos_token_id": None, "pad_token_id": 0, "temperature": 1.0, "top_p": 1.0,
                "do_sample": False, "generator": None}
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    try:
        grouped = compute.generate(model, prompts.repeat_interleave(3, 0), prompt_mask.repeat_interleave(3, 0),
                                   **settings)
    finally:
        hook.remove()
    assert seen[0] == (2, 5) and seen[1] == (6, 1)  # one prefill per prompt, then every sample decodes
    alone = compute.generate(model, prompts, prompt_mask, **settings)
    for key in ("responses", "response_mask"):
        assert grouped[key].equal(alone[key].repeat_interleave(3, 0)), key
    torch.testing.assert_close(grouped["rollout_log_probs"], alone["rollout_log_probs"].repeat_interleave(3, 0), **TOL)


# ---- on policy (one epoch, one mini-batch): no old-log-prob forward


@pytest.mark.parametrize("epochs,rows,mini,kl_in_reward,expected", [
    (1, 8, 8, False, True), (1, 8, 16, False, True), (2, 8, 8, False, False), (1, 8, 4, False, False),
    (1, 8, 8, True, False),
])
def test_on_policy_is_verls_condition(epochs, rows, mini, kl_in_reward, expected):
    assert compute.on_policy(ppo_epochs=epochs, rows=rows, mini_batch=mini, kl_in_reward=kl_in_reward) is expected


@pytest.mark.parametrize("remove_padding", [False, True])
def test_an_on_policy_update_equals_one_fed_the_old_log_probs_of_a_separate_forward(remove_padding):
    """The separate forward's log-probs and entropy are what the update's own forwards see (every micro-batch
    runs before the one optimizer step), so the update, its metrics and the step's old log-probs agree."""
    batch = mixed_batch()
    n, r = batch["responses"].shape
    batch["advantages"] = torch.randn(n, r, generator=torch.Generator().manual_seed(5))
    results = []
    for on_policy in (False, True):
        model = _lm("sdpa")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = dict(batch)
        if not on_policy:
            with torch.no_grad():
                step["old_log_probs"], old_entropy = compute.policy_forward(
                    model, step, compute.NO_SP, temperature=1.0, with_entropy=True, remove_padding=remove_padding)
        settings = compute.ActorSettings(ppo_epochs=1, mini_batch=n, micro_batch=2, clip_ratio=0.2, entropy_coeff=0.0,
                                         use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl",
                                         grad_clip=1.0, temperature=1.0, on_policy=on_policy)
        seen: list = []
        metrics = compute.update_actor(model, optimizer, step, compute.NO_SP, settings, remove_padding=remove_padding,
                                       seen=seen)
        old = torch.cat([lp for lp, _ in seen]) if on_policy else step["old_log_probs"]
        entropy = torch.cat([e for _, e in seen]) if on_policy else old_entropy
        results.append((metrics, old, entropy, [p.detach().clone() for p in model.parameters()]))
    (m_a, old_a, ent_a, params_a), (m_b, old_b, ent_b, params_b) = results
    assert m_a.keys() == m_b.keys()
    for key in m_a:
        assert m_a[key] == pytest.approx(m_b[key], rel=1e-4, abs=1e-6), key
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(old_a[mask], old_b[mask], **TOL)
    torch.testing.assert_close(ent_a[mask], ent_b[mask], **TOL)
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
