// ComfyUI-CHAI: show each CHAI node's report on the node after a run.
//
// The nodes return their report as ComfyUI's text UI output (the status line first); the core frontend shows
// that only for its own preview nodes, so this extension puts it in a read-only text box on every CHAI node.
// A node whose result ComfyUI served from its output cache did not run: its box then says so above the last
// run's report. The one-line status the nodes send while they run (progress text) needs no extension.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const WIDGET = "chai_report";
const CACHED_NOTE = "(from ComfyUI's output cache: nothing ran this time; this is the last run's report)";
const cachedThisRun = new Set();

function reportWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (!widget) {
    widget = ComfyWidgets.STRING(node, WIDGET, ["STRING", { multiline: true }], app).widget;
    widget.element.readOnly = true;
    widget.serialize = false; // not a widget value: saved workflows keep their widgets_values unchanged
  }
  return widget;
}

function markCached(node) {
  const widget = node?.widgets?.find((w) => w.name === WIDGET);
  if (widget && typeof widget.value === "string" && !widget.value.startsWith(CACHED_NOTE)) {
    widget.value = `${CACHED_NOTE}\n${widget.value}`;
    node.setDirtyCanvas?.(true, true);
  }
}

app.registerExtension({
  name: "CHAI.Reports",
  setup() {
    api.addEventListener("execution_start", () => cachedThisRun.clear());
    api.addEventListener("execution_cached", ({ detail }) => {
      for (const id of detail?.nodes ?? []) {
        cachedThisRun.add(String(id));
        // Node ids arrive as strings; the graph keys its nodes by number.
        markCached(app.graph?.getNodeById(Number(id)) ?? app.graph?.getNodeById(id));
      }
    });
  },
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (!nodeData?.name?.startsWith("CHAI_")) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = message?.text;
      if (!text || !text.length) return;
      const body = Array.isArray(text) ? text.join("\n") : String(text);
      reportWidget(this).value = cachedThisRun.has(String(this.id)) ? `${CACHED_NOTE}\n${body}` : body;
      this.setDirtyCanvas?.(true, true);
    };
  },
});
