// Interop: events built by the official JavaScript CloudEvents SDK (npm `cloudevents`) in
// structured, binary and batched mode are accepted by evmesh and read back faithfully.
// usage: node node_sdk.js TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
const { CloudEvent, HTTP } = require("cloudevents");
const assert = require("node:assert/strict");

const [traffic, admin] = process.argv.slice(2);
const topic = "sdk-node";

async function post(headers, body) {
  const r = await fetch(`http://${traffic}/events/publish?topic=${topic}`, { method: "POST", headers, body });
  const text = await r.text();
  assert.equal(r.status, 202, text);
  return JSON.parse(text);
}

async function stored(p, o) {
  const r = await fetch(`http://${admin}/admin/topics/${topic}/partitions/${p}/events?from=${o}&max=1`);
  const got = await r.json();
  assert.equal(got[0].offset, o);
  return got[0].event;
}

async function check(mode, ce, placed, binary) {
  const got = await stored(placed.partition, placed.offset);
  for (const [k, v] of Object.entries(ce.toJSON())) {
    if (k === "data" || k === "data_base64" || v === undefined) continue;
    const want = binary && typeof v !== "string" ? String(v) : v;
    assert.deepEqual(got[k], want, `${mode} ${k}`);
  }
  if (ce.data === undefined) {
    assert.ok(!("data" in got) && !("data_base64" in got), mode);
  } else if (ce.data instanceof Uint8Array) {
    assert.deepEqual(Buffer.from(got.data_base64, "base64"), Buffer.from(ce.data), mode);
  } else if (typeof ce.data === "string") {
    assert.equal(got.data, ce.data, mode);
  } else {
    assert.deepEqual(got.data, ce.data, mode);
  }
  console.log(`ok ${mode} ${ce.id} -> ${placed.partition}/${placed.offset}`);
}

(async () => {
  const events = [
    new CloudEvent({ type: "com.example.json", source: "/sdk/js", datacontenttype: "application/json", amount: 7, vip: false, data: { sku: "B-2", list: [1, "two"], u: "ŝ" } }),
    new CloudEvent({ type: "com.example.text", source: "/sdk/js", datacontenttype: "text/plain", subject: "x y", data: "hello \"text\"" }),
    new CloudEvent({ type: "com.example.bytes", source: "/sdk/js", datacontenttype: "application/octet-stream", partitionkey: "k-9", data: new Uint8Array([0, 1, 2, 250, 255]) }),
    new CloudEvent({ type: "com.example.nodata", source: "/sdk/js" }),
  ];
  for (const ce of events) {
    const m = HTTP.structured(ce);
    await check("structured", ce, await post(m.headers, m.body), false);
  }
  for (const ce of events) {
    const m = HTTP.binary(ce);
    await check("binary", ce, await post(m.headers, m.body), true);
  }
  const body = "[" + events.map((e) => HTTP.structured(e).body).join(",") + "]";
  const { results } = await post({ "content-type": "application/cloudevents-batch+json" }, body);
  assert.equal(results.length, events.length);
  for (let i = 0; i < events.length; i++) await check("batch", events[i], results[i], false);
  console.log("node sdk interop: all checks passed");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
