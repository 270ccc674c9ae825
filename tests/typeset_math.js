// Typesets the math of the built site the way a browser does, and reports what fails.
//
// Usage: node typeset_math.js SITE < formulas.json > report.json
//
// The input is a list of the site's `.arithmatex` elements, `{"tag": "span" | "div",
// "text": ...}` (their text, unescaped). Each is run through the site's own
// `javascripts/katex-init.js`, which calls KaTeX's auto-render (vendored with
// the site) with the site's delimiters, on a minimal stand-in for the DOM. Where the
// browser would show a red KaTeX error (the site renders with throwOnError: false),
// this records KaTeX's message; text that auto-render leaves untypeset (unbalanced or
// missing delimiters) is recorded too. The output has one list of problems per
// element, in order.
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

const site = process.argv[2];
const elements = JSON.parse(fs.readFileSync(0, "utf-8"));

class Text {
  constructor(text) {
    this.nodeType = 3;
    this.textContent = text;
    this.parentNode = null;
  }
  get nextSibling() {
    const siblings = this.parentNode.childNodes;
    return siblings[siblings.indexOf(this) + 1] || null;
  }
  remove() {
    const siblings = this.parentNode.childNodes;
    siblings.splice(siblings.indexOf(this), 1);
  }
}

class Element {
  constructor(tag, className = "") {
    this.nodeType = 1;
    this.nodeName = tag.toUpperCase();
    this.className = className;
    this.childNodes = [];
    this.typeset = []; // the formulas rendered into this span: [tex, error]
  }
  appendChild(node) {
    node.parentNode = this;
    this.childNodes.push(node);
    return node;
  }
  replaceChild(fragment, old) {
    const index = this.childNodes.indexOf(old);
    for (const node of fragment.childNodes) node.parentNode = this;
    this.childNodes.splice(index, 1, ...fragment.childNodes);
  }
}

const problems = [];
const roots = elements.map(({ tag, text }, index) => {
  const element = new Element(tag, "arithmatex");
  element.index = index;
  element.appendChild(new Text(text));
  problems.push([]);
  return element;
});

const body = new Element("body");
body.querySelectorAll = (selector) => {
  if (selector !== ".arithmatex") throw new Error(`unexpected selector ${selector}`);
  return roots;
};
let onLoad = null;
const context = {
  console,
  Node: { TEXT_NODE: 3, ELEMENT_NODE: 1 },
  document: {
    body,
    compatMode: "CSS1Compat", // a page with a doctype, as the site's
    createDocumentFragment: () => new Element("#fragment"),
    createTextNode: (text) => new Text(text),
    createElement: (tag) => new Element(tag),
    addEventListener: (type, listener) => {
      if (type === "DOMContentLoaded") onLoad = listener;
    },
  },
};
context.self = context;
vm.createContext(context);
const run = (file) =>
  vm.runInContext(fs.readFileSync(path.join(site, file), "utf-8"), context, {
    filename: file,
  });

run("javascripts/katex/katex.min.js");
// KaTeX's own renderer, asked to throw where the page would show an error.
const katex = context.katex;
katex.render = (tex, span, options) => {
  try {
    katex.renderToString(tex, { ...options, throwOnError: true });
    span.typeset.push([tex, null]);
  } catch (error) {
    if (!(error instanceof katex.ParseError)) throw error;
    span.typeset.push([tex, error.message]);
  }
};
run("javascripts/katex/auto-render.min.js");
run("javascripts/katex-init.js");
if (onLoad === null) throw new Error("katex-init.js registered no load listener");
onLoad();

roots.forEach((element, index) => {
  let formulas = 0;
  for (const node of element.childNodes) {
    if (node.nodeType === 3) {
      if (node.textContent.trim()) {
        problems[index].push(`left as text: ${JSON.stringify(node.textContent)}`);
      }
      continue;
    }
    for (const [tex, error] of node.typeset) {
      formulas += 1;
      if (error !== null) problems[index].push(`${error} (in ${JSON.stringify(tex)})`);
    }
  }
  if (formulas === 0 && problems[index].length === 0) {
    problems[index].push("no formula in it");
  }
});
process.stdout.write(JSON.stringify(problems));
