// The executions list: filters, id-prefix search and keyset paging over GET /v0/executions,
// with status badges kept current by the activity feed.
import { api, query } from "./api.js";
import { badge, executionLink, h, replace, time } from "./dom.js";

const STATUSES = ["pending", "running", "blocked", "completed", "failed", "cancelled"];
const FILTERS = ["status", "agent_id", "session", "created_after", "created_before", "id_prefix"];
// Set by the links of an execution's lineage, not by the form: whose relatives are listed.
const LINEAGE = { spawned_by: "Sub-agents of", parent_execution_id: "Continuations of", forked_from: "Forks of" };

function isoOrEmpty(local) {
  return local ? new Date(local).toISOString() : "";
}

function localOf(iso) {
  if (!iso) return "";
  const moment = new Date(iso);
  const shifted = new Date(moment.getTime() - moment.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 16);
}

function filterForm(params, agents) {
  const field = (label, control) => h("div", {}, h("label", { for: control.id }, label), control);
  const status = h("select", { id: "f-status", name: "status" }, h("option", { value: "" }, "any"),
    STATUSES.map((one) => h("option", { value: one, selected: params.get("status") === one }, one)));
  const agent = h("select", { id: "f-agent", name: "agent_id" }, h("option", { value: "" }, "any"),
    agents.map((one) => h("option", { value: one.id, selected: params.get("agent_id") === one.id }, one.id)));
  const session = h("input", { id: "f-session", name: "session", value: params.get("session") || "", size: 12 });
  const after = h("input", { id: "f-after", type: "datetime-local", value: localOf(params.get("created_after")) });
  const before = h("input", { id: "f-before", type: "datetime-local", value: localOf(params.get("created_before")) });
  const prefix = h("input", { id: "f-id", name: "id_prefix", value: params.get("id_prefix") || "",
    placeholder: "id or its start", size: 16, spellcheck: "false" });
  const form = h("form", { class: "filters", role: "search" },
    field("Status", status), field("Agent", agent), field("Session", session),
    field("Created after", after), field("Created before", before), field("Id", prefix),
    h("button", { type: "submit" }, "Filter"),
    h("a", { href: "#/executions" }, "Clear"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = {
      status: status.value, agent_id: agent.value, session: session.value.trim(),
      created_after: isoOrEmpty(after.value), created_before: isoOrEmpty(before.value),
      id_prefix: prefix.value.trim(),
      ...Object.fromEntries(Object.keys(LINEAGE).map((key) => [key, params.get(key)])),
    };
    window.location.hash = `#/executions${query(next)}`;
  });
  return form;
}

export function executionRow(execution) {
  return h("tr", { "data-id": execution.id },
    h("td", { "data-label": "Id" }, executionLink(execution.id)),
    h("td", { "data-label": "Agent" }, h("a", { href: `#/agents/${execution.agent_id}` }, execution.agent_id)),
    h("td", { "data-label": "Status", class: "status" }, badge(execution.status)),
    h("td", { "data-label": "Created" }, time(execution.created_at)),
    h("td", { "data-label": "Updated", class: "updated" }, time(execution.updated_at)),
    h("td", { "data-label": "Session" }, execution.session || ""));
}

export function executionTable(items) {
  return h("table", { class: "responsive executions" },
    h("thead", {}, h("tr", {}, ["Id", "Agent", "Status", "Created", "Updated", "Session"].map((one) => h("th", { scope: "col" }, one)))),
    h("tbody", {}, items.map(executionRow)));
}

function matches(execution, params) {
  for (const [key, field] of [["status", "status"], ["agent_id", "agent_id"], ["session", "session"]]) {
    const wanted = params.get(key);
    if (wanted && execution[field] !== wanted) return false;
  }
  for (const key of Object.keys(LINEAGE)) {
    const wanted = params.get(key);
    const value = key === "spawned_by" ? execution.spawned_by?.execution_id : execution[key];
    if (wanted && value !== wanted) return false;
  }
  return !params.get("cursor") && !params.get("id_prefix") && !params.get("created_before");
}

export async function render(main, params) {
  const filters = Object.fromEntries([...FILTERS, ...Object.keys(LINEAGE)].map((key) => [key, params.get(key)]));
  const relatives = Object.entries(LINEAGE).filter(([key]) => params.get(key))
    .map(([key, label]) => h("p", { class: "muted" }, `${label} `, executionLink(params.get(key))));
  // Listening before the first read; what changes meanwhile is applied once it is shown.
  const early = [];
  const buffer = (event) => early.push(event);
  window.addEventListener("rebuno:execution", buffer);
  const [page, agents] = await Promise.all([
    api(`/v0/executions${query({ ...filters, cursor: params.get("cursor"), limit: 50 })}`),
    api("/v0/agents"),
  ]).finally(() => window.removeEventListener("rebuno:execution", buffer));
  const table = executionTable(page.executions);
  const tbody = table.querySelector("tbody");
  const pager = h("p", { class: "row" });
  if (params.get("cursor")) pager.append(h("a", { href: `#/executions${query(filters)}` }, "First page"));
  if (page.next_cursor) {
    pager.append(h("a", { href: `#/executions${query({ ...filters, cursor: page.next_cursor })}`, rel: "next" }, "Next page"));
  }
  replace(main,
    h("h1", {}, "Executions"),
    relatives,
    filterForm(params, agents),
    page.executions.length ? table : h("p", { class: "muted empty" }, "No execution matches."),
    pager);
  if (!page.executions.length) main.insertBefore(table, pager);
  // Ids are time-ordered: one above the newest listed was created since.
  const newest = page.executions.length ? page.executions[0].id : "";
  const onChange = (event) => {
    const execution = event.detail;
    const row = tbody.querySelector(`tr[data-id="${execution.id}"]`);
    if (row) {
      replace(row.querySelector(".status"), badge(execution.status));
      replace(row.querySelector(".updated"), time(execution.updated_at));
    } else if (execution.id > newest && matches(execution, params)) {
      const fresh = executionRow(execution);
      fresh.classList.add("fresh");
      tbody.prepend(fresh);
      main.querySelector(".empty")?.remove();
    }
  };
  window.addEventListener("rebuno:execution", onChange);
  early.forEach(onChange);
  return () => window.removeEventListener("rebuno:execution", onChange);
}
