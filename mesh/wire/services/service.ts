// One instance of a named service on the bus (a reward actor, an environment): its connection (its
// own, from a URL and credentials, or one it is given), the handler on the service's shared subject
// (in its queue group) and on its own instance subject, and a presence beat every second.
import { connectBus, type Bus, type Msg, type NatsConnection } from '../bus/bus.ts';

export interface ServiceSubjects {
  request: string;
  queue: string;
  instance(id: string): string;
  presence: string;
}

export interface ServiceInstance {
  nc: Bus;
  stop(): Promise<void>;
}

/** Connects (when given a URL) and serves `handle` as `instance` of a service, beating `hello` on its presence subject. */
export async function serveInstance(
  nats: Bus | string,
  o: { client: string; user?: string; pass?: string; subjects: ServiceSubjects; instance: string; hello: () => Uint8Array; handle: (msg: Msg) => void },
): Promise<ServiceInstance> {
  const own: NatsConnection | undefined = typeof nats === 'string' ? await connectBus(nats, o.client, { user: o.user, pass: o.pass }) : undefined;
  const nc: Bus = own ?? (nats as Bus);
  const subs = [nc.subscribe(o.subjects.request, { queue: o.subjects.queue, callback: (_e, m) => o.handle(m) }), nc.subscribe(o.subjects.instance(o.instance), { callback: (_e, m) => o.handle(m) })];
  const hello = () => nc.publish(o.subjects.presence, o.hello());
  await nc.flush();
  hello();
  const beat = setInterval(hello, 1000);
  return {
    nc,
    async stop() {
      clearInterval(beat);
      for (const s of subs) s.unsubscribe();
      if (own) await own.drain().catch(() => {});
    },
  };
}
