// An agent's policy: the bundle in force rendered rule by rule (evaluation order), and an
// editor that checks a new bundle with the kernel's own loader, shows its diff against the
// current one, tries it against a step, and saves it.
import { api } from "./api.js";
import { badge, confirmAction, h, pretty, replace } from "./dom.js";

function condition(when) {
  const parts = Object.entries(when || {}).map(([key, value]) =>
    h("div", {}, h("span", { class: "muted" }, `${key}: `), h("code", {}, typeof value === "string" ? value : JSON.stringify(value))));
  return parts.length ? parts : h("span", { class: "muted" }, "every step");
}

function decision(then) {
  const { decision: action, ...rest } = then || {};
  return h("div", {}, badge(action || "?"), Object.keys(rest).length ? h("pre", {}, pretty(rest)) : null);
}

export function rulesTable(described) {
  if (!described.rules.length && described.default_action === null) {
    return h("p", { class: "muted" }, "No bundle: every step is allowed.");
  }
  return h("div", {},
    h("table", { class: "responsive rules" },
      h("thead", {}, h("tr", {}, ["#", "Rule", "Matches", "Decides"].map((one) => h("th", { scope: "col" }, one)))),
      h("tbody", {}, described.rules.map((rule, index) => h("tr", { "data-rule": rule.id },
        h("td", { "data-label": "#" }, rule.priority !== undefined ? `${index + 1} (priority ${rule.priority})` : String(index + 1)),
        h("td", { "data-label": "Rule", class: "mono" }, rule.id),
        h("td", { "data-label": "Matches" }, condition(rule.when)),
        h("td", { "data-label": "Decides" }, decision(rule.then)))))),
    h("p", {}, "Otherwise: ", badge(described.default_action)));
}

// A line diff (longest common subsequence), enough for bundles of a few hundred lines.
export function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  const table = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    }
  }
  const lines = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { lines.push([" ", a[i]]); i++; j++; }
    else if (j < b.length && (i === a.length || table[i][j + 1] >= table[i + 1][j])) { lines.push(["+", b[j]]); j++; }
    else { lines.push(["-", a[i]]); i++; }
  }
  return lines;
}

function diffBlock(before, after) {
  const lines = lineDiff(before, after);
  if (lines.every(([mark]) => mark === " ")) return h("p", { class: "muted" }, "No change from the bundle in force.");
  return h("pre", { class: "diff", "aria-label": "Diff against the bundle in force" },
    lines.map(([mark, text]) => h("span", { class: mark === "+" ? "add" : mark === "-" ? "del" : "" }, `${mark} ${text}`)));
}

export async function render(main, params, id) {
  let agent = await api(`/v0/agents/${encodeURIComponent(id)}`);
  const path = `/v0/policies/${encodeURIComponent(id)}`;
  const current = h("div", { id: "current" });
  const editor = h("textarea", { id: "bundle", rows: 16, spellcheck: "false" }, agent.policy_bundle || "");
  const verdict = h("div", { id: "verdict", role: "status" });
  const diff = h("div", { id: "diff" });
  const kind = h("select", { id: "try-kind" }, ["tool_call", "llm_call", "local"].map((one) => h("option", { value: one }, one)));
  const target = h("input", { id: "try-target", placeholder: "target, e.g. run_command" });
  const args = h("textarea", { id: "try-args", rows: 3, spellcheck: "false" }, "{}");
  const tried = h("div", { id: "tried", role: "status" });

  const showCurrent = async () => replace(current, rulesTable(await api(`${path}/check`, { method: "POST", body: {} })));

  async function validate() {
    replace(diff, diffBlock(agent.policy_bundle || "", editor.value));
    try {
      const described = await api(`${path}/check`, { method: "POST", body: { bundle: editor.value } });
      replace(verdict, h("p", { class: "notice" }, "Valid: the kernel's loader accepts this bundle."), rulesTable(described));
      return true;
    } catch (error) {
      replace(verdict, h("p", { class: "error invalid", role: "alert" }, error.message));
      return false;
    }
  }

  async function tryIt() {
    let parsed;
    try {
      parsed = JSON.parse(args.value || "null");
    } catch (error) {
      replace(tried, h("p", { class: "error" }, `Arguments are not JSON: ${error.message}`));
      return;
    }
    try {
      const checked = await api(`${path}/check`, {
        method: "POST", body: { bundle: editor.value, step: { kind: kind.value, target: target.value, args: parsed } },
      });
      const outcome = checked.decision;
      replace(tried, h("p", {}, badge(outcome.action), ` by rule ${outcome.rule_id}`, outcome.reason ? ` (${outcome.reason})` : ""));
    } catch (error) {
      replace(tried, h("p", { class: "error", role: "alert" }, error.message));
    }
  }

  async function save() {
    if (!(await validate())) return;
    if (!(await confirmAction("Save this bundle?", `It decides the next new step of ${id}; recorded steps keep their decisions.`, "Save"))) return;
    try {
      await api(path, { method: "POST", body: { bundle: editor.value } });
      agent = await api(`/v0/agents/${encodeURIComponent(id)}`);
      replace(verdict, h("p", { class: "notice saved" }, "Saved."));
      replace(diff);
      await showCurrent();
    } catch (error) {
      replace(verdict, h("p", { class: "error", role: "alert" }, error.message));
    }
  }

  replace(main,
    h("h1", {}, "Policy of ", h("a", { href: `#/agents/${id}`, class: "mono" }, id)),
    h("h2", {}, "In force"), current,
    h("h2", {}, "Edit"),
    h("label", { for: "bundle" }, "Bundle (YAML)"), editor,
    h("div", { class: "row" },
      h("button", { class: "quiet", id: "validate", onclick: validate }, "Check"),
      h("button", { id: "save", onclick: save }, "Save…")),
    verdict, diff,
    h("h2", {}, "Try against a step"),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "try-kind" }, "Kind"), kind),
      h("div", {}, h("label", { for: "try-target" }, "Target"), target)),
    h("label", { for: "try-args" }, "Arguments (JSON)"), args,
    h("div", { class: "row" }, h("button", { class: "quiet", id: "try", onclick: tryIt }, "Try")),
    tried);
  await showCurrent();
  return undefined;
}
