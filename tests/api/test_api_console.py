"""The console's part of the API (§40): the session cookie as a credential with its CSRF
token, the sign-in form, the list's id-range filters and the policy check; both stores."""

from __future__ import annotations

import httpx
import pytest

from rebuno.kernel.api.session import CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE, mint_csrf
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, TOKEN, assert_error

CSRF = mint_csrf(TOKEN.encode())


def listed(response: httpx.Response) -> list[str]:
    return [one["id"] for one in response.json()["executions"]]


def signed_in(anon: httpx.AsyncClient, csrf: str = CSRF) -> httpx.AsyncClient:
    anon.cookies.set(SESSION_COOKIE, TOKEN)
    anon.cookies.set(CSRF_COOKIE, csrf)
    return anon


async def test_the_session_cookie_reads_like_the_bearer_token(anon: httpx.AsyncClient) -> None:
    response = await signed_in(anon).get("/v0/executions")

    assert response.status_code == 200


async def test_a_wrong_session_cookie_is_unauthorized(anon: httpx.AsyncClient) -> None:
    anon.cookies.set(SESSION_COOKIE, TOKEN + "x")

    assert_error(await anon.get("/v0/executions"), 401, "unauthorized")


async def test_a_cookie_post_with_its_csrf_token_acts(
    anon: httpx.AsyncClient, execution: Execution
) -> None:
    response = await signed_in(anon).post(
        f"/v0/executions/{execution.id}/cancel",
        headers={CSRF_HEADER: CSRF, "Sec-Fetch-Site": "same-origin"},
    )

    assert response.status_code == 204


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no CSRF header at all
        {CSRF_HEADER: mint_csrf(TOKEN.encode())},  # another session's token
        {CSRF_HEADER: CSRF, "Sec-Fetch-Site": "cross-site"},
        {CSRF_HEADER: CSRF, "Origin": "http://attacker.test"},
    ],
)
async def test_a_cookie_post_without_its_csrf_token_is_forbidden(
    anon: httpx.AsyncClient, kernel: Kernel, execution: Execution, headers: dict[str, str]
) -> None:
    response = await signed_in(anon).post(f"/v0/executions/{execution.id}/cancel", headers=headers)

    assert_error(response, 403, "forbidden")
    assert (await kernel.get_execution(execution.id)).status.value == "pending"


async def test_a_csrf_token_not_made_with_the_session_token_is_forbidden(
    anon: httpx.AsyncClient, execution: Execution
) -> None:
    forged = "0" * 32 + "." + "0" * 64
    response = await signed_in(anon, forged).post(
        f"/v0/executions/{execution.id}/cancel", headers={CSRF_HEADER: forged}
    )

    assert_error(response, 403, "forbidden")


async def test_sign_in_sets_an_http_only_strict_cookie(anon: httpx.AsyncClient) -> None:
    response = await anon.post(
        "/ui/sign-in", content=f"token={TOKEN}", headers={"Sec-Fetch-Site": "same-origin"}
    )

    assert (response.status_code, response.headers["location"]) == (303, "/ui")
    cookies = response.headers.get_list("set-cookie")
    session = next(one for one in cookies if one.startswith(SESSION_COOKIE + "="))
    assert "HttpOnly" in session and "SameSite=strict" in session
    csrf = next(one for one in cookies if one.startswith(CSRF_COOKIE + "="))
    assert "HttpOnly" not in csrf and TOKEN not in csrf


async def test_sign_in_refuses_a_wrong_token_and_a_cross_site_post(
    anon: httpx.AsyncClient,
) -> None:
    wrong = await anon.post("/ui/sign-in", content="token=nope")
    cross = await anon.post(
        "/ui/sign-in", content=f"token={TOKEN}", headers={"Sec-Fetch-Site": "cross-site"}
    )

    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    assert TOKEN not in wrong.text + cross.text


async def test_the_console_page_needs_a_session_in_server_mode(anon: httpx.AsyncClient) -> None:
    before = await anon.get("/ui")
    after = await signed_in(anon).get("/ui")

    assert (before.status_code, before.headers["location"]) == (303, "/ui/sign-in")
    assert after.status_code == 200 and "Content-Security-Policy" in after.headers


async def test_the_list_filters_by_id_prefix_and_creation_time(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    made = [await kernel.create_execution(AGENT, "null", None) for _ in range(3)]
    target = made[1]

    by_prefix = await client.get("/v0/executions", params={"id_prefix": target.id[:36]})
    after = await client.get(
        "/v0/executions", params={"created_after": target.origin.created_at.isoformat()}
    )
    before = await client.get(
        "/v0/executions", params={"created_before": "2000-01-01T00:00:00+00:00"}
    )

    assert [one["id"] for one in by_prefix.json()["executions"]] == [target.id]
    assert target.id in listed(after) and made[2].id in listed(after)
    # Ids carry milliseconds: everything listed was created in or after target's millisecond.
    floor = target.origin.created_at.replace(
        microsecond=target.origin.created_at.microsecond // 1000 * 1000
    )
    assert all(one.origin.created_at >= floor for one in made if one.id in listed(after))
    assert before.json()["executions"] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"id_prefix": "xyz"}, "id_prefix"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_before": "2026-01-01T00:00:00"}, "UTC offset"),
    ],
)
async def test_bad_list_filters_are_400(
    client: httpx.AsyncClient, params: dict[str, str], message: str
) -> None:
    response = await client.get("/v0/executions", params=params)

    assert_error(response, 400, "validation_error")
    assert message in response.json()["message"]


async def test_the_policy_check_describes_and_tries_a_bundle_without_saving(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    bundle = (
        "rules:\n  - id: ask\n    when: {target: pay}\n"
        "    then: {decision: require_approval, approval_config: {approvers: [bo]}}\n"
    )
    response = await client.post(
        f"/v0/policies/{AGENT}/check",
        json={"bundle": bundle, "step": {"kind": "tool_call", "target": "pay", "args": {}}},
    )

    assert response.status_code == 200
    body = response.json()
    assert body["rules"][0]["id"] == "ask" and body["rules"][0]["when"] == {"target": "pay"}
    assert body["default_action"] == "deny"
    assert body["decision"]["action"] == "require_approval" and body["decision"]["approvers"] == [
        "bo"
    ]
    assert (await kernel.get_agent(AGENT)).policy_bundle is None


async def test_the_policy_check_refuses_an_invalid_bundle_with_the_loaders_message(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(f"/v0/policies/{AGENT}/check", json={"bundle": "rules: 3"})

    assert_error(response, 400, "validation_error")
    assert "must be a list, not an integer" in response.json()["message"]
