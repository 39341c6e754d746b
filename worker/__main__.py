"""``python -m worker run SPEC.yaml|json [--save-actor DIR] [--resume DIR] [--json]``: run a spec without the app.

Starts a local Ray on 127.0.0.1 (or joins ``RAY_ADDRESS`` when set), shows a progress bar and the
attention table per role, or prints every event as one JSON line with ``--json``. Exit status: 0
succeeded, 1 failed, 2 invalid spec or arguments, 3 cancelled (Ctrl-C).

Checkpoints go where verl puts them: ``trainer.default_local_dir`` (relative: under the working folder,
``--artefact-dir`` to choose another), every ``trainer.save_freq`` steps. ``--resume DIR`` resumes from
a ``global_step_N`` folder or the newest complete checkpoint in a folder of them (verl's
``trainer.resume_mode=resume_path``); with ``resume_mode=auto`` (verl's default) a run resumes from the
newest one in its own folder by itself. A rank that dies restarts the run from its newest checkpoint
(``attnboard.max_restarts`` times).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from worker.core import roles
from worker.core.attention_payload import SUMMARY_FIELDS, cell
from worker.core.contract import TERMINAL

EXIT = {"succeeded": 0, "failed": 1, "cancelled": 3}


def _load_spec(path: str, resume: str | None = None):
    """A spec file (YAML, JSON or a verl command line) -> (RunSpec, warnings); ``resume``: a checkpoint
    (``global_step_N``) or a folder of them, set as ``trainer.resume_mode=resume_path``."""
    from worker.interop.specfile import load_spec_file
    from worker.spec import parse_spec, spec_to_tree

    result = load_spec_file(path)
    spec = result.spec
    if resume is not None:
        tree = spec_to_tree(spec)
        tree["trainer"].update(resume_mode="resume_path", resume_from_path=str(Path(resume).expanduser().resolve()))
        spec = parse_spec(tree)
    return spec, result.warnings


class _Console:
    """Progress bar + attention table (rich) for people; JSON lines for machines."""

    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.attention: dict[tuple[str, int], dict[str, Any]] = {}
        if not as_json:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.console = Console(stderr=False)
            self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console)
            self.task = None

    def __call__(self, event: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(event, default=str), flush=True)
            return
        from rich.markup import escape

        kind, p = event["kind"], event["payload"]
        if kind == "status":
            if p["state"] == "running" and self.task is None:
                self.progress.start()
                self.task = self.progress.add_task("PPO", total=p.get("total_steps"), info="")
            if p["state"] in TERMINAL:
                self.close()
                self._print_attention()
            self.console.print(f"[cyan]status[/] {p['state']}: {escape(str(p.get('reason', '')))}")
        elif kind == "attention":
            self.attention[(p["role"], p["rank"])] = p
        elif kind == "fallback":
            self.console.print(f"[yellow]fallback[/] {escape(p['role'])} rank {p['rank']}: {p['from']} -> {p['to']} "
                               f"({escape(p['error'])})")
        elif kind == "attention_mismatch":
            self.console.print(f"[red]mismatch[/] {escape(p['message'])}")
        elif kind == "error":
            self.console.print(f"[red]error[/] {escape(p['message'])}")
        elif kind == "restart":
            self.console.print(f"[yellow]restart[/] {escape(p['message'])}")
        elif kind == "metric" and self.task is not None:
            v = p["values"]
            kl = f"  kl {v['actor/kl']:.4f}" if "actor/kl" in v else ""  # only where a KL term ran the reference
            info = f"score {v.get('critic/score/mean', 0):.3f}{kl}  {v.get('perf/tokens_per_s', 0):.0f} tok/s"
            self.progress.update(self.task, completed=p["step"], info=info)

    def _print_attention(self) -> None:
        from rich.table import Table

        if not self.attention:
            return
        table = Table(title="attention per role and rank")
        for col in SUMMARY_FIELDS:
            table.add_column(col.replace("_", " "))
        for _, p in sorted(self.attention.items(), key=lambda item: (roles.order(item[0][0]), item[0][1])):
            table.add_row(*(cell(p, name) for name in SUMMARY_FIELDS))
        self.console.print(table)

    def close(self) -> None:
        if not self.as_json and self.task is not None:
            self.progress.stop()
            self.task = None


def _run(args: argparse.Namespace) -> int:
    import ray

    from worker.engine import models
    from worker.engine.events import EventLog, RunState
    from worker.engine.trainer import RunOptions, Trainer
    from worker.interop.verl import VerlImportError
    from worker.spec import SpecError

    try:
        spec, warnings = _load_spec(args.spec, args.resume)
    except SpecError as exc:
        for issue in exc.issues:
            print(f"{args.spec}: {issue.field}: {issue.message}", file=sys.stderr)
        return 2
    except (VerlImportError, OSError) as exc:
        print(f"{args.spec}: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    run_id = args.run_id or uuid.uuid4().hex[:12]
    console = _Console(args.json)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    log = EventLog(run_id, console)
    log.status(RunState.queued, "submitted from the command line")
    trainer = Trainer(spec, log=log, options=RunOptions(
        model_roots=models.model_roots_from_env(os.environ.get("ATTNBOARD_MODEL_ROOTS")),
        cache_dir=Path(args.cache_dir) if args.cache_dir else models.default_cache_dir(),
        save_actor_to=Path(args.save_actor) if args.save_actor else None,
        artefact_dir=Path(args.artefact_dir).resolve() if args.artefact_dir else Path.cwd()))
    try:
        state = trainer.run()
    except KeyboardInterrupt:
        trainer.cancel("interrupted (Ctrl-C)")
        state = "cancelled"
    finally:
        console.close()
        ray.shutdown()
    return EXIT.get(state, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description="Run an attnboard spec without the app.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a spec file (YAML or JSON)")
    run.add_argument("spec", help="the spec file: .yaml, .yml or .json")
    run.add_argument("--save-actor", metavar="DIR", help="save the final actor as a Hugging Face folder")
    run.add_argument("--resume", metavar="DIR", help="resume from a checkpoint: a global_step_N folder, or a folder "
                                                     "of them (its newest complete one)")
    run.add_argument("--artefact-dir", metavar="DIR",
                     help="where a relative trainer.default_local_dir goes (default: the working folder, as verl)")
    run.add_argument("--json", action="store_true", help="print every event as a JSON line")
    run.add_argument("--run-id", help="the run id (default: random)")
    run.add_argument("--cache-dir", help="where built-in models are materialised")
    args = parser.parse_args(argv)
    if not Path(args.spec).is_file():
        print(f"spec file {args.spec!r} does not exist", file=sys.stderr)
        return 2
    if args.resume is not None and not Path(args.resume).expanduser().is_dir():
        print(f"--resume {args.resume!r}: no such folder; give a global_step_N folder or a folder of them",
              file=sys.stderr)
        return 2
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
