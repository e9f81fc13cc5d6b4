"""Routing rules attached to catalog models: parsed, checked and chosen.

```toml
[[models.chat-a.rules]]
name = "eu-only"
when = { "org.tags" = "eu" }
chain = [{ provider = "azure-eu", model = "gpt-4o" }]
```

The first rule whose ``when`` holds replaces the model's whole chain for the
call, fallback models included (``Route.cross_tier`` is false).  A rule's
chain is fixed in the catalog; metadata can only be compared against.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from prism_proxy import Binding, Call, Catalog, ConfigError, ModelSpec, Route

from .conditions import (
    MISSING,
    Condition,
    ConditionError,
    Context,
    compile_when,
    equality_key,
    guard,
)

__all__ = ["CATALOG_KEY", "Rule", "RuleBook", "RuleIndex", "compile_catalog", "compile_rules"]

CATALOG_KEY = "rules"
_RULE_KEYS = frozenset({"name", "when", "chain", "description"})
_LINE_KEYS = frozenset({"provider", "model"})
#: Rule names go into the x-prism-route header: keep them to header-safe tokens.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@attrs.frozen
class Rule:
    name: str
    when: Condition
    chain: tuple[Binding, ...]


@attrs.frozen
class RuleIndex:
    """One model's rules, indexed at load time by the equality each cannot match without.

    A rule whose ``when`` needs ``field = value`` (or ``$in``, alone or in an
    ``$and``) is only evaluated for calls that carry one of its values there;
    the rest are evaluated always.  Either way rules are tried in catalog order
    and the first that holds wins, so the index changes the cost, never the
    choice: 200 rules on tenant metadata cost a dictionary lookup, not 200 tests.
    """

    rules: tuple[Rule, ...]
    always: frozenset[int]
    #: field -> equality key -> positions of the rules guarded by it.
    by_field: Mapping[str, Mapping[tuple[str, Any], tuple[int, ...]]]

    @classmethod
    def of(cls, rules: tuple[Rule, ...]) -> RuleIndex:
        always: set[int] = set()
        by_field: dict[str, dict[tuple[str, Any], list[int]]] = {}
        for position, rule in enumerate(rules):
            test = guard(rule.when)
            if test is None or test.equals is None:
                always.add(position)
                continue
            keys = by_field.setdefault(test.field, {})
            for value in test.equals:
                keys.setdefault(equality_key(value), []).append(position)
        frozen = {f: {k: tuple(v) for k, v in keys.items()} for f, keys in by_field.items()}
        return cls(rules, frozenset(always), frozen)

    def first_match(self, ctx: Context) -> Rule | None:
        candidates = set(self.always)
        for field, keys in self.by_field.items():
            value = ctx.value(field)
            if value is MISSING:
                continue
            values = value if isinstance(value, frozenset) else (value,)
            for item in values:
                found = keys.get(equality_key(item))
                if found is not None:
                    candidates.update(found)
        if not candidates:
            # The usual call: many rules, none guarded by a value it carries.
            return None
        for position in sorted(candidates):
            rule = self.rules[position]
            if rule.when.matches(ctx):
                return rule
        return None


@attrs.frozen
class RuleBook:
    """Every model's rules, in catalog order."""

    by_model: Mapping[str, tuple[Rule, ...]]
    indexes: Mapping[str, RuleIndex] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        indexes = {model: RuleIndex.of(rules) for model, rules in self.by_model.items()}
        object.__setattr__(self, "indexes", indexes)

    def own_lines(self, catalog: Catalog) -> list[tuple[str, Binding]]:
        """The rule lines that are not catalog chain lines, with their catalog addresses."""
        known = {id(binding) for model in catalog.models.values() for binding in model.chain}
        return [
            (f"models.{model}.{CATALOG_KEY}[{index}].chain[{position}]", binding)
            for model, rules in self.by_model.items()
            for index, rule in enumerate(rules)
            for position, binding in enumerate(rule.chain)
            if id(binding) not in known
        ]

    def route(self, call: Call, model: ModelSpec) -> Route | None:
        index = self.indexes.get(model.name) if not model.pinned else None
        if index is None:
            return None
        principal = call.principal
        ctx = Context(
            org_name=principal.org,
            org_tags=principal.org_tags,
            scopes=principal.scopes,
            model=call.model_name,
            metadata=call.metadata,
        )
        rule = index.first_match(ctx)
        if rule is None:
            return None
        return Route(bindings=rule.chain, name=rule.name, cross_tier=False)


def compile_catalog(catalog: Catalog, binding_keys: frozenset[str] | None = None) -> RuleBook:
    """All models' rules; raises ``ConfigError`` naming the model, rule and problem.

    ``binding_keys`` are the chain-line keys plugins declared (``price`` …);
    when given, any other key on a rule's chain line is an error, as it is
    on a catalog chain line.
    """
    by_model: dict[str, tuple[Rule, ...]] = {}
    for name, model in catalog.models.items():
        raw = model.options.get(CATALOG_KEY)
        if raw is not None:
            by_model[name] = compile_rules(model, raw, catalog, binding_keys)
    return RuleBook(by_model=by_model)


def compile_rules(
    model: ModelSpec, raw: Any, catalog: Catalog, binding_keys: frozenset[str] | None = None
) -> tuple[Rule, ...]:
    where = f"models.{model.name}.{CATALOG_KEY}"
    if not isinstance(raw, list):
        raise ConfigError(catalog.source, where, "expected a list of rule tables ([[...rules]])")
    rules: list[Rule] = []
    names: set[str] = set()
    for index, table in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(table, Mapping):
            raise ConfigError(catalog.source, at, "expected a table with name, when and chain")
        name = table.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "default":
            raise ConfigError(
                catalog.source,
                f"{at}.name",
                f"expected a name of 1-64 letters, digits, '.', '_' or '-' other than "
                f"'default', got {name!r}",
            )
        at = f"{at} ({name})"
        if name in names:
            raise ConfigError(catalog.source, at, f"another rule of {model.name} is named {name!r}")
        names.add(name)
        for key in table:
            if key not in _RULE_KEYS:
                raise ConfigError(
                    catalog.source,
                    at,
                    f"unknown key {key!r} (known: chain, description, name, when)",
                )
        try:
            when = compile_when(table.get("when", {}))
        except ConditionError as exc:
            raise ConfigError(catalog.source, at, str(exc)) from None
        chain = _chain(table.get("chain"), at, model, catalog, binding_keys)
        rules.append(Rule(name=name, when=when, chain=chain))
    return tuple(rules)


def _chain(
    raw: Any,
    at: str,
    model: ModelSpec,
    catalog: Catalog,
    binding_keys: frozenset[str] | None,
) -> tuple[Binding, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(catalog.source, at, "chain: missing or empty: list at least one binding")
    own_lines = {binding.id: binding for binding in reversed(model.chain)}
    chain: list[Binding] = []
    for index, line in enumerate(raw):
        where = f"chain[{index}]"
        if not isinstance(line, Mapping):
            raise ConfigError(
                catalog.source, at, f"{where}: expected a table {{ provider = ..., model = ... }}"
            )
        provider = line.get("provider")
        if not isinstance(provider, str) or provider not in catalog.providers:
            known = ", ".join(sorted(catalog.providers)) or "none"
            raise ConfigError(
                catalog.source,
                at,
                f"{where}.provider: unknown provider {provider!r} (known: {known})",
            )
        upstream = line.get("model")
        if not isinstance(upstream, str) or not upstream:
            raise ConfigError(
                catalog.source, at, f"{where}.model: missing: the upstream model name"
            )
        extra = {k: v for k, v in line.items() if k not in _LINE_KEYS}
        binding_id = f"{provider}/{upstream}"
        # Reuse the catalog's own line (this model's first, else any model's): its
        # price, region … were checked by the plugins that own them, and breakers,
        # statistics and bills keyed on the line agree with the default route.
        existing = own_lines.get(binding_id) or catalog.bindings.get(binding_id)
        if existing is not None:
            if extra:
                raise ConfigError(
                    catalog.source,
                    at,
                    f"{where}: {binding_id} is a catalog binding already; set "
                    f"{', '.join(sorted(extra))} on its catalog chain line, not here",
                )
            chain.append(existing)
            continue
        if binding_keys is not None:
            for key in extra:
                if key not in binding_keys:
                    known = ", ".join(sorted(_LINE_KEYS | binding_keys))
                    raise ConfigError(
                        catalog.source, at, f"{where}.{key}: unknown key (known: {known})"
                    )
        catalog.check_line_options(f"{at} {where}", extra)
        chain.append(catalog.line(provider, upstream, extra))
    return tuple(chain)
