"""What a second rank costs: one PPO actor step (rollout, a log-prob forward, the update) of the engine's own
compute functions on FSDP2 over gloo, at a world of 1 and of 2, under ``torch.profiler``; per phase the wall
time and the time in gloo's collectives (all-gather, reduce-scatter, all-reduce) with their count.

    .venv/bin/python bench/profile_ranks.py [--shape full|quick] [--rows 16] [--response 64] [--threads 1]

No Ray: two processes (``torch.multiprocessing``) stand for the two rank actors, each with the layout
``RankWorker._wrap`` gives a CPU actor (one unit per decoder layer kept gathered from forward to backward, the
root). Prints a table per world size; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "full": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
             "num_key_value_heads": 2, "vocab_size": 8192},
    "quick": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512},
}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from worker.engine import compute

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[args.shape], use_sliding_window=False)
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config)
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows, p, r = args.rows // world, 64, args.response
    prompt = torch.randint(4, 80, (rows, p), generator=torch.Generator().manual_seed(rank))
    mask = torch.ones_like(prompt)
    settings = compute.ActorSettings(ppo_epochs=1, mini_batch=rows, micro_batch=min(8, rows), clip_ratio=0.2,
                                     entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl",
                                     grad_clip=1.0, temperature=1.0, on_policy=True)
    phases: dict[str, tuple[float, dict[str, list[float]]]] = {}

    def phase(name: str, fn):
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            result = fn()
            wall = time.perf_counter() - t0
        coll: dict[str, list[float]] = {}
        for e in prof.key_averages():  # gloo's own events: the wire time, counted once (FSDP's wrap them)
            if e.key.startswith("gloo:"):
                got = coll.setdefault(e.key, [0, 0.0])
                got[0] += e.count
                got[1] += e.cpu_time_total / 1e6
        phases[name] = (wall, coll)
        return result

    gen = phase("rollout", lambda: compute.generate(model, prompt, mask, max_new_tokens=r, eos_token_id=None,
                                                   pad_token_id=0, temperature=1.0, top_p=1.0, do_sample=True,
                                                   generator=torch.Generator().manual_seed(1),
                                                   sync_group=dist.group.WORLD if world > 1 else None))
    batch = {**compute.assemble(prompt, mask, gen["responses"], gen["response_mask"]), "responses": gen["responses"],
             "response_mask": gen["response_mask"], "advantages": torch.randn(rows, r)}
    with torch.no_grad():
        phase("log-prob forward", lambda: compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0,
                                                                with_entropy=True, remove_padding=True))
    phase("update", lambda: compute.update_actor(model, optimizer, batch, compute.NO_SP, settings, remove_padding=True))
    if rank == 0:
        lines = [f"world {world} ({args.threads} thread(s) per rank, {rows} rows per rank)", "",
                 "| phase | wall s | in collectives s | collectives (calls) |", "|---|---:|---:|---|"]
        for name, (wall, coll) in phases.items():
            total = sum(v[1] for v in coll.values())
            calls = ", ".join(f"{k} x{int(v[0])}" for k, v in sorted(coll.items()))
            lines.append(f"| {name} | {wall:.2f} | {total:.2f} | {calls or '-'} |")
        out.write_text("\n".join(lines) + "\n\n")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from worker.engine.rank import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="full")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    text = ""
    for world in (1, 2):
        part = Path(f"/tmp/profile-ranks-{os.getpid()}-{world}.md")
        mp.spawn(_rank, args=(world, free_port(), args, part), nprocs=world, join=True)
        text += part.read_text()
        part.unlink()
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
