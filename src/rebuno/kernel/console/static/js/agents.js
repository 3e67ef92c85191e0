// Agents: each one's webhook, lease and registration, its recent executions and links to
// its policy and to a new execution. The secret never leaves the kernel, so it is never here.
import { api, query } from "./api.js";
import { facts, h, jsonBlock, replace, time } from "./dom.js";
import { executionTable } from "./executions.js";

function lease(agent) {
  return agent.lease_timeout_seconds !== undefined ? `${agent.lease_timeout_seconds} s` : "kernel default";
}

async function list(main) {
  const agents = await api("/v0/agents");
  replace(main, h("h1", {}, "Agents"),
    agents.length ? h("table", { class: "responsive agents" },
      h("thead", {}, h("tr", {}, ["Agent", "Webhook", "Lease", "Registered", "Policy"].map((one) => h("th", { scope: "col" }, one)))),
      h("tbody", {}, agents.map((agent) => h("tr", { "data-agent": agent.id },
        h("td", { "data-label": "Agent" }, h("a", { href: `#/agents/${agent.id}` }, agent.id)),
        h("td", { "data-label": "Webhook", class: "mono" }, agent.webhook_url),
        h("td", { "data-label": "Lease" }, lease(agent)),
        h("td", { "data-label": "Registered" }, time(agent.registered_at)),
        h("td", { "data-label": "Policy" }, h("a", { href: `#/agents/${agent.id}/policy` }, agent.policy_bundle ? "bundle" : "none (allow all)"))))))
      : h("p", { class: "muted" }, "No agent is registered."));
}

export async function render(main, params, id) {
  if (!id) return list(main);
  const [agent, recent] = await Promise.all([
    api(`/v0/agents/${encodeURIComponent(id)}`),
    api(`/v0/executions${query({ agent_id: id, limit: 10 })}`),
  ]);
  replace(main,
    h("h1", {}, "Agent ", h("span", { class: "mono" }, agent.id)),
    facts([
      ["Webhook", h("span", { class: "mono" }, agent.webhook_url)],
      ["Lease", lease(agent)],
      ["Registered", time(agent.registered_at)],
      ["Description", agent.metadata && agent.metadata.description],
    ]),
    agent.metadata && agent.metadata.input_schema ? jsonBlock("Input schema", agent.metadata.input_schema, false) : null,
    h("p", { class: "row" },
      h("a", { href: `#/agents/${agent.id}/policy` }, "Policy"),
      h("a", { href: `#/new?agent=${encodeURIComponent(agent.id)}` }, "New execution"),
      h("a", { href: `#/executions?agent_id=${encodeURIComponent(agent.id)}` }, "All its executions")),
    h("h2", {}, "Recent executions"),
    recent.executions.length ? executionTable(recent.executions) : h("p", { class: "muted" }, "None yet."));
  return undefined;
}
