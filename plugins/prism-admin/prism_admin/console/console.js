"use strict";
// The Prism console: the admin API (/prism/admin/) read and written with the session
// cookie; every write carries the session's CSRF token. Data is shown as text only.
(function () {
  const API = "/prism/admin";
  const $ = (id) => document.getElementById(id);
  const state = { me: null, csrf: null, org: null, orgs: [] };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function say(text, error) {
    const status = $("status");
    status.textContent = text;
    status.className = error ? "error" : "";
  }

  async function api(method, path, body) {
    const headers = { "Accept": "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET" && state.csrf) headers["X-Prism-CSRF"] = state.csrf;
    const response = await fetch(API + path, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const answer = (response.headers.get("Content-Type") || "").includes("json")
      ? await response.json() : await response.text();
    if (!response.ok) {
      const err = (answer && answer.error) || {};
      const message = (err.message || response.statusText) + (err.param ? ` (${err.param})` : "");
      if (response.status === 401 && path !== "/session") showSignIn();
      throw new Error(message);
    }
    return answer;
  }

  async function act(what, work) {
    try {
      say(what + "…");
      const done = await work();
      say(done || what + ": done");
    } catch (exc) {
      say(what + " failed: " + exc.message, true);
    }
  }

  // --- signing in ---

  function showSignIn() {
    state.me = null;
    $("signin").hidden = false;
    $("app").hidden = true;
    $("signout").hidden = true;
    $("whoami").textContent = "Not signed in";
    $("token").focus();
  }

  async function signedIn(me) {
    state.me = me;
    state.csrf = me.csrf;
    $("signin").hidden = true;
    $("app").hidden = false;
    $("signout").hidden = false;
    $("whoami").textContent = "Signed in as " + me.who + (me.org ? " (organisation " + me.org + ")" : "");
    for (const node of document.querySelectorAll(".operator-only")) node.hidden = !me.operator;
    await loadOrgs();
    showTab(location.hash.slice(1) || "orgs");
  }

  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    try {
      await signedIn(await api("POST", "/session", { token }));
      $("signin-status").textContent = "";
    } catch (exc) {
      $("signin-status").textContent = "Sign-in refused: " + exc.message;
    }
  });

  $("signout").addEventListener("click", async () => {
    try { await api("DELETE", "/session"); } catch (exc) { /* signed out either way */ }
    state.csrf = null;
    showSignIn();
  });

  // --- tabs ---

  const loaders = {
    orgs: () => loadKeys(), budgets: () => loadBudgets(), usage: () => loadUsage(),
    overrides: () => loadOverrides(), audit: () => loadAudit(),
  };

  function showTab(name) {
    if (!loaders[name]) name = "orgs";
    for (const panel of document.querySelectorAll("[data-panel]")) panel.hidden = panel.dataset.panel !== name;
    for (const link of document.querySelectorAll("[data-tab]")) {
      if (link.dataset.tab === name) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    act("Loading", async () => { await loaders[name](); return ""; });
  }

  window.addEventListener("hashchange", () => { if (state.me) showTab(location.hash.slice(1)); });

  // --- organisations and keys ---

  async function loadOrgs() {
    state.orgs = (await api("GET", "/orgs")).orgs;
    const pick = $("org-pick");
    pick.replaceChildren(...state.orgs.map((o) => el("option", { value: o.name, text: o.name + (o.disabled ? " (disabled)" : "") })));
    if (!state.orgs.some((o) => o.name === state.org)) state.org = state.orgs.length ? state.orgs[0].name : null;
    if (state.org) pick.value = state.org;
    showToggle();
  }

  function currentOrg() {
    return state.orgs.find((o) => o.name === state.org);
  }

  function showToggle() {
    const org = currentOrg();
    const toggle = $("org-toggle");
    toggle.disabled = !org;
    toggle.textContent = org && org.disabled ? "Enable organisation" : "Disable organisation";
    toggle.className = org && org.disabled ? "secondary operator-only" : "danger operator-only";
  }

  $("org-toggle").addEventListener("click", () => {
    const org = currentOrg();
    if (!org) return;
    const name = org.name;
    const enable = org.disabled;
    act((enable ? "Enabling " : "Disabling ") + name, async () => {
      if (enable) await api("PATCH", "/orgs/" + encodeURIComponent(name), { disabled: false });
      else await api("DELETE", "/orgs/" + encodeURIComponent(name));
      await loadOrgs();
      await loadKeys();
      return "Organisation " + name + (enable ? " enabled: its keys work again" : " disabled: its keys are refused");
    });
  });

  $("org-pick").addEventListener("change", () => {
    state.org = $("org-pick").value;
    showToggle();
    act("Loading", async () => { await loaders[currentTab()](); return ""; });
  });

  function currentTab() {
    const shown = document.querySelector("[data-panel]:not([hidden])");
    return shown ? shown.dataset.panel : "orgs";
  }

  $("org-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = $("org-name").value.trim();
    act("Creating organisation " + name, async () => {
      await api("POST", "/orgs", { name });
      state.org = name;
      $("org-name").value = "";
      await loadOrgs();
      await loadKeys();
      return "Organisation " + name + " created";
    });
  });

  function showSecret(record) {
    $("secret").hidden = false;
    $("secret-text").textContent = record.key;
    $("secret-text").dataset.keyId = record.id;
    $("copy").focus();
  }

  $("copy").addEventListener("click", () => act("Copying", async () => {
    await navigator.clipboard.writeText($("secret-text").textContent);
    return "Copied the key's text";
  }));

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const scopes = $("key-scopes").value.split(",").map((s) => s.trim()).filter(Boolean);
    const body = { org: state.org, scopes };
    if ($("key-desc").value.trim()) body.description = $("key-desc").value.trim();
    act("Creating a key", async () => {
      const made = await api("POST", "/keys", body);
      showSecret(made);
      await loadKeys();
      return "Key " + made.id + " created: copy its text now, it is not shown again";
    });
  });

  async function loadKeys() {
    const body = $("keys").tBodies[0];
    if (!state.org) { body.replaceChildren(); return; }
    const keys = (await api("GET", "/keys?org=" + encodeURIComponent(state.org))).keys;
    body.replaceChildren(...keys.map((k) => {
      const live = !k.revoked && !k.expired;
      const actions = el("td", { class: "actions" });
      if (live) {
        actions.append(
          el("button", { type: "button", class: "secondary", "aria-label": "Rotate key " + k.id, text: "Rotate",
            onclick: () => act("Rotating " + k.id, async () => {
              const made = await api("POST", "/keys/" + k.id + "/rotate", { grace_s: 3600 });
              showSecret(made);
              await loadKeys();
              return "Key " + k.id + " rotated: the old text works for an hour more";
            }) }),
          " ",
          el("button", { type: "button", class: "danger", "aria-label": "Revoke key " + k.id, text: "Revoke",
            onclick: () => act("Revoking " + k.id, async () => {
              await api("DELETE", "/keys/" + k.id);
              await loadKeys();
              return "Key " + k.id + " revoked";
            }) }));
      }
      return el("tr", { "data-key": k.id },
        el("td", { text: k.id }), el("td", { text: k.scopes.join(", ") }),
        el("td", { text: k.description || "" }), el("td", { text: k.last_used || "never" }),
        el("td", { class: "key-state", text: k.revoked ? "revoked" : k.expired ? "expired" : "active" }),
        actions);
    }));
  }

  // --- limits and budgets ---

  $("settings-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const owner = $("setting-owner").value;
    const name = $("setting-name").value.trim();
    const value = $("setting-value").value.trim();
    const settings = { settings: { [name]: value || null } };
    if (!owner) { say("Create a key first: its settings are set here", true); return; }
    const onKey = owner.startsWith("key:");
    const where = onKey ? "key " + owner.slice(4) : state.org;
    act("Setting " + name, async () => {
      if (onKey) await api("PATCH", "/keys/" + encodeURIComponent(owner.slice(4)), settings);
      else await api("PATCH", "/orgs/" + encodeURIComponent(state.org), settings);
      await loadOrgs();
      await loadBudgets();
      return name + (value ? " set to " + value : " unset") + " on " + where;
    });
  });

  $("budgets-refresh").addEventListener("click", () => act("Refreshing", async () => { await loadBudgets(); return "Budgets refreshed"; }));

  async function loadLimits(org) {
    const keys = org ? (await api("GET", "/keys?org=" + encodeURIComponent(org.name))).keys.filter((k) => !k.revoked) : [];
    const owner = $("setting-owner");
    const chosen = owner.value;
    const owners = [];
    // The organisation's own settings are the operator's: its administrators set its keys'.
    if (org && state.me.operator) owners.push(el("option", { value: "org", text: "organisation " + org.name }));
    for (const k of keys) owners.push(el("option", { value: "key:" + k.id, text: "key " + k.id + (k.description ? " (" + k.description + ")" : "") }));
    owner.replaceChildren(...owners);
    if ([...owner.options].some((o) => o.value === chosen)) owner.value = chosen;
    const rows = [];
    const add = (who, settings) => {
      for (const [name, value] of Object.entries(settings || {})) {
        rows.push(el("tr", {}, el("td", { text: who }), el("td", { text: name }), el("td", { text: value })));
      }
    };
    if (org) add("organisation " + org.name, org.settings);
    for (const k of keys) add("key " + k.id, k.settings);
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "3", text: "Nothing is set." })));
    $("limits").tBodies[0].replaceChildren(...rows);
  }

  function meter(label, used, value, share, extra) {
    const bar = el("div", { class: "bar" + (share >= 1 ? " full" : share >= 0.8 ? " high" : ""),
      role: "meter", "aria-valuemin": "0", "aria-valuemax": String(value), "aria-valuenow": String(used),
      "aria-label": label, ...extra });
    bar.append(el("span", { style: "width:" + (share * 100).toFixed(2) + "%" }));
    return bar;
  }

  async function loadRates() {
    const list = $("limit-bars");
    if (!state.org) { list.replaceChildren(); return; }
    const answer = await api("GET", "/limits?org=" + encodeURIComponent(state.org));
    const rates = answer.limits.filter((l) => l.limit !== "budget");
    list.replaceChildren(...rates.map((l) => {
      const who = l.key ? "key " + l.key : "organisation " + l.org;
      const label = who + ": " + l.limit + " " + l.value;
      const share = l.value > 0 ? Math.max(0, Math.min(1, l.used / l.value)) : 1;
      return el("li", {}, el("div", { text: label }),
        meter(label, l.used, l.value, share, { "data-limit": (l.key || "") + "|" + l.limit }),
        el("div", { class: "used", text: `${l.used} used, ${l.remaining} remaining` }));
    }));
    if (!answer.live) list.append(el("li", { text: "Rate limits are not counted here (prism-limits is not serving)." }));
    else if (!rates.length) list.append(el("li", { text: "No rpm, tpm or max_parallel is set on " + state.org + " or its keys." }));
  }

  async function loadBudgets() {
    const org = currentOrg();
    await loadLimits(org);
    await loadRates();
    if (!state.org) { $("budget-bars").replaceChildren(); return; }
    const answer = await api("GET", "/budgets?org=" + encodeURIComponent(state.org));
    const currency = answer.currency || "";
    $("budget-bars").replaceChildren(...answer.budgets.map((b) => {
      const share = Math.max(0, Math.min(1, b.ratio));
      const who = b.key ? "key " + b.key : "organisation " + b.org;
      const label = who + (b.model ? " on " + b.model : "") + ": " + b.budget;
      const text = `${b.used} ${currency} used, ${b.remaining} remaining (${(share * 100).toFixed(1)}%)`;
      const bar = el("div", { class: "bar" + (share >= 1 ? " full" : share >= 0.8 ? " high" : ""),
        role: "meter", "aria-valuemin": "0", "aria-valuemax": b.amount, "aria-valuenow": b.used,
        "aria-label": label, "data-budget": (b.key || "") + "|" + (b.model || "") });
      bar.append(el("span", { style: "width:" + (share * 100).toFixed(2) + "%" }));
      return el("li", {}, el("div", { text: label }), bar, el("div", { class: "used", text }));
    }));
    if (!answer.budgets.length) $("budget-bars").append(el("li", { text: "No budget is set on " + state.org + " or its keys." }));
  }

  // --- usage ---

  function monthAgo() {
    const d = new Date(Date.now() - 30 * 86400000);
    return d.toISOString().slice(0, 10);
  }

  $("usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act("Loading usage", async () => { await loadUsage(); return "Usage shown"; });
  });

  const COLOURS = ["#0b5cad", "#1a7f37", "#9a6700", "#8250df", "#b42318", "#0a7a86", "#6e7781"];
  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }

  async function loadUsage() {
    if (!$("usage-since").value) $("usage-since").value = monthAgo();
    const metric = $("usage-metric").value;
    const query = "?group_by=day,model&since=" + $("usage-since").value + (state.org ? "&org=" + encodeURIComponent(state.org) : "");
    const answer = await api("GET", "/usage" + query);
    const rows = answer.groups;
    $("usage-table").tBodies[0].replaceChildren(...rows.map((r) => el("tr", {},
      el("td", { text: r.day }), el("td", { text: r.model }), el("td", { text: String(r.calls) }),
      el("td", { text: r.input_tokens + " / " + r.output_tokens }), el("td", { text: r.cost + " " + answer.currency }))));
    drawChart(rows, metric, answer.currency);
  }

  function drawChart(rows, metric, currency) {
    const days = [...new Set(rows.map((r) => r.day))].sort();
    const models = [...new Set(rows.map((r) => r.model))].sort();
    const value = (r) => Number(r[metric]) || 0;
    const totals = days.map((d) => rows.filter((r) => r.day === d).reduce((s, r) => s + value(r), 0));
    const top = Math.max(1e-9, ...totals);
    const W = 640, H = 240, left = 48, bottom = 24, gap = 4;
    const bw = days.length ? Math.max(4, (W - left) / days.length - gap) : 0;
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H + bottom}`, role: "img",
      "aria-label": `${metric} per day and model, ${days.length} days` });
    chart.append(svg("line", { x1: left, y1: H, x2: W, y2: H, stroke: "#57606a" }));
    const topLabel = svg("text", { x: 0, y: 12, "font-size": 11, fill: "#57606a" });
    topLabel.textContent = top.toPrecision(3);
    chart.append(topLabel);
    days.forEach((day, i) => {
      let y = H;
      models.forEach((model, m) => {
        const row = rows.find((r) => r.day === day && r.model === model);
        if (!row) return;
        const h = (value(row) / top) * (H - 16);
        y -= h;
        const rect = svg("rect", { x: left + i * (bw + gap), y, width: bw, height: h, fill: COLOURS[m % COLOURS.length] });
        const tip = svg("title", {});
        tip.textContent = `${day} ${model}: ${row[metric]}`;
        rect.append(tip);
        chart.append(rect);
      });
      if (days.length <= 14 || i % Math.ceil(days.length / 7) === 0) {
        const label = svg("text", { x: left + i * (bw + gap), y: H + 16, "font-size": 10, fill: "#57606a" });
        label.textContent = day.slice(5);
        chart.append(label);
      }
    });
    const legend = el("div", { class: "legend" }, ...models.map((m, i) =>
      el("span", {}, el("span", { class: "swatch", style: "background:" + COLOURS[i % COLOURS.length] }), m)));
    $("usage-chart").replaceChildren(chart, legend);
    const sum = totals.reduce((a, b) => a + b, 0);
    $("usage-caption").textContent = days.length
      ? `${metric === "cost" ? "Spend" : metric} from ${days[0]} to ${days[days.length - 1]}: ${metric === "cost" ? sum.toFixed(6) + " " + currency : sum}`
      : "No usage in this range.";
  }

  // --- overrides ---

  $("override-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { kind: $("ov-kind").value, scope: $("ov-scope").value, target: $("ov-target").value.trim(), reason: $("ov-reason").value.trim() };
    if ($("ov-review").value.trim()) body.review_by = $("ov-review").value.trim();
    if ($("ov-max").value !== "") body.max_in_flight = Number($("ov-max").value);
    act("Adding the override", async () => {
      const made = await api("POST", "/overrides", body);
      await loadOverrides();
      return made.kind + " " + made.id + " on " + made.target + " added";
    });
  });

  async function loadOverrides() {
    if (!state.me || !state.me.operator) return;
    const answer = await api("GET", "/overrides");
    $("overrides").tBodies[0].replaceChildren(...answer.overrides.map((o) => el("tr", { "data-override": o.id },
      el("td", { text: o.id }), el("td", { text: o.kind + (o.kind === "cap" ? " " + o.max_in_flight : "") }),
      el("td", { text: o.scope + " " + o.target }), el("td", { text: o.owner }), el("td", { text: o.reason }),
      el("td", { text: o.review_by + (o.review_overdue ? " (overdue)" : "") }),
      el("td", {}, el("button", { type: "button", class: "danger", "aria-label": "Release override " + o.id, text: "Release",
        onclick: () => act("Releasing " + o.id, async () => {
          await api("POST", "/overrides/" + o.id + "/release", { reason: "released from the console" });
          await loadOverrides();
          return o.id + " released";
        }) })))));
  }

  // --- audit ---

  $("audit-refresh").addEventListener("click", () => act("Refreshing", async () => { await loadAudit(); return "Audit log refreshed"; }));

  async function loadAudit() {
    const entries = (await api("GET", "/audit?limit=200")).entries;
    $("audit").tBodies[0].replaceChildren(...entries.map((e) => el("tr", {},
      el("td", { text: e.at }), el("td", { text: e.actor }), el("td", { text: e.action }),
      el("td", { text: e.subject }), el("td", { text: e.address || "" }))));
  }

  // --- start ---

  api("GET", "/session").then(signedIn, showSignIn);
})();
