"""Issue 17's journeys (b), (c) and (f) as a newcomer walks them, in Debian's Chromium against ``attnboard
serve``'s app on the embedded default (its own data folder and local Ray head, real runs on the tiny CPU
preset; the ``server`` fixture of ``test_dashboard_browser``):

(b) paste the seed-style launch script (Hub model, ``$HOME`` data, vllm rollout, 8 GPUs, ``$@ 2>&1 | tee``)
    -> "Adapt to cpu" -> the first launch succeeds;
(c) strict FlashAttention 2 on a CPU -> Launch disabled beside the remedy -> one click -> succeeded on eager;
(f) the README's CI snippets (the CLI and the curl blocks of "CI over the REST API") run verbatim, on the
    YAML the form downloads.

Screenshots of the new-run form with its preflight at 1400 and 390 px go to ``tests/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.browser.support import ROOT, RUN_TIMEOUT_MS, Server, expect, reveal, run_id_of, served_as_readme_says

pytestmark = [pytest.mark.browser, pytest.mark.ray]

ACTOR_ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_ATTN = "critic.model.override_config.attn_implementation"
SCREENSHOTS = ROOT / "tests" / "screenshots"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``attnboard serve`` on a fresh data folder (SQLite there, the embedded Ray head) and a write token from
    ``attnboard token create``, as the README says."""
    data = tmp_path_factory.mktemp("journeys-ci")
    with served_as_readme_says(data, "ci") as srv:
        yield srv


SEED_STYLE = ROOT / "tests" / "fixtures" / "seed" / "seed_style_qwen.sh"
README = ROOT / "README.md"
ROLES = ("actor", "rollout", "reference", "critic")


def shots(page, name: str) -> None:
    """The page at 1400 and 390 px wide, whole, and its preview alone (the viewport is put back afterwards)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    for width in (1400, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
        if page.locator("#preflight").count():
            page.locator("#preview").screenshot(path=str(SCREENSHOTS / f"{name}-{width}-preview.png"))
    page.set_viewport_size(size)


def preflight_fits_its_box(page) -> None:
    """At 390 px nothing in the preflight panel sticks out of it (long keys and paths wrap). The form's own
    columns at that width are issue 17 item 4's (the form layout), not checked here."""
    page.set_viewport_size({"width": 390, "height": 900})
    wide = page.evaluate("""() => { const box = document.getElementById('preflight').getBoundingClientRect();
        return [...document.querySelectorAll('#preflight *')].filter(e => e.getBoundingClientRect().right > box.right + 1)
            .slice(0, 8).map(e => e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 40)); }""")
    page.set_viewport_size({"width": 1440, "height": 1000})
    assert wide == [], f"sticks out of the preflight panel at 390 px: {wide}"


def ci_blocks() -> list[str]:
    """The ```sh blocks of the README's "CI over the REST API" section, as written."""
    text = README.read_text()
    start = text.index("## CI over the REST API")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start:end], flags=re.DOTALL)


# --------------------------------------------------------------------------------------------
# (b) import -> adapt to target -> the first launch succeeds


def test_b_a_pasted_seed_style_script_adapted_to_cpu_succeeds_at_its_first_launch(page, server):
    page.goto(server.base + "/runs/new")
    page.click("details.import summary")
    page.fill("#verl-text", SEED_STYLE.read_text())
    page.click("#import-form button[type='submit']")
    page.wait_for_selector("#import-notes")
    panel = page.locator("#preflight")
    expect(panel).to_have_attribute("data-launch-blocked", "true")  # FA2 by default on a CPU, under strict
    expect(page.locator("#launch")).to_be_disabled()
    keys = panel.locator("li.finding").evaluate_all("items => items.map(li => li.dataset.key)")
    assert set(keys) >= {"trainer.device", "trainer.n_gpus_per_node", "actor_rollout_ref.model.path",
                         "critic.model.path", "data.train_files", ACTOR_ATTN, CRITIC_ATTN}, keys
    hub = panel.locator("li[data-key='actor_rollout_ref.model.path']")
    expect(hub).to_contain_text("Hugging Face Hub id")
    expect(hub.locator(".suggested code")).to_have_text("builtin:tiny-llama")
    expect(panel.locator("li[data-key='critic.model.path']")).to_contain_text("holds verl's default")
    expect(panel.locator("li[data-key='trainer.n_gpus_per_node'] .suggested code")).to_have_text("2")  # Ray has 2 CPUs
    shots(page, "journey-b-imported")
    preflight_fits_its_box(page)
    page.wait_for_load_state("networkidle")

    page.click("#adapt-to-target")
    page.wait_for_selector("#adapt-notes")
    expect(page.locator("#preflight .ok-line")).to_have_text("Nothing this launch would hit here.")
    expect(page.locator("#launch")).to_be_enabled()
    reveal(page, "trainer.device")
    assert page.input_value("select[name='trainer.device']") == "cpu"
    assert page.input_value("input[name='trainer.n_gpus_per_node']") == "2"
    shots(page, "journey-b-adapted")
    page.click("#launch")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    run_id = run_id_of(page)
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    runs = server.api("/api/runs?limit=100")["data"]
    assert [r["id"] for r in runs if r["name"] == "qwen_seed_style"] == [run_id]  # the first launch was the one
    for role in ROLES:
        expect(page.locator(f"#attention tr[data-role='{role}'][data-rank='0'] td.effective")).to_have_text(
            "eager → eager")
    assert page.dialogs == [] and page.console_errors == []


# --------------------------------------------------------------------------------------------
# (c) strict FA2 on CPU -> Launch disabled with the remedy -> one click -> succeeded with eager


def test_c_strict_flash_attention_on_cpu_is_fixed_in_one_click_and_succeeds_on_eager(page, server):
    page.goto(server.base + "/runs/new")
    page.fill("#f-name", "strict fa2 on cpu")
    for key in ("trainer.total_training_steps", ACTOR_ATTN, CRITIC_ATTN):
        reveal(page, key)
    page.fill("input[name='trainer.total_training_steps']", "2")
    page.select_option(f"select[name='{ACTOR_ATTN}']", "flash_attention_2")
    page.select_option(f"select[name='{CRITIC_ATTN}']", "flash_attention_2")
    expect(page.locator("#preflight")).to_have_attribute("data-launch-blocked", "true")
    expect(page.locator("#launch")).to_be_disabled()
    remedy = page.locator("#preflight .remedy")
    expect(remedy).to_contain_text("actor, rollout, reference, critic cannot run their attention here")
    expect(remedy.locator(".remedy-sentence")).to_contain_text(f"set {ACTOR_ATTN}=eager and {CRITIC_ATTN}=eager")
    page.wait_for_load_state("networkidle")  # the preview's last swap is in (a click on a swapped-out button is lost)
    shots(page, "journey-c-blocked")

    page.click("#apply-remedy")
    page.wait_for_selector("#adapt-notes")
    assert page.locator("#adapt-notes li").all_inner_texts() == [f"{ACTOR_ATTN} = eager", f"{CRITIC_ATTN} = eager"]
    assert page.input_value(f"select[name='{ACTOR_ATTN}']") == "eager"
    assert page.input_value(f"select[name='{CRITIC_ATTN}']") == "eager"
    assert page.input_value("#f-name") == "strict fa2 on cpu"  # nothing typed is lost
    expect(page.locator("#launch")).to_be_enabled()
    page.click("#launch")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    expect(page.locator("#status")).to_have_attribute("data-status", "succeeded", timeout=RUN_TIMEOUT_MS)
    for role in ROLES:
        expect(page.locator(f"#attention tr[data-role='{role}'][data-rank='0'] td.effective")).to_have_text(
            "eager → eager")
    assert page.dialogs == [] and page.console_errors == []


# --------------------------------------------------------------------------------------------
# (f) the README's CI snippets, verbatim


def test_f_the_readmes_ci_snippets_run_verbatim_on_the_forms_yaml(page, server, tmp_path: Path):
    blocks = ci_blocks()
    assert len(blocks) == 2 and blocks[0].startswith("attnboard submit") and "curl" in blocks[1]
    page.goto(server.base + "/runs/new")
    reveal(page, "trainer.total_training_steps")
    page.fill("input[name='trainer.total_training_steps']", "2")
    page.wait_for_load_state("networkidle")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download YAML").click()
    download.value.save_as(tmp_path / "nightly.yaml")

    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}", "ATTNBOARD_SERVER": server.base,
           "ATTNBOARD_TOKEN": server.token}
    for block in blocks:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_MS / 1000 + 60)
        assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "succeeded" and result["exit_code"] == 0
    assert [row["role"] for row in result["attention"]] == list(ROLES)
    curl_answer, _ = json.JSONDecoder().raw_decode(done.stdout)  # the curl block's jq '{status, attention}', then true
    assert curl_answer["status"] == "succeeded"
    assert [row["role"] for row in curl_answer["attention"]] == list(ROLES)
    assert set(curl_answer["attention"][0]) == set(result["attention"][0])  # one shape for the CLI and /wait

    page.goto(server.base + "/docs")  # the API's docs, from vendored assets only
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("attnboard", timeout=30_000)
    page.goto(server.base + "/redoc")
    expect(page.locator("h1").first).to_contain_text("attnboard", timeout=30_000)
    # ReDoc's "powered by" badge names an image on Redocly's CDN: the page's CSP blocks it, nothing leaves
    blocked = [e for e in page.console_errors if "cdn.redoc.ly" in e and "Content Security Policy" in e]
    assert [e for e in page.console_errors if e not in blocked] == []
