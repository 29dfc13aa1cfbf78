// Run events travel each on its own type's subject (`ferry.<run>.events.<type>`), so that the
// server's permissions can say who may publish which: the launcher `done` and `exit`, the
// supervisor the others, nobody else anything (auth.ts). A subscriber hears them all, and takes
// an event only from its own type's subject: a `done` sent on the `log` subject is not a `done`.
import { subscribe, type Bus, type Msg } from './bus.ts';
import { encode, ProtocolError } from '../messages/codec.ts';
import { PROTOCOL_VERSION, RunEvent } from '../messages/protocol.ts';
import type { Subjects } from './subjects.ts';

/** An event as its publisher writes it: the protocol version is added here. */
export type RunEventOut = Record<string, unknown> & { type: RunEvent['type'] };

export function publishEvent(bus: Bus, subj: Subjects, event: RunEventOut): void {
  bus.publish(subj.event(event.type), encode({ ...event, v: PROTOCOL_VERSION }));
}

/** Hears every run event; one that does not decode, or came on another type's subject, goes to `onMalformed`. */
export function subscribeEvents(bus: Bus, subj: Subjects, onEvent: (event: RunEvent, msg: Msg) => void, onMalformed: (error: ProtocolError, msg: Msg) => void): () => void {
  return subscribe(
    bus,
    subj.events,
    RunEvent,
    (event, msg) => {
      const own = subj.event(event.type);
      if (msg.subject !== own) return onMalformed(new ProtocolError(msg.subject, `a '${event.type}' event travels on ${own}, not here`), msg);
      onEvent(event, msg);
    },
    onMalformed,
  );
}
