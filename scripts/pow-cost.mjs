// What the waiting room's proof of work costs a browser-class client: the
// buyer page's own loop (WebCrypto SHA-256 in batches of 256), run in Node
// (the same WebCrypto API). Usage: node scripts/pow-cost.mjs [bits...]
// Prints hashes per second and the mean time to solve per difficulty.
const subtle = globalThis.crypto.subtle;
const encoder = new TextEncoder();

function zeroBits(bytes) {
  let bits = 0;
  for (const b of bytes) {
    if (b === 0) { bits += 8; continue; }
    return bits + Math.clz32(b) - 24;
  }
  return bits;
}

async function solve(challenge, user, difficulty) {
  const batch = 256;
  for (let from = 0; ; from += batch) {
    const tries = [];
    for (let n = from; n < from + batch; n++) {
      tries.push(subtle.digest("SHA-256", encoder.encode(`${challenge}:${user}:${n}`)));
    }
    const hashes = await Promise.all(tries);
    const found = hashes.findIndex((h) => zeroBits(new Uint8Array(h)) >= difficulty);
    if (found >= 0) return { nonce: from + found, tried: from + batch };
  }
}

const bits = process.argv.slice(2).map(Number);
const challenge = "5a0f3c2e9b1d4a7788c6e1f2a3b4c5d6";
for (const difficulty of bits.length ? bits : [10, 12, 14, 16]) {
  const buyers = difficulty >= 16 ? 8 : 16;
  let tried = 0;
  const t0 = performance.now();
  for (let user = 1; user <= buyers; user++) {
    tried += (await solve(challenge, user, difficulty)).tried;
  }
  const ms = performance.now() - t0;
  console.log(`${difficulty} bits: ${(ms / buyers).toFixed(0)} ms per join on average over ${buyers} buyers, ` +
    `${Math.round(tried / (ms / 1000))} hashes/s`);
}
