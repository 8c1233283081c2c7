// The ONNX Runtime peer of bench/serve_bench.cc (make bench-serve): a persistent process that
// reads one JSON command per line on stdin and answers one JSON line on stdout.
//
//   {"cmd":"load","name":"mlp_b1","path":"/tmp/x/mlp_b1.onnx","threads":2}
//       -> {"ok":true,"inputs":["x"],"outputs":["logits","prediction"]}
//   {"cmd":"run","name":"mlp_b1","input":"/tmp/x/in.f32","shape":[1,1024],"iters":50,
//    "out":"/tmp/x/ort_out.f32"}
//       -> {"ok":true,"us":[...one time per iteration...]}   (first output written raw to "out")
//
// Sessions run with intraOpNumThreads = threads, one inter-op thread, sequential execution and
// every graph optimization (ORT's defaults otherwise: its thread pool spins between calls).
'use strict';
const fs = require('fs');
const readline = require('readline');
const ort = require('onnxruntime-node');

const sessions = new Map();

async function handle(msg) {
  if (msg.cmd === 'load') {
    const s = await ort.InferenceSession.create(msg.path, {
      intraOpNumThreads: msg.threads || 2,
      interOpNumThreads: 1,
      executionMode: 'sequential',
      graphOptimizationLevel: 'all',
    });
    sessions.set(msg.name, s);
    return {ok: true, inputs: s.inputNames, outputs: s.outputNames};
  }
  if (msg.cmd === 'run') {
    const s = sessions.get(msg.name);
    if (!s) return {ok: false, error: `no session '${msg.name}'`};
    const raw = fs.readFileSync(msg.input);
    const data = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
    const feeds = {[s.inputNames[0]]: new ort.Tensor('float32', data, msg.shape)};
    const us = [];
    let last = null;
    for (let i = 0; i < msg.iters; ++i) {
      const t0 = process.hrtime.bigint();
      last = await s.run(feeds);
      us.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
    if (msg.out && last) {
      const first = last[s.outputNames[0]];
      fs.writeFileSync(msg.out, Buffer.from(first.data.buffer, first.data.byteOffset,
                                            first.data.byteLength));
    }
    return {ok: true, us};
  }
  if (msg.cmd === 'profile') {
    // A throwaway session with ORT's profiler on: `iters` runs after one warm-up run, then the
    // profile (a Chrome trace JSON) is written and its path returned.
    const s = await ort.InferenceSession.create(msg.path, {
      intraOpNumThreads: msg.threads || 2,
      interOpNumThreads: 1,
      executionMode: 'sequential',
      graphOptimizationLevel: 'all',
      enableProfiling: true,
      profileFilePrefix: msg.prefix,
    });
    const raw = fs.readFileSync(msg.input);
    const data = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
    const feeds = {[s.inputNames[0]]: new ort.Tensor('float32', data, msg.shape)};
    for (let i = 0; i < msg.iters; ++i) await s.run(feeds);
    await s.endProfiling();
    const path = require('path');
    const dir = path.dirname(msg.prefix), base = path.basename(msg.prefix);
    const files = fs.readdirSync(dir).filter((f) => f.startsWith(base) && f.endsWith('.json'));
    files.sort((a, b) => fs.statSync(path.join(dir, b)).mtimeMs - fs.statSync(path.join(dir, a)).mtimeMs);
    if (files.length === 0) return {ok: false, error: `no profile written under ${msg.prefix}`};
    return {ok: true, file: path.join(dir, files[0])};
  }
  if (msg.cmd === 'quit') process.exit(0);
  return {ok: false, error: `unknown command '${msg.cmd}'`};
}

const rl = readline.createInterface({input: process.stdin});
let chain = Promise.resolve();
rl.on('line', (line) => {
  chain = chain.then(async () => {
    let reply;
    try {
      reply = await handle(JSON.parse(line));
    } catch (e) {
      reply = {ok: false, error: String(e && e.message ? e.message : e)};
    }
    process.stdout.write(JSON.stringify(reply) + '\n');
  });
});
rl.on('close', () => chain.then(() => process.exit(0)));
