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


def refusal_of(manifest: str) -> str:
    with pytest.raises(ValidationFailed) as caught:
        load_manifest(manifest, env={})
    return caught.value.message


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("  - webhook_url: http://h\n    secret: s\n", "line 2: agents[0]: id is required"),
        ("  - id: a\n    secret: s\n", "line 2: agents[0]: webhook_url is required"),
        (
            "  - id: a\n    webhook_url: ''\n    secret: s\n",
            "line 3: agents[0]: webhook_url is required",
        ),
        (
            "  - id: a\n    webhook_url: http://h\n    secret: s\n    policy: x\n"
            "    policy_file: p.yaml\n",
            "line 2: agents[0]: set either policy or policy_file, not both",
        ),
        (
            "  - id: a\n    webhook_url: http://h\n    secret: s\n    lease_timeout_seconds: -1\n",
            "line 5: agents[0]: lease_timeout_seconds must be a finite number of seconds above 0",
        ),
    ],
)
def test_bad_entry_names_the_file_its_line_and_its_index(
    tmp_path: Path, entry: str, message: str
) -> None:
    manifest = write(tmp_path / "m.yaml", "agents:\n" + entry)

    assert refusal_of(manifest) == f"manifest {manifest}, {message}"


def test_second_entry_without_id_is_reported_with_its_index(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n  - secret: s\n",
    )

    assert refusal_of(manifest) == f"manifest {manifest}, line 5: agents[1]: id is required"


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
    assert refusal_of(manifest) == (
        f"manifest {manifest}, line 5: agents[0]: cannot read policy_file "
        f"{tmp_path / 'nope.yaml'}: No such file or directory"
    )


def test_invalid_bundle_is_an_error(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.yaml",
        "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n    policy: 'rules: 5'\n",
    )
    assert refusal_of(manifest) == (
        f"manifest {manifest}, line 5: agents[0].policy: field 'rules': must be a list, "
        "not an integer"
    )


def test_empty_manifest_provisions_nothing(tmp_path: Path) -> None:
    assert load_manifest(write(tmp_path / "m.yaml", ""), env={}) == []


# Unknown keys are refused, never ignored: a misspelt `policy` would boot the agent unrestricted.

AGENT = "agents:\n  - id: a\n    webhook_url: http://h\n    secret: s\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "agent:\n  - id: a\n",
            "line 1: agent: unknown key (did you mean agents?)",
        ),
        (
            AGENT + "version: 2\n",
            "line 5: version: unknown key (known keys: agents)",
        ),
        (
            AGENT + "    polcy: |\n      default_action: deny\n",
            "line 5: agents[0].polcy: unknown key (did you mean policy?)",
        ),
        (
            AGENT + "    lease_timout_seconds: 600\n",
            "line 5: agents[0].lease_timout_seconds: unknown key "
            "(did you mean lease_timeout_seconds?)",
        ),
        (
            AGENT + "    policy_files: p.yaml\n",
            "line 5: agents[0].policy_files: unknown key (did you mean policy_file?)",
        ),
        (
            AGENT + "    owner: alice\n",
            "line 5: agents[0].owner: unknown key (known keys: id, webhook_url, secret, "
            "lease_timeout_seconds, policy, policy_file)",
        ),
        (
            AGENT + "    42: x\n",
            "line 5: agents[0].42: unknown key (known keys: id, webhook_url, secret, "
            "lease_timeout_seconds, policy, policy_file)",
        ),
    ],
)
def test_unknown_key_is_refused_naming_its_path_line_and_closest_key(
    tmp_path: Path, text: str, message: str
) -> None:
    manifest = write(tmp_path / "rebuno.yaml", text)

    assert refusal_of(manifest) == f"manifest {manifest}, {message}"


def test_misspelt_required_key_is_named_rather_than_reported_missing(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "rebuno.yaml",
        "agents:\n  - id: a\n    secret: s\n  - id: b\n    webhok_url: http://h\n    secret: s\n",
    )

    assert refusal_of(manifest) == (
        f"manifest {manifest}, line 5: agents[1].webhok_url: unknown key "
        "(did you mean webhook_url?)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agents:\n  - secret: s\nagnets: []\n", "line 3: agnets: unknown key"),
        ("agents:\n  - secret: s\n  - id: b\n    secrt: s\n", "line 4: agents[1].secrt: unknown"),
    ],
)
def test_unknown_key_is_found_before_any_entry_is_read(
    tmp_path: Path, text: str, message: str
) -> None:
    # The first entry lacks its id; the typo below it is still what the operator hears about.
    manifest = write(tmp_path / "m.yaml", text)

    assert refusal_of(manifest).startswith(f"manifest {manifest}, {message}")


INLINE = AGENT + (
    "    policy: |\n"
    "      default_action: deny\n"
    "      rules:\n"
    "        - id: reads\n"
    "          when: {target: read_file}\n"
    "          then:\n"
    "            decision: allow\n"
)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "            decision: allow\n",
            "            efect: allow\n",
            "line 11: agents[0].policy: rule 'reads': field 'then.efect': unknown field "
            "(known: approval_config, budget, decision, rate_limit, reason)",
        ),
        (
            "{target: read_file}",
            "{taget: read_file}",
            "line 9: agents[0].policy: rule 'reads': field 'when.taget': unknown field "
            "(did you mean 'target'?)",
        ),
        (
            "      default_action: deny\n",
            "      default: deny\n",
            "line 6: agents[0].policy: field 'default': unknown field "
            "(did you mean 'default_action'?)",
        ),
    ],
)
def test_a_typo_in_an_inline_policy_names_its_line_in_the_manifest(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    manifest = write(tmp_path / "rebuno.yaml", INLINE.replace(old, new))

    assert refusal_of(manifest) == f"manifest {manifest}, {message}"


def test_a_yaml_error_in_an_inline_policy_names_its_line_and_column_in_the_manifest(
    tmp_path: Path,
) -> None:
    manifest = write(
        tmp_path / "rebuno.yaml", INLINE.replace("{target: read_file}", "{target: read_file")
    )

    message = refusal_of(manifest)

    assert message.startswith(
        f"manifest {manifest}, line 10, column 15: agents[0].policy: invalid YAML: "
        "expected ',' or '}', but got ':' (while parsing a flow mapping that starts on line 9)"
    )


def test_a_typo_in_a_policy_file_names_that_file_and_its_line(tmp_path: Path) -> None:
    policy = write(
        tmp_path / "policies" / "reads.yaml",
        "default_action: deny\nrules:\n  - id: reads\n    then: {decison: allow}\n",
    )
    manifest = write(tmp_path / "rebuno.yaml", AGENT + "    policy_file: policies/reads.yaml\n")

    assert refusal_of(manifest) == (
        f"manifest {manifest}, agents[0].policy_file {policy}, line 4: rule 'reads': "
        "field 'then.decison': unknown field (did you mean 'decision'?)"
    )


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("agents: [\n", 2, 1),
        ("agents:\n  - id: a\n   secret: s\n", 3, 4),
        ("agents:\n  - id: a\n    id: b\n", 3, 5),
        ("agents:\n  - id: a\n    secret: 'x\n", 4, 1),
    ],
)
def test_bad_yaml_names_its_line_and_column(
    tmp_path: Path, text: str, line: int, column: int
) -> None:
    manifest = write(tmp_path / "m.yaml", text)

    message = refusal_of(manifest)

    assert message.startswith(f"manifest {manifest}, line {line}, column {column}: invalid YAML: ")
    assert "\n" not in message


# The manifests the project ships and documents load as written.

ROOT = Path(__file__).parents[2]


def test_the_example_manifest_loads() -> None:
    specs = load_manifest(str(ROOT / "examples" / "rebuno.yaml"), env={})

    assert [spec.id for spec in specs] == ["hello", "writer", "shell"]
    assert specs[2].policy_bundle is not None


def test_the_documented_manifest_loads(tmp_path: Path) -> None:
    protocol = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = protocol[protocol.index("### §18.4 Provisioning manifest") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    write(tmp_path / "policies" / "research.yaml", BUNDLE)
    manifest = write(tmp_path / "rebuno.yaml", example)

    [spec] = load_manifest(manifest, env={"RESEARCHER_SECRET": "s"})

    assert (spec.id, spec.lease_timeout_seconds, spec.policy_bundle) == ("researcher", 600, BUNDLE)
