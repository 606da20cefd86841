// ComfyUI-CHAI: show each CHAI node's report on the node after a run.
//
// The nodes return their report as ComfyUI's text UI output (the status line first); the core frontend shows
// that only for its own preview nodes, so this extension puts it in a read-only text box on every CHAI node.
// The one-line status the nodes send while they run (progress text) needs no extension.
//
// A node whose output ComfyUI served from its output cache did not run, and ComfyUI sends its stored report
// only for output nodes (Cache Write, Cache Stats). So: `execution_cached` marks the boxes of the cached
// nodes at once, and when the prompt is done the stored reports of all of them are read from its history entry
// (ComfyUI keeps every cached node's UI output there), so each cached node shows the report that belongs to
// the output it served, under the mark, also in a page that never saw that node run.
//
// A run that is stopped (or fails) leaves the nodes that did not finish with the previous run's report, which
// reads as this run's ("HIT sunny beach" under a sampler that never got there): so every CHAI node that neither
// reported nor was served from the cache in this run is marked as not finished, its old report kept under the mark.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const WIDGET = "chai_report";
const CACHED_NOTE = "(from ComfyUI's output cache: nothing ran this time; this is the last run's report)";
const CACHED_STATUS = "cached · ";
const CORE_STATUS_WIDGET = "$$node-text-preview"; // the core frontend's progress-text line on a node
const UNFINISHED_STATUS = { interrupted: "interrupted · this node did not finish in the last run",
                            failed: "not run · the last run failed before this node finished" };
const UNFINISHED_NOTE = "(an earlier run's report, not the last run's: the last run stopped before this node finished)";
const run = { promptId: null, cached: new Set(), reported: new Set() };

function graphNode(id) {
  // Node ids arrive as strings and the graph keys its nodes by number; a node inside a subgraph arrives as its
  // execution path ("6:101": node 101 of the subgraph that instance node 6 holds).
  const path = String(id).split(":");
  let graph = app.graph;
  for (const step of path.slice(0, -1)) graph = graph?.getNodeById(Number(step))?.subgraph;
  const last = path[path.length - 1];
  return graph?.getNodeById(Number(last)) ?? graph?.getNodeById(last) ?? null;
}

function isChai(node) {
  const kind = node?.comfyClass ?? node?.type;
  return typeof kind === "string" && kind.startsWith("CHAI_");
}

function reportWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (!widget) {
    widget = ComfyWidgets.STRING(node, WIDGET, ["STRING", { multiline: true }], app).widget;
    widget.element.readOnly = true;
    // Not an input: kept out of the saved workflow (widgets_values unchanged) and out of the queued prompt
    // (an extra input there would change the node's cache key, so an unchanged prompt would re-run it).
    widget.serialize = false;
    widget.options ??= {};
    widget.options.serialize = false;
  }
  return widget;
}

function showReport(node, body, cached) {
  reportWidget(node).value = cached ? `${CACHED_NOTE}\n${body}` : body;
  const status = node.widgets?.find((w) => w.name === CORE_STATUS_WIDGET);
  if (cached && status && typeof status.value === "string" && status.value && !status.value.startsWith(CACHED_STATUS)) {
    status.value = CACHED_STATUS + status.value;
  }
  node.setDirtyCanvas?.(true, true);
}

function markCached(node) {
  const widget = node?.widgets?.find((w) => w.name === WIDGET);
  if (widget && typeof widget.value === "string" && !widget.value.startsWith(CACHED_NOTE)) {
    showReport(node, widget.value, true);
  }
}

function markUnfinished(kind) {
  // Every CHAI node of the graph that neither reported in this run nor was served from the cache.
  const marks = Object.values(UNFINISHED_STATUS);
  for (const node of app.graph?._nodes ?? []) {
    const id = String(node.id);
    if (!isChai(node) || run.reported.has(id) || run.cached.has(id)) continue;
    const widget = node.widgets?.find((w) => w.name === WIDGET);
    if (widget && typeof widget.value === "string" && widget.value) {
      let body = widget.value;
      if (marks.some((mark) => body.startsWith(mark))) body = body.split("\n").slice(2).join("\n"); // marked before
      widget.value = `${UNFINISHED_STATUS[kind]}\n${UNFINISHED_NOTE}\n${body}`;
    }
    const status = node.widgets?.find((w) => w.name === CORE_STATUS_WIDGET);
    if (status && typeof status.value === "string" && status.value) status.value = UNFINISHED_STATUS[kind];
    node.setDirtyCanvas?.(true, true);
  }
}

function reportText(output) {
  const text = output?.text;
  if (!text || !text.length) return null;
  return Array.isArray(text) ? text.join("\n") : String(text);
}

async function showCachedReports(promptId, ids) {
  // The history entry is written before ComfyUI says the prompt is done (`executing` with no node).
  const response = await api.fetchApi(`/history/${encodeURIComponent(promptId)}`);
  if (!response.ok) return;
  const outputs = (await response.json())?.[promptId]?.outputs ?? {};
  for (const id of ids) {
    const node = graphNode(id);
    const body = reportText(outputs[id]);
    if (isChai(node) && body) showReport(node, body, true);
  }
}

app.registerExtension({
  name: "CHAI.Reports",
  setup() {
    api.addEventListener("execution_start", ({ detail }) => {
      run.promptId = detail?.prompt_id ?? null;
      run.cached = new Set();
      run.reported = new Set();
    });
    api.addEventListener("execution_interrupted", () => markUnfinished("interrupted"));
    api.addEventListener("execution_error", () => markUnfinished("failed"));
    api.addEventListener("execution_cached", ({ detail }) => {
      for (const id of detail?.nodes ?? []) {
        run.cached.add(String(id));
        markCached(graphNode(id));
      }
    });
    api.addEventListener("executing", ({ detail }) => {
      if (detail !== null && detail !== undefined) return; // a node starts; null: the prompt is done
      const ids = [...run.cached].filter((id) => isChai(graphNode(id)));
      if (run.promptId && ids.length) {
        showCachedReports(run.promptId, ids).catch((err) => console.warn("[CHAI] cached reports:", err));
      }
      run.cached = new Set();
    });
  },
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (!nodeData?.name?.startsWith("CHAI_")) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      run.reported.add(String(this.id));
      const body = reportText(message);
      if (body) showReport(this, body, run.cached.has(String(this.id)));
    };
  },
});
