#!/usr/bin/env python3
"""guess: a multi-turn environment for ferry, written in Python (the twin of guess.ts).

The game: the secret is a digit, the task's seed mod 10. Each step the policy guesses; the guess is
the first character 0-9 in its action. The environment answers "1" (go higher), "0" (go lower), or
ends the episode with reward max(0, 1 - 0.25 * (turn - 1)) when the guess is right. An action with no digit
gets "|" and info {"invalid": 1}.

It speaks ferry's environment protocol, version 1 (docs/environment-protocol.md), over NATS with
msgpack messages, with nats-py and msgpack alone (pip install nats-py msgpack; Debian packages
msgpack as python3-msgpack). No reconnects: losing the server ends the process with status 1. It
has no expert, so it answers a warm-up's env.demo with env.error.

Run it: FERRY_NATS_URL=nats://127.0.0.1:4222 python3 examples/env/guess.py
Settings (ferry sets them when it starts the environment): FERRY_NATS_URL, FERRY_NATS_USER,
FERRY_NATS_PASS, FERRY_ENV_NAME (default "guess"), FERRY_ENV_INSTANCE (default a random 8 chars).
SIGTERM or SIGINT stops it with status 0.
"""
import asyncio
import os
import random
import re
import signal
import string
import sys

import msgpack
import nats

VERSION = 1  # the protocol version this environment speaks
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")  # service names and instance ids become subject tokens


class Guess:
    """The game's state: per episode, its secret and the steps it has had."""

    def __init__(self, instance):
        self.instance = instance
        self.episodes = {}  # (run, episode id) -> {"secret": int, "turn": int}

    def error(self, rid, message):
        reply = {"type": "env.error", "v": VERSION, "instance": self.instance, "message": message}
        if rid is not None:
            reply["id"] = rid
        return reply

    def observation(self, rid, episode, text, reward=0, done=False, info=None):
        reply = {"type": "env.observation", "v": VERSION, "id": rid, "instance": self.instance,
                 "episode": episode, "observation": text, "reward": reward, "done": done}
        if info is not None:
            reply["info"] = info
        return reply

    def handle(self, payload):
        """One request's bytes -> its reply (a dict)."""
        try:
            req = msgpack.unpackb(payload, raw=False)
        except Exception as e:
            return self.error(None, f"unreadable request: not msgpack ({e!r})")
        if not isinstance(req, dict):
            return self.error(None, "unreadable request: not a msgpack map")
        rid = req.get("id") if isinstance(req.get("id"), str) else None
        v = req.get("v")
        if type(v) is not int or v != VERSION:
            return self.error(rid, f"protocol version {v!r} is not spoken here: "
                                   f"this environment speaks version {VERSION}")
        kind, episode = req.get("type"), req.get("episode")
        if rid is None:
            return self.error(None, "unreadable request: no id (a string)")
        if kind not in ("env.reset", "env.step", "env.close"):
            return self.error(rid, f"unknown request type {kind!r}")
        if not isinstance(episode, str):
            return self.error(rid, f"unreadable {kind}: no episode (a string)")
        key = (req.get("run") if isinstance(req.get("run"), str) else "", episode)

        if kind == "env.reset":
            task = req.get("task")
            seed = task.get("seed") if isinstance(task, dict) else None
            if type(seed) is not int:
                return self.error(rid, "unreadable env.reset: no task.seed (an integer)")
            self.episodes[key] = {"secret": seed % 10, "turn": 0}  # a known episode starts over
            return self.observation(rid, episode, "")

        if kind == "env.close":
            self.episodes.pop(key, None)
            return {"type": "env.closed", "v": VERSION, "id": rid, "instance": self.instance,
                    "episode": episode}

        # env.step (replay or not, it is answered the same way)
        state = self.episodes.get(key)
        if state is None:
            return self.error(rid, f"unknown episode {episode!r}: "
                                   "no env.reset for it on this instance")
        action = req.get("action")
        if not isinstance(action, str):
            return self.error(rid, "unreadable env.step: no action (a string)")
        state["turn"] += 1
        guess = next((int(c) for c in action if c in "0123456789"), None)
        if guess is None:
            return self.observation(rid, episode, "|", info={"invalid": 1})
        if guess == state["secret"]:
            reward = max(0.0, 1 - 0.25 * (state["turn"] - 1))
            return self.observation(rid, episode, "", reward, True, {"found": 1, "invalid": 0})
        return self.observation(rid, episode, "1" if guess < state["secret"] else "0",
                                info={"invalid": 0})


async def main():
    url = os.environ.get("FERRY_NATS_URL") or "nats://127.0.0.1:4222"
    name = os.environ.get("FERRY_ENV_NAME") or "guess"
    instance = os.environ.get("FERRY_ENV_INSTANCE") or "".join(
        random.choices(string.ascii_lowercase + string.digits, k=8))
    for what, value in (("FERRY_ENV_NAME", name), ("FERRY_ENV_INSTANCE", instance)):
        if not NAME_RE.match(value):
            print(f"guess: {what} {value!r}: only letters, digits, '-' and '_'", file=sys.stderr)
            return 2
    credentials = {}
    if os.environ.get("FERRY_NATS_USER"):
        credentials = {"user": os.environ["FERRY_NATS_USER"],
                       "password": os.environ.get("FERRY_NATS_PASS", "")}

    lost = asyncio.Event()

    async def on_closed():
        lost.set()

    async def on_error(e):
        print(f"guess: nats: {e}", file=sys.stderr)

    try:
        # No reconnects: an environment that loses its server exits, and whoever started it decides.
        nc = await nats.connect(url, name=f"ferry-env-{name}-{instance}", allow_reconnect=False,
                                connect_timeout=5, closed_cb=on_closed, error_cb=on_error,
                                **credentials)
    except Exception as e:  # noqa: BLE001 (nats-py raises several kinds; each says what failed)
        print(f"guess: cannot connect to {url}: {e or type(e).__name__}", file=sys.stderr)
        return 1

    game = Guess(instance)

    async def on_request(msg):
        answer = game.handle(msg.data)
        if answer["type"] == "env.error":
            print(f"guess: env.error on {msg.subject}: {answer['message']}", file=sys.stderr)
        if msg.reply:  # replies go to the request's reply subject, nowhere else
            await msg.respond(msgpack.packb(answer, use_bin_type=True))
        else:
            print(f"guess: a request on {msg.subject} has no reply subject: dropped", file=sys.stderr)

    await nc.subscribe(f"ferry.env.{name}.i.{instance}", cb=on_request)
    await nc.subscribe(f"ferry.env.{name}", queue=f"ferry-env-{name}", cb=on_request)
    await nc.flush()  # the subscriptions are in place before we say we are here
    hello = msgpack.packb({"type": "env.hello", "v": VERSION, "name": name, "instance": instance})

    async def presence():
        while True:
            await nc.publish(f"ferry.env.{name}.hb", hello)
            await asyncio.sleep(1.0)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    beats = asyncio.ensure_future(presence())
    print(f"guess: serving ferry.env.{name}.i.{instance} (and ferry.env.{name}, queue "
          f"ferry-env-{name}) on {nc.connected_url.netloc if nc.connected_url else url}, "
          f"protocol v{VERSION}", file=sys.stderr, flush=True)

    stopping = asyncio.ensure_future(stop.wait())
    losing = asyncio.ensure_future(lost.wait())
    await asyncio.wait([stopping, losing, beats], return_when=asyncio.FIRST_COMPLETED)
    beats.cancel()
    stopping.cancel()
    losing.cancel()
    if not stop.is_set():  # the connection went away (or the presence loop failed)
        if beats.done() and not beats.cancelled() and beats.exception():
            print(f"guess: presence failed: {beats.exception()}", file=sys.stderr)
        print("guess: lost the NATS server, exiting", file=sys.stderr)
        return 1
    await nc.drain()
    print("guess: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
