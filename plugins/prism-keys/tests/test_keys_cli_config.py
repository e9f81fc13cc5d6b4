"""The keys CLI's refusals and the [prism:keys] section's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from prism_keys import Grants, ScopeError, parse_scopes

from prism_proxy import ConfigError, create_app
from prism_proxy.cli import main


def write_ini(tmp_path: Path, keys_section: str) -> Path:
    path = tmp_path / "prism.ini"
    path.write_text(f"[prism]\ncatalog = catalog.toml\n\n[prism:keys]\n{keys_section}")
    (tmp_path / "catalog.toml").write_text(
        '[providers.alpha]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        '[models.chat-a]\nchain = [{ provider = "alpha", model = "up" }]\n'
    )
    return path


def run(path: Path, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(path)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_create_prints_the_key_alone_on_the_last_line_and_list_never_shows_it(tmp_path, capsys):
    path = write_ini(tmp_path, "db_path = keys.db\n")
    status, out, _ = run(path, capsys, "create", "--org", "acme", "--scopes", "chat, model:chat-a")
    assert status == 0
    lines = out.splitlines()
    key = lines[-1]
    assert key.startswith("sk-prism-") and " " not in key and len(key) > 50
    assert f"key id:  {key.split('-')[2]}" in lines
    _, listed, _ = run(path, capsys, "list", "--org", "acme")
    assert key.split("-")[2] in listed and "chat,model:chat-a" in listed and "active" in listed
    assert key not in listed
    assert key[len("sk-prism-") + 13 :] not in listed


def test_cli_refusals_say_what_is_wrong(tmp_path, capsys):
    path = write_ini(tmp_path, "db_path = keys.db\n")
    status, _, err = run(path, capsys, "create", "--org", "acme", "--scopes", "chta,model:x")
    assert status == 1 and "unknown scope 'chta'" in err
    status, _, err = run(path, capsys, "create", "--org", "bad org", "--scopes", "chat,model:*")
    assert status == 1 and "invalid organisation 'bad org'" in err
    status, _, err = run(path, capsys, "revoke", "0123456789ab")
    assert status == 1 and "unknown key id" in err
    status, _, err = run(path, capsys, "org-tags", "nobody")
    assert status == 1 and "unknown organisation" in err
    status, _, err = run(path, capsys, "org-tags", "acme", "--set", "eu,no spaces")
    assert status == 1 and "invalid tag 'no spaces'" in err
    assert not list(tmp_path.glob("keys.db-*"))  # nothing half-written left behind


def test_cli_without_db_path_is_a_configuration_error(tmp_path, capsys):
    path = tmp_path / "prism.ini"
    path.write_text("[prism]\ncatalog = catalog.toml\n")
    status, _, err = run(path, capsys, "list")
    assert status == 2
    assert "[prism:keys] db_path: not set" in err


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("refresh_s = 1\n", r"\[prism:keys\] db_path: missing"),
        ("db_path = keys.db\nrefresh = 1\n", r"\[prism:keys\] refresh: unknown key"),
        ("db_path = keys.db\nrefresh_s = 0\n", r"\[prism:keys\] refresh_s: must be at least"),
        ("db_path = nowhere/keys.db\n", r"\[prism:keys\] db_path: directory .* does not exist"),
    ],
)
def test_configuration_mistakes_stop_start_up(tmp_path, section, message):
    path = write_ini(tmp_path, section)
    with pytest.raises(ConfigError, match=message):
        create_app(path)


def test_scope_syntax():
    assert parse_scopes(["chat", "model:chat-*", "tier:gold", "chat"]) == (
        "chat",
        "model:chat-*",
        "tier:gold",
    )
    for bad in (["chta"], ["model:"], ["model:a*b"], ["Tier:gold"], [""]):
        with pytest.raises(ScopeError):
            parse_scopes(bad)
    grants = Grants.from_scopes(["chat", "model:chat-*", "tier:gold"])
    assert grants.allows_endpoint("chat") and not grants.allows_endpoint("embeddings")
    assert grants.allows_model("chat-b") and not grants.allows_model("embed-a")
    everything = Grants.from_scopes(["*"])
    assert everything.allows_endpoint("embeddings") and everything.allows_model("p/m")
