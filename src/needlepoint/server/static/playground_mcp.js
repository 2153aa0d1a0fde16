// needlepoint playground: the MCP tools of `serve --mcp` and hand-offs.
// playground.js loads it at start (same origin); its functions are globals it calls.
"use strict";

const mcp = { tools: [] };  // [{name, server, tool, description, parameters}]

function mcpHeaders() {
  const key = document.getElementById("api-key").value.trim();
  const out = { "Content-Type": "application/json" };
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

// The configured MCP tools, listed with their server under the tools editor.
async function loadMcpTools() {
  const list = document.getElementById("mcp-tools");
  list.replaceChildren();
  try {
    const resp = await fetch("/v1/needlepoint/mcp/tools", { headers: mcpHeaders() });
    mcp.tools = resp.ok ? (await resp.json()).data : [];
  } catch (e) {
    mcp.tools = [];
  }
  document.getElementById("mcp-pane").hidden = mcp.tools.length === 0;
  for (const tool of mcp.tools) {
    const item = document.createElement("li");
    item.className = "mcp-tool";
    item.textContent = `${tool.name} `;
    const server = document.createElement("span");
    server.className = "mcp-server";
    server.textContent = `(${tool.server})`;
    item.appendChild(server);
    item.title = tool.description || "";
    list.appendChild(item);
  }
}

// A tool of the editor wins over an MCP tool of the same name (playground.js: state).
function localTool(name) {
  return (state.tools || []).some((t) => t.function.name === name);
}

function mcpChatTools() {
  return mcp.tools.filter((t) => !localTool(t.name)).map((t) => ({ type: "function",
    function: { name: t.name, description: t.description, parameters: t.parameters } }));
}

function mcpServerOf(name) {
  const tool = localTool(name) ? null : mcp.tools.find((t) => t.name === name);
  return tool ? tool.server : null;
}

// Runs one call on its MCP server: {content} for the tool message, or throws.
async function runMcpCall(call) {
  let args = {};
  try { args = JSON.parse(call.arguments || "{}"); } catch (e) { args = {}; }
  const resp = await fetch("/v1/needlepoint/mcp/call", {
    method: "POST", headers: mcpHeaders(), body: JSON.stringify({ name: call.name,
                                                                  arguments: args }) });
  const body = await resp.json();
  if (!resp.ok) throw new Error((body.error && body.error.message) || `HTTP ${resp.status}`);
  const value = "error" in body ? { error: body.error } : body.result;
  return typeof value === "string" ? value : JSON.stringify(value);
}

// A line under an answer that was handed off to the bigger model, with its reason.
function handoffLine(stats) {
  const mark = stats && stats.handoff;
  if (!mark) return null;
  const node = document.createElement("div");
  node.className = "handoff";
  node.textContent = mark.answered
    ? `handed off to ${mark.model} (${mark.reason})`
    : `hand-off to ${mark.model} failed (${mark.reason}): ${mark.error || "no answer"}`;
  return node;
}

// One automatic round per user turn, as `Needle.run`'s default: calls after it get the
// results form, so a model that keeps calling never loops on its own.
function mcpMayRun(calls) {
  const last = state.messages.map((m) => m.role).lastIndexOf("user");
  const ranSince = state.messages.slice(last + 1).some((m) => m.role === "tool");
  return calls.every((c) => mcpServerOf(c.name)) && !ranSince;
}

// Calls of MCP tools run on their servers; the results go back as tool messages and the
// model answers them (playground.js: state, addMessage, showError, complete).
async function runOnServers(calls) {
  const keep = state.messages.length;
  try {
    for (const call of calls) {
      const content = await runMcpCall(call);
      state.messages.push({ role: "tool", tool_call_id: call.id, content });
      addMessage("tool", `result of ${call.name} (${mcpServerOf(call.name)}): ${content}`);
    }
  } catch (e) {
    state.messages.length = keep;
    showError(String(e.message || e));
    return;
  }
  complete(keep);
}
