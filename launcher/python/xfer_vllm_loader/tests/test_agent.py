"""The wait logic of ``xfer_vllm_loader.agent`` against scripted agent
answers (no vLLM, no agent): shards yielded in the order they arrive, only
once out of ``pending``; another root refused in one line; a long wait that
names the shard and the agent's state. Run with the engine venv's python:
``python -m unittest discover -s launcher/python/xfer_vllm_loader/tests``."""

import importlib
import json
import os
import socket
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

from xfer_vllm_loader.agent import (LoaderError, Settings, View, arrivals, ask_agent,
                                   check_shard_name, meet_for_preflight, ready, view_of,
                                   wait_for_release)

ROOT = "ab" * 32
OTHER = "cd" * 32
DRAFT = "9a" * 32
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
          "model-00003-of-00003.safetensors"]


def settings(**kw):
    s = Settings(expect_root=ROOT, model_name="tiny", prefix="", node="n1",
                 socket_path="/nonexistent/agent.sock", note_s=30, timeout_s=3600)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def model(state="syncing", root=ROOT, pending=(), **kw):
    m = {"name": "tiny", "state": state, "root": root, "pending": list(pending),
         "bytes_held": 1, "bytes_total": 2, "last_error": None}
    m.update(kw)
    return View(model=m)


class Script:
    """Agent answers in turn (the last repeats); a virtual clock."""

    def __init__(self, views, step=1.0):
        self.views, self.asked, self.t, self.step = list(views), 0, 0.0, step

    def ask(self, _s):
        v = self.views[min(self.asked, len(self.views) - 1)]
        self.asked += 1
        return v

    def clock(self):
        return self.t

    def sleep(self, d):
        self.t += self.step


class Arrivals(unittest.TestCase):
    def run_script(self, script, s=None, lines=None):
        out = []
        log = (lines.append if lines is not None else (lambda _l: None))
        for f in arrivals(SHARDS, s or settings(), ask=script.ask, log=log,
                          clock=script.clock, sleep=script.sleep):
            out.append((f, script.asked))
        return out

    def test_shards_come_in_arrival_order_and_only_once_verified(self):
        script = Script([
            View(),  # nothing yet
            model(state="queued", root=None),
            model(pending=SHARDS),
            model(pending=SHARDS[:2]),  # the third shard landed first
            model(pending=SHARDS[:1]),
            model(state="complete", pending=()),
        ])
        got = self.run_script(script)
        self.assertEqual([f for f, _ in got], [SHARDS[2], SHARDS[1], SHARDS[0]])
        # Each was yielded right after the answer that cleared it.
        self.assertEqual([n for _, n in got], [4, 5, 6])

    def test_a_prefix_maps_file_names_to_manifest_paths(self):
        s = settings(prefix="snapshots/c0ffee")
        pend = ["snapshots/c0ffee/" + f for f in SHARDS]
        script = Script([model(pending=pend), model(pending=pend[1:]),
                         model(pending=())])
        got = self.run_script(script, s)
        self.assertEqual([f for f, _ in got], SHARDS)
        self.assertEqual([n for _, n in got], [2, 3, 3])

    def test_another_root_is_refused_in_one_line(self):
        script = Script([model(pending=SHARDS[1:]), model(root=OTHER, state="complete")])
        got = []
        with self.assertRaises(LoaderError) as e:
            for f in arrivals(SHARDS, settings(), ask=script.ask, log=lambda _l: None,
                              clock=script.clock, sleep=script.sleep):
                got.append(f)
        self.assertEqual(got, [SHARDS[0]])
        msg = str(e.exception)
        self.assertNotIn("\n", msg)
        self.assertIn(f"root {OTHER[:12]}", msg)
        self.assertIn(f"planned root {ROOT[:12]}", msg)

    def test_a_root_switched_after_the_last_shard_is_refused(self):
        script = Script([model(pending=()), model(root=OTHER)])
        with self.assertRaises(LoaderError):
            self.run_script(script)

    def test_a_streamed_draft_is_followed_through_its_final_round(self):
        # A Hub pull streaming as a draft (no root yet), then the final
        # round (a root, the draft kept), then complete: one identity.
        s = settings(expect_root="", expect_draft=DRAFT, prefix="snapshots/c0")
        pend = ["blobs/a", "snapshots/c0/" + SHARDS[0], "blobs/b",
                "snapshots/c0/" + SHARDS[1], "blobs/c", "snapshots/c0/" + SHARDS[2]]
        script = Script([
            model(root=None, pending=pend, draft=DRAFT),
            model(root=None, pending=pend[2:], draft=DRAFT),
            model(root=OTHER, pending=["refs/main"], draft=DRAFT),
            model(state="complete", root=OTHER, pending=(), draft=DRAFT),
        ])
        got = self.run_script(script, s)
        self.assertEqual([f for f, _ in got], SHARDS)
        self.assertEqual([n for _, n in got], [2, 3, 3])

    def test_another_draft_or_a_root_without_the_draft_is_refused(self):
        s = settings(expect_root="", expect_draft=DRAFT)
        for other in (model(root=None, draft="ef" * 32), model(root=OTHER, state="complete")):
            with self.assertRaises(LoaderError) as e:
                self.run_script(Script([other]), s)
            self.assertIn(f"planned streamed draft {DRAFT[:12]}", str(e.exception))
            self.assertNotIn("\n", str(e.exception))

    def test_settings_take_either_identity(self):
        base = {"XFER_MODEL_NAME": "tiny", "XFER_NODE": "n1", "XFER_AGENT_SOCKET": "/r/s"}
        self.assertEqual(Settings.from_env({**base, "XFER_EXPECT_DRAFT": DRAFT.upper()}).expect_draft, DRAFT)
        with self.assertRaises(LoaderError) as e:
            Settings.from_env(base)
        self.assertIn("XFER_EXPECT_ROOT (or XFER_EXPECT_DRAFT)", str(e.exception))

    def test_a_long_wait_names_the_shard_and_the_agents_state(self):
        stuck = model(pending=SHARDS[1:], last_error="peer n2 vanished")
        script = Script([stuck], step=10.0)
        lines = []
        with self.assertRaises(LoaderError) as e:
            self.run_script(script, settings(note_s=30, timeout_s=100), lines)
        msg = str(e.exception)
        self.assertIn(f"waiting for shard {SHARDS[1]}", msg)
        self.assertIn("syncing, root " + ROOT[:12], msg)
        self.assertIn("last error: peer n2 vanished", msg)
        self.assertNotIn("\n", msg)
        waits = [l for l in lines if "waiting for shard" in l]
        self.assertTrue(waits[0].startswith(f"xfer loader: waiting for shard {SHARDS[1]}"))
        self.assertTrue(any(l.startswith("xfer loader: still waiting") for l in waits), lines)

    def test_no_agent_socket_fails_at_once_with_the_cause(self):
        with self.assertRaises(LoaderError) as e:
            list(arrivals(["a.safetensors"], settings(), log=lambda _: None,
                          sleep=lambda _: None))
        msg = str(e.exception)
        self.assertIn("/nonexistent/agent.sock", msg)
        self.assertIn("is `xfer serve` running there", msg)
        self.assertNotIn("\n", msg)

    def test_no_answer_is_waited_for_and_said(self):
        script = Script([View(error="the agent did not answer: refused"),
                         model(state="complete")])
        lines = []
        got = self.run_script(script, lines=lines)
        self.assertEqual(len(got), 3)
        self.assertTrue(any("the agent did not answer" in l for l in lines), lines)


class FakeAgent:
    """A real Unix socket answering each request line with ``answer(req)``
    (raw bytes), on a thread; records the requests."""

    def __init__(self, d, answer):
        self.path = os.path.join(d, "agent.sock")
        self.requests = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        self.answer = answer
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                line = b""
                while not line.endswith(b"\n"):
                    part = c.recv(4096)
                    if not part:
                        break
                    line += part
                req = json.loads(line)
                self.requests.append(req)
                c.sendall(self.answer(req))

    def close(self):
        self.sock.close()


class LoaderLink(unittest.TestCase):
    """``ask_agent`` over a real socket: the question it sends, and which
    answers are waited for and which fail the rank at once."""

    def asked(self, answer):
        with tempfile.TemporaryDirectory() as d:
            agent = FakeAgent(d, answer)
            try:
                return ask_agent(settings(socket_path=agent.path), timeout_s=5), agent.requests
            finally:
                agent.close()

    def test_the_model_is_asked_by_name_and_its_entry_returned(self):
        entry = {"name": "tiny", "state": "syncing", "root": ROOT, "pending": []}
        line = (json.dumps({"answer": "model", "node": "n1", "model": entry}) + "\n").encode()
        view, requests = self.asked(lambda _r: line)
        self.assertEqual(requests, [{"ask": "model", "name": "tiny"}])
        self.assertEqual(view.model, entry)

    def test_what_no_wait_mends_fails_at_once(self):
        for answer, said in [
            ({"answer": "model", "node": "n1", "model": None}, "holds no model named tiny"),
            ({"answer": "refused", "why": "too long"}, "refused the loader's question: too long"),
            ({"answer": "jobs"}, "answered 'jobs', not a model"),
        ]:
            with self.assertRaises(LoaderError) as e:
                self.asked(lambda _r, a=answer: (json.dumps(a) + "\n").encode())
            self.assertIn(said, str(e.exception))
            self.assertNotIn("\n", str(e.exception))
        with self.assertRaises(LoaderError) as e:
            self.asked(lambda _r: b"HTTP/1.1 400 Bad Request\r\n\r\n")
        self.assertIn("answered no reply of the loader link", str(e.exception))


class Release(unittest.TestCase):
    """``register``'s wait of a held rank, on a virtual clock."""

    def test_a_rank_not_held_goes_on_at_once(self):
        lines = []
        self.assertFalse(wait_for_release(env={}, log=lines.append))
        self.assertFalse(wait_for_release(env={"XFER_HOLD_FILE": "/r"}, log=lines.append,
                                          exists=lambda _p: True))
        self.assertEqual(lines, [])

    def test_a_held_rank_waits_for_the_file_then_goes_on(self):
        script = Script([], step=0.05)
        checks = []

        def exists(p):
            checks.append(p)
            return len(checks) > 40  # created after 2 s of virtual time

        lines = []
        held = wait_for_release(env={"XFER_HOLD_FILE": "/runs/r1/released"}, log=lines.append,
                                exists=exists, clock=script.clock, sleep=script.sleep)
        self.assertTrue(held)
        self.assertEqual(set(checks), {"/runs/r1/released"})
        self.assertIn("held until xfer-launch's preflight passes", lines[0])
        self.assertIn("/runs/r1/released", lines[0])
        self.assertIn("released after 2.0s", lines[-1])

    def test_a_rank_never_released_gives_up_naming_the_file(self):
        script = Script([], step=1.0)
        with self.assertRaises(LoaderError) as e:
            wait_for_release(env={"XFER_HOLD_FILE": "/runs/r1/released",
                                  "XFER_LOADER_TIMEOUT_S": "30"},
                             log=lambda _l: None, exists=lambda _p: False,
                             clock=script.clock, sleep=script.sleep)
        msg = str(e.exception)
        self.assertIn("never released", msg)
        self.assertIn("/runs/r1/released", msg)
        self.assertIn("xfer-launch down", msg)


class Rendezvous(unittest.TestCase):
    """The preflight's rendezvous met by a released rank's vLLM worker: a
    real file and claim; the meeting itself (torch's Gloo) is injected
    here and real in ``tests/engines.rs``."""

    def env(self, d, **kw):
        e = {"XFER_HOLD_FILE": os.path.join(d, "released"),
             "XFER_RENDEZVOUS": "10.0.0.2:29500 1 2 57.0",
             "XFER_RENDEZVOUS_FILE": os.path.join(d, "rendezvous")}
        e.update(kw)
        return e

    def report(self, d):
        with open(os.path.join(d, "rendezvous")) as f:
            return f.read()

    def test_the_first_worker_of_a_node_meets_it_and_reports_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            specs = []
            meet = lambda spec: specs.append(spec) or "ok 41"  # noqa: E731
            lines = []
            self.assertEqual(meet_for_preflight(self.env(d), worker=lambda: True, meet=meet,
                                                log=lines.append), "ok 41")
            self.assertEqual(specs, ["10.0.0.2:29500 1 2 57.0"])
            self.assertEqual(self.report(d), "ok 41\n")
            self.assertIn("10.0.0.2:29500", lines[0])
            # A second worker of the same node does not meet it again.
            self.assertIsNone(meet_for_preflight(self.env(d), worker=lambda: True, meet=meet))
            self.assertEqual(len(specs), 1)
            self.assertEqual(sorted(os.listdir(d)), ["rendezvous", "rendezvous.claim"])

    def test_a_failed_meeting_is_reported_on_one_line_and_stops_the_worker(self):
        def refused(_spec):
            raise RuntimeError("Connection refused\n  at 10.0.0.2:29500")

        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(LoaderError) as cm:
                meet_for_preflight(self.env(d), worker=lambda: True, meet=refused,
                                   log=lambda _l: None)
            self.assertEqual(self.report(d),
                             "failed RuntimeError: Connection refused at 10.0.0.2:29500\n")
            msg = str(cm.exception)
            self.assertNotIn("\n", msg)
            self.assertIn("did not meet the other nodes", msg)
            self.assertIn("rendezvous row", msg)

    def test_only_a_worker_the_agent_asked_meets_it(self):
        def never(_spec):
            raise AssertionError("met")

        with tempfile.TemporaryDirectory() as d:
            # The API server and the engine core are no workers.
            self.assertIsNone(meet_for_preflight(self.env(d), worker=lambda: False, meet=never))
            for k in ("XFER_RENDEZVOUS", "XFER_RENDEZVOUS_FILE"):
                env = self.env(d)
                del env[k]
                self.assertIsNone(meet_for_preflight(env, worker=lambda: True, meet=never))
            self.assertEqual(os.listdir(d), [])


# Issue 53, finding 9: shard names from the model's own index, which the
# agent never vouched for, naming files outside the model.
ESCAPES = ["../../../.xfer/staging/x/data/0", "/etc/passwd", "a/../../b",
           "model\x00.safetensors", "model\n.safetensors", "", "."]


def listing(top):
    """Every path under ``top`` and where each link leads: to show that a
    refused name changed nothing."""
    out = []
    for d, dirs, files in os.walk(top):
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            out.append((p, os.readlink(p) if os.path.islink(p) else None))
    return sorted(out)


def loader_module():
    """``xfer_vllm_loader.loader`` imported over stand-ins for torch,
    transformers and vLLM (only their names it imports), to call its
    ``shard_names``; restored afterwards."""
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    class DefaultModelLoader:
        pass

    stubs = {
        "torch": mod("torch"),
        "transformers": mod("transformers"),
        "transformers.utils": mod("transformers.utils",
                                  SAFE_WEIGHTS_INDEX_NAME="model.safetensors.index.json",
                                  SAFE_WEIGHTS_NAME="model.safetensors"),
        "vllm": mod("vllm"),
        "vllm.logger": mod("vllm.logger", init_logger=lambda _n: None),
        "vllm.model_executor": mod("vllm.model_executor"),
        "vllm.model_executor.model_loader": mod("vllm.model_executor.model_loader"),
        "vllm.model_executor.model_loader.default_loader": mod(
            "vllm.model_executor.model_loader.default_loader",
            DefaultModelLoader=DefaultModelLoader),
        "vllm.model_executor.model_loader.weight_utils": mod(
            "vllm.model_executor.model_loader.weight_utils",
            safetensors_weights_iterator=None),
    }
    with mock.patch.dict(sys.modules, stubs):
        sys.modules.pop("xfer_vllm_loader.loader", None)
        loader = importlib.import_module("xfer_vllm_loader.loader")
    import xfer_vllm_loader
    xfer_vllm_loader.__dict__.pop("loader", None)
    return loader


class ShardNames(unittest.TestCase):
    """``check_shard_name`` (and ``loader.shard_names``, which calls it on
    every name of the index): only a plain relative path whose file
    resolves inside the model folder, or a Hub snapshot's repo folder."""

    def refused(self, folder, name, index, said=None):
        before = listing(os.path.dirname(folder))
        with self.assertRaises(LoaderError) as e:
            check_shard_name(folder, name, index)
        msg = str(e.exception)
        self.assertTrue(msg.startswith("xfer loader: "), msg)
        self.assertNotIn("\n", msg)
        self.assertIn(index, msg)
        self.assertIn(repr(name), msg)
        if said:
            self.assertIn(said, msg)
        self.assertEqual(listing(os.path.dirname(folder)), before)

    def test_an_index_naming_a_path_out_of_the_model_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            folder = os.path.join(d, "tiny")
            os.makedirs(os.path.join(d, ".xfer/staging/x/data"))
            with open(os.path.join(d, ".xfer/staging/x/data/0"), "w") as f:
                f.write("another model's partial")
            os.mkdir(folder)
            index = os.path.join(folder, "model.safetensors.index.json")
            for name in ESCAPES:
                self.refused(folder, name, index)
            self.refused(folder, "/etc/passwd", index, "an absolute path")
            self.refused(folder, "a/../../b", index, "leaves the model folder")
            self.refused(folder, "m\x00.safetensors", index, "NUL")

    def test_loader_shard_names_refuses_an_index_naming_a_path_out_of_the_model(self):
        loader = loader_module()
        with tempfile.TemporaryDirectory() as d:
            folder = os.path.join(d, "tiny")
            os.mkdir(folder)
            index = os.path.join(folder, "model.safetensors.index.json")
            for name in ESCAPES:
                with open(index, "w") as f:
                    json.dump({"weight_map": {"a.weight": SHARDS[0], "b.weight": name}}, f)
                with self.assertRaises(LoaderError) as e:
                    loader.shard_names(folder)
                self.assertIn(index, str(e.exception))
                self.assertIn(repr(name), str(e.exception))
                self.assertNotIn("\n", str(e.exception))
            with open(index, "w") as f:
                json.dump({"weight_map": {"a": "./" + SHARDS[1], "b": SHARDS[0],
                                          "c": "x/../" + SHARDS[0]}}, f)
            self.assertEqual(loader.shard_names(folder), SHARDS[:2])
            os.remove(index)
            self.assertEqual(loader.shard_names(folder), ["model.safetensors"])
            os.symlink("/etc/passwd", os.path.join(folder, "model.safetensors"))
            with self.assertRaises(LoaderError) as e:
                loader.shard_names(folder)
            self.assertIn("resolves to /etc/passwd", str(e.exception))

    def test_a_plain_name_is_normalized_and_accepted(self):
        with tempfile.TemporaryDirectory() as d:
            index = os.path.join(d, "model.safetensors.index.json")
            for name, norm in [(SHARDS[0], SHARDS[0]), ("./" + SHARDS[0], SHARDS[0]),
                               ("sub//x.safetensors", "sub/x.safetensors"),
                               ("a/../b.safetensors", "b.safetensors")]:
                self.assertEqual(check_shard_name(d, name, index), norm)

    def test_a_link_in_the_model_folder_leading_out_of_it_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            folder = os.path.join(d, "tiny")
            outside = os.path.join(d, "outside")
            os.mkdir(folder)
            os.mkdir(outside)
            os.symlink("/etc/passwd", os.path.join(folder, SHARDS[0]))
            os.symlink(outside, os.path.join(folder, "sub"))
            os.symlink("../outside/x", os.path.join(folder, SHARDS[1]))
            index = os.path.join(folder, "model.safetensors.index.json")
            self.refused(folder, SHARDS[0], index, "resolves to /etc/passwd, outside")
            self.refused(folder, "sub/x.safetensors", index, "outside")
            self.refused(folder, SHARDS[1], index, "outside")

    def test_a_hub_snapshots_links_into_its_blobs_are_accepted_and_no_other(self):
        with tempfile.TemporaryDirectory() as d:
            repo = os.path.join(d, "models--org--tiny")
            folder = os.path.join(repo, "snapshots", "c0")
            os.makedirs(folder)
            os.mkdir(os.path.join(repo, "blobs"))
            with open(os.path.join(repo, "blobs", "abc"), "w") as f:
                f.write("weights")
            os.symlink("../../blobs/abc", os.path.join(folder, "model.safetensors"))
            os.symlink("/etc/passwd", os.path.join(folder, SHARDS[0]))
            os.symlink("../../../other/blob", os.path.join(folder, SHARDS[1]))
            index = os.path.join(folder, "model.safetensors.index.json")
            self.assertEqual(check_shard_name(folder, "model.safetensors", index),
                             "model.safetensors")
            self.refused(folder, SHARDS[0], index, "resolves to /etc/passwd, outside")
            self.refused(folder, SHARDS[1], index, "outside")
            self.refused(folder, "../../blobs/abc", index, "leaves the model folder")
            # Not in snapshots/: the folder alone.
            plain = os.path.join(d, "plain", "c0")
            os.makedirs(plain)
            os.symlink("../../models--org--tiny/blobs/abc",
                       os.path.join(plain, "model.safetensors"))
            self.refused(plain, "model.safetensors", index, "outside")

    def test_ready_refuses_a_path_out_of_the_model_whatever_the_agent_says(self):
        for state in ("complete", "syncing"):
            for path in ["../../../.xfer/staging/x/data/0", "/etc/passwd",
                         "snapshots/c0/../../../x", "a/../../b"]:
                with self.assertRaises(LoaderError) as e:
                    ready(model(state=state), settings(), path)
                msg = str(e.exception)
                self.assertTrue(msg.startswith("xfer loader: "), msg)
                self.assertIn(repr(path), msg)
                self.assertNotIn("\n", msg)
        # A prefix that leaves the model is refused too, and nothing is yielded.
        got = []
        with self.assertRaises(LoaderError):
            for f in arrivals(SHARDS, settings(prefix="../other"),
                              ask=lambda _s: model(state="complete"),
                              log=lambda _l: None, sleep=lambda _d: None):
                got.append(f)
        self.assertEqual(got, [])
        # The final check of the identity asks about no file.
        self.assertTrue(ready(model(state="complete"), settings(), ""))
        self.assertTrue(ready(model(state="complete"), settings(), SHARDS[0]))


if __name__ == "__main__":
    unittest.main()
