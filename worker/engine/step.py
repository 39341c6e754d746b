"""One PPO step as named phases, in the order of verl's ``RayPPOTrainer.fit``: generate (and, for an
estimator that subtracts one, the greedy baseline), rewards, old log-probs, reference (where a KL term reads
it: verl's ``need_reference_policy``), values (for an estimator that reads a critic), advantages, update critic,
update actor, metrics. What the estimator reads is its registry entry's (``worker.ppo.advantage``).

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
from worker.ppo.advantage import compute_advantage, estimator
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
        self.estimator = estimator(spec.algorithm.adv_estimator)
        self.with_reference = compute.needs_reference(use_kl_loss=spec.actor_rollout_ref.actor.use_kl_loss,
                                                      use_kl_in_reward=spec.algorithm.use_kl_in_reward)

    def __call__(self, picked: list[Any], *, step: int, total_steps: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = self.generate(picked)
        if self.estimator.baseline:
            self.greedy_baseline(batch, picked)
        t_gen = time.perf_counter()
        self.rewards(batch, picked)
        if not self.on_policy(batch):
            self.old_log_probs(batch)
        if self.with_reference:
            self.reference(batch)
        metrics = self.kl_in_reward(batch)
        if self.estimator.critic:
            self.values(batch)
        self.advantages(batch)
        if self.estimator.critic:
            metrics.update(self.update_critic(batch))
        metrics.update(self.update_actor(batch))
        return self.metrics(batch, metrics, step=step, total_steps=total_steps, started=t0, generated=t_gen)

    # ---- what the phases share

    def _prompts(self, picked: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts left-padded to the longest of the batch -> prompt_ids, prompt_mask (B, P)."""
        p = max(len(r.prompt_ids) for r in picked)
        prompt_ids = torch.full((len(picked), p), self.pad, dtype=torch.long)  # (B, P)
        prompt_mask = torch.zeros(len(picked), p, dtype=torch.long)  # (B, P)
        for i, row in enumerate(picked):
            ids = torch.tensor(row.prompt_ids, dtype=torch.long)
            prompt_ids[i, p - len(ids):] = ids
            prompt_mask[i, p - len(ids):] = 1
        return prompt_ids, prompt_mask

    def _rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, do_sample: bool) -> dict[str, Any]:
        """generate on the actor's ranks (sampled as ``rollout.*`` says, or greedy) -> responses, response_mask,
        rollout_log_probs (rows, R)."""
        spec, rollout = self.spec, self.spec.actor_rollout_ref.rollout
        settings = {"max_new_tokens": spec.data.max_response_length, "eos_token_id": self.eos,
                    "pad_token_id": self.pad, "temperature": rollout.temperature, "top_p": rollout.top_p,
                    "do_sample": do_sample, "seed": spec.attnboard.seed, "dtype": spec.precision("rollout")[0]}
        return concat_batches(self.group.call("generate", settings,
                                              batch={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}))

    def _score(self, row: Any, response: torch.Tensor) -> float:
        """The rule-based reward of one response (its tokens up to and including EOS) to its prompt's row."""
        from worker.ppo import rewards

        text = self.tokenizer.decode(response.tolist(), skip_special_tokens=True)
        return float(rewards.get_reward_fn(self.spec.custom_reward_function.name, row.data_source)(
            row.data_source, text, row.ground_truth))

    # ---- phases

    def generate(self, picked: list[Any]) -> dict[str, Any]:
        """Prompts, left-padded to the longest in the batch, each repeated n times (a group of samples),
        then the rollout on the actor's ranks -> the assembled batch."""
        n = self.spec.actor_rollout_ref.rollout.n
        prompt_ids, prompt_mask = self._prompts(picked)
        prompt_ids = prompt_ids.repeat_interleave(n, dim=0)  # (N, P), N = B * n
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)  # (N, P)
        gen = self._rollout(prompt_ids, prompt_mask, do_sample=self.spec.actor_rollout_ref.rollout.do_sample)
        if not self.rolled_out:
            self.rolled_out = True
            self.on_first_rollout()
        return {**compute.assemble(prompt_ids, prompt_mask, gen["responses"], gen["response_mask"]),
                "responses": gen["responses"], "response_mask": gen["response_mask"],
                "rollout_log_probs": gen["rollout_log_probs"],
                "uid": [i for i in range(len(picked)) for _ in range(n)]}  # (N,) the prompt (group) of each row

    def greedy_baseline(self, batch: dict[str, Any], picked: list[Any]) -> None:
        """ReMax's baseline, as verl makes it: the score of a greedy rollout of each prompt -> reward_baselines
        (N,), the prompt's score on each of its rows. The prompts are generated once each when they split
        evenly across the actor's data-parallel ranks, else once per row (greedy: the same response)."""
        n = self.spec.actor_rollout_ref.rollout.n
        prompt_ids, prompt_mask = self._prompts(picked)
        per_prompt = len(picked) % self.group.meshes["actor"].dp == 0
        rows = picked if per_prompt else picked_rows(picked, n)
        if not per_prompt:
            prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, dim=0), prompt_mask.repeat_interleave(n, dim=0)
        gen = self._rollout(prompt_ids, prompt_mask, do_sample=False)
        lengths = gen["response_mask"].sum(-1).tolist()
        scores = torch.tensor([self._score(row, gen["responses"][i, :int(lengths[i])]) for i, row in enumerate(rows)],
                              dtype=torch.float32)
        batch["reward_baselines"] = scores.repeat_interleave(n) if per_prompt else scores

    def rewards(self, batch: dict[str, Any], picked: list[Any]) -> None:
        """Rule-based reward on the decoded text, placed on each response's last token -> token_level_scores."""
        n = self.spec.actor_rollout_ref.rollout.n
        mask = batch["response_mask"]
        scores = torch.zeros(mask.shape, dtype=torch.float32)  # (N, R)
        seq_scores = []
        for i, row in enumerate(picked_rows(picked, n)):
            length = int(mask[i].sum())
            score = self._score(row, batch["responses"][i, :length])
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

    def _actor_mini_batch(self, batch: dict[str, Any]) -> tuple[int, int, int]:
        """(rows per actor rank, mini-batch rows per rank, micro-batch rows)."""
        arr, rows = self.spec.actor_rollout_ref, len(batch["uid"])
        actor, mesh = arr.actor, self.group.meshes["actor"]
        mini = max(actor.ppo_mini_batch_size * arr.rollout.n // mesh.dp, 1)
        micro = actor.ppo_micro_batch_size_per_gpu or mini
        return rows // mesh.dp, min(mini, rows // mesh.dp), min(micro, mini)

    def on_policy(self, batch: dict[str, Any]) -> bool:
        """verl's condition for skipping the old-log-prob forward (``compute.on_policy``): one epoch of one
        mini-batch and no KL penalty in the reward (it reads the old log-probs before the update); no
        registered advantage estimator reads them. The update's own forwards then give them (``update_actor``)."""
        rows, mini, _ = self._actor_mini_batch(batch)
        return compute.on_policy(ppo_epochs=self.spec.actor_rollout_ref.actor.ppo_epochs, rows=rows, mini_batch=mini,
                                 kl_in_reward=self.spec.algorithm.use_kl_in_reward)

    def update_actor(self, batch: dict[str, Any]) -> dict[str, float]:
        """The actor's update; on policy it also gives the step's old log-probs and entropy (no forward of
        their own), for the KL and entropy metrics, as the separate forward would have."""
        actor = self.spec.actor_rollout_ref.actor
        _, mini, micro = self._actor_mini_batch(batch)
        on_policy = "old_log_probs" not in batch
        settings = compute.ActorSettings(
            ppo_epochs=actor.ppo_epochs, mini_batch=mini, micro_batch=micro,
            clip_ratio=actor.clip_ratio, entropy_coeff=actor.entropy_coeff, use_kl_loss=actor.use_kl_loss,
            kl_loss_coef=actor.kl_loss_coef, kl_loss_type=actor.kl_loss_type, grad_clip=actor.grad_clip,
            temperature=self.temperature, on_policy=on_policy)
        if not on_policy:
            return _mean(self.group.call("update_actor", settings, batch=_tensors(batch)))
        parts = self.group.call("update_actor_on_policy", settings, batch=_tensors(batch))
        seen = concat_batches([{"old_log_probs": p["old_log_probs"], "entropy": p["entropy"]} for p in parts])
        batch["old_log_probs"], batch["entropy"] = seen["old_log_probs"], seen["entropy"]
        return _mean([p["metrics"] for p in parts])

    def metrics(self, batch: dict[str, Any], metrics: dict[str, float], *, step: int, total_steps: int,
                started: float, generated: float) -> dict[str, Any]:
        step_time = time.perf_counter() - started
        mask = batch["response_mask"].float()  # (N, R)
        seq_scores = batch["seq_scores"]
        valid_tokens = float(batch["attention_mask"].sum())
        probs_diff = ppo_math.masked_mean((batch["rollout_log_probs"].exp() - batch["old_log_probs"].exp()).abs(), mask)
        peak = self.group.call("peak_memory_mb")
        valid = mask.bool()
        advantages, returns = batch["advantages"][valid], batch["returns"][valid]  # the response tokens'
        metrics.update({
            "critic/advantages/mean": float(advantages.mean()),
            "critic/advantages/max": float(advantages.max()),
            "critic/advantages/min": float(advantages.min()),
            "critic/returns/mean": float(returns.mean()),
            "critic/rewards/mean": float(batch["token_level_rewards"].sum(-1).mean()),
            "critic/score/mean": sum(seq_scores) / len(seq_scores),
            "actor/entropy": float(ppo_math.masked_mean(batch["entropy"], mask)),
            "response_length/mean": float(mask.sum(-1).mean()),
            "training/rollout_probs_diff_mean": float(probs_diff),
            "perf/tokens_per_s": valid_tokens / step_time,
            "perf/step_time_s": step_time,
            "timing_s/gen": generated - started,
            "perf/max_memory_mb": max(peak),
        })
        if "ref_log_prob" in batch:  # the k1 estimate of KL to the reference, where a step ran its forward
            metrics["actor/kl"] = float(ppo_math.masked_mean(batch["old_log_probs"] - batch["ref_log_prob"], mask))
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
