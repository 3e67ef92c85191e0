// The console's entry: the hash router, the navigation, the live feed and the approvals badge.
import { api, signedIn } from "./api.js";
import { debounced, replace, h } from "./dom.js";
import * as overview from "./overview.js";
import * as executions from "./executions.js";
import * as execution from "./execution.js";
import * as approvals from "./approvals.js";
import * as agents from "./agents.js";
import * as policy from "./policy.js";
import * as create from "./create.js";

const main = document.getElementById("main");
let cleanup = null;
let first = true;

// Routes: #/ · #/executions?… · #/executions/<id> · #/approvals · #/agents · #/agents/<id>
// · #/agents/<id>/policy · #/new?agent=<id>
function resolve(hash) {
  const [path, search] = (hash.replace(/^#/, "") || "/").split("?");
  const params = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean);
  if (parts.length === 0) return ["overview", overview, params];
  if (parts[0] === "executions" && parts[1]) return ["executions", execution, params, parts[1]];
  if (parts[0] === "executions") return ["executions", executions, params];
  if (parts[0] === "approvals") return ["approvals", approvals, params];
  if (parts[0] === "agents" && parts[2] === "policy") return ["agents", policy, params, parts[1]];
  if (parts[0] === "agents" && parts[1]) return ["agents", agents, params, parts[1]];
  if (parts[0] === "agents") return ["agents", agents, params];
  if (parts[0] === "new") return ["new", create, params];
  return ["", null, params];
}

async function route() {
  if (cleanup) cleanup();
  cleanup = null;
  const [section, page, params, id] = resolve(window.location.hash);
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!page) {
    replace(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Overview")));
    return;
  }
  replace(main, h("p", { class: "muted" }, "Loading…"));
  try {
    cleanup = (await page.render(main, params, id)) || null;
  } catch (error) {
    replace(main, h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, error.message));
  }
  // After a navigation the reader starts at the new page; a first load starts at the top.
  if (!first) main.focus({ preventScroll: true });
  first = false;
}

// One feed of execution changes for the whole page (GET /v0/activity): pages listen for
// "rebuno:execution" events, and the badge recounts when anything may have asked or answered.
function watch() {
  const live = document.getElementById("live");
  const source = new EventSource("/v0/activity");
  source.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
  source.onerror = () => { live.textContent = "reconnecting"; live.classList.remove("on"); };
  source.onmessage = (message) => {
    const frame = JSON.parse(message.data);
    if (frame.type === "execution") {
      window.dispatchEvent(new CustomEvent("rebuno:execution", { detail: frame.execution }));
    } else {
      window.dispatchEvent(new CustomEvent("rebuno:resync"));
    }
    recount();
  };
}

export const recount = debounced(async () => {
  const badge = document.getElementById("approval-count");
  try {
    const pending = await api("/v0/approvals?status=pending");
    badge.textContent = String(pending.length);
    badge.classList.toggle("some", pending.length > 0);
    badge.dataset.count = String(pending.length);
  } catch {
    badge.textContent = "?";
  }
}, 100);

document.getElementById("sign-out").hidden = !signedIn();
window.addEventListener("hashchange", route);
window.addEventListener("rebuno:recount", recount);
watch();
recount();
route();
