"""Which webhook URLs may be registered and which addresses webhooks may reach (§6): every
spelling of loopback, link-local and private addresses, refused unless allowed."""

from __future__ import annotations

import ipaddress
import re

import pytest

from rebuno.kernel.domain.webhook import (
    Targets,
    literal_address,
    parse_networks,
    url_problem,
)

SERVER = Targets()
DEV = Targets(loopback=True)


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/",
        "javascript:alert(1)",
        "http://",
        "http://host/a b",
        "http://host/\r\nX-Injected: 1",
        "http://host:99999/",
        "http://host/#fragment",
        "http://h/" + "x" * 100_000,
    ],
)
def test_a_url_that_is_no_webhook_is_refused(url: str) -> None:
    assert url_problem(url) is not None
    assert DEV.problem(url) is not None


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("169.254.169.254", "169.254.169.254"),
        ("agents.example.com", None),
    ],
)
def test_every_spelling_of_an_address_is_read_as_the_resolver_would(
    host: str, address: str | None
) -> None:
    found = literal_address(host)
    assert (str(found) if found else None) == address


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:5432/",
        "http://0x7f000001/hook",
        "http://2130706433/hook",
        "http://127.1/hook",
        "http://[::1]:8080/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://172.16.0.1/hook",
        "http://0.0.0.0/hook",
        "http://[fe80::1]/hook",
    ],
)
def test_a_server_refuses_special_addresses(url: str) -> None:
    assert SERVER.problem(url) is not None


def test_a_server_takes_public_addresses_and_names() -> None:
    assert SERVER.problem("https://93.184.216.34/hook") is None
    assert SERVER.problem("https://agents.example.com:8443/hook?x=1") is None


def test_dev_takes_loopback_but_not_link_local_or_private() -> None:
    assert DEV.problem("http://127.0.0.1:5001/webhook") is None
    assert DEV.problem("http://[::1]:5001/webhook") is None
    assert DEV.problem("http://169.254.169.254/") is not None
    assert DEV.problem("http://10.0.0.5/") is not None


def test_the_allow_list_names_the_networks_it_opens() -> None:
    targets = Targets(parse_networks("10.1.0.0/16, ::1/128"))

    assert targets.problem("http://10.1.2.3/hook") is None
    assert targets.problem("http://[::1]/hook") is None
    assert targets.problem("http://10.2.0.1/hook") is not None
    assert targets.problem("http://127.0.0.1/hook") is not None
    assert targets.refuses(ipaddress.ip_address("10.1.255.255")) is False


def test_a_bad_allow_list_names_the_bad_range() -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.0/33'")):
        parse_networks("127.0.0.0/8,10.0.0.0/33")
