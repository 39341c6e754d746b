"""The device check runs, first on CPU: its smoke form, as a subprocess where pydantic and Ray cannot be
imported (as on the device machine, which has neither), writing its report to a temporary path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("pydantic", "pydantic_core", "pydantic_settings", "ray")
RUN_WITHOUT = f"""
import runpy, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"No module named {{name!r}} (not installed on the device machine)")
sys.meta_path.insert(0, Absent())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the table under ``## heading``, as cells."""
    section = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_device_check_runs_on_cpu_without_pydantic_or_ray(tmp_path):
    out = tmp_path / "device.md"
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT, str(ROOT / "bench" / "device_check.py"), "--device", "cpu",
                           "--preset", "tiny", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "- machine: " in report and "device cpu" in report and "SDPA backends that run here: flash_attention, math" in report

    kernels = {(r[0], r[1]): r for r in rows(report, "What ran, per role")}
    for impl in ("eager", "sdpa"):
        for role in ("actor", "rollout", "reference", "critic"):
            row = kernels[(impl, role)]
            assert row[2] == impl and row[3].startswith(f"{impl} ({impl} ×")  # loaded and called what was asked
            held = "bfloat16" if role == "reference" else "float32"
            assert row[6] == f"bfloat16 / {held}"
    assert kernels[("sdpa", "actor")][4] == "flash_attention (`aten::_scaled_dot_product_flash_attention_for_cpu`)"
    assert kernels[("eager", "actor")][4] == "—"  # eager calls no SDPA
    for impl in ("flash_attention_2", "flash_attention_3"):
        assert kernels[(impl, "all")][2] == "skipped" and kernels[(impl, "all")][5] == f"{impl} runs on CUDA only"

    units = {(r[0], int(r[1])): r for r in rows(report, "Throughput and peak memory")}
    assert set(units) == {(impl, seq) for impl in ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
                          for seq in (32, 64)}
    for impl in ("eager", "sdpa"):
        for seq in (32, 64):
            row = units[(impl, seq)]
            assert row[6] == "ok" and len(row[3].split(", ")) == 3  # three PPO steps timed
            assert float(row[4].replace(",", "")) > 0 and row[5].endswith(" MB")

    parity = {r[0]: r for r in rows(report, "Parity with eager (same weights, 2 x 32 random ids, bfloat16)")}
    assert float(parity["eager"][1]) == 0
    assert 0 < float(parity["sdpa"][1]) < 0.1  # bf16 rounding between two kernels, not a different model
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in parity["sdpa"][2]
