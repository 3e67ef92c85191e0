"""The console in `rebuno dev`, in a real browser: the inbox, timelines, live output, cancel,
the executions list and the policy editor, each against real agent processes."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from tests.cli.conftest import Stack
from tests.cli.harness import SECRET
from tests.console.conftest import create, document, execution, wait_for_status

# One worker runs them all: one browser and one kernel of each mode, not one per worker.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90), pytest.mark.xdist_group("console")]


def decide(page: Page, execution_id: str, verb: str, rationale: str = "") -> None:
    """Grants or denies the inbox card of the execution's approval, as `alice`."""
    card = page.locator(
        "article.pending", has=page.locator(f'a[href="#/executions/{execution_id}"]')
    )
    expect(card).to_be_visible()
    page.fill("#approver", "alice")
    if rationale:
        card.locator("textarea").fill(rationale)
    card.locator(f"button.{verb}").click()
    page.click("#confirm-yes")
    expect(card.locator(".outcome")).to_contain_text("granted" if verb == "grant" else "denied")


def test_root_redirects_to_the_console(dev: Stack) -> None:
    response = httpx.get(f"{dev.url}/", timeout=5)

    assert (response.status_code, response.headers["location"]) == (302, "/ui")
    assert f"rebuno console at {dev.url}/ui" in dev.kernel.output()


def test_an_approval_arrives_live_is_granted_and_the_timeline_shows_it(
    dev: Stack, page: Page
) -> None:
    page.goto(f"{dev.url}/ui#/approvals")
    expect(page.locator("#live")).to_have_text("live")

    execution_id = create(dev, "gated", {"command": "ls"})

    card = page.locator(
        "article.pending", has=page.locator(f'a[href="#/executions/{execution_id}"]')
    )
    expect(card).to_contain_text("shell_exec")
    expect(card).to_contain_text("run a shell command?")
    expect(card).to_contain_text("review-shell")
    expect(page.locator("#approval-count")).not_to_have_text("0")
    document(page, "console-inbox")
    decide(page, execution_id, "grant")
    page.goto(f"{dev.url}/ui#/executions/{execution_id}")
    expect(page.locator("h1 .badge")).to_have_text("completed")
    step = page.locator("ol.timeline > li", has_text="shell_exec")
    expect(step).to_contain_text("succeeded")
    expect(step.locator(".approval-outcome")).to_contain_text("granted by alice")
    expect(step).to_contain_text("require_approval rule review-shell")
    document(page, "console-timeline")


def test_a_denial_with_a_rationale_reaches_the_handler(dev: Stack, page: Page) -> None:
    execution_id = create(dev, "gated", {"command": "rm -rf /"})
    page.goto(f"{dev.url}/ui#/approvals")

    decide(page, execution_id, "deny", "too risky")

    done = wait_for_status(dev, execution_id, "completed")
    assert "too risky" in done["output"]["ran"]


def _pending_card(dev: Stack, page: Page, execution_id: str) -> tuple[Locator, str]:
    page.goto(f"{dev.url}/ui#/approvals")
    card = page.locator(
        "article.pending", has=page.locator(f'a[href="#/executions/{execution_id}"]')
    )
    expect(card).to_be_visible()
    return card, str(card.get_attribute("data-approval"))


def _deny_elsewhere(dev: Stack, approval: str) -> None:
    httpx.post(
        f"{dev.url}/v0/approvals/{approval}/deny", json={"decided_by": "alice"}, timeout=5
    ).raise_for_status()


def test_an_approval_decided_elsewhere_shows_that_outcome_live(dev: Stack, page: Page) -> None:
    card, approval = _pending_card(dev, page, create(dev, "gated", {"command": "pwd"}))

    _deny_elsewhere(dev, approval)

    expect(card.locator(".result")).to_contain_text("Already resolved")
    expect(card.locator(".outcome")).to_contain_text("denied by alice")
    expect(card.locator("button.grant")).to_have_count(0)


def test_a_grant_that_comes_too_late_shows_the_outcome_not_an_error(dev: Stack, page: Page) -> None:
    page.route("**/v0/activity", lambda route: route.abort())  # no live news: the race
    card, approval = _pending_card(dev, page, create(dev, "gated", {"command": "date"}))
    _deny_elsewhere(dev, approval)

    page.fill("#approver", "alice")
    card.locator("button.grant").click()
    page.click("#confirm-yes")

    expect(card.locator(".result")).to_contain_text("Already resolved")
    expect(card.locator(".outcome")).to_contain_text("denied by alice")
    expect(page.locator("[role=alert]")).to_have_count(0)


def test_the_live_stream_shows_the_deltas_in_order(dev: Stack, page: Page) -> None:
    execution_id = create(dev, "streamer", None)
    page.goto(f"{dev.url}/ui#/executions/{execution_id}")
    live = page.locator("pre.live-output")

    expect(live).to_contain_text("tick5 ")

    text = live.inner_text()
    ticks = text.split()
    first = int(ticks[0].removeprefix("tick"))
    assert ticks == [f"tick{n}" for n in range(first, first + len(ticks))]
    dev.open_gate()
    expect(page.locator("h1 .badge")).to_have_text("completed")


def test_cancel_asks_first_then_ends_the_execution(dev: Stack, page: Page) -> None:
    execution_id = create(dev, "gated", {"command": "whoami"})
    wait_for_status(dev, execution_id, "blocked")
    page.goto(f"{dev.url}/ui#/executions/{execution_id}")

    page.click("#cancel")
    page.click("#confirm-no")
    assert execution(dev, execution_id)["status"] == "blocked"
    page.click("#cancel")
    page.click("#confirm-yes")

    expect(page.locator("h1 .badge")).to_have_text("cancelled")
    assert execution(dev, execution_id)["status"] == "cancelled"


def test_the_executions_list_shows_a_new_execution_and_its_end_without_reload(
    dev: Stack, page: Page
) -> None:
    page.goto(f"{dev.url}/ui#/executions?agent_id=greeter")
    expect(page.locator("#live")).to_have_text("live")

    execution_id = create(dev, "greeter", {"name": "ada"})

    row = page.locator(f'tr[data-id="{execution_id}"]')
    expect(row.locator(".badge")).to_have_text("completed")
    document(page, "console-executions")
    page.fill("#f-id", execution_id[:23])
    page.click("form.filters button[type=submit]")
    expect(page.locator("table.executions tbody tr")).to_have_count(1)


def test_the_policy_editor_refuses_an_invalid_bundle_and_saves_a_valid_one(
    dev: Stack, page: Page
) -> None:
    page.goto(f"{dev.url}/ui#/agents/greeter/policy")
    expect(page.locator("#current")).to_contain_text("every step is allowed")

    page.fill("#bundle", "rules: 3\n")
    page.click("#validate")
    expect(page.locator("#verdict .invalid")).to_contain_text("must be a list, not an integer")

    bundle = (
        "rules:\n  - id: shout-freely\n    when: {target: shout}\n    then: {decision: allow}\n"
    )
    page.fill("#bundle", bundle + "default_action: allow\n")
    page.click("#validate")
    expect(page.locator("#diff .add").first).to_contain_text("+ rules:")
    page.fill("#try-target", "shout")
    page.click("#try")
    expect(page.locator("#tried")).to_contain_text("allow by rule shout-freely")
    document(page, "console-policy")
    page.click("#save")
    page.click("#confirm-yes")

    expect(page.locator("#verdict .saved")).to_be_visible()
    expect(page.locator("#current")).to_contain_text("shout-freely")
    agent = httpx.get(f"{dev.url}/v0/agents/greeter", timeout=5).json()
    assert agent["policy_bundle"] == bundle + "default_action: allow\n"


def test_the_create_form_refuses_input_that_is_not_json(dev: Stack, page: Page) -> None:
    page.goto(f"{dev.url}/ui#/new?agent=greeter")

    page.fill("#input", "{name: ada}")
    expect(page.locator("#input-problem")).to_contain_text("not JSON")
    expect(page.locator("form.create button[type=submit]")).to_be_disabled()
    page.fill("#input", '{"name": "ada"}')
    page.click("form.create button[type=submit]")

    expect(page.locator("h1 .badge")).to_have_text("completed")
    assert "greeter" in page.locator("main").inner_text()


def test_a_phone_width_screen_stacks_the_list_and_the_keyboard_reaches_the_pages(
    dev: Stack, page: Page
) -> None:
    create(dev, "greeter", {"name": "bo"})
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{dev.url}/ui#/executions")

    row = page.locator("table.executions tbody tr").first
    expect(row).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    for _ in range(6):  # the skip link, the brand, then the navigation in order
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.nav") == "approvals":
            break
    page.keyboard.press("Enter")
    expect(page.locator("main h1")).to_have_text("Approvals")


def test_forking_from_an_event_opens_the_fork_linked_to_its_source(dev: Stack, page: Page) -> None:
    source = create(dev, "greeter", {"name": "cy"})
    wait_for_status(dev, source, "completed")
    page.goto(f"{dev.url}/ui#/executions/{source}")

    page.locator('tr[data-seq="2"] button.fork').click()
    page.click("#confirm-yes")

    expect(page).not_to_have_url(re.compile(source))
    expect(page.locator("section.lineage")).to_contain_text("Forked from")
    expect(page.locator(f'section.lineage a[href="#/executions/{source}"]')).to_be_visible()
    expect(page.locator("h1 .badge")).to_have_text("completed")


def test_a_new_fork_joins_the_lineage_tree_live_and_its_link_leads_back(
    dev: Stack, page: Page
) -> None:
    source = create(dev, "greeter", {"name": "ed"})
    wait_for_status(dev, source, "completed")
    page.goto(f"{dev.url}/ui#/executions/{source}")
    expect(page.locator("#live")).to_have_text("live")
    expect(page.locator("h1 .badge")).to_have_text("completed")

    response = httpx.post(f"{dev.url}/v0/executions/{source}/fork", json={"at_seq": 1}, timeout=5)
    response.raise_for_status()
    fork = response.json()["id"]

    node = page.locator(f'section.lineage li.self li[data-id="{fork}"]')
    expect(node).to_contain_text("Fork")
    expect(node).to_contain_text("at event 1")
    expect(node.locator(".badge")).to_have_text("completed")
    node.locator(f'a[href="#/executions/{fork}"]').click()

    expect(page.locator("h1")).to_contain_text(fork)
    up = page.locator(f'section.lineage li[data-id="{source}"]')
    expect(up).to_contain_text("Forked from")
    expect(up.locator(".badge")).to_have_text("completed")


def test_the_agents_page_shows_webhooks_and_never_the_secret(dev: Stack, page: Page) -> None:
    page.goto(f"{dev.url}/ui#/agents")
    row = page.locator('tr[data-agent="gated"]')
    expect(row).to_contain_text("/webhook")
    row.locator("a").first.click()

    expect(page.locator("main h1")).to_contain_text("gated")
    expect(page.locator("main")).to_contain_text("Recent executions")
    assert SECRET not in page.content()


def test_the_overview_counts_executions_and_charts_the_last_hour(dev: Stack, page: Page) -> None:
    wait_for_status(dev, create(dev, "greeter", {"name": "di"}), "completed")
    page.goto(f"{dev.url}/ui#/")

    expect(page.locator('[data-tile="completed"] .value')).not_to_have_text("0")
    expect(page.locator("svg.chart rect")).to_have_count(60)
    expect(page.locator('[data-tile="queue depth"]')).to_be_visible()
