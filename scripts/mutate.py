"""The mutation check: plant plausible one-line bugs, one at a time, and see whether the tests catch them.

    make mutate                              # every mutation in MUTATIONS
    python scripts/mutate.py --only gather tenants --list
    python scripts/mutate.py --only retries --timeout 120

Each mutation names a file, a line of it as it is and as the bug would write
it, and the tests that cover that module (as few as catch its slips). The
line must occur exactly once (else the list has rotted, and the check says so
before anything runs). First each distinct test selection runs unmutated and
must pass, else every mutation of it would look killed. Then, one mutation at
a time, the file is written in place (its cached bytecode removed, so the
mutant is what runs), the tests run in a child pytest (-x, stop at the first
failure) with this checkout first on PYTHONPATH (daemons the tests start
inherit it), and the file is put back whatever happens, also on Ctrl-C. The
child runs in its own process group, ended afterwards, so a daemon a failing
or hung test left behind goes with it. A mutation is killed when its tests
fail, survives when they pass; a run past --timeout counts as killed (the bug
made something hang) and is reported apart. Prints each outcome, the score
(killed / total) and the survivors; exit status 0 when the score reaches
--require (default 0.95), else 1.

Not part of `make test`: it runs the covering tests once per mutation, one
child at a time (108 mutations: tests/test_mutations_list.py holds this count
to len(MUTATIONS)). 81 of them took about 16 minutes on two cores; --only
runs the few a change touches.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]


def m(name, path, before, after, *tests) -> Mutation:
    return Mutation(name, path, before, after, tests)


ENGINE = "jevany_daemon/engine/"
SERVER = "jevany_daemon/server/"
WORKER = "jevany_daemon/worker/"
CLIENT = "client/jevany_client/"
# The tests that cover each module, as few as catch its slips: each mutation runs them once.
RETRIES = "tests/client/test_retries.py"
PROMISES = "tests/client/test_client_promises.py"
RESENDS = "tests/client/test_resends.py"
CALLS = (RETRIES, PROMISES, RESENDS)     # a call's tries, whichever part of them a slip breaks
WORKER_LOOP = "tests/worker/test_loop.py"
GATHER = "tests/server/test_gather.py"
ROUTING = "tests/client/test_routing.py"
FLEET_ROUTING = "tests/client/test_fleet_routing.py"
HOSTILE_PAYLOADS = "tests/client/test_hostile_payloads.py"
HOSTILE_MEDIA = "tests/media/test_hostile_media.py"
DISPATCH = "tests/server/test_dispatch.py"
WORKER_MEDIA = tuple(f"{WORKER_LOOP}::test_{name}" for name in (
    "a_media_requests_private_copies_are_closed_once_it_is_answered",
    "private_copies_are_closed_when_the_engine_refuses_the_request",
    "private_copies_made_before_a_file_that_changed_are_closed"))
FD_GUARD = "tests/server/test_fd_guard.py"
GATHER_STAGGERED = (GATHER + "::test_clients_answered_at_different_times_are_waited_for_until_the_last_is_back"
                    "_or_its_window_ends")
SIGNALS = "tests/server/test_signals_after_drain.py"
TENANTS = "tests/engine/test_prefix_cache.py::test_a_tenants_entries_are_its_own_the_head_is_everyones"
MUTATIONS = [
    # --- the answer self-check ----------------------------------------------------------
    m("self-check: a sum below 1 passes", CLIENT + "answers.py",
      "    if total <= 0 or abs(total - 1) > tolerance:",
      "    if total <= 0 or total - 1 > tolerance:", "tests/client/test_answers.py",
      "tests/client/test_self_check_sums.py"),
    # --- masks: what each query may attend to ---------------------------------------------
    m("masks: the additive mask blocks what is allowed and allows what is not", ENGINE + "masks.py",
      "    return (~allowed).to(twin).mul_(_LOWEST_BITS[dtype]).view(dtype)[:, None]",
      "    return allowed.to(twin).mul_(_LOWEST_BITS[dtype]).view(dtype)[:, None]", "tests/engine/test_packing.py"),
    m("masks: a continued pass's queries blind to their cached keys", ENGINE + "masks.py",
      "        allowed = torch.cat([cached[:, None, :].expand(-1, allowed.shape[1], -1), allowed], dim=2)",
      "        allowed = torch.cat([~cached[:, None, :].expand(-1, allowed.shape[1], -1), allowed], dim=2)",
      "tests/engine/test_packing.py"),
    # --- batching: which requests share a pass ------------------------------------------
    m("batching: a shared prefix counted once per pass", ENGINE + "batching.py",
      "        return price(self.rows, self.width) + requests * self.prefix",
      "        return price(self.rows, self.width) + self.prefix", "tests/engine/test_batching.py"),
    m("batching: a request joining its stem's row also counted as a row of its own", ENGINE + "batching.py",
      "            rows, real, grown = s.rows + p.rows - 1, s.real + p.real - p.shared, row + p.tails",
      "            rows, real, grown = s.rows + p.rows, s.real + p.real - p.shared, row + p.tails",
      "tests/engine/test_batching.py"),
    m("batching: a stem's tokens added to its row again by every request on it", ENGINE + "batching.py",
      "            rows, real, grown = s.rows + p.rows - 1, s.real + p.real - p.shared, row + p.tails",
      "            rows, real, grown = s.rows + p.rows - 1, s.real + p.real - p.shared, row + p.shared + p.tails",
      "tests/engine/test_batching.py"),
    m("batching: queued requests keep the cost they had before the cache changed", ENGINE + "engine.py",
      "        self._recost(queue)", "        pass", "tests/engine/test_reuse_costs.py"),
    m("passes: a shared stem's tokens counted as real once per request", ENGINE + "passes.py",
      "                real -= shape.shared        # its stem is computed once, in the row it shares (batching._Cost)",
      "                real -= 0",
      "tests/engine/test_packing.py::test_requests_continuing_one_kept_state_never_overrun_the_packed_token_bound"),
    # --- the adaptive policy ------------------------------------------------------------
    m("policy: the newest pass weighs four fifths", ENGINE + "batch_policy.py",
      "        self.rates[key] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate",
      "        self.rates[key] = rate if old is None else SMOOTHING * old + (1 - SMOOTHING) * rate",
      "tests/engine/test_batch_policy.py"),
    # --- prefix reuse -------------------------------------------------------------------
    m("prefix reuse: a hit costed as if its state ran again", ENGINE + "prefix_reuse.py",
      "        new, tails = len(enc.stem) - self.prefix_cache.peek(enc.stem, enc.tenant), sum(self._tail_lengths(enc))",
      "        new, tails = len(enc.stem), sum(self._tail_lengths(enc))", "tests/engine/test_reuse_costs.py"),
    m("prefix reuse: new stems on the pinned head left out of the one-pass rule", ENGINE + "prefix_reuse.py",
      "            fresh = [s for s in todo if not s.cached or s.base in pinned]",
      "            fresh = [s for s in todo if not s.cached]", "tests/engine/test_reuse_costs.py"),
    # --- the supervisor's deadlines -----------------------------------------------------
    m("deadline: timeout_ms read as tenths of a second", SERVER + "client_ops.py",
      "        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 1000",
      "        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 100",
      "tests/server/test_promises_requests.py::test_deadline_exceeded_comes_once_timeout_ms_has_passed_and_soon_after"),
    # --- supervisor dispatch, signals, descriptors, worker media (added) ---
    m("dispatch: a busy worker waits for more than a full pass", SERVER + "supervisor.py",
      "            elif not (worker.can_prefetch and len(self.queue) >= full):",
      "            elif not (worker.can_prefetch and len(self.queue) > full):", DISPATCH),
    m("dispatch: a busy worker handed half a pass", SERVER + "supervisor.py",
      "            elif not (worker.can_prefetch and len(self.queue) >= full):",
      "            elif not (worker.can_prefetch and len(self.queue) >= full // 2):", DISPATCH),
    m("dispatch: a busy worker that cannot prefetch handed a pass", SERVER + "supervisor.py",
      "            elif not (worker.can_prefetch and len(self.queue) >= full):",
      "            elif not (len(self.queue) >= full):", DISPATCH),
    m("worker media: an answered request's private copies left open", WORKER + "loop.py",
      "        record.copies.close()\n        return _wire(record.tag, outcome)",
      "        return _wire(record.tag, outcome)", *WORKER_MEDIA),
    m("worker media: a request the engine refused keeps its private copies", WORKER + "loop.py",
      "                record.copies.close()", "                pass", *WORKER_MEDIA),
    m("worker media: copies made before a changed file kept", WORKER + "loop.py",
      "                mine.close()", "                pass", *WORKER_MEDIA),
    m("fd guard: a silent client holding a request shed", SERVER + "peers.py",
      "        open_ = [c for c in self.conns.values() if not c.closing and c.fd not in busy]",
      "        open_ = [c for c in self.conns.values() if not c.closing]", FD_GUARD),
    m("fd guard: the most recently heard idle clients shed first", SERVER + "peers.py",
      "c.seen >= quiet_s), key=lambda c: c.seen)", "c.seen >= quiet_s), key=lambda c: -c.seen)", FD_GUARD),
    m("fd guard: mute connections not counted toward those shed", SERVER + "peers.py",
      "        return mute + quiet[:max(0, n - len(mute))]", "        return mute + quiet[:n]", FD_GUARD),
    m("gather: the hold counted from the first answer, not the last", SERVER + "gather.py",
      "                last = at if last is None else max(last, at)",
      "                last = at if last is None else min(last, at)", GATHER_STAGGERED),
    m("gather: a client waited for past its own window", SERVER + "gather.py",
      "            if now - at > wait:", "            if now - at > 2 * wait:", GATHER_STAGGERED),
    m("signals: a first SIGTERM after a drain op stops without waiting", SERVER + "supervisor.py",
      "            if self.run_state.stopping:\n                self.run_state.stop_now()",
      "            if self.run_state.winding_down:\n                self.run_state.stop_now()", SIGNALS),
    m("signals: a second signal still waits for the queue", SERVER + "supervisor.py",
      "                self.run_state.stop_now()     # a second signal", "                pass     # a second signal",
      SIGNALS),
    m("signals: a drain op after SIGTERM cancels the exit", SERVER + "run_state.py",
      "        self._exiting = self._exiting or exiting", "        self._exiting = exiting", SIGNALS),
    # --- the client's retries (calls.py, client.py, async_client.py) ---------------------
    m("retries: the deadline guard forgets the pause", CLIENT + "calls.py",
      "            if deadline is not None and time.monotonic() + pause >= deadline:",
      "            if deadline is not None and time.monotonic() >= deadline:", *CALLS),
    m("retries: control ops sent again when a connection drops", CLIENT + "calls.py",
      "                resends = self.retries if op in IDEMPOTENT else 0",
      "                resends = self.retries", *CALLS),
    m("retries: control ops retried on a retryable error", CLIENT + "calls.py",
      "            if not todo or op not in IDEMPOTENT or attempt >= self.retries:",
      "            if not todo or attempt >= self.retries:", *CALLS),
    m("retries: one retry more than asked", CLIENT + "calls.py",
      "            if not todo or op not in IDEMPOTENT or attempt >= self.retries:",
      "            if not todo or op not in IDEMPOTENT or attempt > self.retries:", *CALLS),
    m("retries: errors that are not retryable retried", CLIENT + "calls.py",
      "    return isinstance(outcome, JevanyError) and outcome.retryable",
      "    return isinstance(outcome, JevanyError)", *CALLS),
    m("retries: pauses grow by 50 ms, not double", CLIENT + "calls.py",
      "    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0)",
      "    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (attempt + 1)) * random.uniform(0.5, 1.0)", *CALLS),
    m("retries: pauses not capped at 1 s", CLIENT + "calls.py",
      "    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0)",
      "    return BACKOFF_FIRST_S * 2**attempt * random.uniform(0.5, 1.0)", *CALLS),
    m("retries: the jitter may take off the whole pause", CLIENT + "calls.py",
      "    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0)",
      "    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.0, 1.0)", *CALLS),
    m("retries: the daemon told the call's whole timeout, not what is left", CLIENT + "calls.py",
      "                    payload = yield from self._encode(rid, op, bodies[i], _daemon_ms(timeout_ms, left))",
      "                    payload = yield from self._encode(rid, op, bodies[i], _daemon_ms(timeout_ms, wait))",
      *CALLS),
    m("retries: the time left sent in seconds, not milliseconds", CLIENT + "calls.py",
      "        return None if left is None else math.ceil(left * 1000)",
      "        return None if left is None else math.ceil(left)", *CALLS),
    m("drops: resends past the retries bound (JevClient)", CLIENT + "client.py",
      "            if self.resends_left[rid] > 0:",
      "            if self.resends_left[rid] >= 0:", *CALLS),
    m("drops: what a dropped connection held never sent again (JevClient)", CLIENT + "client.py",
      "                self.unsent.append(rid)",
      "                pass", *CALLS),
    m("drops: resends past the retries bound (AsyncJevClient)", CLIENT + "async_client.py",
      "            if entry.resends_left > 0:",
      "            if entry.resends_left >= 0:", *CALLS),
    m("replies: a timed-out request never sent counted as sent", CLIENT + "client.py",
      "            self.outcomes[rid] = timeout_error(step, where, rid, rid in self.sent, self.unattributed)",
      "            self.outcomes[rid] = timeout_error(step, where, rid, True, self.unattributed)",
      "tests/client/test_client.py::test_unreachable_daemon_times_out_without_sending"),
    m("replies: a daemon answering shutting_down stays in the pool (both clients: Peer.replies)",
      CLIENT + "fleet.py", "                self.draining = True\n", "                pass\n",
      FLEET_ROUTING + "::test_a_daemon_answering_shutting_down_leaves_the_pool_at_once"),
    # --- the worker's pipeline (worker/loop.py) ------------------------------------------
    m("worker: work taken ahead keeps no deadline", WORKER + "loop.py",
      "            held.append(Held(item.tag, None if item.left is None else sent + float(item.left), mine))",
      "            held.append(Held(item.tag, None, mine))", WORKER_LOOP),
    m("worker: no deadline check before a pass", WORKER + "loop.py",
      "            self.expire()",
      "            pass", WORKER_LOOP),
    m("worker: work without a deadline expires", WORKER + "loop.py",
      "        return self.deadline is not None and self.deadline <= now",
      "        return self.deadline is None or self.deadline <= now", WORKER_LOOP),
    m("worker: an expired request scored as well", WORKER + "loop.py",
      "            else:\n                kept.append(pending)",
      "            if True:\n                kept.append(pending)", WORKER_LOOP),
    m("worker: a request refused at admission never answered", WORKER + "loop.py",
      "                self.ready.append(_wire(item.tag, exc))",
      "                pass", WORKER_LOOP),
    m("worker: every answer marked the last", WORKER + "loop.py",
      "        kind = channel.EARLY if self.busy else channel.RESULTS",
      "        kind = channel.RESULTS", WORKER_LOOP),
    m("worker: on an accelerator the next pass waits for this one's answers", WORKER + "loop.py",
      "            self.launch()         # the device starts the next pass while this one is answered",
      "            pass", WORKER_LOOP),
    m("worker: hand-overs during a pass wait for it to end", WORKER + "loop.py",
      "        if asynchronous:\n            # While the device runs",
      "        if False:\n            # While the device runs", WORKER_LOOP),
    # --- GPU-aware group commit (gather.py) ----------------------------------------------
    m("gather: waits with a full pass queued", SERVER + "gather.py",
      "        if queued >= full:", "        if queued > full:", GATHER),
    m("gather: waits longer than the fixed cost justifies", SERVER + "gather.py",
      "        wait = min(self.max_wait_s, FIXED_SHARE * self.cost.fixed_s())",
      "        wait = max(self.max_wait_s, FIXED_SHARE * self.cost.fixed_s())", GATHER),
    m("gather: waits for clients that come back late", SERVER + "gather.py",
      "        if back is None or back > wait:",
      "        if back is None:", GATHER),
    m("gather: clients past the window still waited for", SERVER + "gather.py",
      "            if now - at > wait:", "            if now - at > 2 * wait:", GATHER),
    m("gather: the window counted from now, not from the last answer", SERVER + "gather.py",
      "        return last + wait", "        return now + wait", GATHER),
    m("gather: a client that came back still counted as out", SERVER + "gather.py",
      "        if count <= 1:", "        if count < 1:", GATHER),
    m("gather: the clients' return a mean, which a few late ones drag past the window", SERVER + "gather.py",
      "        return statistics.median(self.returns) if self.returns else None",
      "        return statistics.mean(self.returns) if self.returns else None", GATHER),
    m("gather: clients never seen coming back waited for", SERVER + "gather.py",
      "            if client in self._returning:      # a client never seen coming back",
      "            if True:      # a client never seen coming back", GATHER),
    m("gather: requests through the HTTP gateway waited for as one client", SERVER + "request_queue.py",
      '        if self.transport == "http":', "        if False:", GATHER),
    m("gather: the newest pass cost weighs four fifths", SERVER + "gather.py",
      "(1 - SMOOTHING) * old[1] + SMOOTHING * seconds)", "SMOOTHING * old[1] + (1 - SMOOTHING) * seconds)", GATHER),
    m("gather: failed passes teach the cost", SERVER + "gather.py",
      "            if record.ok:", "            if True:", GATHER),
    m("gather: a falling cost makes the fixed part more than a pass costs", SERVER + "gather.py",
      "        return max(0.0, my - max(0.0, slope) * mx)", "        return max(0.0, my - slope * mx)", GATHER),
    m("gather: one size class trusted for the fit", SERVER + "gather.py",
      "        if len(self.classes) < MIN_CLASSES:", "        if not self.classes:", GATHER),
    m("gather: the newest client forgotten when memory is full", SERVER + "gather.py",
      "            del self._answered[next(iter(self._answered))]",
      "            del self._answered[next(reversed(self._answered))]", GATHER),
    m("gather: a worker's answers noted only once their replies are sent", SERVER + "worker_events.py",
      "        self.gather.answered(entry[0].client, self.clock())", "        pass", GATHER),
    # --- client routing (routing.py, fleet.py) -------------------------------------------
    m("routing: least_loaded takes the more loaded of two", CLIENT + "routing.py",
      "        return peers[a] if peers[a].load(now) <= peers[b].load(now) else peers[b]",
      "        return peers[a] if peers[a].load(now) >= peers[b].load(now) else peers[b]", ROUTING),
    m("routing: a load report never fades", CLIENT + "fleet.py",
      "        fading = 0.5 ** (max(0.0, now - self.reported_at) / REPORT_HALF_LIFE_S)",
      "        fading = 1.0", ROUTING),
    m("routing: our own requests counted twice in a report", CLIENT + "fleet.py",
      "        self.others = max(0, queue + inflight - len(self.pending))",
      "        self.others = max(0, queue + inflight)", ROUTING),
    m("routing: the affinity bound leaves out the request being placed", CLIENT + "routing.py",
      "        bound = math.ceil(BALANCE_FACTOR * (sum(loads.values()) + 1) / len(loads))",
      "        bound = math.ceil(BALANCE_FACTOR * sum(loads.values()) / len(loads))", ROUTING),
    m("routing: a peer at its bound still takes the key", CLIENT + "routing.py",
      "            if loads[name] + 1 <= bound:", "            if loads[name] <= bound:", ROUTING),
    m("routing: round_robin stuck on one peer", CLIENT + "routing.py",
      "        self._turn += 1", "        self._turn += 0", ROUTING),
    m("routing: the affinity key digests the whole state", CLIENT + "routing.py",
      "    return hashlib.sha256(bytes(head[:AFFINITY_PREFIX_BYTES])).hexdigest()[:16]",
      "    return hashlib.sha256(bytes(head)).hexdigest()[:16]", ROUTING),
    m("routing: the affinity key depends on key order", CLIENT + "routing.py",
      "json.JSONEncoder(sort_keys=True,", "json.JSONEncoder(sort_keys=False,", ROUTING),
    m("fleet: a draining daemon stays in the pool", CLIENT + "fleet.py",
      "        return not (self.dropped or self.draining or self.retiring)",
      "        return not (self.dropped or self.retiring)", ROUTING,
      FLEET_ROUTING + "::test_a_daemon_answering_shutting_down_leaves_the_pool_at_once"),
    m("fleet: with every daemon out, the draining ones are not used", CLIENT + "fleet.py",
      "        return pool or [p for p in self.peers.values() if p.draining and not (p.dropped or p.retiring)]",
      "        return pool", ROUTING),
    m("fleet: a draining daemon that reconnects stays out", CLIENT + "fleet.py",
      "        self.dropped = self.draining = False", "        self.dropped = False", ROUTING),
    m("fleet: a retiring daemon closed while it holds requests", CLIENT + "fleet.py",
      "        closing = [peer for peer in self.peers.values() if peer.retiring and not peer.pending]",
      "        closing = [peer for peer in self.peers.values() if peer.retiring]", ROUTING),
    m("fleet: a name's vanished address never retired", CLIENT + "fleet.py",
      "                peer.retiring = endpoint not in wanted", "                peer.retiring = False", ROUTING,
      FLEET_ROUTING + "::test_addresses_join_and_leave_as_the_records_change"),
    # --- attack defences: decode caps (protocol.py) ---------------------------------------
    m("caps: a map reaching the caps refused", CLIENT + "protocol.py",
      "        self.values += len(pairs)\n        self.containers += 1\n"
      "        if self.values > MAX_VALUES or self.containers > MAX_CONTAINERS:",
      "        self.values += len(pairs)\n        self.containers += 1\n"
      "        if self.values >= MAX_VALUES or self.containers >= MAX_CONTAINERS:", HOSTILE_PAYLOADS),
    m("caps: arrays not counted as containers", CLIENT + "protocol.py",
      "        self.values += len(items)\n        self.containers += 1\n",
      "        self.values += len(items)\n", HOSTILE_PAYLOADS),
    m("caps: maps' pairs not counted as values", CLIENT + "protocol.py",
      "        self.values += len(pairs)\n", "        self.values += 1\n", HOSTILE_PAYLOADS),
    # (decode_request's full decode; decode_envelope has a line of its own, alike)
    m("caps: a refusal for the counts loses the id", CLIENT + "protocol.py",
      "budget\n    except _TooMany:\n"
      "        raise InvalidRequestError(_too_many_problem(), request_id=_salvage_id(payload)) from None",
      "budget\n    except _TooMany:\n"
      "        raise InvalidRequestError(_too_many_problem(), request_id=None) from None", HOSTILE_PAYLOADS),
    m("caps: an id of 257 bytes accepted", CLIENT + "protocol.py",
      "    return None if size <= MAX_ID_BYTES else", "    return None if size <= MAX_ID_BYTES + 1 else",
      "tests/client/test_protocol.py"),
    m("caps: the timestamp extension accepted", CLIENT + "protocol.py",
      "    max_ext_len=0,\n", "    max_ext_len=1 << 20,\n", "tests/client/test_protocol.py"),
    # --- attack defences: media files (media/files.py) ------------------------------------
    m("media: a FIFO opened blocking", "jevany_daemon/media/files.py",
      "os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC", "os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC",
      HOSTILE_MEDIA),
    m("media: a final symlink followed", "jevany_daemon/media/files.py",
      "os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC", "os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC",
      HOSTILE_MEDIA),
    m("media: what is not a regular file read", "jevany_daemon/media/files.py",
      "        if not stat.S_ISREG(st.st_mode):", "        if False:", HOSTILE_MEDIA),
    m("media: the cap trusts the size fstat reports", "jevany_daemon/media/files.py",
      "            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))",
      "            chunk = os.read(fd, min(_CHUNK, max_bytes - size))", HOSTILE_MEDIA),
    m("media: checked bytes compared by size alone", "jevany_daemon/media/files.py",
      "    if len(data) != size or hashlib.sha256(data).hexdigest() != expected:",
      "    if len(data) != size:", HOSTILE_MEDIA),
    # --- attack defences: tenant isolation in the prefix cache -----------------------------
    # Entries are keyed by (tenant, tokens): a lookup walks only its tenant's keys and the pinned heads.
    m("tenants: every entry usable by everyone", ENGINE + "prefix_cache.py",
      "*((k[1], e) for k, e in self._entries.items() if k[0] == tenant)]:",
      "*((k[1], e) for k, e in self._entries.items())]:", TENANTS),
    m("tenants: a request without a tenant sees every entry", ENGINE + "prefix_cache.py",
      "*((k[1], e) for k, e in self._entries.items() if k[0] == tenant)]:",
      "*((k[1], e) for k, e in self._entries.items() if tenant is None or k[0] == tenant)]:", TENANTS),
    m("tenants: an entry without a tenant is everyone's", ENGINE + "prefix_cache.py",
      "        whole = self._entries.get((tenant, tokens)) or self._heads.get(tokens)",
      "        whole = self._entries.get((tenant, tokens)) or self._entries.get((None, tokens))"
      " or self._heads.get(tokens)",
      TENANTS),
    m("tenants: another tenant's exact state served whole", ENGINE + "prefix_cache.py",
      "        whole = self._entries.get((tenant, tokens)) or self._heads.get(tokens)",
      "        whole = next((e for k, e in self._entries.items() if k[1] == tokens), None) or self._heads.get(tokens)",
      TENANTS),
    m("tenants: get answers for a state another tenant holds", ENGINE + "prefix_cache.py",
      "        if (tenant, tokens) not in self._entries and tokens not in self._heads:",
      "        if all(k[1] != tokens for k in self._entries) and tokens not in self._heads:", TENANTS),
    m("tenants: entries kept without their tenant", ENGINE + "prefix_cache.py",
      "        self._entries[(tenant, tokens)] = Entry(cache, nbytes, tenant=tenant)",
      "        self._entries[(None, tokens)] = Entry(cache, nbytes, tenant=tenant)", TENANTS),
    m("tenants: a tenant's state replaces the shared head", ENGINE + "prefix_cache.py",
      "        if not self.eligible(tokens) or tokens in self._heads:    # the head is everyone's already",
      "        if not self.eligible(tokens):    # the head is everyone's already", TENANTS),
    # --- settings, gateway, async client, eval merge (added) -------------------------------
    m("settings: an empty list flag overrides the variable and the file", SERVER + "settings.py",
      "    given = {k: v for k, v in flags.items() if v is not None and v != ()}",
      "    given = {k: v for k, v in flags.items() if v is not None}",
      "tests/server/test_settings.py::test_a_list_flag_left_empty_leaves_the_variable_and_the_file_their_say"),
    m("settings: the TOML file beats the environment", SERVER + "settings.py",
      "    merged = {**toml, **environment, **given}", "    merged = {**environment, **toml, **given}",
      "tests/server/test_settings.py::test_a_list_flag_left_empty_leaves_the_variable_and_the_file_their_say"),
    m("settings: only the first --bind is checked for exposure", SERVER + "validation.py",
      "    exposed = [e for e in endpoints if not is_loopback(e)]",
      "    exposed = [e for e in endpoints[:1] if not is_loopback(e)]",
      "tests/server/test_settings.py::test_an_exposed_address_needs_its_override_and_is_taken_with_it"),
    m("settings: a non-loopback --http accepted without a token or --insecure", SERVER + "validation.py",
      '    elif not is_loopback(f"tcp://{host}:{port}") and not s.insecure:',
      "    elif not is_loopback(s.http) and not s.insecure:",
      "tests/server/test_settings.py::test_an_exposed_address_needs_its_override_and_is_taken_with_it"),
    m("settings: exposed metrics accepted without --insecure", SERVER + "validation.py",
      "    if s.metrics_port is not None and not address.is_loopback and not s.insecure:",
      "    if s.metrics_port is None and not address.is_loopback and not s.insecure:",
      "tests/server/test_settings.py::test_an_exposed_address_needs_its_override_and_is_taken_with_it"),
    m("gateway: the bearer scheme matched case-sensitively", "jevany_daemon/gateway/guard.py",
      '        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())',
      '        return scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())',
      "tests/server/test_guard.py::test_the_bearer_scheme_is_matched_whatever_its_case_the_token_exactly"),
    m("gateway: a request's release gives back nothing of its body's hold", "jevany_daemon/gateway/guard.py",
      "        self._give(self.size)", "        self._give(0)",
      "tests/server/test_guard.py::test_every_request_gives_back_what_its_body_held"),
    m("gateway: CORS answers every origin whatever --http-cors-origins says", "jevany_daemon/gateway/app.py",
      '        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"],',
      '        app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"],',
      "tests/server/test_guard.py::test_cors_origins_narrowed_answer_only_the_origins_listed"),
    m("backlog: a new request jumps the queued ones (AsyncJevClient)", CLIENT + "async_client.py",
      "        if not self._backlog and self._send_now(rid, entry):", "        if self._send_now(rid, entry):",
      "tests/client/test_async_backlog.py"),
    m("backlog: queued requests sent last first (AsyncJevClient)", CLIENT + "async_client.py",
      "        self._backlog.append((rid, entry, waiter))", "        self._backlog.appendleft((rid, entry, waiter))",
      "tests/client/test_async_backlog.py"),
    m("eval merge: records written in the order the files gave them", CLIENT + "eval/merge.py",
      '    _write_atomically(out, b"".join(record_line(merged[i]) for i in sorted(merged)))',
      '    _write_atomically(out, b"".join(record_line(merged[i]) for i in merged))',
      "tests/client/test_eval_shards.py::test_merge_writes_interleaved_shards_in_suite_order_and_a_duplicate_must_answer_alike"),
    m("eval merge: duplicates with other answers count as alike", CLIENT + "eval/merge.py",
      '        return ("result", record["result"].get("model"), record["result"].get("answers"))',
      '        return ("result", record["result"].get("model"))',
      "tests/client/test_eval_shards.py::test_merge_writes_interleaved_shards_in_suite_order_and_a_duplicate_must_answer_alike"),
    m("eval merge: a duplicate's latency makes it disagree", CLIENT + "eval/merge.py",
      '        return ("result", record["result"].get("model"), record["result"].get("answers"))',
      '        return ("result", record["result"])',
      "tests/client/test_eval_shards.py::test_merge_writes_interleaved_shards_in_suite_order_and_a_duplicate_must_answer_alike"),
]


def pytest_env() -> dict:
    """The children import this checkout's code, whatever copy the interpreter has installed."""
    paths = [str(ROOT), str(ROOT / "client"), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_tests(tests: tuple[str, ...], timeout: float) -> str:
    """'passed', 'failed' or 'timeout' for one child pytest (-x), its process group ended after."""
    # Its own session, so what the tests started (daemons, fake daemons) goes with it on a timeout.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                            cwd=ROOT, env=pytest_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # a hung test, or a daemon a failed test left behind
        except ProcessLookupError:
            pass
        proc.wait()
    if code in (4, 5):
        raise SystemExit(f"pytest {' '.join(tests)}: exit {code} (a usage error, or no tests collected): "
                         "update scripts/mutate.py")
    return "timeout" if code is None else "passed" if code == 0 else "failed"


def forget_bytecode(path: Path) -> None:
    # A mutant of the same size written within the second of its original would otherwise be run
    # from the original's cached bytecode (and the original, restored, from the mutant's).
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


def problems(mutation: Mutation) -> list[str]:
    """What makes an entry stale: its line not found exactly once, a no-op mutant, a test file or test gone.

    Cheap (a text search per entry): tests/test_mutations_list.py runs it on every entry in `make test`.
    """
    found = []
    path = ROOT / mutation.path
    if not path.is_file():
        found.append(f"{mutation.path} does not exist")
    else:
        count = path.read_text().count(mutation.before)
        if count != 1:
            found.append(f"the line to mutate occurs {count} times in {mutation.path}, not once")
    if mutation.after == mutation.before:
        found.append("the mutated line is the original")
    for test in mutation.tests:
        file, _, name = test.partition("::")
        if not (ROOT / file).is_file():
            found.append(f"no test file {file}")
        elif name and not re.search(rf"^(async )?def {re.escape(name)}\(", (ROOT / file).read_text(), re.M):
            found.append(f"no test {name} in {file}")
    return found


def check_all(mutations) -> None:
    """Every stale entry named at once (not only the first), before anything runs."""
    stale = [f"  {mu.name}: {'; '.join(found)}" for mu in mutations if (found := problems(mu))]
    if stale:
        raise SystemExit(f"{len(stale)} stale mutation(s); update scripts/mutate.py:\n" + "\n".join(stale))


def check(mutation: Mutation) -> str:
    """The file's text, once it is known to hold the line to mutate exactly once."""
    original = (ROOT / mutation.path).read_text()
    if original.count(mutation.before) != 1:
        raise SystemExit(f"{mutation.name}: the line to mutate occurs {original.count(mutation.before)} times in "
                         f"{mutation.path}, not once; update scripts/mutate.py")
    return original


def run(mutation: Mutation, timeout: float) -> tuple[str, float]:
    """('killed' | 'survived' | 'timeout', seconds) for one mutation, its file restored afterwards."""
    path = ROOT / mutation.path
    original = check(mutation)
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutation.before, mutation.after))
        forget_bytecode(path)
        outcome = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[run_tests(mutation.tests, timeout)]
    finally:
        path.write_text(original)
        forget_bytecode(path)
    return outcome, time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="WORD", help="mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations (each line checked) and exit")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a mutation's tests may take")
    parser.add_argument("--require", type=float, default=0.95, help="score below which the exit status is 1")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running each test selection unmutated first")
    args = parser.parse_args(argv)
    chosen = [mu for mu in MUTATIONS if not args.only or any(w in mu.name for w in args.only)]
    check_all(chosen)
    if args.list:
        for mu in chosen:
            print(f"{mu.name}  [{mu.path}; {' '.join(mu.tests)}]")
        return 0
    if not args.no_baseline:
        # A selection that fails unmutated would count every mutation of it as killed.
        for tests in dict.fromkeys(mu.tests for mu in chosen):
            started = time.monotonic()
            outcome = run_tests(tests, args.timeout)
            print(f"baseline {time.monotonic() - started:6.1f} s  {outcome}: {' '.join(tests)}", flush=True)
            if outcome != "passed":
                raise SystemExit(f"the tests {' '.join(tests)} do not pass unmutated; fix them first")
    outcomes = []
    for mu in chosen:
        outcome, seconds = run(mu, args.timeout)
        outcomes.append((mu, outcome))
        print(f"{outcome:8} {seconds:6.1f} s  {mu.name}", flush=True)
    killed = sum(o != "survived" for _, o in outcomes)
    score = killed / len(outcomes) if outcomes else 1.0
    print(f"\nscore: {killed}/{len(outcomes)} killed ({score:.0%})")
    for mu, o in outcomes:
        if o == "survived":
            print(f"  survived: {mu.name} ({mu.path})")
        elif o == "timeout":
            print(f"  timed out (counted killed): {mu.name}")
    return 0 if score >= args.require else 1


if __name__ == "__main__":
    sys.exit(main())
