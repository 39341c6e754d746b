"""One side of ``bench_trl.py`` in a process of its own: it sets up, runs one warm-up step, then one step per
``step`` line on stdin; ``quit`` ends it. Every answer is one line ``@@ {json}`` on stdout (anything else a
library prints there is ignored by the driver).

    python bench/bench_sides.py SIDE 'CONFIG_JSON'

SIDE:
- ``attnboard``: the real engine (``worker.engine.trainer.Trainer`` on a local Ray of ``threads`` CPUs,
  ``ranks`` rank actors of ``threads / ranks`` CPUs and torch threads each), PPO (gae) or GRPO;
- ``floor``: the plain-torch step, the least work one needs (no reference forward, as attnboard's sides run
  none), per ``algo``: PPO (gae): HF ``generate``, one critic forward, one forward/backward per micro-batch of
  the actor and the critic, one AdamW step each; GRPO: the prefill once per prompt, HF ``generate`` of ``n``
  samples, group-normalised advantages, one actor forward/backward per micro-batch, one AdamW step;
- ``trl-ppo``: TRL's ``trl.experimental.ppo.PPOTrainer`` (TRL <= 1.12; 1.13 removed it);
- ``trl-grpo``: TRL's ``GRPOTrainer`` (n samples per prompt, no KL term: ``beta=0``).

The TRL sides run in the Python of their TRL venv (``bench/_work/trl-ppo-venv`` with TRL 1.12,
``bench/_work/trl-grpo-venv`` with TRL 1.16; see ``bench_trl.py``); the others in the project's. The step is
timed here, from the ``step`` line to the end of the update; the driver measures the machine around it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the project (worker.*) when run as a script


def say(**fields: Any) -> None:
    sys.stdout.write("@@ " + json.dumps(fields) + "\n")
    sys.stdout.flush()


def command() -> str:
    """The next driver command (``step`` or ``quit``); EOF counts as quit."""
    line = sys.stdin.readline()
    return line.strip() or "quit"


class Turns:
    """The step protocol: ``done(...)`` after each update answers the driver and waits for its next word."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.warm = False

    def done(self, **fields: Any) -> bool:
        """-> True to go on, False on quit."""
        end = time.perf_counter()
        if not self.warm:
            say(event="ready", warmup_s=end - (self.started or end), **fields)
            self.warm = True
        else:
            say(event="step", step_s=end - (self.started or end), **fields)
        if command() != "step":
            return False
        self.started = time.perf_counter()
        return True


# ---------------------------------------------------------------------------------------------
# attnboard


def attnboard(cfg: dict[str, Any]) -> None:
    import ray

    from worker.engine.controller import run_options
    from worker.engine.events import EventLog
    from worker.engine.trainer import Trainer
    from worker.spec.presets import tiny_cpu_spec

    rows = cfg["prompts"] * cfg["n"]
    micro = min(cfg["micro"], rows // cfg["ranks"])  # each rank's share of the mini-batch holds whole micro-batches
    spec = tiny_cpu_spec(**{
        "actor_rollout_ref.model.path": cfg["folder"], "critic.model.path": cfg["folder"],
        "algorithm.adv_estimator": cfg["algo"],
        "trainer.n_gpus_per_node": cfg["ranks"], "attnboard.rank_cpus": cfg["threads"] // cfg["ranks"],
        "trainer.total_training_steps": cfg["max_steps"],
        "data.train_files": cfg["data"], "data.max_prompt_length": cfg["prompt_len"],
        "data.max_response_length": cfg["response_len"], "data.train_batch_size": cfg["prompts"],
        "actor_rollout_ref.rollout.n": cfg["n"],
        "actor_rollout_ref.actor.ppo_mini_batch_size": cfg["prompts"],  # one mini-batch: every row
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro, "critic.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_epochs": 1, "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "actor_rollout_ref.model.use_remove_padding": cfg.get("remove_padding", True),
        "critic.model.use_remove_padding": cfg.get("remove_padding", True),
    })
    ray.init(num_cpus=cfg["threads"], include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             namespace="attnboard-bench")
    turns = Turns()
    turns.started = time.perf_counter()
    trainer: list[Any] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["kind"] == "error":
            print(f"attnboard error: {event['payload'].get('message')}", file=sys.stderr)
        if event["kind"] != "metric":
            return
        values = event["payload"]["values"]
        if not turns.done(gen_s=values["timing_s/gen"], tokens=values["response_length/mean"] * rows,
                          rank_peak_mb=values["perf/max_memory_mb"]):
            trainer[0].cancel("the benchmark has its steps")

    log = EventLog(f"bench-{os.getpid()}", on_event)
    trainer.append(Trainer(spec, log=log, options=run_options(model_roots=[Path(cfg["folder"]).parent],
                                                                cache_dir=cfg["work"])))
    try:
        state = trainer[0].run()
    finally:
        ray.shutdown()
    if state not in ("succeeded", "cancelled"):
        raise SystemExit(f"attnboard run ended {state}")


# ---------------------------------------------------------------------------------------------
# The plain-torch floor (PPO with gae, or GRPO)

FLOOR_ALGOS = ("gae", "grpo")


def floor(cfg: dict[str, Any]) -> None:
    """The least work one step of ``cfg["algo"]`` needs, in plain torch. No reference forward: the bench's
    attnboard sides set neither ``actor.use_kl_loss`` nor ``algorithm.use_kl_in_reward``, so the engine runs none.
    No old log-prob forward either: one epoch of one mini-batch is on-policy, the ratio's denominator is the
    update's own forward, detached.

    - gae: HF ``generate`` of one response per prompt, one critic forward (the old values), a random last-token
      reward, GAE (gamma = lambda = 1); per micro-batch one actor and one critic forward + backward (PPO clip
      loss, clipped value loss); one AdamW step each.
    - grpo: the prompts' prefill once, then HF ``generate`` of ``n`` samples per prompt from it; a random rule
      reward per sample, advantages normalised per prompt group (mean, std); per micro-batch one actor forward +
      backward (PPO clip loss); one AdamW step. No critic.
    """
    import torch
    import torch.nn.functional as F

    from worker.engine import models

    algo = cfg["algo"]
    if algo not in FLOOR_ALGOS:
        raise SystemExit(f"floor: cfg algo {algo!r} is not one the floor runs; valid: {', '.join(FLOOR_ALGOS)}")
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    folder = cfg["folder"]
    config = models.build_config(folder, {}, "sdpa")
    actor = models.load_causal_lm(folder, config)
    a_opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)
    critic = models.load_value_model(folder, config) if algo == "gae" else None
    c_opt = torch.optim.AdamW(critic.parameters(), lr=1e-6) if critic is not None else None
    k = cfg["n"] if algo == "grpo" else 1  # samples per prompt
    prompts_n, p, r, micro = cfg["prompts"], cfg["prompt_len"], cfg["response_len"], cfg["micro"]
    n = prompts_n * k  # rows: prompt i's samples are rows i*k .. i*k+k-1
    prompts = torch.randint(4, min(config.vocab_size, 80), (prompts_n, p))  # every prompt p tokens: no padding

    def logp(model: torch.nn.Module, seqs: torch.Tensor) -> torch.Tensor:
        keep = torch.arange(p - 1, p + r - 1)  # the positions that predict the response: the output layer runs there
        logits = model(input_ids=seqs, use_cache=False, logits_to_keep=keep).logits.float()  # (m, r, V)
        return torch.gather(F.log_softmax(logits, -1), -1, seqs[:, p:, None]).squeeze(-1)  # (m, r)

    def values(seqs: torch.Tensor) -> torch.Tensor:
        assert critic is not None
        return critic(input_ids=seqs, use_cache=False).logits.float()[:, p - 1: p + r - 1, 0]  # (m, r)

    def generate() -> torch.Tensor:
        """-> (n, p + r): ``k`` sampled responses per prompt, the prompts' prefill run once."""
        ids = prompts
        sample = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": r,
                  "min_new_tokens": r, "pad_token_id": 0}
        if k == 1:
            return actor.generate(ids, attention_mask=torch.ones_like(ids), **sample)
        cache = actor(input_ids=ids[:, :-1], use_cache=True).cache  # the prefill, once per prompt
        cache.batch_repeat_interleave(k)  # (prompts_n, ...) -> (n, ...): each prompt's cache for its k samples
        ids = ids.repeat_interleave(k, 0)  # (n, p); generate runs only the last prompt token, k times
        return actor.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, **sample)

    def clip_loss(rows: slice, advantages: torch.Tensor) -> torch.Tensor:
        """The PPO clip loss on policy over ``rows`` (clip 0.2)."""
        new = logp(actor, seqs[rows])  # (m, r): on-policy, so the old log-probs are this forward's
        ratio = torch.exp(new - new.detach())
        return -torch.min(ratio * advantages[rows], ratio.clamp(0.8, 1.2) * advantages[rows]).mean()

    turns = Turns()
    turns.started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        actor.eval()
        with torch.no_grad():
            seqs = generate()  # (n, p + r)
        gen_s = time.perf_counter() - t0
        if critic is None:  # GRPO: one outcome score per sample, normalised within its prompt's group
            scores = torch.rand(prompts_n, k)  # (prompts, k)
            scores = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
            adv = scores.reshape(n, 1).expand(n, r)  # (n, r): the sample's score on every response token
        else:
            with torch.no_grad():
                old_values = values(seqs)  # (n, r)
            reward = torch.zeros(n, r)
            reward[:, -1] = torch.rand(n)
            adv, last = torch.zeros(n, r), torch.zeros(n)
            for t in reversed(range(r)):  # GAE, gamma = lambda = 1
                nxt = old_values[:, t + 1] if t + 1 < r else torch.zeros(n)
                last = reward[:, t] + nxt - old_values[:, t] + last
                adv[:, t] = last
            returns = adv + old_values
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        actor.train()
        a_opt.zero_grad()
        if critic is not None and c_opt is not None:
            critic.train()
            c_opt.zero_grad()
        for i in range(0, n, micro):
            rows, share = slice(i, i + micro), min(micro, n - i) / n
            (clip_loss(rows, adv) * share).backward()
            if critic is not None:
                v = values(seqs[rows])
                vf = 0.5 * torch.max((v - returns[rows]) ** 2,
                                     (old_values[rows] + (v - old_values[rows]).clamp(-0.5, 0.5) - returns[rows]) ** 2).mean()
                (vf * share).backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
        a_opt.step()
        if critic is not None and c_opt is not None:
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            c_opt.step()
        if not turns.done(gen_s=gen_s, tokens=float(n * r)):
            return


# ---------------------------------------------------------------------------------------------
# TRL


def _trl_callback(turns: Turns, rows: int, response_len: int):
    from transformers import TrainerCallback

    class StepTurns(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            turns.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if not turns.done(tokens=float(rows * response_len)):
                control.should_training_stop = True
            return control

    return StepTurns()


def _trl_common(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"output_dir": str(Path(cfg["work"]) / f"trl-{os.getpid()}"), "report_to": "none", "save_strategy": "no",
            "use_cpu": True, "bf16": False, "fp16": False, "disable_tqdm": True, "seed": 0, "learning_rate": 1e-6,
            "logging_steps": 10_000, "dataloader_num_workers": 0}


def trl_ppo(cfg: dict[str, Any]) -> None:
    import datasets
    import torch

    from worker.engine import models

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.ppo import PPOConfig, PPOTrainer  # TRL <= 1.12

    torch.set_num_threads(cfg["threads"])
    folder, n = cfg["folder"], cfg["prompts"]
    tok = models.load_tokenizer(folder)
    tok.padding_side = "left"
    text = cfg["prompt_text"]
    dataset = datasets.Dataset.from_dict({"input_ids": [tok(text)["input_ids"]] * (n * (cfg["max_steps"] + 1))})

    def causal_lm():
        return models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa"))

    def value_model():
        return models.load_value_model(folder, models.build_config(folder, {}, "sdpa"))

    config = PPOConfig(**_trl_common(cfg), temperature=1.0, response_length=cfg["response_len"], stop_token=None,
                       missing_eos_penalty=None, num_sample_generations=0, per_device_train_batch_size=cfg["micro"],
                       gradient_accumulation_steps=n // cfg["micro"], num_mini_batches=1, num_ppo_epochs=1,
                       local_rollout_forward_batch_size=n, total_episodes=cfg["max_steps"] * n)
    turns = Turns()
    trainer = PPOTrainer(args=config, processing_class=tok, model=causal_lm(), ref_model=causal_lm(),
                         reward_model=value_model(), value_model=value_model(), train_dataset=dataset,
                         eval_dataset=dataset, callbacks=[_trl_callback(turns, n, cfg["response_len"])])
    trainer.train()


def trl_grpo(cfg: dict[str, Any]) -> None:
    import datasets
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from worker.engine import models

    torch.set_num_threads(cfg["threads"])
    folder, prompts, n = cfg["folder"], cfg["prompts"], cfg["n"]
    tok = models.load_tokenizer(folder)
    tok.padding_side = "left"
    dataset = datasets.Dataset.from_dict({"prompt": [cfg["prompt_text"]] * (prompts * (cfg["max_steps"] + 1))})

    def reward(completions, **kwargs):  # a rule reward, as attnboard's: nearly free
        return [float(len(c) % 7 == 0) for c in completions]

    rows = prompts * n
    config = GRPOConfig(**_trl_common(cfg), temperature=1.0, top_p=1.0, max_completion_length=cfg["response_len"],
                        num_generations=n, per_device_train_batch_size=cfg["micro"],
                        gradient_accumulation_steps=rows // cfg["micro"], num_iterations=1, beta=0.0,
                        max_steps=cfg["max_steps"])
    model = models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa"))
    turns = Turns()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tok,
                          callbacks=[_trl_callback(turns, rows, cfg["response_len"])])
    trainer.train()


SIDES = {"attnboard": attnboard, "floor": floor, "trl-ppo": trl_ppo, "trl-grpo": trl_grpo}


def main() -> int:
    side, cfg = sys.argv[1], json.loads(sys.argv[2])
    try:
        SIDES[side](cfg)
    except ImportError as exc:
        say(event="unavailable", reason=f"{type(exc).__name__}: {exc}")
        return 0
    say(event="bye")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
