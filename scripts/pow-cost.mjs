// What the waiting room's proof of work costs a browser-class client: the
// buyer page's own loop (src/http/buyers/buyer_page/assets/pow.js, WebCrypto
// SHA-256 in batches of 256), run in Node (the same WebCrypto API).
// Usage: node scripts/pow-cost.mjs [bits...]
// Prints hashes per second and the mean time to solve per difficulty.
import { readFileSync } from "node:fs";

const page = new URL("../src/http/buyers/buyer_page/assets/pow.js", import.meta.url);
const { solveProof } = new Function(`${readFileSync(page, "utf8")}; return { solveProof };`)();

const bits = process.argv.slice(2).map(Number);
const challenge = "5a0f3c2e9b1d4a7788c6e1f2a3b4c5d6";
for (const difficulty of bits.length ? bits : [10, 12, 14, 16]) {
  const buyers = difficulty >= 16 ? 8 : 16;
  let tried = 0;
  const t0 = performance.now();
  for (let user = 1; user <= buyers; user++) {
    tried += (await solveProof(challenge, user, difficulty)).tried;
  }
  const ms = performance.now() - t0;
  console.log(`${difficulty} bits: ${(ms / buyers).toFixed(0)} ms per join on average over ${buyers} buyers, ` +
    `${Math.round(tried / (ms / 1000))} hashes/s`);
}
