"""What this node's xfer agent says of the model, and the wait for each
shard (no vLLM import here: the unit tests run it alone).

The agent is the only judge of "verified". The loader never hashes: it asks
its own node's agent, on the agent's Unix socket (the loader link, one JSON
line each way: ``{"ask": "model", "name": NAME}``), and reads a shard only
when the agent reports the model with the plan's identity and the shard's
file no longer pending, that is verified and under its final name (xfer
renames a file into place only once every chunk of it is verified, and
places a Hub snapshot's link only once its blob is). The identity is the
manifest root, or, for a Hub pull that still streams when the ranks start,
the streamed draft's id, which the agent keeps reporting for the complete
model (``draft`` in its status). A model named otherwise is refused at
once; a model being replaced or not yet named is waited for, and a long
wait says which shard and what the agent reports. What no wait mends fails
the rank at once with its cause: no socket, no agent answering on it, a
refused question, an agent that holds no model of the name.

A shard's name is the model's own word (its ``model.safetensors.index.json``),
not the agent's: ``check_shard_name`` takes only a plain relative path inside
the model folder whose file resolves inside it (or, for a Hub snapshot, inside
its repo folder, where the snapshot's links lead), and ``ready`` refuses a
manifest path that is absolute or has a ``..``, whatever the agent reports.

Environment (set by ``xfer-launch up`` under ``[launch] stream_weights``):

- ``XFER_EXPECT_ROOT``: the manifest root every node was receiving (hex),
  or ``XFER_EXPECT_DRAFT``: the streamed draft's id (hex); one is set;
- ``XFER_MODEL_NAME``: the model's name in the node's store;
- ``XFER_MODEL_PREFIX``: the model path below that model's folder (``""``
  for the folder itself), to turn a shard's file name into a manifest path;
- ``XFER_NODE``: this node's name in the cluster file (for messages);
- ``XFER_AGENT_SOCKET`` (set by the agent, never by the launcher, for every
  rank it starts): the agent's socket, ``ROOT/.xfer/agent.sock``, mode 0600;
- ``XFER_LOADER_NOTE_S`` (default 30): seconds between "still waiting" lines;
- ``XFER_LOADER_TIMEOUT_S`` (default 3600): give up on a shard after this;
- ``XFER_HOLD_FILE`` (set by the agent, never by the launcher, for a rank
  ``up`` starts *held* while its preflight still runs): ``register`` waits
  until this file exists, which the agent creates once the preflight passed
  (``up`` stops the rank otherwise). vLLM calls ``register`` while it parses
  its arguments: its Python and torch are imported, and it has not read the
  model, bound a port, touched a GPU or met a peer.
- ``XFER_RENDEZVOUS`` (``MASTER RANK WORLD TIMEOUT_S``) and
  ``XFER_RENDEZVOUS_FILE`` (set by the agent beside ``XFER_HOLD_FILE``):
  the preflight's rendezvous, met by the held engine itself once released.
  One vLLM worker per node (the first to claim ``XFER_RENDEZVOUS_FILE``
  ``.claim``) runs, in ``register``, one Gloo all-reduce through the store
  at ``MASTER``, with the torch it imported already, before vLLM's own
  distributed init; it writes ``ok MS`` or ``failed WHY`` to the file,
  which the agent reads, and on a failure stops the worker with that line.
  A separate probe would import torch again on every node, seconds of CPU
  taken from the engine's own start. c10d reverse-looks-up its first
  socket's address and, after a lookup that failed, no other in that
  process: so where the resolver does not answer, this meeting pays the
  wait the engine's own init would have paid, and the engine then pays
  none (the preflight's resolver row measures that wait and names the
  fix).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional


class LoaderError(RuntimeError):
    """One line for the operator: what is wrong and what to do."""


@dataclass
class Settings:
    expect_root: str
    model_name: str
    prefix: str
    node: str
    socket_path: str
    note_s: float
    timeout_s: float
    expect_draft: str = ""

    @staticmethod
    def from_env(env=os.environ) -> "Settings":
        missing = [
            k
            for k in ("XFER_MODEL_NAME", "XFER_NODE", "XFER_AGENT_SOCKET")
            if not env.get(k)
        ]
        if not env.get("XFER_EXPECT_ROOT") and not env.get("XFER_EXPECT_DRAFT"):
            missing.insert(0, "XFER_EXPECT_ROOT (or XFER_EXPECT_DRAFT)")
        if missing:
            raise LoaderError(
                f"xfer loader: {', '.join(missing)} not set; start vLLM with "
                "--load-format xfer through `xfer-launch up` with "
                "[launch] stream_weights = true, which sets them"
            )
        return Settings(
            expect_root=env.get("XFER_EXPECT_ROOT", "").strip().lower(),
            expect_draft=env.get("XFER_EXPECT_DRAFT", "").strip().lower(),
            model_name=env["XFER_MODEL_NAME"],
            prefix=env.get("XFER_MODEL_PREFIX", "").strip("/"),
            node=env["XFER_NODE"],
            socket_path=env["XFER_AGENT_SOCKET"],
            note_s=float(env.get("XFER_LOADER_NOTE_S", "30")),
            timeout_s=float(env.get("XFER_LOADER_TIMEOUT_S", "3600")),
        )

    def planned(self) -> str:
        if self.expect_root:
            return f"root {self.expect_root[:12]}"
        return f"streamed draft {self.expect_draft[:12]}"

    def manifest_path(self, file_name: str) -> str:
        return f"{self.prefix}/{file_name}" if self.prefix else file_name


@dataclass
class View:
    """The agent's answer about the model: ``model`` is its status entry
    (``None`` when the agent holds nothing of that name), ``error`` why
    there is no answer at all."""

    model: Optional[dict] = None
    error: Optional[str] = None

    def describe(self) -> str:
        if self.error is not None:
            return self.error
        if self.model is None:
            return "the agent holds nothing of this name yet (no transfer has begun)"
        m = self.model
        root = (m.get("root") or "")[:12] or "not known yet"
        held, total = m.get("bytes_held", 0), m.get("bytes_total", 0)
        why = f"{m.get('state')}, root {root}, {held} of {total} bytes verified"
        if m.get("draft"):
            why += f", streamed draft {m['draft'][:12]}"
        if m.get("last_error"):
            why += f"; last error: {m['last_error']}"
        return why


def ask_agent(s: Settings, timeout_s: float = 30.0) -> View:
    """Asks this node's agent, on its socket, what it says of the model.

    What no wait can mend raises a ``LoaderError`` at once, with its cause:
    no socket there or no agent answering on it, a refused question, an
    answer that is not the link's, or no model of the name (the launcher
    starts the ranks only once every node holds the model's small files).
    An agent that is slow to answer is waited for."""
    where = f"the agent's socket {s.socket_path} on {s.node}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(timeout_s)
            c.connect(s.socket_path)
            c.sendall(
                (json.dumps({"ask": "model", "name": s.model_name}) + "\n").encode()
            )
            got = b""
            while not got.endswith(b"\n") and len(got) < (1 << 22):
                part = c.recv(1 << 16)
                if not part:
                    break
                got += part
    except socket.timeout:
        return View(error=f"{where} did not answer within {timeout_s:.0f}s")
    except OSError as e:
        raise LoaderError(
            f"xfer loader: cannot ask {where} ({e.strerror or e}); the agent "
            "serves it from its start: is `xfer serve` running there, with the "
            "root the rank was started from? Its first log lines say why not"
        ) from e
    try:
        reply = json.loads(got)
    except ValueError:
        raise LoaderError(
            f"xfer loader: {where} answered no reply of the loader link "
            f"({got[:80]!r}); another program listens there, or the agent is "
            "of another version: run the ranks through `xfer-launch up`"
        )
    return view_of(reply, s)


def view_of(reply: dict, s: Settings) -> View:
    """The agent's reply as a ``View``; a refusal or an unknown model
    raises."""
    answer = reply.get("answer") if isinstance(reply, dict) else None
    if answer == "refused":
        raise LoaderError(
            f"xfer loader: the agent on {s.node} refused the loader's question: "
            f"{reply.get('why')}"
        )
    if answer != "model":
        raise LoaderError(
            f"xfer loader: the agent on {s.node} answered {answer!r}, not a "
            "model; run the ranks through `xfer-launch up` with an agent of "
            "this version"
        )
    if reply.get("model") is None:
        raise LoaderError(
            f"xfer loader: the agent on {s.node} holds no model named "
            f"{s.model_name} (removed, or never synced here); sync it "
            "(`xfer-launch deploy` does), then `xfer-launch up` again"
        )
    return View(model=reply["model"])


def check_shard_name(folder: str, name, index_path: str) -> str:
    """The shard ``name`` that ``index_path`` names (the model's index, or
    the single shard file itself), normalized, once it is a plain relative
    path inside the model ``folder``: no absolute path, no ``..``, no NUL
    or other control character; and its file, where links lead, resolves
    inside the folder, or, for a Hub snapshot (a folder in ``snapshots/``,
    whose files link to ``../../blobs/``), inside the repo folder above
    ``snapshots/``. Raises a ``LoaderError`` otherwise: the index is the
    model's own file, not the agent's word."""

    def refuse(why: str) -> LoaderError:
        return LoaderError(
            f"xfer loader: {index_path} names shard {name!r}, {why}; a shard "
            f"must be a file inside the model folder {folder}: fix the model's "
            "index (or its links) at its source and sync it again"
        )

    if not isinstance(name, str) or not name:
        raise refuse("which is no file name")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise refuse("with a NUL or other control character")
    if name.startswith("/"):
        raise refuse("an absolute path")
    norm = os.path.normpath(name)
    if norm == ".":
        raise refuse("which is the model folder itself")
    if ".." in norm.split("/"):
        raise refuse("a path that leaves the model folder ('..')")
    real_folder = os.path.realpath(folder)
    roots = [real_folder]
    if os.path.basename(os.path.dirname(real_folder)) == "snapshots":
        roots.append(os.path.dirname(os.path.dirname(real_folder)))
    real = os.path.realpath(os.path.join(folder, norm))
    if not any(real != r and os.path.commonpath([real, r]) == r for r in roots):
        raise refuse(f"whose file resolves to {real}, outside {' and '.join(roots)}")
    return norm


def ready(view: View, s: Settings, path: str) -> bool:
    """Whether the agent vouches for the manifest file ``path`` with the
    plan's identity; raises when it holds the model named otherwise, or
    when ``path`` is no path inside the model (absolute, or with ``..``):
    the agent vouches only for the model's own files."""
    if path.startswith("/") or ".." in path.split("/"):
        raise LoaderError(
            f"xfer loader: refusing shard {path!r} of {s.model_name}: a "
            "manifest path is relative and never leaves the model (no '/' "
            "first, no '..'); fix the model's index or XFER_MODEL_PREFIX"
        )
    m = view.model
    if m is None:
        return False
    root = (m.get("root") or "").lower()
    draft = (m.get("draft") or "").lower()
    if not root and not draft:
        return False
    ours = (s.expect_root and root == s.expect_root) or (
        s.expect_draft and draft == s.expect_draft
    )
    if not ours:
        held = f"root {root[:12]}" if root else f"streamed draft {draft[:12]}"
        raise LoaderError(
            f"xfer loader: {s.node} holds {s.model_name} with {held}, "
            f"but this launch planned {s.planned()}; refusing to load "
            "it: sync the planned model again, or run `xfer-launch up` again to "
            "plan the one the nodes hold"
        )
    if m.get("state") == "complete":
        return True
    return m.get("state") == "syncing" and path not in m.get("pending", [])


def arrivals(
    shards: Iterable[str],
    s: Settings,
    ask: Callable[[Settings], View] = ask_agent,
    log: Callable[[str], None] = print,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Yields each shard (a file name in the model folder) once the agent
    vouches for it, in the order they arrive (shards found ready together
    in their given order). The caller opens a shard only once it is
    yielded."""
    pending = list(shards)
    log(
        f"xfer loader: {len(pending)} shard(s) of {s.model_name} to load as the "
        f"agent on {s.node} verifies them ({s.planned()})"
    )
    since = clock()
    last_note = since
    announced = None
    while pending:
        view = ask(s)
        got = [f for f in pending if ready(view, s, s.manifest_path(f))]
        if got:
            for f in got:
                pending.remove(f)
                log(
                    f"xfer loader: shard {f} verified by the agent ({len(pending)} "
                    "left); loading it"
                )
                yield f
            since = last_note = clock()
            continue
        now = clock()
        waited = now - since
        if waited >= s.timeout_s:
            raise LoaderError(
                f"xfer loader: gave up after {waited:.0f}s waiting for shard "
                f"{pending[0]} of {s.model_name} on {s.node}: the agent reports "
                f"{view.describe()}; see `xfer status` and the sync's job"
            )
        if announced != pending[0]:
            announced = pending[0]
            log(
                f"xfer loader: waiting for shard {announced}: the agent reports "
                f"{view.describe()}"
            )
        elif now - last_note >= s.note_s:
            log(
                f"xfer loader: still waiting for shard {pending[0]} after "
                f"{waited:.0f}s ({len(pending)} left): the agent reports "
                f"{view.describe()}"
            )
            last_note = now
        sleep(poll_s)
    # A root that changed under the load would have been refused above;
    # once more at the end, so a switch after the last shard is caught too.
    ready(ask(s), s, "")


def meet_gloo(spec: str) -> str:
    """One Gloo all-reduce of ``WORLD`` ranks through the TCP store at
    ``MASTER`` (``spec`` is ``MASTER RANK WORLD TIMEOUT_S``, the agent's);
    ``ok MS``, the milliseconds from the first store contact to its end.
    Raises on any failure."""
    import datetime

    import torch
    import torch.distributed as dist

    master, rank, world, timeout_s = spec.split()
    rank, world = int(rank), int(world)
    t0 = time.monotonic()
    dist.init_process_group(
        "gloo",
        init_method="tcp://" + master,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=float(timeout_s)),
    )
    try:
        x = torch.tensor([float(rank + 1)])
        dist.all_reduce(x)
        want = world * (world + 1) / 2
        if x.item() != want:
            raise RuntimeError(
                f"the all-reduce gave {x.item()}, not {want}: a rank of another launch joined"
            )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return f"ok {int((time.monotonic() - t0) * 1000)}"


def is_vllm_worker() -> bool:
    """Whether this process is one of vLLM's multiprocess workers (named
    ``VllmWorker-RANK`` by its executor): the process that runs the
    engine's own distributed init right after ``register``."""
    import multiprocessing

    return multiprocessing.current_process().name.startswith("VllmWorker")


def meet_for_preflight(
    env=os.environ,
    worker: Callable[[], bool] = is_vllm_worker,
    meet: Callable[[str], str] = meet_gloo,
    log: Callable[[str], None] = print,
) -> Optional[str]:
    """Meets the preflight's rendezvous (``XFER_RENDEZVOUS``) in this vLLM
    worker, if it is the first of its node to claim it, and writes the
    outcome, one line, to ``XFER_RENDEZVOUS_FILE`` (whole or not at all);
    that line, or None when this process has none to meet. A failure is
    raised too, so the worker stops before the engine's own init hangs."""
    spec, out = env.get("XFER_RENDEZVOUS"), env.get("XFER_RENDEZVOUS_FILE")
    if not spec or not out or not worker():
        return None
    try:
        os.close(os.open(out + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return None  # another worker of this node meets it
    log(f"xfer loader: meeting the other nodes' workers for the preflight's rendezvous ({spec.split()[0]})")
    try:
        line = meet(spec)
    except Exception as e:  # noqa: BLE001 - reported, then raised again below
        why = " ".join(f"{type(e).__name__}: {e}".split())
        line = f"failed {why[:400]}"
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        f.write(line + "\n")
    os.rename(tmp, out)
    if line.startswith("failed "):
        raise LoaderError(
            "xfer loader: this worker did not meet the other nodes at the preflight's "
            f"rendezvous ({spec.split()[0]}): {line[7:]}; xfer-launch stops the ranks and "
            "its rendezvous row says what to check"
        )
    log(f"xfer loader: the preflight's rendezvous was met: {line}")
    return line


def wait_for_release(
    env=os.environ,
    log: Callable[[str], None] = print,
    exists: Callable[[str], bool] = os.path.exists,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Returns once ``XFER_HOLD_FILE`` exists (at once when it is unset or
    already there); whether the process was held. Gives up after
    ``XFER_LOADER_TIMEOUT_S`` with one line naming the file."""
    path = env.get("XFER_HOLD_FILE")
    if not path or exists(path):
        return False
    timeout_s = float(env.get("XFER_LOADER_TIMEOUT_S", "3600"))
    log(
        "xfer loader: held until xfer-launch's preflight passes (the agent "
        f"then creates {path}); nothing is read or bound until then"
    )
    since = clock()
    while not exists(path):
        waited = clock() - since
        if waited >= timeout_s:
            raise LoaderError(
                f"xfer loader: held for {waited:.0f}s and never released: "
                f"{path} was not created; `xfer-launch up` releases a held "
                "rank once its preflight passed and stops it otherwise: see "
                "its output, then `xfer-launch down` and `up` again"
            )
        sleep(poll_s)
    log(f"xfer loader: released after {clock() - since:.1f}s: the preflight passed")
    return True
