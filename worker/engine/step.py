"""One PPO step as named phases, in the order of verl's ``RayPPOTrainer.fit``: generate, rewards, old
log-probs, reference, values, advantages, update critic, update actor, metrics.

Each phase reads and adds fields of one batch (a dict of tensors and lists, rows = prompt x sample,
``N = B * rollout.n``) and calls the ranks through the run's ``WorkerGroup``; the arithmetic between the
calls is the PPO math of ``worker.ppo``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from worker.engine import compute
from worker.engine.dispatch import concat_batches
from worker.engine.group import WorkerGroup
from worker.ppo import core_algos as ppo_math
from worker.ppo.advantage import compute_advantage
from worker.spec import RunSpec


class PPOStep:
    """The phases of one step for a run's spec, ranks and tokenizer; ``__call__`` runs them in order."""

    def __init__(self, spec: RunSpec, group: WorkerGroup, tokenizer: Any, *, on_first_rollout: Callable[[], None]):
        self.spec, self.group, self.tokenizer = spec, group, tokenizer
        self.on_first_rollout = on_first_rollout
        self.rolled_out = False
        eos = tokenizer.eos_token_id
        self.eos = eos
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
        rollout = spec.actor_rollout_ref.rollout
        self.temperature = rollout.temperature if rollout.do_sample and rollout.temperature > 0 else 1.0

    def __call__(self, picked: list[Any], *, step: int, total_steps: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = self.generate(picked)
        t_gen = time.perf_counter()
        self.rewards(batch, picked)
        self.old_log_probs(batch)
        self.reference(batch)
        metrics = self.kl_in_reward(batch)
        if self.spec.has_critic:
            self.values(batch)
        self.advantages(batch)
        if self.spec.has_critic:
            metrics.update(self.update_critic(batch))
        metrics.update(self.update_actor(batch))
        return self.metrics(batch, metrics, step=step, total_steps=total_steps, started=t0, generated=t_gen)

    # ---- phases

    def generate(self, picked: list[Any]) -> dict[str, Any]:
        """Prompts, left-padded to the longest in the batch, each repeated n times (a group of samples),
        then the rollout on the actor's ranks -> the assembled batch."""
        spec, n = self.spec, self.spec.actor_rollout_ref.rollout.n
        rollout = spec.actor_rollout_ref.rollout
        p = max(len(r.prompt_ids) for r in picked)
        prompt_ids = torch.full((len(picked), p), self.pad, dtype=torch.long)  # (B, P)
        prompt_mask = torch.zeros(len(picked), p, dtype=torch.long)  # (B, P)
        for i, row in enumerate(picked):
            ids = torch.tensor(row.prompt_ids, dtype=torch.long)
            prompt_ids[i, p - len(ids):] = ids
            prompt_mask[i, p - len(ids):] = 1
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)  # (N, P), N = B * n
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)  # (N, P)
        settings = {"max_new_tokens": spec.data.max_response_length, "eos_token_id": self.eos,
                    "pad_token_id": self.pad, "temperature": rollout.temperature, "top_p": rollout.top_p,
                    "do_sample": rollout.do_sample, "seed": spec.attnboard.seed, "dtype": spec.precision("rollout")[0]}
        gen = concat_batches(self.group.call("generate", settings,
                                             batch={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}))
        if not self.rolled_out:
            self.rolled_out = True
            self.on_first_rollout()
        return {**compute.assemble(prompt_ids, prompt_mask, gen["responses"], gen["response_mask"]),
                "responses": gen["responses"], "response_mask": gen["response_mask"],
                "rollout_log_probs": gen["rollout_log_probs"],
                "uid": [i for i in range(len(picked)) for _ in range(n)]}  # (N,) the prompt (group) of each row

    def rewards(self, batch: dict[str, Any], picked: list[Any]) -> None:
        """Rule-based reward on the decoded text, placed on each response's last token -> token_level_scores."""
        from worker.ppo import rewards

        n = self.spec.actor_rollout_ref.rollout.n
        mask = batch["response_mask"]
        scores = torch.zeros(mask.shape, dtype=torch.float32)  # (N, R)
        seq_scores = []
        for i, row in enumerate(picked_rows(picked, n)):
            length = int(mask[i].sum())
            text = self.tokenizer.decode(batch["responses"][i, :length].tolist(), skip_special_tokens=True)
            score = float(rewards.get_reward_fn(self.spec.custom_reward_function.name, row.data_source)(
                row.data_source, text, row.ground_truth))
            seq_scores.append(score)
            scores[i, max(length - 1, 0)] = score
        batch["token_level_scores"], batch["seq_scores"] = scores, seq_scores

    def old_log_probs(self, batch: dict[str, Any]) -> None:
        old = concat_batches(self.group.call("compute_log_prob", self.temperature, batch=_tensors(batch)))
        batch["old_log_probs"], batch["entropy"] = old["old_log_probs"], old["entropy"]

    def reference(self, batch: dict[str, Any]) -> None:
        batch["ref_log_prob"] = concat_batches(
            self.group.call("compute_ref_log_prob", self.temperature, batch=_tensors(batch)))["ref_log_prob"]

    def kl_in_reward(self, batch: dict[str, Any]) -> dict[str, float]:
        """token_level_rewards: the scores, less ``kl_coef`` x KL to the reference with ``use_kl_in_reward``."""
        algorithm = self.spec.algorithm
        if not algorithm.use_kl_in_reward:
            batch["token_level_rewards"] = batch["token_level_scores"]
            return {}
        batch["token_level_rewards"], metrics = ppo_math.apply_kl_in_reward(
            batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"].float(),
            algorithm.kl_ctrl.kl_coef, algorithm.kl_penalty)
        return metrics

    def values(self, batch: dict[str, Any]) -> None:
        batch["values"] = concat_batches(self.group.call("compute_values", batch=_tensors(batch)))["values"]

    def advantages(self, batch: dict[str, Any]) -> None:
        """advantages, returns: the registered estimator of ``algorithm.adv_estimator`` (``worker.ppo.advantage``)."""
        algorithm = self.spec.algorithm
        compute_advantage(batch, algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                          norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo)

    def update_critic(self, batch: dict[str, Any]) -> dict[str, float]:
        arr, critic, rows = self.spec.actor_rollout_ref, self.spec.critic, len(batch["uid"])
        mesh = self.group.meshes["critic"]
        mini = min(max(arr.actor.ppo_mini_batch_size * arr.rollout.n // mesh.dp, 1), rows // mesh.dp)
        settings = compute.CriticSettings(
            ppo_epochs=arr.actor.ppo_epochs, mini_batch=mini, micro_batch=critic.ppo_micro_batch_size_per_gpu or mini,
            cliprange_value=critic.cliprange_value, grad_clip=critic.grad_clip)
        return _mean(self.group.call("update_critic", settings, batch=_tensors(batch)))

    def update_actor(self, batch: dict[str, Any]) -> dict[str, float]:
        arr, rows = self.spec.actor_rollout_ref, len(batch["uid"])
        actor, mesh = arr.actor, self.group.meshes["actor"]
        mini = max(actor.ppo_mini_batch_size * arr.rollout.n // mesh.dp, 1)
        micro = actor.ppo_micro_batch_size_per_gpu or mini
        settings = compute.ActorSettings(
            ppo_epochs=actor.ppo_epochs, mini_batch=min(mini, rows // mesh.dp), micro_batch=min(micro, mini),
            clip_ratio=actor.clip_ratio, entropy_coeff=actor.entropy_coeff, use_kl_loss=actor.use_kl_loss,
            kl_loss_coef=actor.kl_loss_coef, kl_loss_type=actor.kl_loss_type, grad_clip=actor.grad_clip,
            temperature=self.temperature)
        return _mean(self.group.call("update_actor", settings, batch=_tensors(batch)))

    def metrics(self, batch: dict[str, Any], metrics: dict[str, float], *, step: int, total_steps: int,
                started: float, generated: float) -> dict[str, Any]:
        step_time = time.perf_counter() - started
        mask = batch["response_mask"].float()  # (N, R)
        seq_scores = batch["seq_scores"]
        valid_tokens = float(batch["attention_mask"].sum())
        kl = ppo_math.masked_mean(batch["old_log_probs"] - batch["ref_log_prob"], mask)  # k1 estimate
        probs_diff = ppo_math.masked_mean((batch["rollout_log_probs"].exp() - batch["old_log_probs"].exp()).abs(), mask)
        peak = self.group.call("peak_memory_mb")
        metrics.update({
            "critic/rewards/mean": float(batch["token_level_rewards"].sum(-1).mean()),
            "critic/score/mean": sum(seq_scores) / len(seq_scores),
            "actor/kl": float(kl),
            "actor/entropy": float(ppo_math.masked_mean(batch["entropy"], mask)),
            "response_length/mean": float(mask.sum(-1).mean()),
            "training/rollout_probs_diff_mean": float(probs_diff),
            "perf/tokens_per_s": valid_tokens / step_time,
            "perf/step_time_s": step_time,
            "timing_s/gen": generated - started,
            "perf/max_memory_mb": max(peak),
        })
        return {"step": step, "total_steps": total_steps, "values": metrics,
                "peak_memory_mb": {str(r): m for r, m in enumerate(peak)}}


RANK_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "old_log_probs",
               "ref_log_prob", "values", "advantages", "returns")
"""The batch fields the ranks read (the rest stays with the controller: scores, group ids, entropy, ...)."""


def _tensors(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in RANK_FIELDS if k in batch}


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for row in rows for k in row}
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}


def picked_rows(picked: list[Any], n: int) -> list[Any]:
    return [row for row in picked for _ in range(n)]
