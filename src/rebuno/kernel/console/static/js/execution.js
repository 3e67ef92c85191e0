// One execution: its facts, input and output, the timeline of its steps, its raw event log,
// the live output of a running step, cancel, fork from an event, and its lineage as a tree.
import { api, query } from "./api.js";
import {
  badge, confirmAction, debounced, duration, executionLink, facts, h, jsonBlock, pretty, replace, time,
} from "./dom.js";

const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const EVENTS_PAGE = 50;
const LINEAGE_PAGE = 50;
const DECISIONS = {
  "step.allowed": "allow", "step.denied": "deny", "step.awaiting_approval": "require_approval",
  "step.rate_limited": "rate_limited",
};

async function allEvents(id) {
  const events = [];
  for (;;) {
    const after = events.length ? events[events.length - 1].event_seq : 0;
    const page = await api(`/v0/executions/${id}/events${query({ after_seq: after, limit: 1000 })}`);
    events.push(...page);
    if (page.length < 1000) return events;
  }
}

// The executions this one comes from, above it, and those that come from it, below: its
// sub-agents, the executions that continue it and its forks, each from the list filter
// that names them (§5.1). A relative is read as a list item, so a large input or output
// stays behind; one retention removed shows without a status.
async function listed(filters, limit) {
  return api(`/v0/executions${query({ ...filters, limit })}`);
}

async function lineage(execution) {
  const id = execution.id;
  const up = [];
  if (execution.spawned_by) up.push(["Sub-agent of", execution.spawned_by.execution_id, ""]);
  if (execution.forked_from) up.push(["Forked from", execution.forked_from, ` at event ${execution.fork_seq}`]);
  if (execution.parent_execution_id) up.push(["Continues", execution.parent_execution_id, ""]);
  const down = [["Sub-agent", "spawned_by"], ["Continued by", "parent_execution_id"], ["Fork", "forked_from"]];
  const [ups, downs] = await Promise.all([
    Promise.all(up.map(([, other]) => listed({ id_prefix: other }, 1))),
    Promise.all(down.map(([, filter]) => listed({ [filter]: id }, LINEAGE_PAGE))),
  ]);
  return {
    up: up.map(([label, other, note], at) => ({ label, id: other, note, found: ups[at].executions[0] })),
    down: down.map(([label, filter], at) => ({ label, filter, page: downs[at] })),
  };
}

function relative(label, id, found, note = "") {
  return h("li", { "data-id": id }, `${label} `, executionLink(id), note, " ",
    found ? [badge(found.status), h("span", { class: "muted" }, ` ${found.agent_id}`)] : h("span", { class: "muted" }, "(no longer stored)"));
}

function lineageTree(execution, found) {
  const below = [];
  for (const { label, filter, page } of found.down) {
    for (const one of [...page.executions].reverse()) {
      below.push(relative(label, one.id, one, filter === "forked_from" ? ` at event ${one.fork_seq}` : ""));
    }
    if (page.next_cursor) {
      below.push(h("li", {}, h("a", { href: `#/executions${query({ [filter]: execution.id })}` }, `Every ${label.toLowerCase()}`)));
    }
  }
  if (!found.up.length && !below.length) return null;
  return h("section", { class: "lineage", "aria-label": "Lineage" },
    h("h2", {}, "Lineage"),
    h("ul", { class: "tree" },
      found.up.map((one) => relative(one.label, one.id, one.found, one.note)),
      h("li", { class: "self", "data-id": execution.id }, "This execution ", h("span", { class: "mono" }, execution.id), " ",
        badge(execution.status), below.length ? h("ul", {}, below) : null)));
}

function summary(execution, onCancel) {
  const cancel = TERMINAL.has(execution.status) ? null
    : h("button", { class: "danger", id: "cancel", onclick: onCancel }, "Cancel execution");
  return h("section", { "aria-label": "Execution" },
    h("h1", {}, "Execution ", h("span", { class: "mono" }, execution.id), " ", badge(execution.status)),
    facts([
      ["Agent", h("a", { href: `#/agents/${execution.agent_id}` }, execution.agent_id)],
      ["Status", execution.status],
      ["Failure", execution.failure_reason],
      ["Created", time(execution.created_at)],
      ["Admitted", time(execution.admitted_at)],
      ["Updated", time(execution.updated_at)],
      ["Took", TERMINAL.has(execution.status) ? duration(execution.created_at, execution.updated_at) : ""],
      ["Deadline", time(execution.deadline_at)],
      ["Created by", execution.created_by],
      ["On behalf of", execution.on_behalf_of],
      ["Session", execution.session],
      ["Idempotency key", execution.idempotency_key],
    ]),
    cancel,
    jsonBlock("Input", execution.input),
    "output" in execution ? jsonBlock("Output", execution.output) : null);
}

function decisionsByStep(events) {
  const found = new Map();
  for (const event of events) {
    const stepId = event.payload && event.payload.step_id;
    if (!stepId) continue;
    const entry = found.get(stepId) || { decision: null, rule: null, usage: null };
    if (DECISIONS[event.type] && !entry.decision) {
      entry.decision = DECISIONS[event.type];
      entry.rule = event.payload.rule_id || null;
    }
    if (event.type === "step.succeeded" && event.payload.usage) entry.usage = event.payload.usage;
    found.set(stepId, entry);
  }
  return found;
}

function stepItem(step, decided, approval, liveText) {
  const usage = step.usage || decided.usage;
  const item = h("li", { class: step.status, "data-step": step.step_id },
    h("h3", {}, `${step.kind} `, h("span", { class: "mono" }, step.target || "(no target)"), " ", badge(step.status)),
    facts([
      ["Policy", decided.decision ? h("span", {}, badge(decided.decision), decided.rule ? ` rule ${decided.rule}` : "") : ""],
      ["Approval", approval ? h("span", { class: "approval-outcome" }, badge(approval.status),
        approval.decided_by ? ` by ${approval.decided_by}` : "",
        approval.rationale ? `: ${approval.rationale}` : "") : ""],
      ["Idempotency", step.idempotency],
      ["Occurrence", String(step.occurrence)],
      ["Started", time(step.started_at)],
      ["Took", duration(step.started_at, step.completed_at)],
      ["Tokens", usage ? `${usage.input_tokens} in, ${usage.output_tokens} out` : ""],
      ["Step id", h("span", { class: "mono" }, step.step_id)],
    ]),
    "args" in step ? jsonBlock("Arguments", step.args, false) : null,
    "result" in step ? jsonBlock("Result", step.result, false) : null,
    "error" in step ? jsonBlock("Error", step.error, true) : null);
  if (liveText !== undefined || (step.kind === "llm_call" && step.status === "executing")) {
    item.append(h("h3", {}, "Live output"),
      h("pre", { class: "live-output", "data-live-step": step.step_id, "aria-live": "polite" }, liveText || ""));
  }
  return item;
}

function eventRow(event, onFork) {
  return h("tr", { "data-seq": event.event_seq },
    h("td", { "data-label": "Seq" }, String(event.event_seq)),
    h("td", { "data-label": "Type", class: "mono" }, event.type),
    h("td", { "data-label": "At" }, time(event.occurred_at)),
    h("td", { "data-label": "Payload" }, event.omitted ? "(left out: large)" : h("details", {},
      h("summary", {}, "payload"), h("pre", {}, pretty(event.payload)))),
    h("td", {}, h("button", { class: "quiet fork", onclick: () => onFork(event.event_seq) }, "Fork here")));
}

export async function render(main, params, id) {
  const live = new Map(); // step id → text streamed so far
  let eventsAfter = Number(params.get("after_seq") || 0);
  const head = h("div");
  const tree = h("div");
  let latest = null; // the execution as last read
  const timeline = h("ol", { class: "timeline", "aria-label": "Timeline" });
  const log = h("tbody");
  const pager = h("p", { class: "row" });
  const notice = h("p", { role: "status" });

  async function onCancel() {
    if (!(await confirmAction("Cancel this execution?", `Execution ${id} stops; a running step is cancelled.`, "Cancel execution"))) return;
    try {
      await api(`/v0/executions/${id}/cancel`, { method: "POST" });
      notice.textContent = "Cancelled.";
    } catch (error) {
      notice.textContent = error.message;
    }
    refresh();
  }

  async function onFork(seq) {
    if (!(await confirmAction("Fork from this event?", `A new execution starts from event ${seq} of this one.`, "Fork"))) return;
    try {
      const fork = await api(`/v0/executions/${id}/fork`, { method: "POST", body: { at_seq: seq } });
      window.location.hash = `#/executions/${fork.id}`;
    } catch (error) {
      notice.textContent = error.message;
    }
  }

  async function showEvents() {
    const page = await api(`/v0/executions/${id}/events${query({ after_seq: eventsAfter, limit: EVENTS_PAGE })}`);
    replace(log, page.map((event) => eventRow(event, onFork)));
    replace(pager);
    if (eventsAfter > 0) {
      pager.append(h("button", { class: "quiet", onclick: () => { eventsAfter = Math.max(0, eventsAfter - EVENTS_PAGE); showEvents(); } }, "Earlier events"));
    }
    if (page.length === EVENTS_PAGE) {
      pager.append(h("button", { class: "quiet", onclick: () => { eventsAfter = page[page.length - 1].event_seq; showEvents(); } }, "Later events"));
    }
  }

  async function showLineage(execution) {
    replace(tree, lineageTree(execution, await lineage(execution)));
  }

  async function refresh() {
    const [execution, steps, approvals, events] = await Promise.all([
      api(`/v0/executions/${id}`),
      api(`/v0/executions/${id}/steps`),
      api(`/v0/approvals${query({ status: "all", execution_id: id })}`),
      allEvents(id),
    ]);
    latest = execution;
    replace(head, summary(execution, onCancel));
    const related = showLineage(execution);
    const decided = decisionsByStep(events);
    const byStep = new Map(approvals.map((one) => [one.step_id, one]));
    replace(timeline, steps.length ? steps.map((step) => stepItem(step, decided.get(step.step_id) || {}, byStep.get(step.step_id), live.get(step.step_id)))
      : h("li", { class: "muted" }, "No steps yet."));
    await Promise.all([related, showEvents()]);
    return execution;
  }

  // Listening before the first read, so a change made while it is on its way is not lost.
  let loaded = false;
  let missed = false;
  let stream = null;
  const again = debounced(async () => {
    const now = await refresh();
    if (stream && TERMINAL.has(now.status)) { stream.close(); stream = null; }
  });
  const againLineage = debounced(() => showLineage(latest));
  const onChange = (event) => {
    const changed = event.detail;
    if (changed.id === id) {
      if (loaded) again(); else missed = true;
      return;
    }
    const node = tree.querySelector(`li[data-id="${changed.id}"] > .badge`);
    if (node) node.replaceWith(badge(changed.status));
    else if (loaded && [changed.spawned_by?.execution_id, changed.parent_execution_id, changed.forked_from].includes(id)) againLineage();
  };
  window.addEventListener("rebuno:execution", onChange);
  window.addEventListener("rebuno:resync", again);
  const cleanup = () => {
    window.removeEventListener("rebuno:execution", onChange);
    window.removeEventListener("rebuno:resync", again);
    if (stream) stream.close();
  };
  let execution;
  try {
    execution = await refresh();
  } catch (error) {
    cleanup();
    throw error;
  }
  replace(main, head, notice, tree,
    h("h2", {}, "Timeline"), timeline,
    h("h2", {}, "Event log"),
    h("table", { class: "responsive events" },
      h("thead", {}, h("tr", {}, ["Seq", "Type", "At", "Payload", ""].map((one) => h("th", { scope: "col" }, one)))), log),
    pager);

  if (!TERMINAL.has(execution.status)) {
    stream = new EventSource(`/v0/executions/${id}/stream`);
    stream.onmessage = (message) => {
      const delta = JSON.parse(message.data);
      live.set(delta.step_id, (live.get(delta.step_id) || "") + delta.data);
      let target = timeline.querySelector(`pre[data-live-step="${delta.step_id}"]`);
      if (!target) {
        const item = timeline.querySelector(`li[data-step="${delta.step_id}"]`);
        if (!item) return; // the step shows up with the next refresh, text included
        target = h("pre", { class: "live-output", "data-live-step": delta.step_id, "aria-live": "polite" });
        item.append(h("h3", {}, "Live output"), target);
      }
      target.textContent = live.get(delta.step_id);
    };
  }
  loaded = true;
  if (missed) again();
  return cleanup;
}
