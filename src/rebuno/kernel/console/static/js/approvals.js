// The approvals inbox: pending first, soonest timeout first, each with the step it gates;
// grant or deny with a rationale after a confirmation; resolved ones with who and when.
import { api, query } from "./api.js";
import {
  badge, confirmAction, countdown, debounced, executionLink, facts, h, jsonBlock, replace, time,
} from "./dom.js";

const APPROVER_KEY = "rebuno.approver";

async function stepOf(approval) {
  try {
    return await api(`/v0/executions/${approval.execution_id}/steps/${approval.step_id}`);
  } catch {
    return null;
  }
}

async function ruleOf(approval) {
  const events = await api(`/v0/executions/${approval.execution_id}/events${query({ limit: 1000 })}`);
  const asked = events.find((event) => event.type === "step.awaiting_approval" && event.payload.step_id === approval.step_id);
  return asked ? asked.payload.rule_id : null;
}

function outcome(approval) {
  return h("p", { class: "outcome", role: "status" }, badge(approval.status),
    approval.decided_by ? ` by ${approval.decided_by}` : "",
    approval.decided_at ? h("span", {}, " at ", time(approval.decided_at)) : "",
    approval.rationale ? ` — “${approval.rationale}”` : "");
}

function resolvedHere(card, approval) {
  card.querySelector(".actions")?.remove();
  replace(card.querySelector(".result"), h("p", {}, "Already resolved:"), outcome(approval));
}

function pendingCard(approval, step, rule, execution, approver, redraw) {
  const rationale = h("textarea", { rows: 2, id: `why-${approval.id}`, placeholder: "Why (optional)" });
  const status = h("div", { class: "result" });
  const clock = h("span", { class: "countdown", "data-until": approval.timeout_at }, countdown(approval.timeout_at));
  async function decide(verb) {
    const who = approver.value.trim();
    const question = verb === "grant" ? "Grant this approval?" : "Deny this approval?";
    const text = `${step ? `${step.kind} ${step.target}` : "The step"} of ${approval.execution_id}` +
      (who ? `, as ${who}` : "") + (rationale.value.trim() ? `: “${rationale.value.trim()}”` : "");
    if (!(await confirmAction(question, text, verb === "grant" ? "Grant" : "Deny"))) return;
    if (who) localStorage.setItem(APPROVER_KEY, who);
    try {
      await api(`/v0/approvals/${approval.id}/${verb}`, {
        method: "POST", body: { decided_by: who || undefined, rationale: rationale.value.trim() || undefined },
      });
      replace(status, outcome(await api(`/v0/approvals/${approval.id}`)));
      card.querySelector(".actions")?.remove();
    } catch (error) {
      if (error.status === 409) {
        // Someone (or the expiry) decided first: show what happened, not an error.
        resolvedHere(card, await api(`/v0/approvals/${approval.id}`));
      } else {
        replace(status, h("p", { class: "error", role: "alert" }, error.message));
      }
    }
    redraw();
  }
  const card = h("article", { class: "card pending", "data-approval": approval.id },
    h("h3", {}, step ? `${step.kind} ` : "step ", h("span", { class: "mono" }, step ? step.target : approval.step_id), " ", badge("pending")),
    approval.message ? h("p", { class: "message" }, approval.message) : null,
    facts([
      ["Agent", execution ? h("a", { href: `#/agents/${execution.agent_id}` }, execution.agent_id) : ""],
      ["Execution", executionLink(approval.execution_id)],
      ["Rule", rule],
      ["Approvers", approval.approvers === null ? "anyone" : approval.approvers.join(", ")],
      ["Asked", time(approval.created_at)],
      ["Expires", h("span", {}, time(approval.timeout_at), " (", clock, ")")],
    ]),
    step && "args" in step ? jsonBlock("Arguments", step.args, true) : null,
    h("label", { for: rationale.id }, "Rationale"), rationale,
    h("div", { class: "actions" },
      h("button", { class: "danger deny", onclick: () => decide("deny") }, "Deny…"),
      h("button", { class: "grant", onclick: () => decide("grant") }, "Grant…")),
    status);
  return card;
}

function resolvedRow(approval) {
  return h("tr", { "data-approval": approval.id },
    h("td", { "data-label": "Execution" }, executionLink(approval.execution_id)),
    h("td", { "data-label": "Outcome" }, badge(approval.status)),
    h("td", { "data-label": "By" }, approval.decided_by || ""),
    h("td", { "data-label": "When" }, time(approval.decided_at)),
    h("td", { "data-label": "Rationale" }, approval.rationale || ""));
}

export async function render(main) {
  const approver = h("input", { id: "approver", value: localStorage.getItem(APPROVER_KEY) || "", autocomplete: "name",
    placeholder: "your name, as the rule lists it" });
  const pendingList = h("div", { class: "cards", id: "pending" });
  const resolved = h("tbody");
  const draw = async () => {
    const all = await api("/v0/approvals?status=all");
    const pending = all.filter((one) => one.status === "pending")
      .sort((a, b) => new Date(a.timeout_at) - new Date(b.timeout_at));
    const shown = new Set([...pendingList.querySelectorAll("article.pending")].map((one) => one.dataset.approval));
    const wanted = new Set(pending.map((one) => one.id));
    for (const card of pendingList.querySelectorAll("article.pending")) {
      if (wanted.has(card.dataset.approval) || card.querySelector(".outcome")) continue;
      // Decided elsewhere (another person, the expiry, a cancel): say so where it was.
      const found = all.find((one) => one.id === card.dataset.approval);
      if (!found) { card.remove(); continue; }
      resolvedHere(card, found);
    }
    for (const approval of pending) {
      if (shown.has(approval.id)) continue;
      const [step, rule, execution] = await Promise.all([stepOf(approval), ruleOf(approval),
        api(`/v0/executions/${approval.execution_id}`).catch(() => null)]);
      pendingList.append(pendingCard(approval, step, rule, execution, approver, redraw));
    }
    pendingList.querySelector(".empty")?.remove();
    if (!pendingList.children.length) pendingList.append(h("p", { class: "muted empty" }, "Nothing waits for a decision."));
    const done = all.filter((one) => one.status !== "pending")
      .sort((a, b) => new Date(b.decided_at || b.created_at) - new Date(a.decided_at || a.created_at)).slice(0, 50);
    replace(resolved, done.map(resolvedRow));
    window.dispatchEvent(new CustomEvent("rebuno:recount"));
  };
  // One drawing at a time, and one more after it when news came in the meantime.
  let drawing = null;
  let again = false;
  const redraw = debounced(async () => {
    if (drawing) { again = true; return; }
    drawing = draw().finally(() => { drawing = null; if (again) { again = false; redraw(); } });
  });
  replace(main,
    h("h1", {}, "Approvals"),
    h("div", { class: "row" }, h("div", {}, h("label", { for: "approver" }, "Deciding as"), approver)),
    h("h2", {}, "Pending"), pendingList,
    h("h2", {}, "Resolved"),
    h("table", { class: "responsive" },
      h("thead", {}, h("tr", {}, ["Execution", "Outcome", "By", "When", "Rationale"].map((one) => h("th", { scope: "col" }, one)))),
      resolved));
  window.addEventListener("rebuno:execution", redraw);
  window.addEventListener("rebuno:resync", redraw);
  drawing = draw().finally(() => { drawing = null; if (again) { again = false; redraw(); } });
  await drawing;
  const tick = setInterval(() => {
    for (const clock of main.querySelectorAll(".countdown")) clock.textContent = countdown(clock.dataset.until);
  }, 1000);
  return () => {
    clearInterval(tick);
    window.removeEventListener("rebuno:execution", redraw);
    window.removeEventListener("rebuno:resync", redraw);
  };
}
