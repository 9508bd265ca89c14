"""JevAny's own cases, replayed over HTTP against a server: what its tests, its client and its Playground read.

Each case restates, in our words, what one of JevAny's tests (tests/test_serving.py,
test_api_values.py, test_remote_admission.py, test_client_workflow.py,
test_playground_workflow.py), its documented calls (docs/API.md) or its serving
code (runtime.py describe(), letter_runtime.py, serve.py) asserts about the
server, and checks it through HTTP alone: status codes, `detail`, headers, fields
and their types. A case runs against one of three servers, one per readout:
`pointer` and `lm_token` (JevAny run directories, read natively) and `choice`
(the training-free readout); each has a media root holding one image.

Run on its own, it starts the three servers (`jevany-daemon serve --http`) on tiny
models and prints how many cases match:

    .venv/bin/python -m tests.server.jevany_replay

tests/server/test_jevany_replay.py runs the same cases in the suite.
"""
import argparse
import http.client
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CASES: list["Case"] = []
# Cases where we chose to differ from JevAny, each with docs/COMING-FROM-JEVANY.md's words for why (its
# departures table says so; the suite checks the table has them).
DEPARTURES = {
    "letter_runtime: the choice readout reports no prefix cache [choice]":
        "our choice readout keeps a prefix cache",
    # the daemon's gateway (pointer); the in-process app serves one caller, and shows them
    "test_serving: two identical requests are one miss then one hit in prefix_cache [pointer]":
        "hits and misses are null on the daemon's public endpoints",
}
NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
ANSWER_KEYS = {"choice": ["type", "choice", "confidence", "probabilities"], "noul": ["type", "noul"],
               "score": ["type", "score", "legend", "probabilities", "confidence"]}
# test_serving.py's request: one question of each type.
SERVING_BODY = {"state": "state " * 20, "questions": {
    "choice": {"type": "choice", "instructions": "choose", "criteria": {"a": None, "b": None}},
    "noul": {"type": "noul", "instructions": "choose yes"},
    "score": {"type": "score", "instructions": "choose other", "criteria": ["a", "b"]},
}}
# docs/API.md's request, as documented.
API_BODY = {"model": "jevany-latest", "state": "I was charged twice.", "questions": {
    "department": {"type": "choice", "instructions": "Which team should handle this?",
                   "criteria": {"billing": "Payment problems", "shipping": "Delivery problems"}},
    "urgent": {"type": "noul", "instructions": "Does this need urgent review?"},
    "priority": {"type": "score", "instructions": "Assign priority.", "criteria": ["low", "normal", "high"]},
}}


class Mismatch(AssertionError):
    """The server does not do what JevAny's case asserts; the message says what differs."""


def expect(condition, why: str) -> None:
    if not condition:
        raise Mismatch(why)


@dataclass
class Case:
    name: str          # source file, then what it checks
    readout: str       # which server: pointer, choice or lm_token
    check: Callable
    media: bool = False    # sends a file: needs a server with a media root


def case(name: str, *readouts: str, media: bool = False):
    """Register a check as one case per readout (pointer alone when none is named)."""
    def register(check):
        for readout in readouts or ("pointer",):
            CASES.append(Case(f"{name} [{readout}]", readout, check, media))
        return check
    return register


class Server:
    """One HTTP server under test; request() → (status, lower-cased headers, JSON or text)."""

    def __init__(self, readout: str, port: int, model_dir: Path, media_file: str | None):
        self.readout, self.port, self.model_dir, self.media_file = readout, port, Path(model_dir), media_file
        self._tokenizer = None

    def request(self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            sent = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers={**sent, **(headers or {})})
            reply = conn.getresponse()
            payload = reply.read()
            kind = reply.getheader("Content-Type") or ""
            value = json.loads(payload) if kind.startswith("application/json") else payload.decode()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, value
        finally:
            conn.close()

    def post(self, body=None, headers: dict | None = None, raw: bytes | None = None):
        return self.request("POST", "/v1/systemone", body, headers, raw)

    def decide(self, body) -> dict:
        status, _, reply = self.post(body)
        expect(status == 200, f"POST /v1/systemone: {status} {reply}")
        return reply

    def entry(self) -> dict:
        status, _, reply = self.request("GET", "/v1/models")
        expect(status == 200, f"GET /v1/models: {status} {reply}")
        return reply["models"][0]

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self._tokenizer

    def context_window(self) -> int:
        config = self.model_dir / ("config.json" if self.readout == "choice" else "base/config.json")
        return json.loads(config.read_text())["max_position_embeddings"]


def replay(servers: dict[str, Server], cases: list[Case] = CASES) -> list[tuple[Case, str | None]]:
    """Every case against its server: [(case, None when it matched, else why not)]; media cases only
    where the server has a media file."""
    outcomes = []
    for c in cases:
        if c.media and servers[c.readout].media_file is None:
            continue
        try:
            c.check(servers[c.readout])
            outcomes.append((c, None))
        except Mismatch as exc:
            outcomes.append((c, str(exc) or "mismatch"))
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
            outcomes.append((c, f"{type(exc).__name__}: {exc}"))
    return outcomes


# --- helpers shared by the checks ----------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rounded(value) -> bool:
    return _is_number(value) and round(value, 2) == value


def _no_questions_detail(reply) -> bool:
    return isinstance(reply.get("detail"), list) and reply["detail"] and "loc" in reply["detail"][0]


def jevany_response_problem(body: dict, reply: dict) -> str | None:
    """What JevAny's client refuses in a decide response (its own checks, restated), or None."""
    answers = reply.get("answers")
    if not isinstance(answers, dict) or set(answers) != set(body["questions"]):
        return "answer ids differ from the question ids"
    for qid, question in body["questions"].items():
        answer, kind = answers[qid], question["type"]
        if not isinstance(answer, dict) or answer.get("type") != kind:
            return f"{qid!r}: type"
        if kind == "noul":
            if not (_is_number(answer.get("noul")) and 0 <= answer["noul"] <= 1):
                return f"{qid!r}: noul"
            continue
        keys = list(question["criteria"]) if kind == "choice" else [str(i) for i in range(len(question["criteria"]))]
        p = answer.get("probabilities")
        if not isinstance(p, dict) or set(p) != set(keys) or not all(_is_number(v) and 0 <= v <= 1 for v in p.values()):
            return f"{qid!r}: probabilities"
        if abs(sum(p.values()) - 1) > max(1e-5, 0.005 * len(keys) + 1e-8):
            return f"{qid!r}: probabilities sum to {sum(p.values())}"
        if not (_is_number(answer.get("confidence")) and 0 <= answer["confidence"] <= 1):
            return f"{qid!r}: confidence"
        if kind == "choice" and (answer.get("choice") not in question["criteria"]
                                 or p[answer["choice"]] < max(p.values())):
            return f"{qid!r}: choice is not an argmax option"
        if kind == "score":
            if not (_is_number(answer.get("score")) and 0 <= answer["score"] <= len(keys) - 1):
                return f"{qid!r}: score"
            if not isinstance(answer.get("legend"), dict) or set(answer["legend"]) != set(keys):
                return f"{qid!r}: legend"
    return None


def jevany_shape(answers: dict) -> dict:
    """The answers as JevAny writes them: its keys, in its order (the count output_tokens is taken over)."""
    return {qid: {k: a[k] for k in ANSWER_KEYS[a["type"]]} for qid, a in answers.items()}


def _choice_body(n: int, names=None) -> dict:
    names = names or [f"o{i}" for i in range(n)]
    return {"state": "s", "questions": {"q": {"type": "choice", "criteria": {name: None for name in names}}}}


def _media_body(server: Server) -> dict:
    return {"state": "state", "media": [{"type": "image", "uri": server.media_file}],
            "questions": {"color": {"type": "choice", "criteria": {"red": None, "blue": None}}}}


# --- tests/test_serving.py -----------------------------------------------------------------------

@case("test_serving: a checkpoint answers each question type over HTTP", "pointer", "lm_token", "choice")
def _answers(s):
    reply = s.decide(SERVING_BODY)
    expect(set(reply["answers"]) == {"choice", "noul", "score"}, f"answer ids {sorted(reply['answers'])}")
    for qid, answer in reply["answers"].items():
        expect(answer["type"] == qid, f"{qid}: type {answer['type']}")


@case("test_serving: the response names the served model, as /v1/models does", "pointer", "choice")
def _model_named(s):
    expect(s.decide(SERVING_BODY)["model"] == s.entry()["id"], "response model differs from the entry's id")


@case("test_serving: noul is p(true) rounded to two places", "pointer", "lm_token", "choice")
def _noul(s):
    expect(_rounded(s.decide(SERVING_BODY)["answers"]["noul"]["noul"]), "noul is not rounded to 2 places")


@case("test_serving: choice and score carry probabilities by key, rounded confidence and score, the legend",
      "pointer", "lm_token", "choice")
def _choice_and_score(s):
    answers = s.decide(SERVING_BODY)["answers"]
    choice, score = answers["choice"], answers["score"]
    expect(list(choice["probabilities"]) == ["a", "b"] and choice["choice"] in ("a", "b"), "choice keys")
    expect(_rounded(choice["confidence"]) and _rounded(score["confidence"]), "confidence not rounded")
    expect(list(score["probabilities"]) == ["0", "1"] and _rounded(score["score"]), "score keys or rounding")
    expect(score["legend"] == {"0": "a", "1": "b"}, f"legend {score['legend']}")


@case("test_serving: the same request twice reports the same usage", "pointer", "choice")
def _same_usage(s):
    expect(s.decide(SERVING_BODY)["usage"] == s.decide(SERVING_BODY)["usage"], "usage differs between repeats")


@case("test_serving: /v1/models reports the backbone's context window", "pointer", "lm_token", "choice")
def _context_window(s):
    window = s.entry().get("capabilities", {}).get("context_window")
    expect(window == s.context_window(), f"capabilities.context_window {window!r}")


@case("test_serving: a text checkpoint's media_types is []", "pointer", "lm_token", "choice")
def _media_types(s):
    expect(s.entry().get("capabilities", {}).get("media_types") == [], "capabilities.media_types is not []")


@case("test_serving: limits.branch_tokens is the configured limit capped by the window", "pointer", "lm_token")
def _branch_tokens(s):
    got = s.entry()["limits"].get("branch_tokens")
    expect(got == min(8192, s.context_window()), f"limits.branch_tokens {got!r}")


@case("test_serving: branch_mode is packed or rows", "pointer", "lm_token")
def _branch_mode(s):
    expect(s.entry().get("branch_mode") in ("packed", "rows"), f"branch_mode {s.entry().get('branch_mode')!r}")


@case("test_serving: id, aliases, capabilities, branch_mode, prefix_cache are in the entry", "pointer", "choice")
def _entry_keys(s):
    entry = s.entry()
    missing = {"id", "aliases", "capabilities", "branch_mode", "prefix_cache"} - set(entry)
    expect(not missing, f"missing {sorted(missing)}")
    expect(entry["aliases"] == ["jevany-latest"], f"aliases {entry['aliases']}")


@case("test_serving: linear_attention_kernels is null on a model without linear attention", "pointer")
def _kernels(s):
    acceleration = s.entry().get("acceleration")
    expect(isinstance(acceleration, dict) and "linear_attention_kernels" in acceleration
           and acceleration["linear_attention_kernels"] is None, f"acceleration {acceleration!r}")


@case("test_serving: two identical requests are one miss then one hit in prefix_cache", "pointer")
def _prefix_hits(s):
    entry = s.entry()
    cache = entry["prefix_cache"]
    body = {"state": "many words here " * max(64, cache.get("min_state_tokens", 384) // 2),
            "questions": {"q": {"type": "noul"}}}
    s.decide(body)
    s.decide(body)
    after = s.entry()["prefix_cache"]
    enabled = int(bool(cache.get("enabled")) and bool(entry.get("capabilities", {}).get("prefix_cache")))
    expect(None not in (cache["hits"], after["hits"]), "hits and misses are null on this endpoint")
    expect((after["hits"] - cache["hits"], after["misses"] - cache["misses"]) == (enabled, enabled),
           f"hits {cache['hits']}->{after['hits']}, misses {cache['misses']}->{after['misses']}, enabled {enabled}")


@case("test_serving: /health is 200 when ready", "pointer", "lm_token", "choice")
def _health(s):
    status, _, reply = s.request("GET", "/health")
    expect((status, reply) == (200, {"status": "ready"}), f"{status} {reply}")


@case("test_serving: an over-long state is 422 'state exceeds'", "pointer", "lm_token", "choice")
def _too_long(s):
    status, _, reply = s.post({**SERVING_BODY, "state": "state " * (s.context_window() + 64)})
    expect(status == 422 and "state exceeds" in str(reply.get("detail")), f"{status} {reply}")


@case("test_serving: an unknown model is 422 'unknown model'", "pointer", "choice")
def _unknown_model(s):
    status, _, reply = s.post({**SERVING_BODY, "model": "other-model"})
    expect(status == 422 and "unknown model" in str(reply.get("detail")), f"{status} {reply}")


@case("test_serving: no questions is 422", "pointer")
def _no_questions(s):
    status, _, reply = s.post({**SERVING_BODY, "questions": {}})
    expect(status == 422 and _no_questions_detail(reply), f"{status} {reply}")


@case("test_serving: an empty model selector is 422", "pointer")
def _empty_model(s):
    expect(s.post({**SERVING_BODY, "model": ""})[0] == 422, "not 422")


@case("test_serving: media on a text checkpoint: 'does not support ... media'", "pointer", "lm_token", media=True)
def _media_on_text(s):
    status, _, reply = s.post(_media_body(s))
    expect(status == 422 and "checkpoint does not support the requested media type" in str(reply.get("detail")),
           f"{status} {reply}")


@case("test_serving: a question past the branch limit is 422 'branch too long'", "pointer")
def _branch_limit(s):
    window = s.context_window()
    body = {"state": "s", "questions": {"q": {"type": "noul", "instructions": "word " * (window + 64)}}}
    status, headers, reply = s.post(body)
    expect(status == 422 and "branch too long" in str(reply.get("detail")), f"{status} {reply}")


@case("test_serving: a request past the packed limit is 422 'packed tokens'", "pointer")
def _packed_limit(s):
    questions = {f"q{i}": {"type": "noul", "instructions": "word " * 300} for i in range(40)}
    status, headers, reply = s.post({"state": "s", "questions": questions})
    expect(status == 422 and "packed tokens" in str(reply.get("detail")), f"{status} {reply}")
    expect(headers.get("x-jevany-error-code") == "context_length_exceeded", "no context_length_exceeded header")


# --- tests/test_api_values.py --------------------------------------------------------------------

def _nonfinite_body(field: str, value: float) -> dict:
    nested = {"measurements": [1, {"value": value}]}
    question = {"type": "noul"}
    body = {"state": "evidence", "questions": {"q": question}}
    if field == "state":
        body["state"] = nested
    elif field == "instructions":
        question["instructions"] = nested
    elif field == "choice":
        question.update(type="choice", criteria={"a": nested, "b": None})
    elif field == "noul":
        question["criteria"] = {"true": nested}
    else:
        question.update(type="score", criteria=["low", nested])
    return body


def _nonfinite_case(field: str, label: str):
    def check(s):
        status, headers, reply = s.post(raw=json.dumps(_nonfinite_body(field, NONFINITE[label])).encode())
        detail = reply.get("detail") if isinstance(reply, dict) else None
        expect(status == 422 and isinstance(detail, list), f"{status} {reply}")
        expect(any("finite" in d.get("msg", "") for d in detail), f"no 'finite' in {detail}")
        if field == "state":
            expect(detail[0]["loc"] == ["body", "state"], f"loc {detail[0]['loc']}")
        expect("x-jevany-error-code" not in headers, "X-JevAny-Error-Code on a validation error")
    return check


for _field in ("state", "instructions", "choice", "noul", "score"):
    for _label in NONFINITE:
        case(f"test_api_values: a non-finite number in {_field} ({_label}) is a 422 naming 'finite'")(
            _nonfinite_case(_field, _label))


@case("test_api_values: finite JSON evidence of every kind is accepted", "pointer", "choice")
def _finite(s):
    values = [None, True, False, 0, -7, 1.25, 1e100, "NaN", "∞", {"nested": ["证据"]}]
    body = {"state": {"values": values},
            "questions": {"q": {"type": "choice", "instructions": values, "criteria": {"a": values, "b": None}}}}
    status, _, reply = s.post(body)
    expect(status == 200, f"{status} {reply}")


@case("test_api_values: after a refused NaN, the finite request is answered")
def _finite_after(s):
    expect(s.post({"state": {"measurement": [0.25]}, "questions": {"q": {"type": "noul"}}})[0] == 200, "not 200")


# --- tests/test_remote_admission.py --------------------------------------------------------------

@case("test_remote_admission: a context-length 422 carries X-JevAny-Error-Code", "pointer", "lm_token", "choice")
def _context_header(s):
    status, headers, _ = s.post({**SERVING_BODY, "state": "state " * (s.context_window() + 64)})
    expect(status == 422 and headers.get("x-jevany-error-code") == "context_length_exceeded",
           f"{status}, header {headers.get('x-jevany-error-code')!r}")


@case("test_remote_admission: an unknown-model 422 has no X-JevAny-Error-Code", "pointer", "choice")
def _unknown_model_header(s):
    status, headers, _ = s.post({**SERVING_BODY, "model": "missing"})
    expect(status == 422 and not headers.get("x-jevany-error-code"),
           f"{status}, header {headers.get('x-jevany-error-code')!r}")


@case("test_remote_admission: any other 422 has no X-JevAny-Error-Code", "pointer", "choice")
def _other_header(s):
    status, headers, _ = s.post({"state": "s", "questions": {"q": {"type": "noul", "criteria": {"maybe": 1}}}})
    expect(status == 422 and not headers.get("x-jevany-error-code"),
           f"{status}, header {headers.get('x-jevany-error-code')!r}")


# --- tests/test_client_workflow.py and test_playground_workflow.py: what JevAny's client reads ----

@case("test_client_workflow: GET /v1/models is a non-empty list of model objects", "pointer", "lm_token", "choice")
def _models_list(s):
    status, _, reply = s.request("GET", "/v1/models")
    models = reply.get("models") if isinstance(reply, dict) else None
    expect(status == 200 and isinstance(models, list) and models and all(isinstance(m, dict) for m in models),
           f"{status} {reply}")


@case("test_client_workflow: JevClient's default headers (Bearer local, Accept JSON) are served", "pointer")
def _client_headers(s):
    status, _, reply = s.post(SERVING_BODY, headers={"authorization": "Bearer local", "accept": "application/json"})
    expect(status == 200, f"{status} {reply}")


@case("test_client_workflow: the answer passes JevAny's client's response check", "pointer", "lm_token", "choice")
def _client_check(s):
    for body in (SERVING_BODY, API_BODY):
        problem = jevany_response_problem(body, s.decide(body))
        expect(problem is None, problem)


@case("test_client_workflow: a refusal's detail is the server's sentence", "pointer")
def _detail_string(s):
    status, _, reply = s.post({**SERVING_BODY, "model": "wrong"})
    expect(status == 422 and isinstance(reply.get("detail"), str) and "'wrong'" in reply["detail"],
           f"{status} {reply}")


@case("test_client_workflow: a validation refusal's detail is a list with loc and msg", "pointer")
def _detail_list(s):
    status, _, reply = s.post({"state": "s"})
    expect(status == 422 and _no_questions_detail(reply) and "msg" in reply["detail"][0], f"{status} {reply}")


@case("test_playground_workflow: the entry the Playground adopts: id, aliases, capabilities, limits, device",
      "pointer", "lm_token", "choice")
def _playground_entry(s):
    entry = s.entry()
    expect(isinstance(entry.get("id"), str) and entry["id"], "id")
    expect(isinstance(entry.get("aliases"), list), "aliases is not a list")
    caps, limits = entry.get("capabilities"), entry.get("limits")
    expect(isinstance(caps, dict), "capabilities is not an object")
    expect(isinstance(caps.get("media_types"), list) and all(isinstance(t, str) for t in caps["media_types"]),
           "capabilities.media_types is not a list of names")
    expect(isinstance(limits, dict) and isinstance(limits.get("media_enabled"), bool), "limits.media_enabled")
    expect(isinstance(entry.get("device"), str), "device is not a name")


@case("test_playground_workflow: the entry names its base and decision_mode", "pointer", "lm_token")
def _playground_served(s):
    entry = s.entry()
    expect(isinstance(entry.get("base"), str) and entry["base"], f"base {entry.get('base')!r}")
    expect(entry.get("decision_mode") == s.readout, f"decision_mode {entry.get('decision_mode')!r}")


@case("test_playground_workflow: a custom choice question returns choice, confidence, probabilities, latency",
      "pointer", "choice")
def _playground_decide(s):
    body = {"model": s.entry()["id"], "state": "A customer was charged twice.", "questions": {"decision": {
        "type": "choice", "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments", "shipping": None, "accounts": None}}}}
    reply = s.decide(body)
    answer = reply["answers"]["decision"]
    expect({"choice", "confidence", "probabilities"} <= set(answer), f"answer keys {sorted(answer)}")
    expect(list(answer["probabilities"]) == ["billing", "shipping", "accounts"], "option order")
    expect(_is_number(reply.get("latency_ms")) and reply.get("model") == body["model"], "latency_ms or model")


# --- runtime.py describe() and letter_runtime.py: the /v1/models entry ----------------------------

@case("describe: run, base, lora, device_map, devices, temperature", "pointer", "lm_token", "choice")
def _identity(s):
    entry = s.entry()
    expect(isinstance(entry.get("run"), str) and entry["run"], f"run {entry.get('run')!r}")
    expect(isinstance(entry.get("base"), str), f"base {entry.get('base')!r}")
    expect(_is_int(entry.get("lora")), f"lora {entry.get('lora')!r}")
    expect("device_map" in entry and entry["device_map"] is None, f"device_map {entry.get('device_map', 'absent')!r}")
    expect(isinstance(entry.get("devices"), list) and all(isinstance(d, str) for d in entry["devices"]),
           f"devices {entry.get('devices')!r}")
    expect(_is_number(entry.get("temperature")), f"temperature {entry.get('temperature')!r}")


@case("describe: a native checkpoint's readout is 'native'", "pointer", "lm_token")
def _readout_native(s):
    expect(s.entry().get("readout") == "native", f"readout {s.entry().get('readout')!r}")


@case("describe: backbone_adapter names the adapter", "pointer", "lm_token", "choice")
def _adapter(s):
    expect(isinstance(s.entry().get("backbone_adapter"), str), f"{s.entry().get('backbone_adapter')!r}")


@case("describe: acceleration {compile_mode, lora_merged, approximate_bf16_merge, cuda_graphs, ...}",
      "pointer", "lm_token", "choice")
def _acceleration(s):
    acc = s.entry().get("acceleration")
    expect(isinstance(acc, dict), f"acceleration {acc!r}")
    missing = {"compile_mode", "lora_merged", "approximate_bf16_merge", "cuda_graphs"} - set(acc)
    expect(not missing, f"acceleration lacks {sorted(missing)}")
    expect(isinstance(acc["lora_merged"], bool) and isinstance(acc["approximate_bf16_merge"], bool), "not booleans")


@case("describe: capabilities {context_window, prefix_cache, media_types, max_media_questions}",
      "pointer", "lm_token", "choice")
def _capabilities(s):
    caps = s.entry().get("capabilities")
    expect(isinstance(caps, dict), f"capabilities {caps!r}")
    missing = {"context_window", "prefix_cache", "media_types", "max_media_questions"} - set(caps)
    expect(not missing, f"capabilities lacks {sorted(missing)}")
    expect(isinstance(caps["prefix_cache"], bool), "capabilities.prefix_cache is not a boolean")


@case("describe: limits {state_tokens, branch_tokens, packed_tokens, choices}", "pointer", "lm_token", "choice")
def _limits(s):
    limits = s.entry().get("limits", {})
    missing = {"state_tokens", "branch_tokens", "packed_tokens", "choices"} - set(limits)
    expect(not missing, f"limits lacks {sorted(missing)}")
    expect(all(_is_int(limits[k]) for k in ("state_tokens", "branch_tokens", "packed_tokens")), "not integers")


@case("describe: limits.choices is null on the pointer head", "pointer")
def _choices_pointer(s):
    expect("choices" in s.entry()["limits"] and s.entry()["limits"]["choices"] is None, "not null")


@case("describe: limits.choices is the verbalizer count on lm_token", "lm_token")
def _choices_lm(s):
    import torch

    verbalizers = len(torch.load(s.model_dir / "head.pt", weights_only=False)["verbalizers"])
    expect(s.entry()["limits"].get("choices") == verbalizers, f"{s.entry()['limits'].get('choices')!r}")


@case("describe: limits.choices is 52 on the choice readout", "choice")
def _choices_choice(s):
    expect(s.entry()["limits"].get("choices") == 52, f"{s.entry()['limits'].get('choices')!r}")


@case("serve: limits carry the media policy", "pointer", "choice")
def _media_policy(s):
    limits = s.entry()["limits"]
    expect(limits.get("media_enabled") is False, "media_enabled (a text model) is not false")
    expect((limits.get("media_max_file_bytes"), limits.get("media_max_total_bytes")) == (50 << 20, 100 << 20)
           and (limits.get("media_max_pixels"), limits.get("media_max_video_frames")) == (4096 * 4096, 3600),
           "media caps")


@case("describe: prefix_cache {enabled, size, min_state_tokens, hits, misses, cached_states}", "pointer", "choice")
def _prefix_keys(s):
    cache = s.entry().get("prefix_cache", {})
    missing = {"enabled", "size", "min_state_tokens", "hits", "misses", "cached_states"} - set(cache)
    expect(not missing, f"prefix_cache lacks {sorted(missing)}")


@case("describe: prefix_cache.size is the configured capacity, not the entries held", "pointer")
def _prefix_size(s):
    body = {"state": "kept words " * 300, "questions": {"q": {"type": "noul"}}}
    s.decide(body)
    cache = s.entry()["prefix_cache"]
    expect(cache.get("size") == 4 and cache.get("min_state_tokens") == 384,
           f"size {cache.get('size')!r}, min_state_tokens {cache.get('min_state_tokens')!r}")


@case("letter_runtime: the choice readout reports readout 'choice' and branch_mode 'chat'", "choice")
def _choice_readout(s):
    entry = s.entry()
    expect((entry.get("readout"), entry.get("branch_mode")) == ("choice", "chat"),
           f"readout {entry.get('readout')!r}, branch_mode {entry.get('branch_mode')!r}")


@case("letter_runtime: choice_readout and its legacy twin letter_readout", "choice")
def _letter_twin(s):
    entry = s.entry()
    expect(isinstance(entry.get("choice_readout"), dict) and entry.get("letter_readout") == entry["choice_readout"],
           "letter_readout is not choice_readout's twin")
    expect(entry["choice_readout"].get("temperature") == entry.get("temperature"), "temperatures differ")


@case("letter_runtime: the choice readout reports no prefix cache", "choice")
def _choice_no_cache(s):
    entry = s.entry()
    expect(entry.get("capabilities", {}).get("prefix_cache") is False and entry["prefix_cache"].get("enabled") is False,
           "prefix cache reported on")


@case("letter_runtime: more than 52 options is 'exact choice-token readout supports at most 52 options'",
      "choice")
def _choice_cap(s):
    status, headers, reply = s.post(_choice_body(53))
    expect(status == 422 and "exact choice-token readout supports at most 52 options" in str(reply.get("detail")),
           f"{status} {reply}")
    expect(not headers.get("x-jevany-error-code"), "X-JevAny-Error-Code on an option cap")


@case("letter_runtime: media on the choice readout is 'choice readout does not support media requests'",
      "choice", media=True)
def _choice_media(s):
    status, _, reply = s.post(_media_body(s))
    expect(status == 422 and "choice readout does not support media requests" in str(reply.get("detail")),
           f"{status} {reply}")


@case("model.py: more options than verbalizers is 'lm-token mode supports at most N options per question'",
      "lm_token")
def _lm_cap(s):
    cap = s.entry()["limits"].get("choices") or 255
    status, _, reply = s.post(_choice_body(cap + 1))
    expect(status == 422 and f"lm-token mode supports at most {cap} options per question" in str(reply.get("detail")),
           f"{status} {reply}")


# --- api.py: the answer's shape and usage --------------------------------------------------------

@case("api.py: a response holds model, answers, usage, latency_ms", "pointer", "lm_token", "choice")
def _top_keys(s):
    keys = list(s.decide(SERVING_BODY))
    expect(keys == ["model", "answers", "usage", "latency_ms"], f"keys {keys}")


@case("api.py: each answer has JevAny's keys, in its order", "pointer", "lm_token", "choice")
def _answer_keys(s):
    for qid, answer in s.decide(SERVING_BODY)["answers"].items():
        expect(list(answer) == ANSWER_KEYS[answer["type"]], f"{qid}: {list(answer)}")


@case("api.py: usage is input_tokens and output_tokens, integers", "pointer", "lm_token", "choice")
def _usage(s):
    usage = s.decide(SERVING_BODY)["usage"]
    expect(set(usage) == {"input_tokens", "output_tokens"} and all(_is_int(v) for v in usage.values()), f"{usage}")


@case("api.py: output_tokens counts the tokens of the answers in JevAny's shape", "pointer", "lm_token", "choice")
def _output_tokens(s):
    for body in (SERVING_BODY, API_BODY):
        reply = s.decide(body)
        counted = len(s.tokenizer(json.dumps(jevany_shape(reply["answers"])), add_special_tokens=False).input_ids)
        expect(reply["usage"]["output_tokens"] == counted, f"{reply['usage']['output_tokens']} != {counted}")


@case("docs/API.md: the documented request is answered, score between its levels", "pointer", "choice")
def _documented(s):
    answers = s.decide(API_BODY)["answers"]
    expect(answers["department"]["choice"] in ("billing", "shipping") and 0 <= answers["priority"]["score"] <= 2,
           f"{answers}")


@case("serve.py: unknown fields are ignored, at the top and in a question", "pointer")
def _unknown_fields(s):
    body = {**SERVING_BODY, "trace_id": "abc", "questions": {"q": {"type": "noul", "weight": 3}}}
    status, _, reply = s.post(body)
    expect(status == 200 and set(reply["answers"]) == {"q"}, f"{status} {reply}")


@case("serve.py: an empty question id is answered under that id", "pointer", "choice")
def _empty_qid(s):
    status, _, reply = s.post({"state": "s", "questions": {"": {"type": "noul"}}})
    expect(status == 200 and list(reply.get("answers", {})) == [""], f"{status} {reply}")


@case("serve.py: an empty option name is an option like any other", "pointer", "choice")
def _empty_option(s):
    status, _, reply = s.post({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"": None, "b": None}}}})
    expect(status == 200 and list(reply["answers"]["q"]["probabilities"]) == ["", "b"], f"{status} {reply}")


# --- serve.py: CORS (CORSMiddleware, every origin, method and header) -----------------------------

@case("serve.py: a browser's preflight for POST /v1/systemone is allowed for any origin", "pointer", "choice")
def _preflight(s):
    status, headers, _ = s.request("OPTIONS", "/v1/systemone", headers={
        "Origin": "http://page.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    expect(status == 200 and headers.get("access-control-allow-origin") in ("*", "http://page.example"),
           f"{status}, allow-origin {headers.get('access-control-allow-origin')!r}")
    expect("POST" in headers.get("access-control-allow-methods", ""), "POST not allowed")


@case("serve.py: a cross-origin POST is answered with Access-Control-Allow-Origin", "pointer")
def _cors_post(s):
    status, headers, _ = s.post(SERVING_BODY, headers={"Origin": "http://page.example"})
    expect(status == 200 and headers.get("access-control-allow-origin") in ("*", "http://page.example"),
           f"{status}, allow-origin {headers.get('access-control-allow-origin')!r}")


@case("serve.py: a cross-origin GET /v1/models is answered with Access-Control-Allow-Origin", "pointer")
def _cors_models(s):
    status, headers, _ = s.request("GET", "/v1/models", headers={"Origin": "http://page.example"})
    expect(status == 200 and headers.get("access-control-allow-origin") in ("*", "http://page.example"),
           f"{status}, allow-origin {headers.get('access-control-allow-origin')!r}")


# --- running it on its own -----------------------------------------------------------------------

def start_servers(root: Path, readouts=("pointer", "lm_token", "choice")) -> tuple[dict, list]:
    """Tiny models and one `jevany-daemon serve --http` per readout, each with a media root holding one image."""
    from PIL import Image

    from jevany_daemon.model.tiny import build_tiny_model

    from .daemons import Daemon, wait_for
    from .http_proc import free_port

    media = root / "media"
    media.mkdir()
    Image.new("RGB", (28, 28), "red").save(media / "image.png")
    servers, daemons = {}, []
    for readout in readouts:
        model = build_tiny_model(root / readout, readout=readout)
        port = free_port()
        directory = Path(tempfile.mkdtemp(prefix="jvr-"))
        daemons.append(Daemon(directory, model, "--http", f"127.0.0.1:{port}", "--media-root", str(media)))
        servers[readout] = Server(readout, port, model, "image.png")
    for daemon, server in zip(daemons, servers.values()):
        daemon.wait_ready()
        wait_for(lambda: _healthy(server), 60, f"{server.readout}'s gateway")
    return servers, daemons


def _healthy(server: Server) -> bool:
    try:
        return server.request("GET", "/health")[0] == 200
    except OSError:
        return False


def report(outcomes) -> str:
    lines = [f"{c.name}: {why}{' (a departure)' if c.name in DEPARTURES else ''}"
             for c, why in outcomes if why is not None]
    matched = sum(why is None for _, why in outcomes)
    departed = sum(why is not None and c.name in DEPARTURES for c, why in outcomes)
    return "\n".join(lines + [f"matched {matched}/{len(outcomes)}, departures {departed}"])


def main(argv=None) -> int:
    argparse.ArgumentParser(description="Replay JevAny's cases against jevany-daemon's gateway.").parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="jevany-replay-"))
    servers, daemons = start_servers(root)
    try:
        print(report(replay(servers)))
    finally:
        for daemon in daemons:
            daemon.stop()
            shutil.rmtree(daemon.dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
