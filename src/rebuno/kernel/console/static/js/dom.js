// Building the page from data without ever parsing data as HTML: every text goes in as text.

export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "class") element.className = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(target, ...children) {
  target.replaceChildren();
  append(target, children);
}

export function badge(status) {
  return h("span", { class: `badge ${status}`, "data-status": status }, status);
}

export function pretty(value) {
  if (value === undefined) return "";
  return JSON.stringify(value, null, 2);
}

export function jsonBlock(title, value, open = true) {
  return h("details", { open }, h("summary", {}, title), h("pre", { class: "json" }, pretty(value)));
}

export function time(text) {
  if (!text) return "";
  const moment = new Date(text);
  return h("time", { datetime: text, title: text }, moment.toLocaleString());
}

export function duration(from, to) {
  if (!from || !to) return "";
  const millis = new Date(to) - new Date(from);
  if (millis < 1000) return `${millis} ms`;
  if (millis < 60000) return `${(millis / 1000).toFixed(1)} s`;
  return `${Math.floor(millis / 60000)} min ${Math.round((millis % 60000) / 1000)} s`;
}

export function countdown(until) {
  const left = Math.round((new Date(until) - Date.now()) / 1000);
  if (left <= 0) return "expired";
  const minutes = Math.floor(left / 60);
  return minutes ? `expires in ${minutes} min ${left % 60} s` : `expires in ${left} s`;
}

export function facts(pairs) {
  const list = h("dl", { class: "facts" });
  for (const [name, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    list.append(h("dt", {}, name), h("dd", {}, value));
  }
  return list;
}

export function executionLink(id) {
  return h("a", { href: `#/executions/${id}`, class: "mono" }, id);
}

// A question with Confirm/Back in the page's dialog; resolves true when confirmed.
export function confirmAction(title, text, confirmLabel = "Confirm") {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = confirmLabel;
  dialog.returnValue = "";
  dialog.showModal();
  document.getElementById("confirm-no").focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

// Runs `work` at most once per animation-ish interval however often it is asked for.
export function debounced(work, millis = 150) {
  let timer = null;
  return () => {
    if (timer !== null) return;
    timer = setTimeout(() => { timer = null; work(); }, millis);
  };
}
