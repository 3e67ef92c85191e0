"""The console in `rebuno server`, in a real browser: the sign-in refuses a wrong token and a
form posted from another site; signed in, the token stays out of pages, URLs and logs, and
the console acts through the cookie with its CSRF token."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, Route, expect

from tests.cli.conftest import Stack
from tests.console.conftest import TOKEN, create, execution

# One worker runs them all: one browser and one kernel of each mode, not one per worker.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90), pytest.mark.xdist_group("console")]
ATTACKER = "http://attacker.test/"


def attacker_page(page: Page, action: str, fields: dict[str, str]) -> None:
    """Another site, whose page posts a form to `action` as soon as it loads."""
    inputs = "".join(f'<input name="{name}" value="{value}">' for name, value in fields.items())
    html = (
        f'<form id="f" method="post" action="{action}">{inputs}</form>'
        '<script>document.getElementById("f").submit()</script>'
    )

    def serve(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html", body=html)

    page.route(ATTACKER, serve)


def sign_in(page: Page, server: Stack, token: str) -> None:
    page.goto(f"{server.url}/ui")
    expect(page).to_have_url(f"{server.url}/ui/sign-in")
    page.fill("#token", token)
    page.click("button[type=submit]")


def test_sign_in_refuses_a_wrong_token(server: Stack, page: Page) -> None:
    sign_in(page, server, "not-the-token")

    expect(page.locator(".error")).to_have_text("That token is not accepted.")
    assert page.context.cookies() == []


def test_sign_in_refuses_a_form_posted_from_another_site(server: Stack, page: Page) -> None:
    attacker_page(page, f"{server.url}/ui/sign-in", {"token": TOKEN})

    page.goto(ATTACKER)

    expect(page.locator(".error")).to_contain_text("posted from another site")
    assert page.context.cookies() == []


def test_signed_in_the_console_acts_and_the_token_shows_nowhere(server: Stack, page: Page) -> None:
    execution_id = create(server, "gated", {"command": "ls"}, token=TOKEN)
    sign_in(page, server, TOKEN)
    expect(page.locator("#live")).to_have_text("live")

    session = next(one for one in page.context.cookies() if one["name"] == "rebuno_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    page.goto(f"{server.url}/ui#/approvals")
    card = page.locator(
        "article.pending", has=page.locator(f'a[href="#/executions/{execution_id}"]')
    )
    page.fill("#approver", "alice")
    card.locator("button.grant").click()
    page.click("#confirm-yes")
    expect(card.locator(".outcome")).to_contain_text("granted by alice")

    assert TOKEN not in page.content() + page.url
    assert TOKEN not in page.evaluate("document.cookie")
    assert TOKEN not in server.kernel.output()


def test_a_form_posted_from_another_site_does_not_act_for_a_signed_in_browser(
    server: Stack, page: Page
) -> None:
    execution_id = create(server, "gated", {"command": "pwd"}, token=TOKEN)
    sign_in(page, server, TOKEN)
    expect(page.locator("#live")).to_have_text("live")
    attacker_page(page, f"{server.url}/v0/executions/{execution_id}/cancel", {"x": "1"})

    page.goto(ATTACKER)

    expect(page.locator("body")).to_contain_text("unauthorized")
    assert execution(server, execution_id, TOKEN)["status"] != "cancelled"
