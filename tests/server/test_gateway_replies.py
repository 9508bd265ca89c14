"""Protocol errors as HTTP answers (gateway/replies.py): status, headers and body, in process."""
import json

from jevany_daemon.gateway.replies import ERROR_CODE_HEADER, JEVANY_ERROR_HEADER, STATUS, error_response


def test_an_explicit_status_wins_over_the_code_s():
    # A body too big for the daemon is invalid_request's code with 413, not invalid_request's 422.
    reply = error_response("invalid_request", "too big", status=413)
    assert reply.status_code == 413 and reply.headers[ERROR_CODE_HEADER] == "invalid_request"


def test_jevany_s_header_marks_an_over_long_request_and_no_other_error():
    # JevAny's remote evaluation tells an over-long request from the other 422s by this header alone.
    assert error_response("context_length_exceeded", "long").headers[JEVANY_ERROR_HEADER] == "context_length_exceeded"
    for code in sorted(STATUS):
        if code != "context_length_exceeded":
            assert JEVANY_ERROR_HEADER not in error_response(code, "m").headers, code


def test_each_code_gets_its_status_and_the_dialect_s_body():
    got = {code: error_response(code, "m").status_code for code in
           ("unknown_model", "overloaded", "worker_lost", "deadline_exceeded", "forbidden", "no_such_code")}
    assert got == {"unknown_model": 422, "overloaded": 429, "worker_lost": 503, "deadline_exceeded": 504,
                   "forbidden": 403, "no_such_code": 500}
    typesafe = error_response("unknown_model", "m", "typesafe")
    assert typesafe.status_code == 400 and json.loads(typesafe.body)["detail"]["error_type"] == "api_usage_error"


def test_the_codes_a_client_may_retry_soon_carry_retry_after_and_the_others_do_not():
    # docs/COMING-FROM-JEVANY.md: overloaded, worker_lost (a new worker is starting), shutting_down and not_ready
    # tell a client when to come back; named here, not read from replies.RETRY_AFTER, so a code dropped there shows.
    retry = {code: error_response(code, "m").headers.get("Retry-After") for code in sorted(STATUS)}
    assert {code for code, after in retry.items() if after is not None} == {
        "overloaded", "worker_lost", "shutting_down", "not_ready"}
    assert retry["worker_lost"] == "1"
