// The overview: executions by status, the dispatch queue and failing deliveries (from the
// kernel's /metrics), approvals waiting, the latest failures, and executions per minute.
import { api, query } from "./api.js";
import { executionTable } from "./executions.js";
import { h, replace } from "./dom.js";

const STATUSES = ["pending", "running", "blocked", "completed", "failed", "cancelled"];
const SVG = "http://www.w3.org/2000/svg";

async function count(status) {
  const page = await api(`/v0/executions${query({ status, limit: 200 })}`);
  return page.next_cursor ? "200+" : String(page.executions.length);
}

async function metrics() {
  const response = await fetch("/metrics");
  const text = response.ok ? await response.text() : "";
  const found = { depth: 0, lag: 0, failed: 0 };
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const [name, value] = [line.slice(0, line.lastIndexOf(" ")), Number(line.slice(line.lastIndexOf(" ") + 1))];
    if (name.startsWith("rebuno_dispatch_queue_depth")) found.depth += value;
    else if (name.startsWith("rebuno_dispatch_queue_lag_seconds")) found.lag = Math.max(found.lag, value);
    else if (name.startsWith("rebuno_dispatch_attempts_total") && /outcome="(failed|exhausted)"/.test(name)) found.failed += value;
  }
  return found;
}

async function perMinute() {
  const since = new Date(Date.now() - 3600 * 1000);
  const buckets = new Array(60).fill(0);
  let cursor;
  for (let page = 0; page < 10; page++) {
    const found = await api(`/v0/executions${query({ created_after: since.toISOString(), limit: 200, cursor })}`);
    for (const one of found.executions) {
      const minute = Math.floor((new Date(one.created_at) - since) / 60000);
      if (minute >= 0 && minute < 60) buckets[minute]++;
    }
    if (!found.next_cursor) break;
    cursor = found.next_cursor;
  }
  return buckets;
}

function chart(buckets) {
  const most = Math.max(1, ...buckets);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", "0 0 600 120");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `Executions created per minute over the last hour, at most ${most} a minute`);
  buckets.forEach((value, index) => {
    const bar = document.createElementNS(SVG, "rect");
    const height = (value / most) * 110;
    bar.setAttribute("x", String(index * 10 + 1));
    bar.setAttribute("y", String(115 - height));
    bar.setAttribute("width", "8");
    bar.setAttribute("height", String(height));
    const title = document.createElementNS(SVG, "title");
    title.textContent = `${60 - index} min ago: ${value}`;
    bar.append(title);
    svg.append(bar);
  });
  const axis = document.createElementNS(SVG, "line");
  for (const [name, value] of [["x1", 0], ["y1", 115], ["x2", 600], ["y2", 115]]) axis.setAttribute(name, String(value));
  svg.append(axis);
  return svg;
}

function tile(label, value, href) {
  return h("a", { class: "tile", href, "data-tile": label }, h("div", { class: "value" }, value), h("div", { class: "muted" }, label));
}

export async function render(main) {
  const [counts, queue, approvals, failures, buckets] = await Promise.all([
    Promise.all(STATUSES.map(count)), metrics(), api("/v0/approvals?status=pending"),
    api(`/v0/executions${query({ status: "failed", limit: 5 })}`), perMinute(),
  ]);
  replace(main,
    h("h1", {}, "Overview"),
    h("h2", {}, "Executions by status"),
    h("div", { class: "tiles" }, STATUSES.map((status, index) => tile(status, counts[index], `#/executions?status=${status}`))),
    h("h2", {}, "Work"),
    h("div", { class: "tiles" },
      tile("approvals waiting", String(approvals.length), "#/approvals"),
      tile("queue depth", String(queue.depth), "#/executions?status=pending"),
      tile("queue lag (s)", queue.lag.toFixed(1), "#/executions?status=pending"),
      tile("failed deliveries", String(queue.failed), "#/executions")),
    h("h2", {}, "Executions per minute, last hour"), chart(buckets),
    h("h2", {}, "Latest failures"),
    failures.executions.length ? executionTable(failures.executions) : h("p", { class: "muted" }, "No failure."));
  return undefined;
}
