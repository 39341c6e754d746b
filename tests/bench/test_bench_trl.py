"""bench_trl.py's ``--groups``: a subset runs, and the result file says "not run" for every group left out (here
only packing runs, in quick form: no TRL venv is needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_trl.py"


def section(markdown: str, heading: str) -> str:
    return markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def test_a_subset_of_groups_runs_and_the_others_say_not_run(tmp_path):
    out = tmp_path / "trl.md"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--groups", "packing", "--work", str(tmp_path),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "- command: `.venv/bin/python bench/bench_trl.py --quick --groups packing`" in report
    for heading in ("PPO (gae), 2 core(s)", "GRPO (n=4), 2 core(s)", "How attnboard's PPO step grows (1 rank x 2 threads)"):
        assert section(report, heading).strip() == "not run (not in --groups packing)", heading
    for heading in ("PPO (gae), 1 core(s)", "GRPO (n=4), 1 core(s)"):
        assert section(report, heading).strip() == "not run (--quick runs the 2-core groups only)", heading
    ratios = section(report, "Ratios at 2 cores (medians)")
    assert "- PPO (gae): not run (not in --groups packing)" in ratios
    assert "- GRPO (n=4): not run (not in --groups packing)" in ratios
    packed = [line for line in section(report, "Packed").splitlines() if line.startswith("| sdpa") or line.startswith("| eager")]
    assert [line.split("|")[1:3] for line in packed] == [[" sdpa ", " padded "], [" sdpa ", " packed "],
                                                         [" eager ", " padded "], [" eager ", " packed "]]


def test_an_unknown_group_is_refused_naming_the_value_and_the_valid_ones():
    done = subprocess.run([sys.executable, str(BENCH), "--groups", "ppo2,ppo3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert ("--groups 'ppo2,ppo3': no group 'ppo3'; valid: a comma-separated subset of ppo1, ppo2, grpo1, grpo2, "
            "growth, packing") in done.stderr
