"""Each family of advantage estimators trains end to end on CPU (2 ranks, the tiny Llama, builtin:count,
2 steps): a group estimator (rloo; opo, gpg, reinforce_plus_plus_baseline and grpo take the same path), the
discounted token returns of reinforce_plus_plus, and ReMax's greedy baseline rollout. Their formulas are
checked against verl's in tests/worker/ppo/test_advantage.py; here the engine feeds them and trains on them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.worker.engine.test_engine_runs import of, tiny_spec
from worker.engine import run_spec

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.mark.parametrize(("algo", "extra", "rollouts_per_step"), [
    ("rloo", {}, 1),
    ("reinforce_plus_plus", {"algorithm.gamma": 0.9}, 1),
    ("remax", {}, 2),  # the sampled rollout and the greedy baseline
])
def test_each_estimator_family_trains_end_to_end(local_ray, cache_dir, tmp_path, algo, extra, rollouts_per_step):
    spec = tiny_spec(algo=algo, steps=2, **{"trainer.save_freq": 2, **extra})
    events: list[dict] = []
    state = run_spec(spec, run_id=f"estimator-{algo}", on_event=events.append, cache_dir=cache_dir,
                     artefact_dir=tmp_path)
    assert state == "succeeded", of(events, "error")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {p["role"] for p in of(events, "attention")} == {"actor", "reference", "rollout"}  # no critic
    metrics = [p["values"] for p in of(events, "metric")]
    assert len(metrics) == 2
    for values in metrics:
        assert all(math.isfinite(v) for v in values.values()), values
        # the estimator told the tokens apart, so the policy loss has a gradient
        assert values["critic/advantages/max"] > values["critic/advantages/min"], values
        assert values["actor/pg_loss"] != 0.0
    saved = [p["checkpoint"] for p in of(events, "log") if "checkpoint" in p]
    meta = json.loads((Path(saved[-1]["path"]) / "checkpoint.json").read_text())
    assert meta["generations"] == 2 * rollouts_per_step  # each rank's generate calls over the 2 steps
