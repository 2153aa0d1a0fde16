// needlepoint playground: talks to this server's OpenAI endpoints only (no other origin).
// A conversation is a list of OpenAI chat messages; each answer is streamed from
// POST /v1/chat/completions and rendered as it arrives (text, reasoning, tool calls).
"use strict";

const $ = (id) => document.getElementById(id);
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const state = { model: null, messages: [], busy: false, tools: null };

// ---- API key (kept for this browser tab only) -------------------------------------------
function apiKey() { return $("api-key").value.trim(); }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h.Authorization = "Bearer " + apiKey();
  return h;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

function showError(text) {
  const box = $("error");
  box.textContent = text || "";
  box.hidden = !text;
}

// ---- tools editor: validated as you type ------------------------------------------------
// Accepts a list of functions ({name, description, parameters}) or OpenAI's
// {"type": "function", "function": {...}} wrappers; returns OpenAI's form.
function parseTools(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    return { error: "JSON: " + e.message };
  }
  if (!Array.isArray(data)) return { error: "expected a JSON list of tools" };
  const seen = new Set();
  const tools = [];
  for (let i = 0; i < data.length; i++) {
    let fn = data[i];
    if (fn === null || typeof fn !== "object" || Array.isArray(fn)) {
      return { error: `tool ${i}: expected an object` };
    }
    if (fn.type === "function" && fn.function !== undefined) fn = fn.function;
    if (typeof fn.name !== "string" || !NAME.test(fn.name)) {
      return { error: `tool ${i}: "name" must be 1-64 letters, digits, _ . or -` };
    }
    if (seen.has(fn.name)) return { error: `tool ${i}: the name ${fn.name} is used twice` };
    seen.add(fn.name);
    if (fn.description !== undefined && typeof fn.description !== "string") {
      return { error: `${fn.name}: "description" must be a string` };
    }
    const params = fn.parameters;
    if (params !== undefined &&
        (params === null || typeof params !== "object" || Array.isArray(params))) {
      return { error: `${fn.name}: "parameters" must be a JSON schema object` };
    }
    if (params && params.type !== undefined && params.type !== "object") {
      return { error: `${fn.name}: "parameters" must have "type": "object"` };
    }
    tools.push({ type: "function", function: fn });
  }
  return { tools };
}

function validateTools() {
  const parsed = parseTools($("tools").value);
  const status = $("tools-status");
  $("tools").classList.toggle("invalid", !!parsed.error);
  if (parsed.error) {
    status.className = "bad";
    status.textContent = "✗ " + parsed.error;
    state.tools = null;
  } else {
    const names = parsed.tools.map((t) => t.function.name);
    status.className = "ok";
    status.textContent = `✓ ${names.length} tool${names.length === 1 ? "" : "s"}` +
      (names.length ? ": " + names.join(", ") : "");
    state.tools = parsed.tools;
    fillToolChoice(names);
  }
  updateSend();
}

function fillToolChoice(names) {
  const select = $("tool-choice");
  const previous = select.value;
  const options = ["auto", "required", "none", ...names.map((n) => "function:" + n)];
  select.replaceChildren(...options.map((value) => {
    const opt = document.createElement("option");
    opt.value = value;
    opt.textContent = value.startsWith("function:") ? "call " + value.slice(9) : value;
    return opt;
  }));
  select.value = options.includes(previous) ? previous : "auto";
}

function toolChoice() {
  const value = $("tool-choice").value;
  if (value.startsWith("function:")) {
    return { type: "function", function: { name: value.slice(9) } };
  }
  return value;
}

function updateSend() {
  const ok = state.tools !== null && !state.busy && state.model !== null;
  $("send").disabled = !ok;
  document.querySelectorAll(".results button").forEach((b) => { b.disabled = !ok; });
}

// ---- rendering --------------------------------------------------------------------------
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function addMessage(role, text) {
  const node = el("div", "msg " + role, text);
  $("log").appendChild(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

function prettyArgs(raw) {
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch (_) { return raw; }
}

function fmtRate(tps) { return tps > 0 ? Math.round(tps).toLocaleString("en") : "–"; }

function statsLine(answer) {
  const parts = [];
  const t = answer.stats && answer.stats.timings;
  if (t) {
    parts.push(`prefill ${fmtRate(t.prefill_tps)} tok/s (${t.prefill_tokens} tokens)`);
    parts.push(`decode ${fmtRate(t.decode_tps)} tok/s (${t.decode_tokens} tokens)`);
  }
  parts.push(`first token ${answer.ttft.toFixed(0)} ms`);
  parts.push(`${answer.chunks} chunks`);
  parts.push(`finish: ${answer.finish || "?"}`);
  return parts.join(" · ");
}

// ---- one streamed answer ----------------------------------------------------------------
function newAnswer() {
  const node = addMessage("assistant", "");
  const answer = { node, text: "", reasoning: "", calls: [], finish: null, stats: null,
                   chunks: 0, ttft: 0, reasoningNode: null, textNode: el("span", "text") };
  node.appendChild(answer.textNode);
  return answer;
}

function callCard(answer, index) {
  if (!answer.calls[index]) {
    const card = el("div", "tool-call");
    const name = el("span", "call-name");
    const args = el("pre", "call-args");
    const conf = el("div", "confidence", "confidence: …");
    card.append(name, args, conf);
    answer.node.appendChild(card);
    answer.calls[index] = { id: "", name: "", arguments: "", card, nameNode: name,
                            argsNode: args, confNode: conf };
  }
  return answer.calls[index];
}

function applyDelta(answer, delta) {
  if (delta.reasoning_content) {
    if (!answer.reasoningNode) {
      answer.reasoningNode = el("div", "reasoning");
      answer.node.insertBefore(answer.reasoningNode, answer.textNode);
    }
    answer.reasoning += delta.reasoning_content;
    answer.reasoningNode.textContent = answer.reasoning;
  }
  if (delta.content) {
    answer.text += delta.content;
    answer.textNode.textContent = answer.text;
  }
  for (const tc of delta.tool_calls || []) {
    const call = callCard(answer, tc.index);
    if (tc.id) call.id = tc.id;
    if (tc.function && tc.function.name) {
      call.name += tc.function.name;
      call.nameNode.textContent = call.name;
    }
    if (tc.function && tc.function.arguments) {
      call.arguments += tc.function.arguments;
      call.argsNode.textContent = call.arguments;
    }
  }
}

async function readEvents(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

function finishAnswer(answer) {
  const conf = answer.stats ? answer.stats.confidence : null;
  for (const call of answer.calls) {
    if (!call) continue;
    call.argsNode.textContent = prettyArgs(call.arguments);
    const source = answer.stats ? answer.stats.confidence_source : null;
    call.confNode.textContent = conf !== null && conf !== undefined
      ? `confidence: ${conf.toFixed(3)} (${source === "head" ? "confidence head"
        : "token probabilities"})`
      : "confidence: n/a (answered by the hand-off model)";
    const server = mcpServerOf(call.name);
    if (server) call.nameNode.textContent = `${call.name} (MCP: ${server})`;
  }
  const handoff = handoffLine(answer.stats);
  if (handoff) answer.node.appendChild(handoff);
  answer.node.appendChild(el("div", "stats", statsLine(answer)));
  const calls = answer.calls.filter(Boolean);
  state.messages.push({
    role: "assistant",
    content: calls.length ? null : answer.text,
    ...(calls.length ? { tool_calls: calls.map((c) => ({
      id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })) } : {}),
  });
  if (calls.length && mcpMayRun(calls)) runOnServers(calls);
  else if (calls.length) resultsForm(calls);
}

// ---- entering the tools' results ---------------------------------------------------------
function resultsForm(calls) {
  const form = el("form", "results");
  const inputs = calls.map((call) => {
    const label = el("label", null, `result of ${call.name}`);
    const input = el("input", "tool-result");
    input.placeholder = '{"ok": true}';
    input.dataset.callId = call.id;
    label.appendChild(input);
    form.appendChild(label);
    return input;
  });
  const button = el("button", "send-results", "Send results");
  button.type = "submit";
  form.appendChild(button);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (state.busy) return;
    form.remove();
    const keep = state.messages.length;
    for (const input of inputs) {
      const content = input.value.trim() || "done";
      state.messages.push({ role: "tool", tool_call_id: input.dataset.callId, content });
      addMessage("tool", `${input.parentNode.firstChild.textContent}: ${content}`);
    }
    complete(keep);
  });
  $("log").appendChild(form);
  inputs[0].focus();
  updateSend();
}

// ---- a request --------------------------------------------------------------------------
async function complete(keep) {
  state.busy = true;
  updateSend();
  showError("");
  const body = { model: state.model, messages: state.messages, stream: true,
                 stream_options: { include_usage: true },
                 temperature: Number($("temperature").value) };
  const tools = state.tools.concat(mcpChatTools());
  if (tools.length) {
    body.tools = tools;
    body.tool_choice = toolChoice();
  }
  const started = performance.now();
  let answer = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    answer = newAnswer();
    await readEvents(resp, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
      answer.chunks += 1;
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (!answer.ttft && (d.content || d.reasoning_content || d.tool_calls)) {
          answer.ttft = performance.now() - started;
        }
        applyDelta(answer, d);
        if (choice.finish_reason) answer.finish = choice.finish_reason;
      }
      if (chunk.needlepoint) answer.stats = chunk.needlepoint;
    });
    finishAnswer(answer);
  } catch (e) {
    if (answer) answer.node.remove();
    state.messages.length = keep;  // the turn that failed is taken back: fix, send again
    showError(String(e.message || e));
  } finally {
    state.busy = false;
    updateSend();
  }
}

function ask(event) {
  event.preventDefault();
  const query = $("query").value.trim();
  if (!query || state.busy || state.tools === null) return;
  document.querySelectorAll(".results").forEach((f) => f.remove());
  $("query").value = "";
  const keep = state.messages.length;
  state.messages.push({ role: "user", content: query });
  addMessage("user", query);
  complete(keep);
}

function reset() {
  state.messages = [];
  $("log").replaceChildren();
  showError("");
}

// ---- start ------------------------------------------------------------------------------
async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) throw new Error(await errorText(resp));
    const body = await resp.json();
    state.model = body.data[0].id;
    $("model").textContent = state.model;
    showError("");
  } catch (e) {
    state.model = null;
    $("model").textContent = "not connected";
    showError(`Cannot list the models (${e.message}). Enter the server's API key above.`);
  }
  updateSend();
}

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = resolve;
    script.onerror = () => reject(new Error(`cannot load ${src}`));
    document.head.appendChild(script);
  });
}

async function start() {
  $("api-key").value = sessionStorage.getItem("needlepoint-api-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("needlepoint-api-key", apiKey());
    loadModel().then(() => typeof loadMcpTools === "function" && loadMcpTools());
  });
  $("tools").addEventListener("input", validateTools);
  $("ask").addEventListener("submit", ask);
  $("reset").addEventListener("click", reset);
  const resp = await fetch("/playground/tools.json");
  $("tools").value = JSON.stringify(await resp.json(), null, 2);
  validateTools();
  await loadModel();
  await loadScript("/playground/playground_mcp.js");  // MCP tools, hand-offs
  await loadMcpTools();
  $("query").focus();
}

start();
