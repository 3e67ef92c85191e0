// The one way the console talks to the kernel: the same /v0 API the SDK uses.
// Signed in (server mode), the session cookie goes along by itself; a request that changes
// state repeats the CSRF cookie in the Rebuno-CSRF header.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function csrfToken() {
  const found = document.cookie.split("; ").find((one) => one.startsWith("rebuno_csrf="));
  return found ? found.slice("rebuno_csrf=".length) : "";
}

export function signedIn() {
  return csrfToken() !== "";
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && signedIn()) headers["Rebuno-CSRF"] = csrfToken();
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  if (response.status === 401) {
    window.location.assign("/ui/sign-in");
    throw new ApiError(401, "unauthorized", "signed out");
  }
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = data || {};
    throw new ApiError(response.status, error.code || "error", error.message || response.statusText);
  }
  return data;
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
