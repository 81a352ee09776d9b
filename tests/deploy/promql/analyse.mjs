// Parses and lints PromQL with Prometheus' own parser (the lezer grammar and the linter of its
// web UI, npm @prometheus-io/codemirror-promql, pinned in package.json beside this file and
// installed by scripts/setup-deploy.sh into NODE_MODULES, the first argument), and lists what
// an expression reads, so tests/harness/promql.py can compare it with what Envoy exports.
//
//   node analyse.mjs NODE_MODULES     then one JSON string (an expression) per stdin line;
//                                     one JSON object per line back:
//   {"diagnostics": ["<severity> at <from>-<to>: <message>", ...],   the linter's, syntax
//                                                                    and types (empty: valid)
//    "selectors": [{"name": "<metric>" | null,
//                   "matchers": [{"label": "...", "op": "=|!=|=~|!~", "value": "..."}]}],
//    "grouping": ["<label>", ...],        by / without / on / ignoring / group_left labels
//    "replacements": [{"function": "label_replace" | "label_join", "dst": "...",
//                      "replacement": "...", "src": ["..."], "regex": "...",
//                      "selectors": [i, ...]}],   indices of the selectors it relabels
//    "unsupported": ["<node name>", ...]} constructs this analysis does not follow (a test
//                                         must refuse them rather than miss a name)
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { createRequire } from "node:module";

const modules = process.argv[2];
if (!modules || !fs.existsSync(modules)) {
  console.error(`analyse.mjs: no node_modules at ${modules} (run scripts/setup-deploy.sh)`);
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modules), "resolve-from-here.js"));
const { EditorState } = require("@codemirror/state");
const { syntaxTree, ensureSyntaxTree } = require("@codemirror/language");
const { promQLLanguage, LanguageType } = require("@prometheus-io/codemirror-promql");
const { Parser } = require("@prometheus-io/codemirror-promql/dist/cjs/parser/parser.js");

const language = promQLLanguage(LanguageType.PromQL);

// The state with its whole syntax tree: the editor parses lazily, within a time budget.
function fullState(expr) {
  const start = EditorState.create({ doc: expr, extensions: language });
  if (!ensureSyntaxTree(start, expr.length, 10000)) throw new Error("parse did not finish");
  const state = start.update({}).state;
  if (syntaxTree(state).length !== expr.length) throw new Error("parse did not cover the expression");
  return state;
}

// A PromQL string literal's value: "..." and '...' with Go escapes, `...` raw.
function stringValue(text) {
  const quote = text[0];
  const body = text.slice(1, -1);
  if (quote === "`") return body;
  if (quote === "'") return JSON.parse(`"${body.replace(/\\'/g, "'").replace(/"/g, '\\"')}"`);
  return JSON.parse(text);
}

const children = (node) => {
  const out = [];
  for (let c = node.firstChild; c; c = c.nextSibling) out.push(c);
  return out;
};

function analyse(expr) {
  const state = fullState(expr);
  const parser = new Parser(state);
  parser.analyze();
  const diagnostics = parser
    .getDiagnostics()
    .map((d) => `${d.severity} at ${d.from}-${d.to}: ${d.message}`);
  // The editor's linter leaves out an error at the very end (someone is typing there); here
  // every error node is an error.
  syntaxTree(state).iterate({
    enter: (n) => {
      if (n.type.isError) diagnostics.push(`error at ${n.from}-${n.to}: syntax error`);
    },
  });
  const text = (node) => state.sliceDoc(node.from, node.to);
  const out = { diagnostics, selectors: [], grouping: [], replacements: [], unsupported: [] };

  const walk = (node) => {
    switch (node.name) {
      case "⚠":
        return;
      case "VectorSelector": {
        const sel = { name: null, matchers: [] };
        for (const c of children(node)) {
          if (c.name === "Identifier") sel.name = text(c);
          else if (c.name === "LabelMatchers") {
            for (const m of children(c)) {
              if (m.name !== "UnquotedLabelMatcher") {
                out.unsupported.push(m.name);
                continue;
              }
              const [label, op, value] = children(m);
              sel.matchers.push({ label: text(label), op: text(op), value: stringValue(text(value)) });
            }
          } else out.unsupported.push(c.name);
        }
        out.selectors.push(sel);
        return;
      }
      case "GroupingLabels":
        for (const c of children(node)) {
          if (c.name === "LabelName") out.grouping.push(text(c));
          else out.unsupported.push(c.name);
        }
        return;
      case "FunctionCall": {
        const [ident, body] = children(node);
        const fn = ident && ident.firstChild ? ident.firstChild.name : "";
        if (fn === "LabelReplace" || fn === "LabelJoin") {
          const args = children(body);
          const strings = args.slice(1).map((a) => (a.name === "StringLiteral" ? stringValue(text(a)) : null));
          if (args.length < 2 || strings.includes(null)) {
            out.unsupported.push(`${fn} with a non-literal argument`);
            break;
          }
          const first = out.selectors.length;
          walk(args[0]);
          const selectors = out.selectors.map((_, i) => i).slice(first);
          if (fn === "LabelReplace") {
            const [dst, replacement, src, regex] = strings;
            out.replacements.push({ function: "label_replace", dst, replacement, src: [src], regex, selectors });
          } else {
            const [dst, separator, ...src] = strings;
            out.replacements.push({ function: "label_join", dst, replacement: separator, src, regex: "", selectors });
          }
          return;
        } else if (["SortByLabel", "SortByLabelDesc", "Absent", "AbsentOverTime", "Info"].includes(fn)) {
          // They read or make labels this analysis does not follow.
          out.unsupported.push(fn);
        }
        break;
      }
      case "AggregateOp":
        // count_values makes a label from its parameter.
        if (node.firstChild && node.firstChild.name === "CountValues") out.unsupported.push("CountValues");
        break;
      default:
        break;
    }
    for (const c of children(node)) walk(c);
  };
  walk(syntaxTree(state).topNode);
  return out;
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let answer;
  try {
    answer = analyse(JSON.parse(line));
  } catch (e) {
    answer = { diagnostics: [`error: ${e.message}`], selectors: [], grouping: [], replacements: [], unsupported: [] };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
