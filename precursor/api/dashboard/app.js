// Precursor dashboard: the shell around its pages (fleet, machine, models, flow). It keeps the state, signs in and
// out, calls the API with the token, routes the URL fragment to a page and wires the live tail to it.
// Plain ES modules, no framework, no external assets.

import { h, view } from "./dom.js";
import { showFleet } from "./fleet.js";
import { showFlow } from "./flow.js";
import { takeToken } from "./fragment.js";
import { HttpError } from "./http.js";
import { LiveTail } from "./live.js";
import { renderMachine, showMachine } from "./machine.js";
import { showModels } from "./models.js";
import { RiskBands } from "./risk.js";

const TOKEN_KEY = "precursor.token";

const state = {
  token: null,
  // The risk bands the pages colour by, at the rule the pipeline alerts by: the fleet page reads it from the fleet
  // summary, so live predictions are judged alike.
  bands: new RiskBands(),
  // The open machine's threshold (its timeline's).
  machineThreshold: 0.7,
  live: null,
  page: null,
  // Each page's data, kept for the redraws live events and resizing ask for.
  fleet: null,
  machine: null,
  flowTimer: null,
};

// What a page is given: the state, the API, the live tail, and where to say a failure.
const shell = { state, api, startLive, stopLive, showError };

async function api(path) {
  const response = await fetch(`/api/v1${path}`, {
    headers: { Authorization: `Bearer ${state.token}`, Accept: "application/json" },
    cache: "no-store",
  });
  if (response.status === 401) {
    signOut("The token was not accepted. Paste a valid one.");
    throw new HttpError(401, "unauthorized");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new HttpError(response.status, body.detail ?? response.statusText);
  return body;
}

function showError(err) {
  if (err instanceof HttpError && err.status === 401) return;
  view().replaceChildren(h("div", { class: "banner", role: "alert", text: `Could not load: ${err.message}` }));
}

// ---------------------------------------------------------------------------------------------------------------
// Authentication: the token comes from the URL fragment (never sent to the server) or the sign-in form.

function takeTokenFromFragment() {
  const { token, rest } = takeToken(location.hash);
  if (token === null) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", rest);
}

function askForToken(message) {
  const dialog = document.getElementById("sign-in");
  const error = document.getElementById("sign-in-error");
  error.hidden = !message;
  error.textContent = message ?? "";
  if (!dialog.open) dialog.showModal();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  stopLive();
  document.getElementById("sign-out").hidden = true;
  askForToken(message);
}

// ---------------------------------------------------------------------------------------------------------------
// Live status and subscriptions: one live tail at a time, for the page on show.

function setLiveState(value) {
  const node = document.getElementById("live-status");
  const text = { live: "live", connecting: "connecting…", error: "reconnecting…", off: "not live", unauthorized: "no access" };
  node.dataset.state = value;
  node.querySelector(".live-text").textContent = text[value] ?? value;
  if (value === "unauthorized") signOut("The token was not accepted. Paste a valid one.");
}

function stopLive() {
  if (state.live) state.live.stop();
  state.live = null;
  setLiveState("off");
}

function startLive(params, onEvent) {
  stopLive();
  state.live = new LiveTail({ token: state.token, params, onEvent, onState: setLiveState }).start();
}

// ---------------------------------------------------------------------------------------------------------------
// Routing

async function route() {
  if (!state.token) {
    askForToken();
    return;
  }
  clearTimeout(state.flowTimer);
  const hash = location.hash || "#/";
  const page = hash.startsWith("#/models") ? "models" : hash.startsWith("#/flow") ? "flow" : "fleet";
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === page);
  }
  try {
    const machine = hash.match(/^#\/machine\/(.+)$/);
    if (machine) await showMachine(shell, decodeURIComponent(machine[1]), "7d");
    else if (page === "models") await showModels(shell);
    else if (page === "flow") await showFlow(shell);
    else await showFleet(shell);
  } catch (err) {
    showError(err);
  }
}

function init() {
  takeTokenFromFragment();
  state.token = sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("sign-out").hidden = !state.token;
  document.getElementById("sign-out").addEventListener("click", () => signOut());
  document.getElementById("sign-in-form").addEventListener("submit", () => {
    const value = document.getElementById("token-input").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    state.token = value;
    document.getElementById("sign-out").hidden = false;
    route();
  });
  window.addEventListener("hashchange", route);
  // The machine page's charts take the width they are given: redraw them once a resize settles.
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => (state.page === "machine" ? renderMachine(shell) : null), 150);
  });
  route();
}

init();
