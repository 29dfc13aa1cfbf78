#!/usr/bin/env python3
"""guess: a multi-turn environment for ferry, written in Python (the twin of guess.ts).

The game: the secret is a digit, the task's seed mod 10. Each step the policy guesses; the guess is
the first character 0-9 in its action. The environment answers "1" (go higher), "0" (go lower), or
ends the episode with reward max(0, 1 - 0.25 * (turn - 1)) when the guess is right. An action with no digit
gets "|" and info {"invalid": 1}.

It speaks ferry's environment protocol, version 1 (docs/environment-protocol.md), over NATS with
msgpack messages. The NATS client is a small one of its own (no nats-py needed): plain TCP, no TLS,
no reconnects; losing the server ends the process with status 1.

Run it: FERRY_NATS_URL=nats://127.0.0.1:4222 python3 examples/env/guess.py
Settings (ferry sets them when it starts the environment): FERRY_NATS_URL, FERRY_NATS_USER,
FERRY_NATS_PASS, FERRY_ENV_NAME (default "guess"), FERRY_ENV_INSTANCE (default a random 8 chars).
SIGTERM or SIGINT stops it with status 0.
"""
import asyncio
import json
import os
import random
import re
import signal
import string
import sys
import traceback
import urllib.parse

try:
    import msgpack
except ImportError:
    # Debian's python3-msgpack installs into the system's dist-packages, which a pyenv or venv
    # python does not search: look there too before giving up.
    sys.path.append("/usr/lib/python3/dist-packages")
    import msgpack

VERSION = 1  # the protocol version this environment speaks
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")  # service names and instance ids become subject tokens


class Nats:
    """A minimal NATS client over asyncio streams: connect, subscribe, publish, ping."""

    def __init__(self):
        self.subs = {}  # sid -> callback(subject, reply, payload)
        self.pongs = []  # futures waiting for the server's PONGs, oldest first
        self.reader = self.writer = self.reading = None

    async def connect(self, host, port, user=None, password=None, token=None, name="ferry-env"):
        self.reader, self.writer = await asyncio.open_connection(host, port, limit=1 << 20)
        line = await self.reader.readline()
        if not line.startswith(b"INFO "):
            raise ConnectionError(f"expected INFO from the server, got {line[:80]!r}")
        if json.loads(line[5:]).get("tls_required"):
            raise ConnectionError("the server requires TLS, which this small client does not speak")
        opts = {"verbose": False, "pedantic": False, "name": name, "lang": "python",
                "version": "1", "protocol": 1, "headers": False}
        if user is not None:
            opts.update(user=user, **{"pass": password or ""})
        elif token is not None:
            opts["auth_token"] = token
        self._send(b"CONNECT " + json.dumps(opts).encode() + b"\r\n")
        self.reading = asyncio.ensure_future(self._read_loop())
        await self.ping()  # a PONG back: the server took our CONNECT (credentials included)

    def _send(self, data):
        self.writer.write(data)

    async def ping(self, timeout=5.0):
        fut = asyncio.get_running_loop().create_future()
        self.pongs.append(fut)
        self._send(b"PING\r\n")
        await asyncio.wait_for(fut, timeout)

    def subscribe(self, subject, callback, queue=None):
        sid = len(self.subs) + 1
        self.subs[sid] = callback
        self._send(f"SUB {subject} {queue + ' ' if queue else ''}{sid}\r\n".encode())

    def publish(self, subject, payload, reply=None):
        head = f"PUB {subject} {reply + ' ' if reply else ''}{len(payload)}\r\n"
        self._send(head.encode() + payload + b"\r\n")

    async def _read_loop(self):
        try:
            while line := await self.reader.readline():
                op = line.split(b" ", 1)[0].strip().upper()
                if op in (b"MSG", b"HMSG"):
                    # MSG <subject> <sid> [reply] <size> / HMSG <subject> <sid> [reply] <hdr> <size>
                    args = line.split()[1:]
                    hdr = int(args.pop(-2)) if op == b"HMSG" else 0
                    size = int(args.pop())
                    data = (await self.reader.readexactly(size + 2))[hdr:-2]
                    reply = args[2].decode() if len(args) == 3 else None
                    callback = self.subs.get(int(args[1]))
                    if callback:
                        try:
                            callback(args[0].decode(), reply, data)
                        except Exception:
                            traceback.print_exc()
                elif op == b"PING":
                    self._send(b"PONG\r\n")
                elif op == b"PONG":
                    if self.pongs and not self.pongs[0].done():
                        self.pongs.pop(0).set_result(None)
                elif op == b"-ERR":
                    print(f"nats: {line.decode(errors='replace').strip()}", file=sys.stderr)
                # +OK and later INFOs (cluster changes) need nothing
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            print(f"nats: connection lost: {e}", file=sys.stderr)
        finally:
            for fut in self.pongs:
                if not fut.done():
                    fut.set_exception(ConnectionError("the server closed the connection"))
            self.pongs.clear()

    async def close(self):
        try:
            await self.writer.drain()
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        if self.reading:
            self.reading.cancel()


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


def server_address(url):
    """nats://[user:pass@]host:port (the first of a comma-separated list) -> its parts."""
    url = url.split(",")[0].strip()
    parts = urllib.parse.urlsplit(url if "://" in url else "nats://" + url)
    if parts.scheme not in ("nats", "tcp"):
        raise ValueError(f"FERRY_NATS_URL: scheme {parts.scheme!r} is not supported (nats:// only)")
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return parts.hostname or "127.0.0.1", parts.port or 4222, user, password


async def main():
    url = os.environ.get("FERRY_NATS_URL") or "nats://127.0.0.1:4222"
    name = os.environ.get("FERRY_ENV_NAME") or "guess"
    instance = os.environ.get("FERRY_ENV_INSTANCE") or "".join(
        random.choices(string.ascii_lowercase + string.digits, k=8))
    for what, value in (("FERRY_ENV_NAME", name), ("FERRY_ENV_INSTANCE", instance)):
        if not NAME_RE.match(value):
            print(f"guess: {what} {value!r}: only letters, digits, '-' and '_'", file=sys.stderr)
            return 2
    try:
        host, port, url_user, url_pass = server_address(url)
    except ValueError as e:
        print(f"guess: {e}", file=sys.stderr)
        return 2
    user = os.environ.get("FERRY_NATS_USER") or (url_user if url_pass is not None else None)
    password = os.environ.get("FERRY_NATS_PASS") or url_pass
    token = url_user if url_pass is None else None  # nats://token@host

    nc = Nats()
    try:
        await nc.connect(host, port, user, password, token, name=f"ferry-env-{name}-{instance}")
    except (OSError, ConnectionError, asyncio.TimeoutError) as e:
        print(f"guess: cannot connect to {host}:{port}: {e or type(e).__name__}", file=sys.stderr)
        return 1

    game = Guess(instance)

    def on_request(subject, reply, payload):
        answer = game.handle(payload)
        if answer["type"] == "env.error":
            print(f"guess: env.error on {subject}: {answer['message']}", file=sys.stderr)
        if reply:  # replies go to the request's reply subject, nowhere else
            nc.publish(reply, msgpack.packb(answer, use_bin_type=True))
        else:
            print(f"guess: a request on {subject} has no reply subject: dropped", file=sys.stderr)

    nc.subscribe(f"ferry.env.{name}.i.{instance}", on_request)
    nc.subscribe(f"ferry.env.{name}", on_request, queue=f"ferry-env-{name}")
    hello = msgpack.packb({"type": "env.hello", "v": VERSION, "name": name, "instance": instance})

    async def presence():
        while True:
            nc.publish(f"ferry.env.{name}.hb", hello)
            await nc.writer.drain()
            await asyncio.sleep(1.0)

    try:
        await nc.ping()  # the subscriptions are in place before we say we are here
    except (ConnectionError, asyncio.TimeoutError) as e:
        print(f"guess: the server did not answer: {e or type(e).__name__}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    beats = asyncio.ensure_future(presence())
    print(f"guess: serving ferry.env.{name}.i.{instance} (and ferry.env.{name}, queue "
          f"ferry-env-{name}) on {host}:{port}, protocol v{VERSION}", file=sys.stderr, flush=True)

    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([stopping, nc.reading, beats], return_when=asyncio.FIRST_COMPLETED)
    beats.cancel()
    if not stop.is_set():  # the connection went away (or the presence loop failed)
        if beats.done() and not beats.cancelled() and beats.exception():
            print(f"guess: presence failed: {beats.exception()}", file=sys.stderr)
        print("guess: lost the NATS server, exiting", file=sys.stderr)
        await nc.close()
        return 1
    stopping.cancel()
    await nc.close()
    print("guess: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
