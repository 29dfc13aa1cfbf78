// A reward actor outside ferry: it imports nothing from ferry, only a NATS client and msgpack,
// and follows docs/reward-protocol.md. It serves the reward "ascending": the share of adjacent
// response tokens in non-decreasing order (a sorted answer scores 1).
//
//   node examples/reward-actor/ascending.mjs --nats nats://127.0.0.1:4222 [--name ascending] [--delay-ms 0]
//
// The same in Python would take nats-py and msgpack and the same three subscriptions.
import { connect } from '@nats-io/transport-node';
import { pack, unpack } from 'msgpackr';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    nats: { type: 'string', default: process.env.NATS_URL ?? 'nats://127.0.0.1:4222' },
    name: { type: 'string', default: 'ascending' },
    user: { type: 'string', default: process.env.FERRY_NATS_USER },
    pass: { type: 'string', default: process.env.FERRY_NATS_PASS },
    'delay-ms': { type: 'string', default: '0' },
  },
});
const V = 1;
const name = values.name;
const instance = randomUUID().slice(0, 8);
const delay = Number(values['delay-ms']);
const log = (line) => console.log(`${new Date().toISOString()} ${name}/${instance} ${line}`);

const nc = await connect({ servers: values.nats, name: `reward-${name}-${instance}`, maxReconnectAttempts: -1, ...(values.user ? { user: values.user, pass: values.pass } : {}) });

function ascending(response) {
  if (response.length < 2) return 1;
  let ok = 0;
  for (let i = 1; i < response.length; i++) if (response[i] >= response[i - 1]) ok += 1;
  return ok / (response.length - 1);
}

async function handle(msg) {
  const reply = (body) => msg.reply && msg.respond(pack({ ...body, v: V, instance }));
  let req;
  try {
    req = unpack(msg.data);
  } catch (e) {
    return reply({ type: 'reward.error', message: `not msgpack: ${e.message}` });
  }
  const id = typeof req?.id === 'string' ? { id: req.id } : {};
  if (req?.v !== V) return reply({ type: 'reward.error', ...id, message: `protocol version ${req?.v} is not supported; this actor speaks v=${V}` });
  const ok = req.type === 'reward.request' && Array.isArray(req.items) && req.items.every((it) => typeof it?.id === 'string' && Array.isArray(it.response));
  if (!ok) return reply({ type: 'reward.error', ...id, message: 'expected a reward.request whose items each have an id and a response' });
  if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  const scores = req.items.map((item) => ({ id: item.id, score: ascending(item.response) }));
  reply({ type: 'reward.reply', id: req.id, scores });
  log(`scored ${scores.length} responses for ${req.run}, iteration ${req.iteration}`);
}

const subject = `ferry.reward.${name}`;
nc.subscribe(subject, { queue: `ferry-reward-${name}`, callback: (_e, m) => handle(m) });
nc.subscribe(`${subject}.i.${instance}`, { callback: (_e, m) => handle(m) });
const hello = () => nc.publish(`${subject}.hb`, pack({ type: 'reward.hello', v: V, name, instance }));
hello();
const beat = setInterval(hello, 1000);
log(`serving ${subject} on ${values.nats}`);

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, async () => {
    clearInterval(beat);
    await nc.drain();
    log('stopped');
    process.exit(0);
  });
}
