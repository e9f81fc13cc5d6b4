"""``[prism:admin]``: the console's sessions and single sign-on (OpenID Connect)."""

from __future__ import annotations

import attrs

from prism_proxy import Config, Section, read_settings, setting

__all__ = ["SECTION", "AdminSettings", "RoleRule", "parse_roles"]

SECTION = "admin"


@attrs.frozen
class RoleRule:
    """One ``MATCH=ROLE`` entry of ``roles``: ``org`` None is the operator's role."""

    kind: str  # "domain", "group" or "email"
    value: str
    org: str | None

    def matches(self, email: str, groups: frozenset[str]) -> bool:
        if self.kind == "group":
            return self.value in groups
        if self.kind == "domain":
            return email.rpartition("@")[2] == self.value
        return email == self.value


def parse_roles(entries: tuple[str, ...]) -> tuple[RoleRule, ...]:
    """``@DOMAIN=ROLE``, ``group:NAME=ROLE`` or ``EMAIL=ROLE``; ROLE ``admin`` or
    ``org-admin:ORG``.  Raises ValueError naming the entry."""
    rules = []
    for entry in entries:
        match, sep, role = (part.strip() for part in entry.rpartition("="))
        if not sep or not match or not role:
            raise ValueError(f"expected MATCH=ROLE, got {entry!r}")
        if role == "admin":
            org = None
        elif role.startswith("org-admin:") and role.partition(":")[2].strip():
            org = role.partition(":")[2].strip()
        else:
            raise ValueError(f"{entry!r}: the role is admin or org-admin:ORG, not {role!r}")
        if match.startswith("group:") and match[6:].strip():
            rules.append(RoleRule("group", match[6:].strip(), org))
        elif match.startswith("@") and "." in match and "@" not in match[1:]:
            rules.append(RoleRule("domain", match[1:].lower(), org))
        elif "@" in match.strip("@"):
            rules.append(RoleRule("email", match.lower(), org))
        else:
            raise ValueError(
                f"{entry!r}: match @DOMAIN, group:NAME or an email address, not {match!r}"
            )
    return tuple(rules)


@attrs.frozen
class AdminSettings:
    session_s: float = setting(
        8 * 3600.0,
        min=60.0,
        max=7 * 86400.0,
        help="how long a console sign-in lasts (seconds) before the session cookie expires",
    )
    cookie_secure: bool = setting(
        False,
        help="always mark the session cookie Secure (behind a proxy that terminates TLS; "
        "it is marked so anyway when the request came over TLS)",
    )
    oidc_issuer: str | None = setting(
        None,
        help="the OpenID provider's issuer URL (its /.well-known/openid-configuration is read); "
        "unset: no single sign-on",
    )
    client_id: str | None = setting(None, help="this gateway's client id at the OpenID provider")
    client_secret_env: str | None = setting(
        None,
        help="the environment variable holding the client secret (unset: a public client, "
        "PKCE only)",
    )
    roles: tuple[str, ...] = setting(
        (),
        help="who may sign in as what, first match wins: @DOMAIN=ROLE, group:NAME=ROLE or "
        "EMAIL=ROLE; ROLE is admin or org-admin:ORG",
    )
    redirect_uri: str | None = setting(
        None,
        help="the callback URL registered at the provider (unset: this gateway's "
        "/prism/console/sso/callback as the browser reached it)",
    )
    source: str = "<config>"

    def check(self, section: Section) -> None:
        if self.oidc_issuer is not None:
            if not self.oidc_issuer.startswith(("https://", "http://")):
                raise section.error("oidc_issuer", "expected an http(s) URL")
            if not self.client_id:
                raise section.error("client_id", "single sign-on needs the client id")
            if not self.roles:
                raise section.error("roles", "single sign-on needs at least one MATCH=ROLE")
        try:
            parse_roles(self.roles)
        except ValueError as exc:
            raise section.error("roles", str(exc)) from None

    @property
    def role_rules(self) -> tuple[RoleRule, ...]:
        return parse_roles(self.roles)

    @classmethod
    def from_config(cls, config: Config) -> AdminSettings:
        return read_settings(cls, config.section(SECTION))
