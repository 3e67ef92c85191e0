"""The provisioning manifest (§18.4): expansion, policy files, and the boot errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.manifest import AgentSpec, expand_env, load_manifest

BUNDLE = "default_action: deny\nrules: []\n"


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_manifest_lists_agents_with_their_settings(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "rebuno.yaml",
        "agents:\n"
        "  - id: researcher\n"
        "    webhook_url: http://localhost:5001/webhook\n"
        "    secret: abc\n"
        "    lease_timeout_seconds: 600\n"
        "  - id: writer\n"
        "    webhook_url: http://localhost:5002/webhook\n"
        "    secret: def\n",
    )
    assert load_manifest(manifest, env={}) == [
        AgentSpec("researcher", "http://localhost:5001/webhook", "abc", 600.0, None),
        AgentSpec("writer", "http://localhost:5002/webhook", "def", None, None),
    ]


def test_environment_is_expanded_before_yaml_parsing(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "rebuno.yaml",
        "agents:\n  - id: a\n    webhook_url: ${HOOK}\n    secret: $SECRET\n",
    )
    [spec] = load_manifest(manifest, env={"HOOK": "http://h/w", "SECRET": "s"})
    assert (spec.webhook_url, spec.secret) == ("http://h/w", "s")


def test_a_double_dollar_is_a_literal_dollar_and_a_lone_one_stays() -> None:
    assert expand_env("a $$HOME b $ c $1", {}) == "a $HOME b $ c $1"


@pytest.mark.parametrize("reference", ["${AGENT_SECRET}", "$AGENT_SECRET"])
def test_an_unset_variable_refuses_the_manifest_naming_it(tmp_path: Path, reference: str) -> None:
    manifest = write(
        tmp_path / "rebuno.yaml",
        f"agents:\n  - id: a\n    webhook_url: http://h/w\n    secret: {reference}\n",
    )
    with pytest.raises(ValidationFailed, match=r"line 4: environment variable AGENT_SECRET is not"):
        load_manifest(manifest, env={})


def test_policy_file_is_read_relative_to_the_manifest(tmp_path: Path) -> None:
    write(tmp_path / "conf" / "policies" / "research.yaml", BUNDLE)
    manifest = write(
        tmp_path / "conf" / "rebuno.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n"
        "    policy_file: policies/research.yaml\n",
    )
    [spec] = load_manifest(manifest, env={})
    assert spec.policy_bundle == BUNDLE


def test_policy_file_contents_are_not_expanded(tmp_path: Path) -> None:
    text = "# costs $HOME\ndefault_action: deny\nrules: []\n"
    write(tmp_path / "p.yaml", text)
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n    policy_file: p.yaml\n",
    )
    [spec] = load_manifest(manifest, env={"HOME": "/root"})
    assert spec.policy_bundle == text


def test_inline_policy_is_kept_as_text(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n    policy: |\n"
        "      default_action: deny\n      rules: []\n",
    )
    [spec] = load_manifest(manifest, env={})
    assert spec.policy_bundle == BUNDLE


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("  - webhook_url: http://h\n    secret: s\n", "agents[0]: id is required"),
        ("  - id: a\n    secret: s\n", "agents[0]: webhook_url is required"),
        (
            "  - id: a\n    webhook_url: http://h\n    secret: s\n    policy: x\n"
            "    policy_file: p.yaml\n",
            "agents[0]: set either policy or policy_file, not both",
        ),
        (
            "  - id: a\n    webhook_url: http://h\n    secret: s\n    lease_timeout_seconds: -1\n",
            "agents[0]: lease_timeout_seconds must be a finite number of seconds above 0",
        ),
    ],
)
def test_bad_entry_names_its_index(tmp_path: Path, entry: str, message: str) -> None:
    manifest = write(tmp_path / "m.yaml", "agents:\n" + entry)
    with pytest.raises(ValidationFailed) as caught:
        load_manifest(manifest, env={})
    assert caught.value.message == message


def test_second_entry_without_id_is_reported_with_its_index(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n  - secret: s\n",
    )
    with pytest.raises(ValidationFailed, match=r"^agents\[1\]: id is required$"):
        load_manifest(manifest, env={})


def test_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationFailed, match="cannot read manifest"):
        load_manifest(str(tmp_path / "absent.yaml"), env={})


def test_bad_yaml_is_an_error(tmp_path: Path) -> None:
    manifest = write(tmp_path / "m.yaml", "agents: [\n")
    with pytest.raises(ValidationFailed, match="invalid YAML"):
        load_manifest(manifest, env={})


def test_unreadable_policy_file_is_an_error(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n"
        "    policy_file: nope.yaml\n",
    )
    with pytest.raises(ValidationFailed, match=r"agents\[0\]: cannot read policy_file"):
        load_manifest(manifest, env={})


def test_invalid_bundle_is_an_error(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n    policy: 'rules: 5'\n",
    )
    with pytest.raises(ValidationFailed, match=r"agents\[0\]: invalid policy: "):
        load_manifest(manifest, env={})


def test_empty_manifest_provisions_nothing(tmp_path: Path) -> None:
    assert load_manifest(write(tmp_path / "m.yaml", ""), env={}) == []
