"""The trace page in a real headless browser (Debian's chromium driven by Playwright): layout
facts a person would notice, checked on the rendered page, not on its source.

A 500-token answer is a paragraph, not 500 lines; the index lists and links every episode;
hovering a token shows its id and logprob; the prompt stays folded until opened; inserted tokens
are grey. The traces are a real proxy trace (tool call and result) and a 500-token prose answer
encoded with the tiny tokenizer (its logprobs made up: only the layout is under test here).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.traces import TOOL_OUTPUT, episode_record, tool_call_segments, write_run

from harness_gym.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs Debian's chromium (scripts/setup installs it as root: apt-get install chromium)",
)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="needs playwright: pip install 'harness-gym[test]'")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PARAGRAPH = (
    "The agent read the failing test, opened the module that builds the slug, and noticed that "
    "the function lowercases the title before it strips the accents, so a capital letter with "
    "an accent survives as two characters. It rewrote the order of the two steps, ran the "
    "tests again, and all of them passed, including the ones that had passed before the change. "
)
ANSWER_TOKENS = 500


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def tool_segments() -> list[dict[str, Any]]:
    return tool_call_segments()


def prose_segment() -> dict[str, Any]:
    from harness_gym.engines import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    ids = tokenizer.encode(PARAGRAPH * 8)[:ANSWER_TOKENS]
    assert len(ids) == ANSWER_TOKENS
    prompt = tokenizer.encode("Fix the slug bug. " * 200)  # a long prompt, folded away
    logprobs = [-(i % 7) * 0.4 for i in range(len(ids))]
    return {"role": "agent", "prompt_ids": prompt, "response_ids": ids,
            "loss_mask": [1] * len(ids), "response_logprobs": logprobs,
            "policy_version": 0, "policy_versions": [0], "n_calls": 1}


@pytest.fixture(scope="module")
def page_file(tool_segments, tmp_path_factory) -> Path:
    """Two runs: the 500-token prose answer, then two tool-call episodes."""
    folder = tmp_path_factory.mktemp("runs")
    first = write_run(folder / "episodes-1.jsonl",
                      [episode_record([prose_segment()], task_id="prose-500")])
    second = write_run(folder / "episodes-2.jsonl", [
        episode_record(tool_segments, task_id=f"tools-{i}", outcome="failed", reward=0.0)
        for i in range(2)])
    out = folder / "trace.html"
    assert main(["trace", str(first), str(second), "--html", str(out)]) == 0
    return out


@pytest.fixture
def page(browser, page_file) -> Iterator[Any]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_file.as_uri())
    yield page
    page.close()


def test_a_500_token_answer_flows_as_a_paragraph(page, tmp_path):
    answer = page.locator("#episode-0 .response")
    assert answer.locator(".t").count() == ANSWER_TOKENS
    line_height = answer.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
    height = answer.bounding_box()["height"]
    page.screenshot(path=str(tmp_path / "trace.png"), full_page=True)  # for a person, on failure
    # ~2,100 characters at ~115 a line: ~19 lines. One token a line would be 500.
    assert height < 40 * line_height, f"{height:.0f} px for {ANSWER_TOKENS} tokens"
    assert height < 700
    # and the whole episode, prompt folded, fits in about a screen
    assert page.locator("#episode-0").bounding_box()["height"] < 1000


def test_the_index_lists_every_episode_and_links_to_it(page):
    rows = page.locator("table.index tbody tr")
    assert rows.count() == 3
    tasks = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(3)]
    assert tasks == ["prose-500", "tools-0", "tools-1"]
    assert rows.nth(2).locator("td").nth(3).inner_text() == "failed"
    rows.nth(2).locator("a").first.click()
    page.wait_for_function("location.hash === '#episode-2'")
    top = page.locator("#episode-2").bounding_box()["y"]  # relative to the viewport
    assert page.evaluate("scrollY") > 0 and 0 <= top < 900  # scrolled into view


def test_hovering_a_token_shows_its_id_and_logprob(page):
    tip = page.locator("#tip")
    assert not tip.is_visible()
    token = page.locator("#episode-0 .response .t").nth(123)
    token.hover()
    assert tip.is_visible()
    token_id, logprob = token.get_attribute("data-i"), float(token.get_attribute("data-l"))
    assert logprob == pytest.approx(-(123 % 7) * 0.4)
    assert tip.inner_text() == (f"id {token_id} · logprob {logprob:.4f} · "
                                f"p {math.exp(logprob):.3f}")
    box, tip_box = token.bounding_box(), tip.bounding_box()
    assert abs(tip_box["y"] - (box["y"] + box["height"])) < 10  # right under the token


def test_the_prompt_stays_folded_until_opened(page):
    prompt = page.locator("#episode-0 details.prompt")
    body = prompt.locator("pre")
    assert not body.is_visible()
    assert "prompt (" in prompt.locator("summary").inner_text()
    prompt.locator("summary").click()
    assert body.is_visible() and "Fix the slug bug." in body.inner_text()


def test_inserted_tokens_are_grey_and_tool_calls_readable(page):
    inserted = page.locator("#episode-1 .inserted").first
    assert TOOL_OUTPUT in inserted.inner_text()
    color = inserted.evaluate("e => getComputedStyle(e).color")
    red, green, blue = (int(c) for c in color[color.index("(") + 1:-1].split(",")[:3])
    assert red == green == blue and 90 < red < 200  # grey, not black
    call = page.locator("#episode-1 .call").first
    assert '"command": "echo step0 > out0.txt"' in call.inner_text()
    inserted.hover()
    assert "loss_mask 0" in page.locator("#tip").inner_text()
