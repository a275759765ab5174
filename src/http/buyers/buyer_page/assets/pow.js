// The waiting room's proof of work, as the buyer's page solves it: a nonce
// such that SHA-256("<challenge>:<user_id>:<nonce>") starts with
// `difficulty` zero bits (about 2^difficulty hashes), tried in batches of
// 256 so the page stays live. WebCrypto only; scripts/pow-cost.mjs runs
// this very file in Node to measure what it costs a browser-class client.

function zeroBits(bytes) {
  let bits = 0;
  for (const b of bytes) {
    if (b === 0) { bits += 8; continue; }
    return bits + Math.clz32(b) - 24;
  }
  return bits;
}

// The first nonce that answers, and how many were tried.
async function solveProof(challenge, user, difficulty) {
  const encoder = new TextEncoder();
  const batch = 256;
  for (let from = 0; ; from += batch) {
    const tries = [];
    for (let n = from; n < from + batch; n++) {
      tries.push(crypto.subtle.digest("SHA-256", encoder.encode(`${challenge}:${user}:${n}`)));
    }
    const hashes = await Promise.all(tries);
    const found = hashes.findIndex((h) => zeroBits(new Uint8Array(h)) >= difficulty);
    if (found >= 0) return { nonce: from + found, tried: from + batch };
  }
}
