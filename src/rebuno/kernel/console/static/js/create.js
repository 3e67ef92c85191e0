// A new execution for an agent: the input is JSON, checked before anything is sent.
import { api } from "./api.js";
import { h, jsonBlock, replace } from "./dom.js";

export async function render(main, params) {
  const agents = await api("/v0/agents");
  const chosen = params.get("agent") || (agents[0] && agents[0].id) || "";
  const agent = h("select", { id: "agent", name: "agent_id", required: true },
    agents.map((one) => h("option", { value: one.id, selected: one.id === chosen }, one.id)));
  const input = h("textarea", { id: "input", rows: 8, spellcheck: "false", "aria-describedby": "input-problem" }, "{}");
  const session = h("input", { id: "session", name: "session" });
  const key = h("input", { id: "idempotency", name: "idempotency_key" });
  const problem = h("p", { id: "input-problem", class: "error", role: "alert" });
  const submit = h("button", { type: "submit" }, "Create execution");
  const schema = h("div");
  const check = () => {
    try {
      JSON.parse(input.value);
      problem.textContent = "";
      submit.disabled = false;
      return true;
    } catch (error) {
      problem.textContent = `Input is not JSON: ${error.message}`;
      submit.disabled = true;
      return false;
    }
  };
  const showSchema = () => {
    const found = agents.find((one) => one.id === agent.value);
    replace(schema, found && found.metadata && found.metadata.input_schema
      ? jsonBlock("Input schema", found.metadata.input_schema, true) : null);
  };
  input.addEventListener("input", check);
  agent.addEventListener("change", showSchema);
  const form = h("form", { class: "create" },
    h("label", { for: "agent" }, "Agent"), agent, schema,
    h("label", { for: "input" }, "Input (JSON)"), input, problem,
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "session" }, "Session (optional)"), session),
      h("div", {}, h("label", { for: "idempotency" }, "Idempotency key (optional)"), key)),
    submit);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!check()) return;
    try {
      const created = await api("/v0/executions", {
        method: "POST",
        body: {
          agent_id: agent.value, input: JSON.parse(input.value),
          session: session.value.trim() || undefined, idempotency_key: key.value.trim() || undefined,
        },
      });
      window.location.hash = `#/executions/${created.id}`;
    } catch (error) {
      problem.textContent = error.message;
    }
  });
  replace(main, h("h1", {}, "New execution"), agents.length ? form : h("p", { class: "muted" }, "Register an agent first."));
  showSchema();
  return undefined;
}
