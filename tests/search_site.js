// Searches the built site with the theme's own search worker, as the browser does.
//
// Usage: node search_site.js WORKER INDEX QUERY... > results.json
//
// WORKER is the site's `assets/javascripts/workers/search.*.min.js` (Material's
// search, on lunr), INDEX its `search/search_index.json`. The worker is sent the
// index and each query as the page sends them; the output maps each query to the
// worker's result: groups of locations, one group per page, best first.
"use strict";
const fs = require("fs");
const vm = require("vm");

const [worker, index, ...queries] = process.argv.slice(2);
let onMessage = null;
const replies = [];
const context = {
  console,
  addEventListener: (type, listener) => {
    if (type === "message") onMessage = listener;
  },
  postMessage: (message) => replies.push(message),
};
context.self = context;
vm.createContext(context);
vm.runInContext(fs.readFileSync(worker, "utf-8"), context, { filename: worker });
if (onMessage === null) throw new Error("the search worker registered no listener");

// The message types of the theme's search worker.
const SETUP = 0;
const READY = 1;
const QUERY = 2;
const RESULT = 3;

async function ask(type, data, expected) {
  await onMessage({ data: { type, data } });
  const reply = replies.pop();
  if (reply === undefined || reply.type !== expected) {
    throw new Error(`search worker: expected reply ${expected}, got ${JSON.stringify(reply)}`);
  }
  return reply.data;
}

(async () => {
  const setup = JSON.parse(fs.readFileSync(index, "utf-8"));
  await ask(SETUP, { ...setup, options: { suggest: false } }, READY);
  const results = {};
  for (const query of queries) {
    const { items } = await ask(QUERY, query, RESULT);
    results[query] = items.map((group) => group.map((item) => item.location));
  }
  process.stdout.write(JSON.stringify(results));
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
